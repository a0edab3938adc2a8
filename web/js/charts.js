// Charts, all drawn by uPlot (vendor/uPlot.iife.min.js, the global `uPlot`). Each chart sets
// data-points on its container to the number of values drawn, and keeps its width in step
// with the container's.

const AXIS = { stroke: '#1a1a1a', grid: { stroke: '#d9d9d9' }, ticks: { stroke: '#bdbdbd' } };
const SHARING_LINE = { label: 'ρ = 1 (sharing incentive)', stroke: '#1a1a1a', dash: [6, 4], width: 1.5, points: { show: false } };

/** Draws `build(width)` into `container`, replacing what was there, and resizes with it. */
function mount(container, build, points) {
  container.__chart?.destroy();
  container.__resize?.disconnect();
  container.replaceChildren();
  const width = Math.max(container.clientWidth, 280);
  const chart = build(width);
  container.__chart = chart;
  container.dataset.points = String(points);
  const observer = new ResizeObserver(() => {
    const next = Math.max(container.clientWidth, 280);
    if (Math.abs(next - chart.width) > 2) chart.setSize({ width: next, height: chart.height });
  });
  observer.observe(container);
  container.__resize = observer;
}

/**
 * rho at the start of each round over time, with the line rho = 1; rounds where the app was
 * starving (rho unbounded) are marked on the top edge of the axis.
 */
export function rhoChart(container, history) {
  const xs = history.map((point) => Date.parse(point.at) / 1000);
  const rhos = history.map((point) => point.rho);
  const finite = rhos.filter((value) => value != null);
  const top = Math.max(1.2, ...finite.map((value) => value * 1.15));
  const starving = rhos.map((value) => (value == null ? top : null));
  const data = [xs, rhos, starving, xs.map(() => 1)];
  mount(container, (width) => new uPlot({
    width,
    height: 240,
    scales: { y: { range: [0, top] } },
    axes: [{ ...AXIS }, { ...AXIS, label: 'ρ at round start' }],
    series: [
      { label: 'time' },
      { label: 'ρ at round start', stroke: '#0072B2', width: 2, spanGaps: false, points: { show: true, size: 5, fill: '#0072B2' } },
      { label: 'ρ ∞ (starving)', stroke: '#D55E00', width: 0, paths: () => null, points: { show: true, size: 9, fill: '#D55E00' } },
      SHARING_LINE,
    ],
  }, data, container), history.length);
}

/**
 * One bar per app, worst first, with the line rho = 1. A starving app (rho unbounded, `null`)
 * gets a bar to the top of the axis in its own colour, marked ∞: it is the worst off, not
 * missing. Sets data-starving on the container to the number of such bars.
 */
export function rhoBars(container, apps, label, axisLabel) {
  const xs = apps.map((_, index) => index);
  const finite = apps.map((app) => app.rho);
  const top = Math.max(1.2, ...finite.filter((value) => value != null).map((value) => value * 1.15));
  const starving = apps.map((app) => (app.rho == null ? top : null));
  const data = [xs, finite, starving, xs.map(() => 1)];
  const bars = uPlot.paths.bars({ size: [0.6, 80] });
  mount(container, (width) => new uPlot({
    width,
    height: 260,
    scales: { x: { time: false, range: [-0.5, Math.max(apps.length - 0.5, 0.5)] }, y: { range: [0, top] } },
    axes: [
      { ...AXIS, splits: () => xs, values: (u, splits) => splits.map((index) => (apps[index] ? label(apps[index]) : '')) },
      { ...AXIS, label: axisLabel },
    ],
    series: [
      { label: 'app' },
      { label: 'ρ', fill: '#56B4E9', stroke: '#0072B2', paths: bars, points: { show: false } },
      { label: 'ρ ∞ (starving)', fill: '#D55E00', stroke: '#a4161a', paths: bars, points: { show: false } },
      SHARING_LINE,
    ],
    hooks: { draw: [(u) => markInfinite(u, starving)] },
  }, data, container), finite.filter((value) => value != null).length + starving.filter((value) => value != null).length);
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
 * A Gantt chart of leases over GPUs: one row per GPU, one thick segment per lease, coloured by
 * the holding app. A GPU holds one lease at a time (the database enforces it), so one series
 * per (app, GPU) draws every lease without overlaps.
 */
export function leaseGantt(container, leases, gpuIds, colourOf, requested) {
  // Start where the first lease does when that is later, so a young market is not a sliver.
  const firstStart = leases.length ? Math.min(...leases.map((lease) => Date.parse(lease.start_at))) : requested.from;
  const window = { from: Math.max(requested.from, Math.min(firstStart, requested.to) - 1000), to: requested.to };
  const row = new Map(gpuIds.map((id, index) => [id, index]));
  const spans = new Map(); // "app|gpu" -> [[start, end], ...]
  for (const lease of leases) {
    const start = Math.max(Date.parse(lease.start_at), window.from) / 1000;
    const end = Math.min(Date.parse(lease.end_at), window.to) / 1000;
    if (end <= start) continue;
    for (const gpu of lease.gpus) {
      if (!row.has(gpu)) continue;
      const key = `${lease.app_id ?? 'other'}|${gpu}`;
      if (!spans.has(key)) spans.set(key, { app: lease.app_id, gpu, intervals: [] });
      spans.get(key).intervals.push([start, end]);
    }
  }
  // Every start and end, and a point just after each end where the segment breaks.
  const xs = new Set([window.from / 1000, window.to / 1000]);
  for (const { intervals } of spans.values()) {
    for (const [start, end] of intervals) xs.add(start).add(end).add(end + 0.001);
  }
  const x = [...xs].sort((a, b) => a - b);
  const series = [{ label: 'time' }];
  const data = [x];
  const thickness = Math.max(6, Math.min(14, 220 / Math.max(gpuIds.length, 1)));
  for (const { app, gpu, intervals } of spans.values()) {
    const level = row.get(gpu);
    data.push(x.map((t) => (intervals.some(([start, end]) => start <= t && t <= end) ? level : null)));
    series.push({ label: `${app ?? 'other'} on ${gpu}`, stroke: colourOf(app).fill, width: thickness,
      spanGaps: false, points: { show: false } });
  }
  const rowHeight = Math.max(thickness + 4, 16);
  mount(container, (width) => new uPlot({
    width,
    height: Math.max(140, gpuIds.length * rowHeight + 60),
    legend: { show: false },
    cursor: { y: false },
    scales: { x: { range: [window.from / 1000, window.to / 1000] }, y: { range: [-0.75, gpuIds.length - 0.25] } },
    axes: [
      { ...AXIS },
      { ...AXIS, size: 90, splits: () => gpuIds.map((_, index) => index), values: (u, splits) => splits.map((index) => gpuIds[index] ?? '') },
    ],
    series,
  }, data, container), spans.size);
}
