// Charts, all drawn by uPlot (vendor/uPlot.iife.min.js, the global `uPlot`). Each chart sets
// data-points on its container to the number of values drawn, and keeps its width in step
// with the container's.

const AXIS = { stroke: '#1a1a1a', grid: { stroke: '#d9d9d9' }, ticks: { stroke: '#bdbdbd' } };
const SHARING_LINE = { label: 'ρ = 1 (sharing incentive)', stroke: '#1a1a1a', dash: [6, 4], width: 1.5, points: { show: false } };

/**
 * Draws a chart into `container`, or, when the chart there has the same `shape` (its series),
 * gives it the new data in place: a zoom (until a double click resets it), the hover and the
 * page's scroll survive the update. `build(width)` makes a new chart.
 */
function mount(container, shape, build, data, points) {
  container.dataset.points = String(points);
  container.dataset.updates = String(Number(container.dataset.updates ?? 0) + 1);
  if (container.__chart && container.__shape === shape) {
    container.__chart.setData(data, !container.__zoomed);
    return;
  }
  container.__chart?.destroy();
  container.__resize?.disconnect();
  container.replaceChildren();
  container.__zoomed = false;
  const chart = build(Math.max(container.clientWidth, 280));
  chart.hooks.setSelect = [...(chart.hooks.setSelect ?? []), (u) => { if (u.select.width > 0) container.__zoomed = true; }];
  container.ondblclick = () => { container.__zoomed = false; };
  container.__chart = chart;
  container.__shape = shape;
  const observer = new ResizeObserver(() => {
    const next = Math.max(container.clientWidth, 280);
    if (Math.abs(next - chart.width) > 2) chart.setSize({ width: next, height: chart.height });
  });
  observer.observe(container);
  container.__resize = observer;
}

/** The top of a rho axis: room above the largest finite rho, and never below 1.2. */
function rhoTop(values) {
  return Math.max(1.2, ...values.filter((value) => value != null).map((value) => value * 1.15));
}

/**
 * A time axis's range: uPlot's (the data's, or the zoom's), or the ten minutes up to the last
 * round for a history of no round, one round, or rounds within a minute, which uPlot would
 * otherwise spread over years.
 */
function timeRange(u, min, max) {
  const xs = u.data[0];
  if (xs.length > 1 && xs[xs.length - 1] - xs[0] >= 60) return [min, max];
  const end = xs.length ? xs[xs.length - 1] : Date.now() / 1000;
  return [end - 600, end + 60];
}

/**
 * rho at the start of each round over time, with the line rho = 1; rounds where the app was
 * starving (rho unbounded) are marked on the top edge of the axis.
 */
export function rhoChart(container, history) {
  const xs = history.map((point) => Date.parse(point.at) / 1000);
  const rhos = history.map((point) => point.rho);
  const top = rhoTop(rhos);
  const data = [xs, rhos, rhos.map((value) => (value == null ? top : null)), xs.map(() => 1)];
  mount(container, 'rho', (width) => new uPlot({
    width,
    height: 240,
    scales: { x: { range: timeRange },
      y: { range: (u) => [0, rhoTop(u.data[1])] } },
    axes: [{ ...AXIS }, { ...AXIS, label: 'ρ at round start' }],
    series: [
      { label: 'time' },
      { label: 'ρ at round start', stroke: '#0072B2', width: 2, spanGaps: false, points: { show: true, size: 5, fill: '#0072B2' } },
      { label: 'ρ ∞ (starving)', stroke: '#D55E00', width: 0, paths: () => null, points: { show: true, size: 9, fill: '#D55E00' } },
      SHARING_LINE,
    ],
  }, data, container), data, history.length);
}

/**
 * The cluster over time: the largest finite rho (left axis, with the line rho = 1) and Jain's
 * index over the finite rhos (right axis, 0 to 1), one point per round of the history.
 */
export function fairnessHistoryChart(container, points) {
  const xs = points.map((point) => Date.parse(point.at) / 1000);
  const data = [xs, points.map((point) => point.max_rho), points.map((point) => point.jains_index), xs.map(() => 1)];
  mount(container, 'fairness-history', (width) => new uPlot({
    width,
    height: 260,
    scales: { y: { range: (u) => [0, rhoTop(u.data[1])] }, jain: { range: [0, 1] } },
    axes: [{ ...AXIS }, { ...AXIS, label: 'max finite ρ' },
      { ...AXIS, scale: 'jain', side: 1, grid: { show: false }, label: 'Jain’s index' }],
    series: [
      { label: 'time' },
      { label: 'max finite ρ', stroke: '#D55E00', width: 2, spanGaps: false, points: { show: false } },
      { label: 'Jain’s index', scale: 'jain', stroke: '#0072B2', width: 2, spanGaps: false, points: { show: false } },
      SHARING_LINE,
    ],
  }, data, container), data, points.length);
}

/**
 * One bar per app, worst first, with the line rho = 1. A starving app (rho unbounded, `null`)
 * gets a bar to the top of the axis in its own colour, marked ∞: it is the worst off, not
 * missing. Sets data-starving on the container to the number of such bars.
 */
