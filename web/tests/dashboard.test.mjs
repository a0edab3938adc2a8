// The dashboard in headless Chromium against a live `agora serve --demo` on a random port,
// with a fresh database that the tests create and drop. Screenshots go to web/test-artifacts/.
//
// AGORA_BIN (default target/debug/agora), AGORA_TEST_POSTGRES (default
// postgres://postgres@127.0.0.1:5432) and CHROMIUM (default /usr/bin/chromium) override;
// AGORA_DOCS_SCREENSHOTS=1 also writes the screenshots docs/dashboard.md shows.

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const ARTIFACTS = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
const DOCS = process.env.AGORA_DOCS_SCREENSHOTS ? fileURLToPath(new URL('../../docs/dashboard/', import.meta.url)) : null;
const BINARY = process.env.AGORA_BIN ?? `${ROOT}target/debug/agora`;
const POSTGRES = process.env.AGORA_TEST_POSTGRES ?? 'postgres://postgres@127.0.0.1:5432';
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const DATABASE = `agora_web_test_${process.pid}`;
const AXE = createRequire(import.meta.url).resolve('axe-core/axe.min.js');

function psql(sql) {
  execFileSync('psql', [`${POSTGRES}/postgres`, '-v', 'ON_ERROR_STOP=1', '-qc', sql], { stdio: 'pipe' });
}

