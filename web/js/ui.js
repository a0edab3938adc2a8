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

/** A place in a round's standings, 1-based for people (the API counts from 0, the worst). */
export function place(position) {
  return position + 1;
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

/**
 * The colour of an app: stable for its id, and distinct for any number of apps (hues step by
 * the golden angle, so no two ids share one, and lightness cycles through three levels so
 * neighbouring hues differ in brightness too); grey for another tenant's app (id unknown).
 * `ink` is the text colour that reads on it, black or white, whichever has the higher contrast
 * (at least 4.5:1 for every fill). Colour is never the only signal: holders are also named.
 */
export function appColour(appId) {
  if (appId == null) return OTHER_TENANT;
  const hue = (appId * 137.508) % 360;
  const lightness = [0.42, 0.58, 0.72][appId % 3];
  const rgb = hslToRgb(hue, 0.7, lightness);
  const fill = `#${rgb.map((channel) => Math.round(channel * 255).toString(16).padStart(2, '0')).join('')}`;
  const luminance = relativeLuminance(rgb);
  const ink = (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) ? '#000000' : '#ffffff';
  return { fill, ink };
}
export const OTHER_TENANT = { fill: '#8a8a8a', ink: '#000000' };

/** HSL (hue in degrees, saturation and lightness 0..1) as [r, g, b] in 0..1. */
function hslToRgb(hue, saturation, lightness) {
  const chroma = (1 - Math.abs(2 * lightness - 1)) * saturation;
  const channel = (n) => {
    const k = (n + hue / 30) % 12;
    return lightness - chroma / 2 * Math.max(-1, Math.min(k - 3, 9 - k, 1));
  };
  return [channel(0), channel(8), channel(4)];
}

/** WCAG relative luminance of an sRGB colour given as [r, g, b] in 0..1. */
function relativeLuminance(rgb) {
  const [r, g, b] = rgb.map((c) => (c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}

/** The app's name as the caller may know it. */
export function appLabel(appId, appsById) {
  if (appId == null) return 'another tenant';
  const app = appsById.get(appId);
  return app ? `${app.name} (#${appId})` : `app #${appId}`;
}
