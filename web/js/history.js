// History: the cluster's max rho and Jain's index over time, and one app's rho over time, over
// a chosen range (15 minutes, 1 hour, 24 hours, all). The server downsamples: whatever the
// range, an answer holds at most 240 points (the last round of each of 240 equal intervals).

import { get } from './api.js';
import { fairnessHistoryChart, rhoChart } from './charts.js';
import { h, time } from './ui.js';

const RANGES = [['15m', '15 min'], ['1h', '1 hour'], ['24h', '24 hours'], ['all', 'all']];

export async function showHistory(container, context, appId) {
  let range = '1h';
  let selected = appId ?? context.me.apps.find((app) => !app.finished_at)?.id ?? context.me.apps[0]?.id;
  const buttons = RANGES.map(([value, label]) => h('button', { type: 'button', class: 'quiet', 'data-range': value,
    'aria-pressed': String(value === range), onclick: () => { range = value; refresh(); } }, label));
  const note = h('p', { class: 'hint', id: 'history-note' });
  const cluster = h('div', { class: 'chart', id: 'cluster-history', role: 'img' });
  const picker = h('select', { id: 'history-app', onchange: () => { selected = Number(picker.value); refresh(); } },
    context.me.apps.map((one) => h('option', { value: one.id, selected: one.id === selected },
      context.admin ? `${one.name} (${one.tenant})` : one.name)));
  const app = h('div', { class: 'chart', id: 'app-history', role: 'img' });
  container.replaceChildren(
    h('h2', { tabindex: '-1' }, 'History'),
    h('div', { class: 'range', role: 'group', 'aria-label': 'Range' }, buttons),
    note,
    h('h3', {}, 'The cluster: max finite ρ and Jain’s index at round start'),
    cluster,
    h('h3', {}, h('label', { for: 'history-app' }, 'ρ at round start of the app ')), picker,
    app);
  const refresh = async () => {
    for (const button of buttons) button.setAttribute('aria-pressed', String(button.dataset.range === range));
    const [history, rhos] = await Promise.all([
      get(`/v1/fairness/history?range=${range}`),
      selected == null ? [] : get(`/v1/apps/${selected}/rho-history?range=${range}`),
    ]);
    note.textContent = history.from == null ? 'No round has run yet.'
      : `From ${time(history.from)} to ${time(history.to)}: ${history.points.length} points, each the last round of one of `
        + `${history.intervals} equal intervals (at most ${history.intervals} whatever the range). ρ = 1, dashed, is the sharing incentive.`;
    cluster.setAttribute('aria-label', `Max finite ρ and Jain’s index over ${range}, ${history.points.length} points`);
    app.setAttribute('aria-label', `ρ at round start of the chosen app over ${range}, ${rhos.length} points`);
    fairnessHistoryChart(cluster, history.points);
    rhoChart(app, rhos);
    cluster.dataset.range = range;
    app.dataset.range = range;
  };
  await refresh();
  return { update: refresh };
}