/** A running `agora serve --demo`, with what its log told: address and tokens. */
class Server {
  constructor(listen) {
    this.log = '';
    this.process = spawn(BINARY, ['serve', '--demo'], {
      cwd: ROOT,
      // Short leases: GPUs come free, and rounds run, every few seconds.
      env: { ...process.env, DATABASE_URL: `${POSTGRES}/${DATABASE}`, AGORA_LISTEN: listen, AGORA_LEASE_SECONDS: '5',
        NO_COLOR: '1', RUST_LOG: 'info,sqlx=warn,actix_server=warn,agora::http=warn' },
      stdio: ['ignore', 'inherit', 'pipe'],
    });
    this.exited = new Promise((resolve) => this.process.on('exit', resolve));
    this.process.stderr.setEncoding('utf8');
    // eslint-disable-next-line no-control-regex
    this.process.stderr.on('data', (text) => { this.log += text.replace(/\x1b\[[0-9;]*m/g, ''); });
  }

  /** The first match of `pattern` in the log, looked for as each line arrives, up to `ms`. */
  logged(pattern, ms = 60_000) {
    return new Promise((resolve, reject) => {
      const stop = () => {
        clearTimeout(timer);
        this.process.stderr.off('data', check);
        this.process.off('exit', fail);
      };
      const fail = () => {
        stop();
        reject(new Error(`agora serve never logged ${pattern}; its log:\n${this.log}`));
      };
      // The constructor's listener, registered first, has appended the new text already.
      const check = () => {
        const match = this.log.match(pattern);
        if (match) {
          stop();
          resolve(match);
        }
      };
      const timer = setTimeout(fail, ms);
      this.process.stderr.on('data', check);
      this.process.on('exit', fail);
      if (this.process.exitCode != null) fail();
      else check();
    });
  }

  async stop() {
    if (this.process.exitCode == null) this.process.kill('SIGTERM');
    await this.exited;
  }
}

let server;
let browser;
let base;
let port;
const tokens = {};
const appsOf = {}; // tenant -> [{id, name}]

async function api(path, token) {
  const response = await fetch(`${base}${path}`, { headers: { Authorization: `Bearer ${token}` } });
  assert.equal(response.status, 200, `${path}: ${await response.clone().text()}`);
  return response.json();
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  if (DOCS) mkdirSync(DOCS, { recursive: true });
  psql(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`);
  psql(`CREATE DATABASE ${DATABASE}`);
  server = new Server('127.0.0.1:0');
  [, base] = await server.logged(/dashboard=(http:\/\/\S+?)\/?\s/);
  port = new URL(base).port;
  [, tokens.admin] = await server.logged(/admin_token=(\S+)/);
  for (const tenant of ['demo-vision', 'demo-speech']) {
    [, tokens[tenant]] = await server.logged(new RegExp(`tenant="?${tenant}"? token=(\\S+)`));
    appsOf[tenant] = (await api('/v1/me', tokens[tenant])).apps;
  }
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});

after(async () => {
  await browser?.close();
  await server?.stop();
  psql(`DROP DATABASE IF EXISTS ${DATABASE} WITH (FORCE)`);
});

/** A fresh page signed in with `token`, recording console errors and the API's answers. */
async function signedIn(token, viewport = { width: 1366, height: 900 }, options = {}) {
  const page = await browser.newPage({ viewport, ...options });
  page.errors = [];
  page.answers = [];
  page.on('console', (message) => { if (message.type() === 'error') page.errors.push(message.text()); });
  page.on('pageerror', (error) => page.errors.push(String(error)));
  page.on('response', (response) => {
    if (response.url().includes('/v1/') && !response.url().includes('/events')) {
      page.answers.push(response.json().then((body) => ({ url: response.url(), body }), () => null));
    }
  });
  await page.goto(base);
  await page.getByLabel('API token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#app-list a').first().waitFor();
  return page;
}

/**
 * Saves a screenshot in web/test-artifacts/; with `docs`, and AGORA_DOCS_SCREENSHOTS set, also
 * the visible part in docs/dashboard/, where docs/dashboard.md shows it.
 */
async function shot(page, name, { docs = false } = {}) {
  await page.screenshot({ path: `${ARTIFACTS}${name}.png`, fullPage: true });
  if (docs && DOCS) await page.screenshot({ path: `${DOCS}${name}.png` });
}

/**
 * The id of the first round the server's rounds stream sends after round `after`. The demo sets
 * the pace of rounds, so a test waits for the server to send the next one, then expects the
 * page, which follows the same stream, to show it.
 */
async function nextStreamedRound(token, after, ms = 120_000) {
  const stream = new AbortController();
  const timer = setTimeout(() => stream.abort(new Error(`no round in ${ms / 1000} s`)), ms);
  try {
    const response = await fetch(`${base}/v1/rounds/events?after=${after}`, {
      headers: { Authorization: `Bearer ${token}` }, signal: stream.signal,
    });
    assert.equal(response.status, 200);
    let text = '';
    for await (const chunk of response.body.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      const id = text.match(/^id: (\d+)$/m);
      if (id) return Number(id[1]);
    }
    throw new Error('the stream ended');
  } catch (error) {
    throw new Error(`no round after ${after} was streamed (${error.message}); server log:\n${server.log.slice(-3000)}`);
  } finally {
    clearTimeout(timer);
    stream.abort();
  }
}

const roundIds = (page) => page.$$eval('#round-list a[data-round]', (links) => links.map((link) => Number(link.dataset.round)));

test('the page loads, a tenant signs in and sees its apps, with no console errors', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const listed = await page.$$eval('#app-list a', (links) => links.map((link) => Number(link.dataset.app)));
  // Apps keep arriving in the living demo: every app listed is demo-vision's, none is missing.
  const visions = new Set((await api('/v1/me', tokens['demo-vision'])).apps.map((app) => app.id));
  assert.ok(listed.every((id) => visions.has(id)), `${listed} are not all demo-vision's`);
  assert.ok(appsOf['demo-vision'].every((app) => listed.includes(app.id)), 'every app of demo-vision is listed');
  await page.locator('#live[data-state="live"]').waitFor();
  await page.waitForFunction(() => Number(document.querySelector('#rho-chart')?.dataset.points) > 0, null, { timeout: 30_000 });
  assert.ok(await page.locator('#rho-chart canvas').count(), 'uPlot drew the rho chart');
  await page.locator('#why').waitFor();
  await shot(page, 'apps-tenant', { docs: true });
  for (const view of ['rounds', 'cluster', 'fairness']) {
    await page.getByRole('link', { name: new RegExp(`^${view}$`, 'i') }).click();
    await page.locator(`#view h2`).filter({ hasText: new RegExp(view, 'i') }).waitFor();
  }
  await page.locator('#fairness-stats .stat').first().waitFor();
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a new round appears in the live list as soon as the server streams it', async () => {
  const page = await signedIn(tokens['demo-speech']);
  await page.goto(`${base}/#/rounds`);
  await page.locator('#round-list a').first().waitFor();
  const round = await nextStreamedRound(tokens['demo-speech'], Math.max(...await roundIds(page)));
  await page.locator(`#round-list a[data-round="${round}"]`).waitFor();
  await shot(page, 'rounds-live', { docs: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('the fairness view and the cluster view chart their data', async () => {
  const page = await signedIn(tokens.admin, { width: 2560, height: 1440 });
  await page.goto(`${base}/#/fairness`);
  await page.waitForFunction(() => Number(document.querySelector('#rho-distribution')?.dataset.points) > 0, null, { timeout: 30_000 });
  const jain = await page.locator('#fairness-stats .stat', { hasText: 'Jain' }).locator('.value').textContent();
  assert.match(jain, /^(0|1)\.\d{3}$/);
  await shot(page, 'fairness-admin');
  await page.goto(`${base}/#/cluster`);
  await page.waitForFunction(() => Number(document.querySelector('#cluster-gantt')?.dataset.points) > 0, null, { timeout: 30_000 });
  assert.ok(await page.locator('#racks .gpu').count() > 0);
  await shot(page, 'cluster-admin-large-monitor', { docs: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('opening a round shows its bids, the own bid table in full', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const mine = new Set(appsOf['demo-vision'].map((app) => app.id));
  await page.goto(`${base}/#/rounds`);
  await page.locator('#round-list a').first().waitFor();
  let round = null;
  for (const id of await roundIds(page)) {
    const detail = await api(`/v1/rounds/${id}`, tokens['demo-vision']);
    if (detail.bids.some((bid) => mine.has(bid.app_id))) { round = detail; break; }
  }
  assert.ok(round, 'a listed round where one of demo-vision\'s apps bid');
  await page.locator(`#round-list a[data-round="${round.round_id}"]`).click();
  await page.locator('#round-bids').waitFor();
  const own = round.bids.find((bid) => mine.has(bid.app_id));
  const rows = page.locator(`#round-bids section[data-app="${own.app_id}"] tr[data-entry]`);
  assert.equal(await rows.count(), own.entries.length);
  assert.ok(own.entries.length > 0);
  await shot(page, 'round-detail-tenant', { docs: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('tenant A never sees tenant B\'s apps or bid details', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const mine = new Set(appsOf['demo-vision'].map((app) => app.id));
  const theirs = appsOf['demo-speech'];
  // Rounds where demo-speech bid, as the admin sees them, opened on demo-vision's page.
  const rounds = await api('/v1/rounds?limit=30', tokens.admin);
  const foreign = [];
  for (const { round_id: id } of rounds) {
    const detail = await api(`/v1/rounds/${id}`, tokens.admin);
    if (detail.bids.some((bid) => theirs.some((app) => app.id === bid.app_id))) foreign.push(id);
    if (foreign.length === 3) break;
  }
  assert.ok(foreign.length > 0, 'demo-speech bid in some round');
  for (const id of foreign) {
    await page.goto(`${base}/#/rounds/${id}`);
    await page.locator('#round-bids').waitFor();
    const sections = await page.$$eval('#round-bids section', (nodes) => nodes.map((node) => ({
      app: node.dataset.app, entries: node.querySelectorAll('tr[data-entry]').length })));
    for (const section of sections) {
      if (section.app === 'other') assert.equal(section.entries, 0, `round ${id}: another tenant's bundles shown`);
      else assert.ok(mine.has(Number(section.app)), `round ${id}: app ${section.app} is not demo-vision's`);
    }
    assert.ok(sections.some((section) => section.app === 'other'), `round ${id} shows demo-speech's bid anonymised`);
    await assertNoTrace(page, theirs);
  }
  await shot(page, 'round-detail-anonymised');
  for (const [view, loaded] of [['apps', '#why'], ['cluster', '#racks .gpu'], ['fairness', '#fairness-stats .stat']]) {
    await page.goto(`${base}/#/${view}`);
    await page.locator(loaded).first().waitFor();
    await assertNoTrace(page, theirs);
  }
  const holders = await page.$$eval('#racks .gpu', (tiles) => tiles.map((tile) => tile.dataset.holder));
  for (const holder of holders) assert.ok(['free', 'other'].includes(holder) || mine.has(Number(holder)), holder);
  // Nor did the API tell the page: every answer it got names only demo-vision's apps.
  for (const answer of (await Promise.all(page.answers)).filter(Boolean)) {
    const text = JSON.stringify(answer.body);
    for (const app of theirs) {
      assert.ok(!text.includes(`"app_id":${app.id},`) && !text.includes(`"app_id":${app.id}}`), `${answer.url} names app ${app.id}`);
    }
  }
  assert.deepEqual(page.errors, []);
  await page.close();
});

async function assertNoTrace(page, apps) {
  const text = await page.locator('body').innerText();
  for (const app of apps) assert.ok(!text.includes(app.name), `demo-speech's app ${app.name} is named on demo-vision's page`);
}

test('the page survives a server restart and goes on with live rounds', async () => {
  const page = await signedIn(tokens['demo-vision']);
  await page.goto(`${base}/#/rounds`);
  // The indicator is live from sign-in on; the list must have loaded before the server goes.
  await page.locator('#round-list a').first().waitFor();
  await page.locator('#live[data-state="live"]').waitFor();
  await server.stop();
  await page.locator('#live[data-state="reconnecting"]').waitFor();
  server = new Server(`127.0.0.1:${port}`);
  await server.logged(/agora arbiter listening/);
  await page.locator('#live[data-state="live"]').waitFor({ timeout: 30_000 });
  const round = await nextStreamedRound(tokens['demo-vision'], Math.max(...await roundIds(page)));
  await page.locator(`#round-list a[data-round="${round}"]`).waitFor();
  await shot(page, 'after-restart');
  await page.close();
});


/**
 * Answers requests for `pathname` with `answer(real)` instead of the server's answer `real`.
 * The live demo decides when an app starves or gets leftovers; a fixed answer makes such a
 * case the same in every run.
 */
async function answerWith(page, pathname, answer) {
  await page.route((url) => url.pathname === pathname, async (route) => {
    const real = await (await route.fetch()).json();
    await route.fulfill({ json: answer(real) });
  });
}

test('a starving app is drawn as the worst, at the axis edge marked ∞, and counted', async () => {
  const page = await signedIn(tokens.admin);
  const apps = (await api('/v1/me', tokens.admin)).apps.slice(0, 4);
  assert.equal(apps.length, 4, 'the demo registers at least 4 apps');
  const rhos = [null, null, 2.5, 0.8];
  const standings = apps.map((app, position) => ({ app_id: app.id, name: app.name, rho: rhos[position], position }));
  await answerWith(page, '/v1/fairness', (real) => ({ ...real, round_id: real.round_id ?? 1, at: real.at ?? new Date().toISOString(),
    apps: standings, starving_apps: 2, max_rho: 2.5, jains_index: 0.77 }));
  await page.goto(`${base}/#/fairness`);
  await page.locator('#rho-distribution[data-starving="2"]').waitFor();
  const drawn = await page.$eval('#rho-distribution', (node) => ({
    top: node.__chart.scales.y.max, finite: node.__chart.data[1], starving: node.__chart.data[2], sharing: node.__chart.data[3],
    label: node.getAttribute('aria-label') }));
  assert.deepEqual(drawn.starving.map((value) => value === drawn.top), [true, true, false, false], 'starving bars reach the top');
  assert.deepEqual(drawn.finite, rhos, 'finite bars at their rho');
  assert.ok(drawn.finite.every((value) => value == null || value < drawn.top), 'a starving bar is taller than every other');
  assert.deepEqual(drawn.sharing, [1, 1, 1, 1], 'the sharing-incentive line rho = 1');
  assert.match(drawn.label, /2 starving \(ρ ∞\)/);
  const starving = page.locator('#fairness-stats .stat', { hasText: 'Starving' }).locator('.value');
  assert.equal(await starving.textContent(), '2');
  const first = await page.locator('#view .table-wrap table tbody tr').first().locator('td').allTextContents();
  assert.deepEqual([first[0], first[2]], ['1', '∞ (starving)'], 'position 1 is the worst off');
  assert.ok(first[1].includes(apps[0].name));
  assert.equal(await page.locator('#view h3', { hasText: 'ρ at round start' }).count(), 1, 'one named rho on the view');
  await shot(page, 'fairness-starving', { docs: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('each app has a colour of its own, with text on it readable, however many apps there are', async () => {
  const page = await signedIn(tokens.admin);
  const colours = await page.evaluate(async () => {
    const { appColour } = await import('/static/js/ui.js');
    return Array.from({ length: 500 }, (_, index) => appColour(index + 1));
  });
  assert.equal(new Set(colours.map((colour) => colour.fill)).size, 500);
  for (const { fill, ink } of colours) assert.ok(contrast(fill, ink) >= 4.5, `${ink} on ${fill}: ${contrast(fill, ink)}`);
  await page.close();
});

/** WCAG contrast ratio of two #rrggbb colours. */
function contrast(a, b) {
  const luminance = (hex) => {
    const [r, g, bl] = [1, 3, 5].map((at) => parseInt(hex.slice(at, at + 2), 16) / 255)
      .map((c) => (c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * bl;
  };
  const [light, dark] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (light + 0.05) / (dark + 0.05);
}

test('each round an app took part in says in words what it got and why: won, lost, leftovers, not offered', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const app = appsOf['demo-vision'][0];
  await page.goto(`${base}/#/apps/${app.id}`);
  const rows = page.locator('#app-rounds tbody > tr[data-round]');
  await rows.first().waitFor({ timeout: 30_000 });
  const shown = await rows.evaluateAll((trs) => trs.map((tr) => [Number(tr.dataset.round), tr.querySelector('.why-sentence').textContent]));
  const rounds = await api(`/v1/apps/${app.id}/rounds?limit=500`, tokens['demo-vision']);
  // The newest round may have been open when the page read it (its outcome not yet known).
  const newest = Math.max(...shown.map(([id]) => id));
  for (const [id, text] of shown) {
    if (id === newest) continue;
    assert.equal(text, rounds.find((round) => round.round_id === id)?.why, `round ${id}`);
    assert.match(text, new RegExp(`^Round ${id}: (you were|not offered)`));
  }
  // A won, a lost and a leftovers-only round, as the API describes them, show what they gave.
  const [real] = rounds;
  const bid = { source: 'agent', rho_old: null, received_at: real.opened_at, entries: [{ gpus: ['m0-g0'], rho: 1.5 }] };
  const won = { ...real, round_id: 903, bidder: true, bid, pf_entry: 0, won: true, won_gpus: ['m0-g0'], leftover_gpus: [], c: 1,
    why: 'Round 903: you were among the 2 worst-off apps (ρ ∞) and bid for 1 GPU; the auction gave you 1 (you keep it: c = 1.000)' };
  const leftovers = { ...real, round_id: 902, bidder: false, bid: null, pf_entry: null, c: null, won: false, won_gpus: [], leftover_gpus: ['m0-g1'],
    why: 'Round 902: not offered: 3 apps were worse off (ρ 0.900) and only the 2 worst off were offered GPUs; you received 1 leftover GPU' };
  const lost = { ...real, round_id: 901, bidder: true, bid, pf_entry: null, c: null, won: false, won_gpus: [], leftover_gpus: [],
    why: 'Round 901: you were among the 2 worst-off apps (ρ 2.000) and bid for 2 GPUs; the auction gave you none: the offered GPUs went to apps whose ρ they improved more' };
  const notOffered = { ...real, round_id: 900, bidder: false, bid: null, pf_entry: null, c: null, won: false, won_gpus: [], leftover_gpus: [],
    why: 'Round 900: not offered: 11 apps were worse off (ρ 0.875) and only the 4 worst off were offered GPUs' };
  await answerWith(page, `/v1/apps/${app.id}/rounds`, () => [won, leftovers, lost, notOffered]);
  await page.goto(`${base}/#/rounds`);
  await page.locator('#round-list').waitFor();
  await page.goto(`${base}/#/apps/${app.id}`);
  await page.locator('#app-rounds tbody > tr[data-round="901"]').waitFor();
  for (const [round, got, bidCell] of [[won, 'won', /bundles/], [leftovers, 'leftovers', /^not offered$/], [lost, 'no', /bundles/],
    [notOffered, 'no', /^not offered$/]]) {
    const cells = await page.locator(`#app-rounds tbody > tr[data-round="${round.round_id}"] > td`).allTextContents();
    assert.equal(cells[3], got, `round ${round.round_id}: Got GPUs?`);
    assert.match(cells[2], bidCell, `round ${round.round_id}: bid table`);
    assert.equal(cells[6], round.why);
  }
  await shot(page, 'apps-why');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('GPU tiles and machines show their GPU types, and an app its leased GPUs\' types', async () => {
  const page = await signedIn(tokens['demo-vision']);
  await page.goto(`${base}/#/cluster`);
  await page.locator('#racks .gpu').first().waitFor();
  // The demo's fleet is the testbed's: every GPU a K80, as the API says.
  const { gpus } = await api('/v1/cluster', tokens['demo-vision']);
  const shown = await page.$$eval('#racks .gpu', (tiles) => tiles.map((tile) => [tile.dataset.gpu, tile.querySelector('.gpu-type').textContent]));
  assert.deepEqual(shown, gpus.map((gpu) => [gpu.id, gpu.gpu_type]));
  assert.ok(shown.every(([, type]) => type === 'K80'), JSON.stringify(shown));
  // A mixed machine of GPU hosts: each tile its type and compute capability, the machine both types.
  await answerWith(page, '/v1/cluster', (real) => ({ gpus: real.gpus.slice(0, 2).map((gpu, index) => ({ ...gpu, host: 'node-a', machine: 0, rack: 0,
    gpu_type: ['h100', 'v100'][index], product_name: ['NVIDIA H100 80GB HBM3', 'Tesla V100-SXM2-16GB'][index], compute_capability: ['9.0', '7.0'][index] })) }));
  await page.goto(`${base}/#/rounds`);
  await page.locator('#round-list').waitFor();
  await page.goto(`${base}/#/cluster`);
  await page.locator('#racks .machine-name', { hasText: 'node-a (h100, v100)' }).waitFor();
  assert.deepEqual(await page.locator('#racks .gpu .gpu-type').allTextContents(), ['h100 · cc 9.0', 'v100 · cc 7.0']);
  assert.match(await page.locator('#racks .gpu').first().getAttribute('title'), /NVIDIA H100 80GB HBM3/);

  const app = appsOf['demo-vision'][0];
  const end = new Date(Date.now() + 60_000).toISOString();
  const typed = [{ id: 'GPU-h0', host: 'node-a', cuda_uuid: 'GPU-h0', gpu_type: 'h100' }, { id: 'GPU-v0', host: 'node-b', cuda_uuid: 'GPU-v0', gpu_type: 'v100' }];
  await answerWith(page, `/v1/apps/${app.id}/leases`, () => [{ id: 77, app_id: app.id, round_id: 1, gpus: typed,
    start_at: new Date().toISOString(), end_at: end, state: 'active', ended_at: null, cpus: 12.25, memory_gib: 32 },
  { id: 78, app_id: app.id, round_id: 1, gpus: typed.slice(0, 1), start_at: new Date().toISOString(), end_at: end,
    state: 'active', ended_at: null, cpus: null, memory_gib: null }]);
  await page.goto(`${base}/#/apps/${app.id}`);
  const row = page.locator('#app-active-leases tr[data-lease="77"] > td');
  await row.first().waitFor();
  const cells = await row.allTextContents();
  assert.equal(cells[1], 'GPU-h0 (h100), GPU-v0 (v100)');
  // One decimal at most; none where the hosts do not model CPUs and memory.
  assert.equal(cells[2], '12.3 CPUs · 32 GiB');
  assert.equal((await page.locator('#app-active-leases tr[data-lease="78"] > td').allTextContents())[2], '–');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('the leases an app holds show the CPUs and memory the server gave them with their GPUs', async () => {
  // The demo's fleet has 6 CPU cores and 56 GiB per GPU on every machine, and its apps no
  // profile, so each lease comes with its GPUs' share: 6 CPUs and 56 GiB a GPU.
  const page = await signedIn(tokens['demo-vision']);
  const shownLeases = async () => {
    for (const app of (await api('/v1/me', tokens['demo-vision'])).apps) {
      await page.goto(`${base}/#/apps/${app.id}`);
      // The app's name and its leases are drawn together.
      await page.locator('#app-detail').getByRole('heading', { name: app.name, exact: true }).waitFor();
      const rows = await page.$$eval('#app-active-leases tr[data-lease]', (trs) => trs.map((tr) => [...tr.cells].map((cell) => cell.textContent)));
      if (rows.length) return rows;
    }
    return [];
  };
  // Whenever none of the tenant's apps holds a lease, the next round may grant one.
  let [{ round_id: round }] = await api('/v1/rounds?limit=1', tokens['demo-vision']);
  let rows = await shownLeases();
  for (let rounds = 0; rounds < 20 && !rows.length; rounds += 1) {
    round = await nextStreamedRound(tokens['demo-vision'], round);
    rows = await shownLeases();
  }
  assert.ok(rows.length, 'no app of demo-vision held a lease in 20 rounds');
  // The app's rho chart spans at most the hour it shows, however few rounds it has had.
  const { span, points } = await page.$eval('#rho-chart', (node) => ({ span: node.__chart.scales.x.max - node.__chart.scales.x.min, points: node.dataset.points }));
  assert.ok(span > 0 && span <= 3600 + 60, `the rho chart of ${points} rounds spans ${span} s`);
  for (const [, gpus, resources] of rows) {
    const count = gpus.split(', ').length;
    assert.equal(resources, `${6 * count} CPUs · ${56 * count} GiB`, `a lease of ${gpus}`);
  }
  await shot(page, 'apps-lease-resources');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('an adapting job shows the phase of its speed it is in; jobs of one speed show none', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const app = appsOf['demo-vision'][0];
  // The demo's jobs keep one speed: the API says one phase each, and the page shows no phases.
  const { jobs } = await api(`/v1/apps/${app.id}`, tokens['demo-vision']);
  assert.ok(jobs.length && jobs.every((job) => job.phases === 1 && job.phase === 0 && job.next_change === null), JSON.stringify(jobs));
  await page.goto(`${base}/#/apps/${app.id}`);
  await page.locator('#app-detail h3', { hasText: app.name }).first().waitFor();
  await page.locator('#why').waitFor();
  assert.equal(await page.locator('#app-job-phases').count(), 0);

  // One job in its second phase of three (it scaled its batch size once), one in its last, one
  // of a single speed.
  await answerWith(page, `/v1/apps/${app.id}`, (real) => ({ ...real, jobs: [
    { job: 'trial-0', completed_iterations: 1300, phase: 1, phases: 3, serial_iteration_time: 0.3,
      next_change: { at_iteration: 3000, serial_iteration_time: 0.25 } },
    { job: 'trial-1', completed_iterations: 4000, phase: 2, phases: 3, serial_iteration_time: 0.25, next_change: null },
    { job: 'trial-2', completed_iterations: 10, phase: 0, phases: 1, serial_iteration_time: 0.4, next_change: null }] }));
  await page.goto(`${base}/#/rounds`);
  await page.locator('#round-list').waitFor();
  await page.goto(`${base}/#/apps/${app.id}`);
  await page.locator('#app-job-phases tr[data-job="trial-0"]').waitFor();
  const rows = await page.$$eval('#app-job-phases tbody tr', (trs) => trs.map((tr) => [...tr.cells].map((cell) => cell.textContent)));
  assert.deepEqual(rows, [
    ['trial-0', '2 of 3', '1300', '0.3 s', 'from iteration 3000: 0.25 s'],
    ['trial-1', '3 of 3', '4000', '0.25 s', 'none (last phase)'],
  ]);
  await shot(page, 'apps-job-phases');
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('each history range loads with a bounded payload', async () => {
  const page = await signedIn(tokens.admin);
  await page.goto(`${base}/#/history`);
  await page.locator('#cluster-history[data-range="1h"]').waitFor();
  for (const range of ['15m', '1h', '24h', 'all']) {
    const answered = page.waitForResponse((response) => response.url().endsWith(`/v1/fairness/history?range=${range}`));
    const appAnswered = page.waitForResponse((response) => /\/v1\/apps\/\d+\/rho-history\?range=/.test(response.url())
      && response.url().endsWith(`range=${range}`));
    await page.locator(`.range button[data-range="${range}"]`).click();
    for (const response of [await answered, await appAnswered]) {
      const body = await response.body();
      assert.equal(response.status(), 200);
      assert.ok(body.length < 40_000, `${response.url()}: ${body.length} bytes`);
      const answer = JSON.parse(body);
      const points = answer.points ?? answer;
      assert.ok(points.length > 0 && points.length <= 240, `${response.url()}: ${points.length} points`);
    }
    await page.locator(`#cluster-history[data-range="${range}"]`).waitFor();
    await page.locator(`#app-history[data-range="${range}"]`).waitFor();
    assert.equal(await page.locator('.range button[aria-pressed="true"]').getAttribute('data-range'), range);
    assert.ok(Number(await page.locator('#cluster-history').getAttribute('data-points')) <= 240);
  }
  await shot(page, 'history', { docs: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('an admin drains a GPU from the cluster view, confirmed and audited, and the next round does not offer it', async () => {
  const page = await signedIn(tokens.admin);
  await page.goto(`${base}/#/cluster`);
  const tile = page.locator('#racks .gpu[data-healthy="true"]').first();
  await tile.waitFor();
  const gpu = await tile.getAttribute('data-gpu');
  const drainButton = page.getByRole('button', { name: `Drain GPU ${gpu}`, exact: true });
  // Cancelling changes nothing.
  await drainButton.click();
  await page.locator('dialog#confirm[open]').waitFor();
  await page.locator('dialog#confirm').getByRole('button', { name: 'Cancel' }).click();
  await page.locator('#operator-status', { hasText: `Cancelled: GPU ${gpu} unchanged.` }).waitFor();
  await drainButton.click();
  const dialog = page.locator('dialog#confirm[open]');
  await dialog.waitFor();
  assert.match(await dialog.locator('#confirm-text').textContent(), new RegExp(`^Drain GPU ${gpu} \\(1 GPU\\)\\?`));
  await shot(page, 'cluster-drain-confirm', { docs: true });
  await dialog.getByRole('button', { name: 'Drain', exact: true }).click();
  await page.locator('#operator-status', { hasText: `Drained GPU ${gpu}.` }).waitFor();
  await page.locator(`#racks .gpu[data-gpu="${gpu}"][data-healthy="false"]`).waitFor();
  await page.locator('#operator-log tbody tr', { hasText: gpu }).first().waitFor();
  const [logged] = await api('/v1/cluster/actions?limit=1', tokens.admin);
  assert.deepEqual([logged.action, logged.gpu], ['drain', gpu], 'audited');
  // Once its lease (if any) is over the GPU is free: every round from then on offers every
  // free GPU in service (rounds are work-conserving), but not this one.
  await page.locator(`#racks .gpu[data-gpu="${gpu}"][data-holder="free"]`).waitFor({ timeout: 60_000 });
  const [{ round_id: last }] = await api('/v1/rounds?limit=1', tokens.admin);
  await page.goto(`${base}/#/rounds`);
  await page.waitForFunction((seen) => [...document.querySelectorAll('#round-list a[data-round]')]
    .some((link) => Number(link.dataset.round) > seen && link.textContent.includes('closed')), last, { timeout: 30_000 });
  const next = (await api('/v1/rounds?limit=20', tokens.admin)).filter((round) => round.round_id > last && round.status === 'closed');
  assert.ok(next.length > 0);
  for (const { round_id: id } of next) {
    const detail = await api(`/v1/rounds/${id}`, tokens.admin);
    assert.ok(detail.offered_gpus.length > 0, `round ${id} offered GPUs`);
    assert.ok(!detail.offered_gpus.includes(gpu), `round ${id} offered the drained GPU ${gpu}`);
  }
  // Restored, it is offered, and taken, again.
  await page.goto(`${base}/#/cluster`);
  await page.getByRole('button', { name: `Restore GPU ${gpu}`, exact: true }).click();
  await page.locator('dialog#confirm[open]').getByRole('button', { name: 'Restore', exact: true }).click();
  await page.locator('#operator-status', { hasText: `Restored GPU ${gpu}.` }).waitFor();
  await page.locator(`#racks .gpu[data-gpu="${gpu}"][data-healthy="true"]:not([data-holder="free"])`).waitFor({ timeout: 60_000 });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('the admin sees the apps grouped by tenant', async () => {
  const page = await signedIn(tokens.admin);
  const tenantOf = new Map((await api('/v1/me', tokens.admin)).apps.map((app) => [app.id, app.tenant]));
  const groups = await page.$$eval('#app-list .app-group', (nodes) => nodes.map((node) => ({
    tenant: node.dataset.tenant, heading: node.querySelector('h3').textContent,
    apps: [...node.querySelectorAll('a[data-app]')].map((link) => Number(link.dataset.app)) })));
  assert.deepEqual(groups.map((group) => group.tenant), ['demo-nlp', 'demo-rl', 'demo-speech', 'demo-vision']);
  for (const group of groups) {
    assert.match(group.heading, new RegExp(`^${group.tenant}: \\d+ active, \\d+ finished$`));
    for (const app of group.apps) assert.equal(tenantOf.get(app) ?? group.tenant, group.tenant, `app ${app}`);
  }
  await shot(page, 'apps-admin-by-tenant', { docs: true });
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('charts update in place: the same chart, its zoom kept, while rounds run; only new rounds are read', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const roundReads = [];
  page.on('request', (request) => { if (/\/v1\/apps\/\d+\/rounds\?/.test(request.url())) roundReads.push(new URL(request.url()).search); });
  await page.waitForFunction(() => Number(document.querySelector('#rho-chart')?.dataset.points) > 1, null, { timeout: 30_000 });
  // Zoom into the left half of the chart with the mouse, as a person would.
  const over = await page.locator('#rho-chart .u-over').boundingBox();
  await page.mouse.move(over.x + 5, over.y + over.height / 2);
  await page.mouse.down();
  await page.mouse.move(over.x + over.width / 2, over.y + over.height / 2, { steps: 5 });
  await page.mouse.up();
  const zoomed = await page.$eval('#rho-chart', (node) => {
    window.firstChart = node.__chart;
    return { min: node.__chart.scales.x.min, max: node.__chart.scales.x.max, updates: Number(node.dataset.updates) };
  });
  await page.waitForFunction((seen) => Number(document.querySelector('#rho-chart').dataset.updates) > seen, zoomed.updates, { timeout: 30_000 });
  const after = await page.$eval('#rho-chart', (node) => ({ same: node.__chart === window.firstChart,
    min: node.__chart.scales.x.min, max: node.__chart.scales.x.max }));
  assert.deepEqual(after, { same: true, min: zoomed.min, max: zoomed.max });
  assert.ok(roundReads.some((search) => /^\?after=\d+&limit=50$/.test(search)), `rounds read incrementally: ${roundReads}`);
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('axe finds no serious or critical accessibility violation in any view', async () => {
  // axe is injected as a script, which the page's Content-Security-Policy would refuse.
  const page = await signedIn(tokens['demo-vision'], undefined, { bypassCSP: true });
  // No live updates while axe reads the page: each view stays as first drawn.
  await page.route((url) => url.pathname === '/v1/rounds/events', (route) => route.abort());
  const [{ round_id: round }] = await api('/v1/rounds?limit=1', tokens['demo-vision']);
  await page.addScriptTag({ path: AXE });
  const views = [['apps', '#why'], [`rounds/${round}`, '#round-outcome'], ['cluster', '#racks .gpu'],
    ['fairness', '#fairness-stats .stat'], ['history', '#cluster-history[data-range]']];
  for (const [view, loaded] of views) {
    await page.goto(`${base}/#/${view}`);
    await page.locator(loaded).first().waitFor();
    const violations = await page.evaluate(async () => (await window.axe.run(document, { resultTypes: ['violations'] })).violations
      .filter((violation) => ['serious', 'critical'].includes(violation.impact))
      .map((violation) => `${violation.id} (${violation.impact}): ${violation.nodes.map((node) => node.target.join(' ')).join(', ')}`));
    assert.deepEqual(violations, [], `#/${view}`);
  }
  await page.close();
});
