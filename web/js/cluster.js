// Cluster: racks, machines and GPUs coloured by the app holding them, drained GPUs marked; and
// a Gantt chart of the leases over every GPU.

import { get } from './api.js';
import { leaseGantt } from './charts.js';
import { appColour, appLabel, h } from './ui.js';

const WINDOW_MS = 10 * 60 * 1000;

export async function showCluster(container, context) {
  const racks = h('div', { class: 'racks', id: 'racks' });
  const legend = h('ul', { class: 'chart-legend', id: 'cluster-legend', 'aria-label': 'Colours' });
  const gantt = h('div', { class: 'chart', id: 'cluster-gantt', role: 'img', 'aria-label': 'Leases over every GPU in the last 10 minutes' });
  container.replaceChildren(
    h('h2', { tabindex: '-1' }, 'Cluster'),
    legend,
    racks,
    h('h3', {}, 'Leases over GPUs (last 10 minutes)'),
    gantt);
  const refresh = async () => {
    const to = Date.now();
    const from = to - WINDOW_MS;
    const window = `from=${new Date(from).toISOString()}&to=${new Date(to).toISOString()}`;
    const [{ gpus }, leases] = await Promise.all([get('/v1/cluster'), get(`/v1/leases?${window}`)]);
    const heldByOthers = new Set(leases.filter((lease) => lease.state === 'active' && lease.app_id == null).flatMap((lease) => lease.gpus));
    const holder = (gpu) => (gpu.app_id != null ? gpu.app_id : heldByOthers.has(gpu.id) ? null : undefined);
    renderRacks(racks, gpus, holder, context);
    renderLegend(legend, gpus.map(holder), context);
    leaseGantt(gantt, leases, gpus.map((gpu) => gpu.id), appColour, { from, to });
  };
  await refresh();
  return { update: refresh };
}

/** `holder(gpu)`: an app id, `null` for another tenant's app, `undefined` when free. */
function renderRacks(racks, gpus, holder, context) {
  const byRack = Map.groupBy(gpus, (gpu) => gpu.rack);
  racks.replaceChildren(...[...byRack].map(([rack, rackGpus]) => h('section', { class: 'rack', 'aria-label': `Rack ${rack}` },
    h('h3', {}, `Rack ${rack}`),
    [...Map.groupBy(rackGpus, (gpu) => gpu.machine)].map(([, machineGpus]) => h('div', { class: 'machine' },
      h('span', { class: 'machine-name' }, `${machineGpus[0].host} (${machineGpus[0].gpu_type})`),
      h('ul', { class: 'gpus' }, machineGpus.map((gpu) => gpuTile(gpu, holder(gpu), context))))))));
}

function gpuTile(gpu, app, context) {
  const free = app === undefined;
  const colour = free ? null : appColour(app);
  const holderText = free ? 'free' : appLabel(app, context.appsById);
  const health = gpu.healthy ? '' : ' · drained';
  return h('li', {
    class: `gpu${free ? ' free' : ''}${gpu.healthy ? '' : ' unhealthy'}`,
    style: colour ? `background-color:${colour.fill};color:${colour.ink}` : null,
    title: `${gpu.id} (${gpu.cuda_uuid}): ${holderText}${health}`,
    'data-gpu': gpu.id,
    'data-holder': free ? 'free' : app ?? 'other',
  }, h('span', { class: 'state' }, gpu.id), `${holderText}${health}`);
}

function renderLegend(legend, holders, context) {
  const apps = [...new Set(holders.filter((app) => app !== undefined))];
  legend.replaceChildren(
    ...apps.map((app) => h('li', {}, h('span', { class: 'swatch', style: `background:${appColour(app).fill}` }), appLabel(app, context.appsById))),
    h('li', {}, h('span', { class: 'swatch', style: 'background:#ffffff;border-style:dashed' }), 'free'),
    h('li', {}, h('span', { class: 'swatch', style: 'background:repeating-linear-gradient(45deg,#fff 0 3px,#a4161a 3px 5px)' }), 'drained (out of service)'));
}
