// Apps: each app's rho now and at the start of each round (with rho = 1), why it has what it
// has, its leases on a timeline, and every round it took part in with its bid table, PF
// choice, c_i and the round in one sentence. While rounds run, only new rounds are read.

import { get } from './api.js';
import { leaseGantt, rhoChart } from './charts.js';
import { appColour, gpuList, h, place, rho, stat, table, time } from './ui.js';

/** How far back the app's lease timeline reaches. */
const LEASE_WINDOW_MS = 15 * 60 * 1000;

export async function showApps(container, context, appId) {
  const list = h('ul', { class: 'list', id: 'app-list', 'aria-label': 'Apps' });
  const detail = h('div', { id: 'app-detail', 'aria-live': 'off' });
  container.replaceChildren(
    h('h2', { tabindex: '-1' }, context.admin ? 'Apps of every tenant' : `Apps of ${context.me.tenant}`),
    h('div', { class: 'split' }, list, detail));
  const selected = appId ?? context.me.apps.find((app) => !app.finished_at)?.id ?? context.me.apps[0]?.id;
  const refresh = async () => {
    await context.reload();
    await Promise.all([renderList(list, context, selected), selected != null && renderDetail(detail, context, selected)]);
  };
  await refresh();
  return { update: refresh };
}

/**
 * The app list, grouped by tenant for the admin. Rebuilt only when what it shows changed, so
 * focus and scroll stay put while rounds run.
 */
async function renderList(list, context, selected) {
  const fairness = await get('/v1/fairness');
  const atStart = new Map(fairness.apps.filter((app) => app.app_id != null).map((app) => [app.app_id, app.rho]));
  const meta = (app) => (app.finished_at ? 'finished' : `ρ at round start ${atStart.has(app.id) ? rho(atStart.get(app.id)) : '–'}`);
  const shown = JSON.stringify([selected, context.me.apps.map((app) => [app.id, meta(app)])]);
  if (list.dataset.shown === shown) return;
  list.dataset.shown = shown;
  if (!context.me.apps.length) {
    list.replaceChildren(h('li', {}, 'No apps yet: register one with POST /v1/apps.'));
    return;
  }
  const item = (app) => h('li', {},
    h('a', { href: `#/apps/${app.id}`, 'aria-current': app.id === selected ? 'true' : null, 'data-app': app.id },
      h('span', { class: 'title' }, h('span', { class: 'swatch', style: `background:${appColour(app.id).fill}` }), app.name),
      h('span', { class: 'meta' }, meta(app))));
  if (!context.admin) {
    list.replaceChildren(...context.me.apps.map(item));
    return;
  }
  const byTenant = [...Map.groupBy(context.me.apps, (app) => app.tenant)].sort(([a], [b]) => a.localeCompare(b));
  list.replaceChildren(...byTenant.map(([tenant, apps]) => {
    const active = apps.filter((app) => !app.finished_at).length;
    return h('li', { class: 'app-group', 'data-tenant': tenant },
      h('h3', {}, `${tenant}: ${active} active, ${apps.length - active} finished`),
      h('ul', { class: 'list', 'aria-label': `Apps of ${tenant}` }, apps.map(item)));
  }));
}