export function rhoBars(container, apps, label, axisLabel) {
  const xs = apps.map((_, index) => index);
  const finite = apps.map((app) => app.rho);
  const top = rhoTop(finite);
  const starving = apps.map((app) => (app.rho == null ? top : null));
  const data = [xs, finite, starving, xs.map(() => 1)];
  const bars = uPlot.paths.bars({ size: [0.6, 80] });
  // The axis reads the labels of the latest data.
  container.__labels = apps.map(label);
  mount(container, 'bars', (width) => new uPlot({
    width,
    height: 260,
    scales: { x: { time: false, range: (u) => [-0.5, Math.max(u.data[0].length - 0.5, 0.5)] }, y: { range: (u) => [0, rhoTop(u.data[1])] } },
    axes: [
      { ...AXIS, splits: (u) => u.data[0], values: (u, splits) => splits.map((index) => container.__labels[index] ?? '') },
      { ...AXIS, label: axisLabel },
    ],
    series: [
      { label: 'app' },
      { label: 'ρ', fill: '#56B4E9', stroke: '#0072B2', paths: bars, points: { show: false } },
      { label: 'ρ ∞ (starving)', fill: '#D55E00', stroke: '#a4161a', paths: bars, points: { show: false } },
      SHARING_LINE,
    ],
    hooks: { draw: [(u) => markInfinite(u, u.data[2])] },
  }, data, container), data, finite.filter((value) => value != null).length + starving.filter((value) => value != null).length);
  container.dataset.starving = String(starving.filter((value) => value != null).length);
}

/** Writes ∞ above each starving app's bar. */
function markInfinite(u, starving) {
  const { ctx } = u;
  ctx.save();
  ctx.fillStyle = '#1a1a1a';
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  ctx.font = `bold ${Math.round(16 * devicePixelRatio)}px system-ui, sans-serif`;
  starving.forEach((value, index) => {
    if (value == null) return;
    ctx.fillText('∞', u.valToPos(index, 'x', true), u.bbox.top + 4 * devicePixelRatio);
  });
  ctx.restore();
}

/**
 * A Gantt chart of leases over GPUs: one row per GPU, one bar per lease on each of its GPUs,
 * coloured by the holding app. The bars are drawn over the chart by a hook from the latest
 * leases, so the chart itself (its zoom, its hover) stays while leases come and go.
 */
export function leaseGantt(container, leases, gpuIds, colourOf, requested) {
  // Start where the first lease does when that is later, so a young market is not a sliver.
  const firstStart = leases.length ? Math.min(...leases.map((lease) => Date.parse(lease.start_at))) : requested.from;
  const window = { from: Math.max(requested.from, Math.min(firstStart, requested.to) - 1000), to: requested.to };
  const row = new Map(gpuIds.map((id, index) => [id, index]));
  const bars = [];
  for (const lease of leases) {
    const start = Math.max(Date.parse(lease.start_at), window.from) / 1000;
    const end = Math.min(Date.parse(lease.end_at), window.to) / 1000;
    if (end <= start) continue;
    const { fill } = colourOf(lease.app_id);
    for (const gpu of lease.gpus) if (row.has(gpu)) bars.push({ row: row.get(gpu), start, end, fill });
  }
  const thickness = Math.max(6, Math.min(14, 220 / Math.max(gpuIds.length, 1)));
  container.__gantt = { bars, window };
  const data = [[window.from / 1000, window.to / 1000], [null, null]];
  mount(container, `gantt ${gpuIds.join(' ')}`, (width) => new uPlot({
    width,
    height: Math.max(140, gpuIds.length * Math.max(thickness + 4, 16) + 60),
    legend: { show: false },
    cursor: { y: false },
    scales: { x: { range: () => [container.__gantt.window.from / 1000, container.__gantt.window.to / 1000] },
      y: { range: [-0.75, gpuIds.length - 0.25] } },
    axes: [
      { ...AXIS },
      { ...AXIS, size: 90, splits: () => gpuIds.map((_, index) => index), values: (u, splits) => splits.map((index) => gpuIds[index] ?? '') },
    ],
    series: [{ label: 'time' }, { label: 'leases', paths: () => null, points: { show: false } }],
    hooks: { draw: [(u) => drawBars(u, container.__gantt.bars, thickness)] },
  }, data, container), data, bars.length);
}

/** Draws each lease bar inside the plot area. */
function drawBars(u, bars, thickness) {
  const { ctx } = u;
  const height = thickness * devicePixelRatio;
  ctx.save();
  ctx.beginPath();
  ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
  ctx.clip();
  for (const bar of bars) {
    const left = u.valToPos(bar.start, 'x', true);
    const right = u.valToPos(bar.end, 'x', true);
    ctx.fillStyle = bar.fill;
    ctx.fillRect(left, u.valToPos(bar.row, 'y', true) - height / 2, Math.max(right - left, 1), height);
  }
  ctx.restore();
}
