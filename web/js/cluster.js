// Cluster: racks, machines and GPUs coloured by the app holding them, drained GPUs marked; a
// Gantt chart of the leases over every GPU; for the admin, drain and restore of a GPU or a
// whole host (confirmed in a dialog, through the API the clients use, and audited), with the
// audit log of those actions.

import { get, post } from './api.js';
import { leaseGantt } from './charts.js';
import { appColour, appLabel, h, table, time } from './ui.js';

const WINDOW_MS = 10 * 60 * 1000;

export async function showCluster(container, context) {
  const racks = h('div', { class: 'racks', id: 'racks' });
  const legend = h('ul', { class: 'chart-legend', id: 'cluster-legend', 'aria-label': 'Colours' });
  const gantt = h('div', { class: 'chart', id: 'cluster-gantt', role: 'img', 'aria-label': 'Leases over every GPU in the last 10 minutes' });
  const status = h('p', { class: 'hint', id: 'operator-status', role: 'status' });
  const log = h('div', { class: 'table-wrap', id: 'operator-log' });
  const dialog = context.admin ? confirmDialog() : null;
  container.replaceChildren(...[
    h('h2', { tabindex: '-1' }, 'Cluster'),
    legend,
    context.admin ? status : null,
    racks,
    h('h3', {}, 'Leases over GPUs (last 10 minutes)'),
    gantt,
    ...(context.admin ? [h('h3', {}, 'Operator actions (audit log)'), log, dialog] : []),
  ].filter(Boolean));
  const refresh = async () => {
    const to = Date.now();
    const from = to - WINDOW_MS;
    const window = `from=${new Date(from).toISOString()}&to=${new Date(to).toISOString()}`;
    const [{ gpus }, leases, actions] = await Promise.all([get('/v1/cluster'), get(`/v1/leases?${window}`),
      context.admin ? get('/v1/cluster/actions?limit=20') : null]);
    const heldByOthers = new Set(leases.filter((lease) => lease.state === 'active' && lease.app_id == null).flatMap((lease) => lease.gpus));
    const holder = (gpu) => (gpu.app_id != null ? gpu.app_id : heldByOthers.has(gpu.id) ? null : undefined);
    const act = context.admin ? (action, targets, what) => operate(dialog, status, action, targets, what).then(refresh) : null;
    renderRacks(racks, gpus, holder, context, act);
    renderLegend(legend, gpus.map(holder), context);
    leaseGantt(gantt, leases, gpus.map((gpu) => gpu.id), appColour, { from, to });
    if (actions) renderLog(log, actions);
  };
  await refresh();
  return { update: refresh };
}

/**
 * Racks of machines of GPU tiles, built once and then updated in place, so that focus, hover
 * and scroll survive the refreshes. `holder(gpu)`: an app id, `null` for another tenant's
 * app, `undefined` when free. `act`, for the admin: drains or restores GPUs.
 */
function renderRacks(racks, gpus, holder, context, act) {
  const layout = gpus.map((gpu) => gpu.id).join(' ');
  if (racks.dataset.layout !== layout) {
    racks.dataset.layout = layout;
    const byRack = Map.groupBy(gpus, (gpu) => gpu.rack);
    racks.replaceChildren(...[...byRack].map(([rack, rackGpus]) => h('section', { class: 'rack', 'aria-label': `Rack ${rack}` },
      h('h3', {}, `Rack ${rack}`),
      [...Map.groupBy(rackGpus, (gpu) => gpu.machine)].map(([, machineGpus]) => h('div', { class: 'machine', 'data-host': machineGpus[0].host },
        h('span', { class: 'machine-name' }, `${machineGpus[0].host} (${gpuTypes(machineGpus)})`),
        act ? hostButtons(machineGpus[0].host, act) : null,
        h('ul', { class: 'gpus' }, machineGpus.map((gpu) => h('li', { class: 'gpu', 'data-gpu': gpu.id },
          h('span', { class: 'state' }, gpu.id), h('span', { class: 'gpu-type' }, gpuModel(gpu)), h('span', { class: 'holder' }),
          act ? h('button', { type: 'button', class: 'gpu-action', onclick: (event) => {
            const drain = event.currentTarget.dataset.action === 'drain';
            act(drain ? 'drain' : 'restore', [gpu.id], `GPU ${gpu.id}`);
          } }) : null))))))));
  }
  const byId = new Map(gpus.map((gpu) => [gpu.id, gpu]));
  for (const tile of racks.querySelectorAll('.gpu')) updateTile(tile, byId.get(tile.dataset.gpu), holder, context);
  for (const machine of racks.querySelectorAll('.machine')) {
    const tiles = [...machine.querySelectorAll('.gpu')];
    machine.dataset.drained = String(tiles.every((tile) => tile.classList.contains('unhealthy')));
  }
}

/** The distinct GPU types of a machine's GPUs, in order: `h100`, or `k80, v100`. */
function gpuTypes(gpus) {
  return [...new Set(gpus.map((gpu) => gpu.gpu_type))].join(', ');
}

/** A GPU's type, with the compute capability its host reported (`h100 · cc 9.0`). */
function gpuModel(gpu) {
  return gpu.compute_capability ? `${gpu.gpu_type} · cc ${gpu.compute_capability}` : gpu.gpu_type;
}