async function renderDetail(detail, context, appId) {
  const app = context.appsById.get(appId);
  if (!app) {
    detail.replaceChildren(h('p', { class: 'error' }, `App ${appId} is not one you can see.`));
    return;
  }
  const now = Date.now();
  const [why, history, rounds, leases, { jobs }] = await Promise.all([
    get(`/v1/apps/${appId}/why`),
    get(`/v1/apps/${appId}/rho-history?range=1h`),
    roundsOf(detail, appId),
    get(`/v1/apps/${appId}/leases`),
    get(`/v1/apps/${appId}`),
  ]);
  const openBids = new Set([...detail.querySelectorAll('details[open]')].map((node) => node.dataset.round));
  const rhoContainer = detail.querySelector('#rho-chart') ?? h('div', { class: 'chart', id: 'rho-chart', role: 'img' });
  const leaseContainer = detail.querySelector('#app-leases') ?? h('div', { class: 'chart', id: 'app-leases', role: 'img' });
  rhoContainer.setAttribute('aria-label', `ρ at round start of ${app.name} over the last hour, ${history.length} rounds`);
  leaseContainer.setAttribute('aria-label', `leases of ${app.name} over the last 15 minutes`);
  const standing = why.now;
  detail.replaceChildren(
    h('h3', {}, app.name, context.admin ? ` (tenant ${app.tenant})` : ''),
    h('div', { class: 'stats' },
      stat('ρ now', standing ? rho(standing.rho) : '–', standing && standing.rho != null && standing.rho <= 1 ? 'good' : 'bad'),
      stat('Position now (1 = worst off)', standing ? `${place(standing.position)} of ${standing.active_apps}` : '–'),
      stat('GPUs held', standing ? standing.gpus_held : 0),
      stat('Status', app.finished_at ? 'finished' : 'active')),
    h('p', { class: 'why', id: 'why' }, h('strong', {}, 'Why: '), why.explanation),
    h('p', { class: 'hint' }, 'ρ now: as the app stands at this moment, with the GPUs it holds. ρ at round start: '
      + 'as it stood when a round opened, which decided who was offered GPUs.'),
    jobPhases(jobs),
    h('h3', {}, 'ρ at round start, over the last hour (longer ranges: History)'),
    rhoContainer,
    h('h3', {}, 'Leases (last 15 minutes)'),
    leaseContainer,
    activeLeases(leases),
    h('h3', {}, 'Rounds it took part in'),
    roundsTable(rounds, openBids));
  rhoChart(rhoContainer, history);
  const window = { from: now - LEASE_WINDOW_MS, to: now };
  const recent = leases
    .map((lease) => ({ ...lease, gpus: lease.gpus.map((gpu) => gpu.id), end_at: lease.ended_at ?? lease.end_at }))
    .filter((lease) => Date.parse(lease.end_at) > window.from);
  const gpus = [...new Set(recent.flatMap((lease) => lease.gpus))].sort();
  leaseGantt(leaseContainer, recent, gpus, appColour, window);
}

/**
 * The speed phase of each job whose speed changes as it trains (batch-size scaling), declared
 * or reported: phases counted from 1 for people (the API counts from 0). Nothing for an app
 * whose jobs each keep one speed.
 */
function jobPhases(jobs) {
  const adapting = jobs.filter((job) => job.phases > 1);
  if (!adapting.length) return new DocumentFragment();
  const next = (change) => (change ? `from iteration ${change.at_iteration}: ${change.serial_iteration_time} s` : 'none (last phase)');
  const rows = adapting.map((job) => h('tr', { 'data-job': job.job },
    h('td', {}, job.job),
    h('td', {}, `${job.phase + 1} of ${job.phases}`),
    h('td', { class: 'num' }, job.completed_iterations),
    h('td', { class: 'num' }, `${job.serial_iteration_time} s`),
    h('td', {}, next(job.next_change))));
  return h('div', { class: 'table-wrap' }, table('Jobs whose speed changes as they train, and the phase each is in',
    ['Job', 'Phase', 'Iterations done', 'Iteration time (1 GPU)', 'Next change'], rows, { id: 'app-job-phases' }));
}

/**
 * The leases the app holds now, each GPU with its type (what the app's throughput prices), and
 * the CPU cores and host memory that come with the lease (– where the hosts do not model them).
 */
function activeLeases(leases) {
  const active = leases.filter((lease) => lease.state === 'active');
  if (!active.length) return h('p', { id: 'app-active-leases' }, 'It holds no lease now.');
  const rows = active.map((lease) => h('tr', { 'data-lease': lease.id },
    h('td', {}, `#${lease.id}`),
    h('td', {}, lease.gpus.map((gpu) => `${gpu.id} (${gpu.gpu_type})`).join(', ')),
    h('td', {}, leaseResources(lease)),
    h('td', {}, time(lease.end_at))));
  return h('div', { class: 'table-wrap' }, table('Leases held now, with each GPU\'s type and the CPUs and memory that come with them',
    ['Lease', 'GPUs (type)', 'CPUs · memory', 'Ends'], rows, { id: 'app-active-leases' }));
}

