// Sign-in, routing (#/apps/12, #/rounds/40, #/cluster, #/fairness, #/history/12), and the live rounds
// stream that keeps the open view current.

import { ApiError, follow, get, session } from './api.js';
import { showApps } from './apps.js';
import { showCluster } from './cluster.js';
import { showFairness } from './fairness.js';
import { showHistory } from './history.js';
import { showRounds } from './rounds.js';

const VIEWS = { apps: showApps, rounds: showRounds, cluster: showCluster, fairness: showFairness, history: showHistory };
/** Views other than the rounds list re-read the API at most this often while rounds run. */
const REFRESH_MS = 2000;

let context = null; // { me, admin, appsById }
let view = null; // what the open view's show() returned: { update(round) }
let stopStream = null;
let navigations = 0; // counts route() calls, so that only the latest one's view goes live
// Rounds streamed while a view loads: its data may predate them, so it gets them once shown.
let missed = [];
const MISSED_LIMIT = 200;

/** The caller and the apps it may see, re-read so new and finished apps show up. */
async function loadContext() {
  const me = await get('/v1/me');
  const fresh = { me, admin: me.role === 'admin', appsById: new Map(me.apps.map((app) => [app.id, app])) };
  context = Object.assign(context ?? { reload: loadContext }, fresh);
  return context;
}

async function start() {
  document.getElementById('sign-in').addEventListener('submit', onSignIn);
  document.getElementById('sign-out').addEventListener('click', signOut);
  window.addEventListener('hashchange', () => route(true));
  if (!session.token) return showSignIn();
  try {
    await loadContext();
    await enter();
  } catch (error) {
    showSignIn(error instanceof ApiError && error.status === 401 ? 'That token is no longer valid.' : error.message);
  }
}

async function onSignIn(event) {
  event.preventDefault();
  const input = document.getElementById('token');
  session.token = input.value.trim();
  try {
    await loadContext();
    input.value = '';
    await enter();
  } catch (error) {
    session.token = null;
    document.getElementById('sign-in-error').textContent = error instanceof ApiError && error.status === 401
      ? 'The server does not know this token. Copy it from the demo log or ask your operator.'
      : `Cannot sign in: ${error.message}`;
  }
}

function showSignIn(message = '') {
  stopStream?.();
  stopStream = null;
  document.getElementById('sign-in-view').hidden = false;
  document.getElementById('view').hidden = true;
  document.getElementById('nav').hidden = true;
  document.getElementById('session').hidden = true;
  document.getElementById('sign-in-error').textContent = message;
  document.getElementById('token').focus();
}

function signOut() {
  session.token = null;
  context = null;
  view = null;
  document.getElementById('view').replaceChildren();
  showSignIn();
}

async function enter() {
  document.getElementById('sign-in-view').hidden = true;
  document.getElementById('view').hidden = false;
  document.getElementById('nav').hidden = false;
  document.getElementById('session').hidden = false;
  const { me } = context;
  document.getElementById('who').textContent = me.role === 'admin' ? 'Admin (sees everything)' : `Tenant ${me.tenant}`;
  await route(false);
  // The stream sends rounds once decided: resume before the oldest one still open.
  const recent = await get('/v1/rounds?limit=20');
  const open = recent.filter((round) => round.status === 'open').map((round) => round.round_id);
  const after = open.length ? Math.min(...open) - 1 : recent[0]?.round_id ?? 0;
  stopStream = follow('/v1/rounds/events', after, onRound, setLive);
}

function setLive(state) {
  const live = document.getElementById('live');
  live.dataset.state = state;
  live.textContent = state === 'live' ? 'live' : 'reconnecting…';
}

let refreshTimer = null;
function onRound(type, round) {
  if (type !== 'round') return;
  if (!view) {
    missed.push(round);
    if (missed.length > MISSED_LIMIT) missed.shift();
    return;
  }
  if (view.live) return view.update(round);
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => {
    refreshTimer = null;
    // A failed refresh (say, the server restarting) is retried with the next round.
    view?.update(round).catch((error) => console.warn('refresh failed:', error.message));
  }, REFRESH_MS);
}

/** Shows the view the location names; `moveFocus` after a navigation, for keyboard users. */
async function route(moveFocus) {
  if (!context) return;
  const [name, param] = location.hash.replace(/^#\/?/, '').split('/');
  const show = VIEWS[name] ?? VIEWS.apps;
  const current = VIEWS[name] ? name : 'apps';
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.dataset.view === current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  // Each navigation renders into its own element. A view still loading when the next
  // navigation begins renders into a detached element and never becomes the live view.
  const navigation = ++navigations;
  const container = document.createElement('div');
  document.getElementById('view').replaceChildren(container);
  view = null;
  missed = []; // the new view's data covers every round decided before it loads
  let shown = null;
  try {
    shown = await show(container, context, param ? Number(param) : null);
  } catch (error) {
    if (navigation !== navigations) return;
    if (error instanceof ApiError && error.status === 401) return signOut();
    container.replaceChildren(Object.assign(document.createElement('p'), { className: 'error', textContent: error.message }));
  }
  if (navigation !== navigations) return;
  view = shown;
  const streamed = missed;
  missed = [];
  if (view) for (const round of streamed) onRound('round', round);
  if (moveFocus) container.querySelector('h2')?.focus();
}

start();