function updateTile(tile, gpu, holder, context) {
  const app = holder(gpu);
  const free = app === undefined;
  const colour = free ? null : appColour(app);
  const holderText = free ? 'free' : appLabel(app, context.appsById);
  const health = gpu.healthy ? '' : ' · drained';
  tile.className = `gpu${free ? ' free' : ''}${gpu.healthy ? '' : ' unhealthy'}`;
  tile.style.cssText = colour ? `background-color:${colour.fill};color:${colour.ink}` : '';
  tile.title = `${gpu.id} (${gpu.cuda_uuid}, ${gpu.product_name ?? gpu.gpu_type}): ${holderText}${health}`;
  tile.dataset.holder = free ? 'free' : app ?? 'other';
  tile.dataset.healthy = String(gpu.healthy);
  tile.querySelector('.holder').textContent = `${holderText}${health}`;
  const button = tile.querySelector('.gpu-action');
  if (button) {
    button.dataset.action = gpu.healthy ? 'drain' : 'restore';
    button.textContent = gpu.healthy ? 'Drain' : 'Restore';
    button.setAttribute('aria-label', `${gpu.healthy ? 'Drain' : 'Restore'} GPU ${gpu.id}`);
  }
}

function hostButtons(host, act) {
  const gpusOf = (button) => [...button.closest('.machine').querySelectorAll('.gpu')];
  return h('span', { class: 'host-actions' },
    h('button', { type: 'button', 'aria-label': `Drain host ${host}`, onclick: (event) => act('drain',
      gpusOf(event.currentTarget).filter((tile) => tile.dataset.healthy === 'true').map((tile) => tile.dataset.gpu), `host ${host}`) },
    'Drain host'),
    h('button', { type: 'button', 'aria-label': `Restore host ${host}`, onclick: (event) => act('restore',
      gpusOf(event.currentTarget).filter((tile) => tile.dataset.healthy === 'false').map((tile) => tile.dataset.gpu), `host ${host}`) },
    'Restore host'));
}

/** The dialog that asks before an operator action; `ask(text, verb)` resolves to true on OK. */
function confirmDialog() {
  const text = h('p', { id: 'confirm-text' });
  const ok = h('button', { type: 'submit', value: 'ok', id: 'confirm-ok' });
  const dialog = h('dialog', { id: 'confirm', 'aria-labelledby': 'confirm-title', 'aria-describedby': 'confirm-text' },
    h('form', { method: 'dialog' },
      h('h3', { id: 'confirm-title' }, 'Operator action'),
      text,
      h('div', { class: 'dialog-buttons' }, h('button', { type: 'submit', value: 'cancel' }, 'Cancel'), ok)));
  dialog.ask = (question, verb) => new Promise((resolve) => {
    text.textContent = question;
    ok.textContent = verb;
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.returnValue = '';
    dialog.showModal();
  });
  return dialog;
}

/** Asks, then drains or restores `gpus` one by one (POST /v1/cluster/gpus/{gpu}/drain|restore). */
async function operate(dialog, status, action, gpus, what) {
  if (!gpus.length) {
    status.textContent = `Nothing to ${action} on ${what}.`;
    return;
  }
  const question = action === 'drain'
    ? `Drain ${what} (${gpus.length} GPU${gpus.length > 1 ? 's' : ''})? No round offers ${gpus.length > 1 ? 'them' : 'it'} from now on; `
      + 'a lease holding one is given notice and revoked after the grace period.'
    : `Restore ${what} (${gpus.length} GPU${gpus.length > 1 ? 's' : ''}) to service? The next rounds may offer ${gpus.length > 1 ? 'them' : 'it'} again.`;
  if (!await dialog.ask(question, action === 'drain' ? 'Drain' : 'Restore')) {
    status.textContent = `Cancelled: ${what} unchanged.`;
    return;
  }
  const acks = [];
  for (const gpu of gpus) acks.push(await post(`/v1/cluster/gpus/${encodeURIComponent(gpu)}/${action}`));
  const notices = acks.filter((ack) => ack.lease != null);
  status.textContent = action === 'drain'
    ? `Drained ${what}.${notices.length ? ` ${notices.map((ack) => `Lease ${ack.lease} on ${ack.gpu} ends at ${time(ack.revoke_at)}`).join('; ')}.` : ''}`
    : `Restored ${what}.`;
}

function renderLog(log, actions) {
  log.replaceChildren(actions.length
    ? table('Newest first', ['When', 'Action', 'GPU', 'Lease given notice'], actions.map((action) => h('tr', {},
      h('td', {}, time(action.at)), h('td', {}, action.action), h('td', {}, action.gpu), h('td', {}, action.lease_id ?? '–'))))
    : h('p', {}, 'No operator action yet.'));
}

function renderLegend(legend, holders, context) {
  const apps = [...new Set(holders.filter((app) => app !== undefined))];
  legend.replaceChildren(
    ...apps.map((app) => h('li', {}, h('span', { class: 'swatch', style: `background:${appColour(app).fill}` }), appLabel(app, context.appsById))),
    h('li', {}, h('span', { class: 'swatch', style: 'background:#ffffff;border-style:dashed' }), 'free'),
    h('li', {}, h('span', { class: 'swatch', style: 'background:repeating-linear-gradient(45deg,#fff 0 3px,#a4161a 3px 5px)' }), 'drained (out of service)'));
}