/** `12 CPUs · 32 GiB`, one decimal at most; a resource the hosts do not model is left out. */
function leaseResources(lease) {
  const amount = (value) => String(Math.round(value * 10) / 10);
  const parts = [];
  if (lease.cpus != null) parts.push(`${amount(lease.cpus)} CPUs`);
  if (lease.memory_gib != null) parts.push(`${amount(lease.memory_gib)} GiB`);
  return parts.length ? parts.join(' · ') : '–';
}

/**
 * The app's last 50 rounds, newest first: read in full when the app is opened, then only the
 * rounds after the newest one already decided (an open round is read again until decided).
 */
async function roundsOf(detail, appId) {
  const known = detail.rounds?.appId === appId ? detail.rounds.list : null;
  let list;
  if (!known) {
    list = await get(`/v1/apps/${appId}/rounds?limit=50`);
  } else {
    const decided = known.filter((round) => round.status !== 'open').map((round) => round.round_id);
    const after = decided.length ? Math.max(...decided) : 0;
    const fresh = await get(`/v1/apps/${appId}/rounds?after=${after}&limit=50`);
    list = [...fresh, ...known.filter((round) => round.round_id <= after)].slice(0, 50);
  }
  detail.rounds = { appId, list };
  return list;
}

function roundsTable(rounds, openBids) {
  if (!rounds.length) return h('p', {}, 'It has not bid in any round yet.');
  const rows = rounds.map((round) => h('tr', { 'data-round': round.round_id },
    h('td', {}, h('a', { href: `#/rounds/${round.round_id}` }, `#${round.round_id}`), h('br'), time(round.opened_at)),
    h('td', { class: 'num' }, rho(round.rho)),
    h('td', {}, round.bid ? bidTable(round, openBids) : round.bidder ? 'no bid' : 'not offered'),
    h('td', {}, outcome(round)),
    h('td', {}, gpuList(round.won_gpus), round.leftover_gpus.length ? ` + leftovers ${gpuList(round.leftover_gpus)}` : ''),
    h('td', { class: 'num' }, round.c == null ? '–' : round.c.toFixed(3)),
    h('td', { class: 'why-sentence' }, round.why)));
  return h('div', { class: 'table-wrap' }, table('Newest first; c_i is the hidden payment share (the app keeps c_i of its bundle)',
    ['Round', 'ρ at round start', 'Bid table', 'Got GPUs?', 'GPUs got', 'c_i', 'Why, in words'], rows, { id: 'app-rounds' }));
}

/** Whether the round gave the app GPUs: in the auction, as leftovers after it, or not at all. */
function outcome(round) {
  if (round.won) return h('span', { class: 'won' }, round.leftover_gpus.length ? 'won + leftovers' : 'won');
  if (round.leftover_gpus.length) return h('span', { class: 'won' }, 'leftovers');
  return h('span', { class: 'lost' }, 'no');
}

function bidTable(round, openBids) {
  const { bid } = round;
  const rows = bid.entries.map((entry, index) => h('tr', { class: index === round.pf_entry ? 'chosen' : null },
    h('td', {}, index + 1, index === round.pf_entry ? ' (PF choice)' : ''),
    h('td', {}, gpuList(entry.gpus)),
    h('td', { class: 'num' }, entry.rho.toFixed(3))));
  return h('details', { 'data-round': round.round_id, open: openBids.has(String(round.round_id)) },
    h('summary', {}, `${bid.entries.length} bundles, ρ if it gets nothing (ρ_old) ${rho(bid.rho_old)} (${bid.source})`),
    table('Bid table', ['#', 'GPUs', 'ρ if won'], rows));
}
