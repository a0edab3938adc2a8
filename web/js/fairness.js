// Fairness summary: rho of every active app now (from the latest round's standings), max rho,
// Jain's index over rho, and GPU utilisation.

import { get } from './api.js';
import { rhoBars } from './charts.js';
import { appColour, appLabel, h, rho, stat, table, time } from './ui.js';

export async function showFairness(container, context) {
  const stats = h('div', { class: 'stats', id: 'fairness-stats' });
  const note = h('p', { class: 'hint' });
  const chart = h('div', { class: 'chart', id: 'rho-distribution', role: 'img', 'aria-label': 'rho of every active app, worst first' });
  const apps = h('div', { class: 'table-wrap' });
  container.replaceChildren(
    h('h2', { tabindex: '-1' }, 'Fairness'),
    note, stats,
    h('h3', {}, 'ρ of every active app (worst first)'),
    chart, apps);
  const refresh = async () => {
    const summary = await get('/v1/fairness');
    note.textContent = summary.round_id == null ? 'No round has run yet.'
      : `As of round ${summary.round_id} (${time(summary.at)}). ρ ≤ 1 means the app finishes no later than on its own 1/N share of the cluster.`;
    stats.replaceChildren(
      stat('Max ρ', summary.max_rho == null ? '–' : summary.max_rho.toFixed(3), summary.max_rho != null && summary.max_rho <= 1 ? 'good' : 'bad'),
      stat('Jain’s index over ρ', summary.jains_index == null ? '–' : summary.jains_index.toFixed(3)),
      stat('GPU utilisation', `${(summary.utilisation * 100).toFixed(0)}% (${summary.gpus.held} of ${summary.gpus.total})`),
      stat('GPUs in service', `${summary.gpus.healthy} of ${summary.gpus.total}`),
      stat('Starving apps (no GPU)', summary.starving_apps, summary.starving_apps ? 'bad' : 'good'),
      stat('Active apps', summary.apps.length));
    const label = (app) => (app.app_id == null ? 'other' : context.appsById.get(app.app_id)?.name ?? `#${app.app_id}`);
    rhoBars(chart, summary.apps, label);
    apps.replaceChildren(table('Standings', ['Position', 'App', 'ρ'], summary.apps.map((app) => h('tr', {},
      h('td', { class: 'num' }, app.position),
      h('td', {}, h('span', { class: 'swatch', style: `background:${appColour(app.app_id).fill}` }), appLabel(app.app_id, context.appsById)),
      h('td', { class: 'num' }, rho(app.rho))))));
  };
  await refresh();
  return { update: refresh };
}
