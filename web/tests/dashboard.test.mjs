// The dashboard in headless Chromium against a live `agora serve --demo` on a random port,
// with a fresh database that the tests create and drop. Screenshots go to web/test-artifacts/.
//
// AGORA_BIN (default target/debug/agora), AGORA_TEST_POSTGRES (default
// postgres://postgres@127.0.0.1:5432) and CHROMIUM (default /usr/bin/chromium) override.

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const ARTIFACTS = fileURLToPath(new URL('../test-artifacts/', import.meta.url));
const BINARY = process.env.AGORA_BIN ?? `${ROOT}target/debug/agora`;
const POSTGRES = process.env.AGORA_TEST_POSTGRES ?? 'postgres://postgres@127.0.0.1:5432';
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const DATABASE = `agora_web_test_${process.pid}`;

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

  /** The first match of `pattern` in the log, waiting up to `ms`. */
  async logged(pattern, ms = 60_000) {
    const deadline = Date.now() + ms;
    for (;;) {
      const match = this.log.match(pattern);
      if (match) return match;
      if (this.process.exitCode != null || Date.now() > deadline) {
        throw new Error(`agora serve never logged ${pattern}; its log:\n${this.log}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
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
async function signedIn(token, viewport = { width: 1366, height: 900 }) {
  const page = await browser.newPage({ viewport });
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

async function shot(page, name) {
  await page.screenshot({ path: `${ARTIFACTS}${name}.png`, fullPage: true });
}

const roundIds = (page) => page.$$eval('#round-list a[data-round]', (links) => links.map((link) => Number(link.dataset.round)));

test('the page loads, a tenant signs in and sees its apps, with no console errors', async () => {
  const page = await signedIn(tokens['demo-vision']);
  const listed = await page.$$eval('#app-list a', (links) => links.map((link) => Number(link.dataset.app)));
  assert.deepEqual(listed.sort(), appsOf['demo-vision'].map((app) => app.id).sort());
  await page.locator('#live[data-state="live"]').waitFor();
  await page.waitForFunction(() => Number(document.querySelector('#rho-chart')?.dataset.points) > 0, null, { timeout: 30_000 });
  assert.ok(await page.locator('#rho-chart canvas').count(), 'uPlot drew the rho chart');
  await page.locator('#why').waitFor();
  await shot(page, 'apps-tenant');
  for (const view of ['rounds', 'cluster', 'fairness']) {
    await page.getByRole('link', { name: new RegExp(`^${view}$`, 'i') }).click();
    await page.locator(`#view h2`).filter({ hasText: new RegExp(view, 'i') }).waitFor();
  }
  await page.locator('#fairness-stats .stat').first().waitFor();
  assert.deepEqual(page.errors, []);
  await page.close();
});

test('a new round appears in the live list within seconds', async () => {
  const page = await signedIn(tokens['demo-speech']);
  await page.goto(`${base}/#/rounds`);
  await page.locator('#round-list a').first().waitFor();
  const newest = Math.max(...await roundIds(page));
  await page.waitForFunction((seen) => [...document.querySelectorAll('#round-list a[data-round]')]
    .some((link) => Number(link.dataset.round) > seen), newest, { timeout: 30_000 })
    .catch((error) => { throw new Error(`${error.message}; newest ${newest}; server log:\n${server.log.slice(-3000)}`); });
  await shot(page, 'rounds-live');
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
  await shot(page, 'cluster-admin-large-monitor');
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
  await shot(page, 'round-detail-tenant');
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
  await page.locator('#live[data-state="live"]').waitFor();
  await server.stop();
  await page.locator('#live[data-state="reconnecting"]').waitFor();
  server = new Server(`127.0.0.1:${port}`);
  await server.logged(/agora arbiter listening/);
  await page.locator('#live[data-state="live"]').waitFor({ timeout: 30_000 });
  const newest = Math.max(...await roundIds(page));
  await page.waitForFunction((seen) => [...document.querySelectorAll('#round-list a[data-round]')]
    .some((link) => Number(link.dataset.round) > seen), newest, { timeout: 30_000 })
    .catch((error) => { throw new Error(`${error.message}; newest ${newest}; server log:\n${server.log.slice(-3000)}`); });
  await shot(page, 'after-restart');
  await page.close();
});
