// Fairness summary: rho of every active app at the start of the latest round (its standings),
// starving apps drawn as the worst and counted, max rho, Jain's index over rho, and GPU
// utilisation.

import { get } from './api.js';
import { rhoBars } from './charts.js';
import { appColour, appLabel, h, place, rho, stat, table, time } from './ui.js';

export async function showFairness(container, context) {
  const stats = h('div', { class: 'stats', id: 'fairness-stats' });
  const note = h('p', { class: 'hint' });
  const chart = h('div', { class: 'chart', id: 'rho-distribution', role: 'img' });
  const title = h('h3', {}, 'ρ at round start of every active app (worst first)');
  const apps = h('div', { class: 'table-wrap' });
  container.replaceChildren(
    h('h2', { tabindex: '-1' }, 'Fairness'),
    note, stats,
    title, chart, apps);
  const refresh = async () => {
    const summary = await get('/v1/fairness');
    const asOf = summary.round_id == null ? 'no round yet' : `round ${summary.round_id}`;
    note.textContent = summary.round_id == null ? 'No round has run yet.'
      : `ρ at round start: each active app's ρ when round ${summary.round_id} opened (${time(summary.at)}). `
        + 'ρ ≤ 1 (the dashed line) means the app finishes no later than on its own 1/N share of the cluster; '
        + 'ρ ∞ means it holds no GPU (starving), the worst off of all.';
    title.textContent = `ρ at round start of every active app, worst first (${asOf})`;
    chart.setAttribute('aria-label', `ρ at the start of ${asOf} of ${summary.apps.length} active apps, worst first; `
      + `${summary.starving_apps} starving (ρ ∞); the dashed line is ρ = 1`);
    stats.replaceChildren(
      stat('Max finite ρ at round start', summary.max_rho == null ? '–' : summary.max_rho.toFixed(3), summary.max_rho != null && summary.max_rho <= 1 ? 'good' : 'bad'),
      stat('Jain’s index over finite ρ', summary.jains_index == null ? '–' : summary.jains_index.toFixed(3)),
      stat('GPU utilisation', `${(summary.utilisation * 100).toFixed(0)}% (${summary.gpus.held} of ${summary.gpus.total})`),
      stat('GPUs in service', `${summary.gpus.healthy} of ${summary.gpus.total}`),
      stat('Starving apps (ρ ∞, no GPU)', summary.starving_apps, summary.starving_apps ? 'bad' : 'good'),
      stat('Active apps', summary.apps.length));
    const label = (app) => (app.app_id == null ? 'other' : context.appsById.get(app.app_id)?.name ?? `#${app.app_id}`);
    rhoBars(chart, summary.apps, label, 'ρ at round start');
    apps.replaceChildren(table('Standings at round start (position 1 is the worst off, first offered GPUs)',
      ['Position', 'App', 'ρ at round start'], summary.apps.map((app) => h('tr', {},
      h('td', { class: 'num' }, place(app.position)),
      h('td', {}, h('span', { class: 'swatch', style: `background:${appColour(app.app_id).fill}` }), appLabel(app.app_id, context.appsById)),
      h('td', { class: 'num' }, rho(app.rho))))));
  };
  await refresh();
  return { update: refresh };
}
