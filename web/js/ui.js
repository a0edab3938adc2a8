// Small DOM helpers, number and time formats, and the colours apps are drawn in.

/** h('td', {class: 'num'}, '1.20') builds an element; null/false children are skipped. */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value == null || value === false) continue;
    if (name.startsWith('on')) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

/** Replaces the children of the element with id `id`. */
export function fill(id, ...children) {
  const element = document.getElementById(id);
  element.replaceChildren(...children.flat().filter((child) => child != null && child !== false));
  return element;
}

/** rho as text; `null` means starving (no GPU held, finish time unbounded). */
export function rho(value) {
  return value == null ? '∞ (starving)' : value.toFixed(3);
}

export function time(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : '–';
}

export function gpuList(gpus) {
  return gpus && gpus.length ? gpus.join(', ') : '–';
}

/** A labelled figure; `tone` 'good' or 'bad' colours the value. */
export function stat(label, value, tone) {
  return h('div', { class: 'stat' }, h('span', { class: 'label' }, label), h('span', { class: `value ${tone ?? ''}` }, value));
}

/** A table with a caption, column headers and rows of cells. */
export function table(caption, columns, rows, attributes = {}) {
  return h('table', attributes,
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, columns.map((column) => h('th', { scope: 'col' }, column)))),
    h('tbody', {}, rows));
}

// Okabe–Ito: distinguishable with every common colour-vision deficiency. `ink` is the text
// colour that reads on it (contrast at least 4.5:1).
const PALETTE = [
  { fill: '#0072B2', ink: '#ffffff' },
  { fill: '#E69F00', ink: '#000000' },
  { fill: '#009E73', ink: '#000000' },
  { fill: '#CC79A7', ink: '#000000' },
  { fill: '#56B4E9', ink: '#000000' },
  { fill: '#D55E00', ink: '#000000' },
  { fill: '#F0E442', ink: '#000000' },
];
export const OTHER_TENANT = { fill: '#8a8a8a', ink: '#000000' };

/** The colour of an app: stable for its id; grey for another tenant's (id unknown). */
export function appColour(appId) {
  return appId == null ? OTHER_TENANT : PALETTE[appId % PALETTE.length];
}

/** The app's name as the caller may know it. */
export function appLabel(appId, appsById) {
  if (appId == null) return 'another tenant';
  const app = appsById.get(appId);
  return app ? `${app.name} (#${appId})` : `app #${appId}`;
}
