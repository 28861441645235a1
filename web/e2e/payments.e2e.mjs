#!/usr/bin/env node
// Browser end-to-end test of the payment page against a claims-payments service.
//
// Plain Node + playwright-core + Debian's chromium (no test runner, no browser download).
// It serves the built page (`ng build` output) from a small static server that also
// proxies /api/* to SERVICE_URL, so page and API share one origin, and drives the page in
// headless Chromium. Run: `SERVICE_URL=http://127.0.0.1:3000 ... npm run e2e`
// (`npm run e2e:fake` runs it against the development fake, e2e/fake-service.mjs).
//
// =====================================================================================
// ADAPTERS: what the harness around the service under test must provide (environment).
// Each adapter is one small function below; change them here if the Rust side's
// control API differs.
//
//   SERVICE_URL          required. Base URL of the service, e.g. http://127.0.0.1:3000
//                        (`claims-payments serve`) or http://127.0.0.1:7071 (func host).
//                        The page calls <static server>/api/payments, proxied to
//                        SERVICE_URL + /api/payments (path kept as is).
//
//   Make the sandbox bank fail its next N payouts, so that the service answers 503 with
//   Retry-After (one of):
//   BANK_FAIL_HOOK_CMD   shell command; `{count}` is replaced by N, and BANK_FAIL_COUNT=N
//                        is in its environment. Must exit 0.
//   BANK_CONTROL_URL     the test POSTs `{"count": N}` (application/json) to it; any 2xx = done.
//
//   Count the payments the service recorded for a claim:
//   LEDGER_CHECK_CMD     shell command; `{claimId}` is replaced by the claim id, and
//                        CLAIM_ID is in its environment. Prints the count (the last integer
//                        on stdout is read). E.g. with the real binary and jq:
//                        claims-payments ledger --json | jq '[.[] | select(.claimId=="{claimId}")] | length'
//
//   Count the payouts the sandbox bank made for a claim (one of):
//   BANK_PAYOUTS_URL     the test GETs `<url>?claimId=<id>`; the answer may be a number,
//                        {"count": n}, an array of payouts, or {"payouts": [...]}
//                        (arrays are filtered by their items' `claimId` when present).
//   BANK_PAYOUTS_CMD     shell command like LEDGER_CHECK_CMD, printing the payout count.
//
// Knobs: E2E_BANK_FAILURES (N above, default 1); E2E_REQUIRE_CLIENT_503 (default 1: the
// page must see at least one 503; set 0 if the service absorbs N bank failures with its
// own retries before answering); E2E_OK_STATUSES (default "paid,recorded": accepted
// final payment statuses); E2E_TIMEOUT_MS (whole run, default 120000); E2E_HEADED=1;
// CHROME_BIN (default /usr/bin/chromium); E2E_OUT (default web/e2e/out).
// =====================================================================================
//
// What it asserts (scenario by scenario):
// A. Lost answer + double click. Pay is double-clicked; the browser's first POST reaches
//    the server (which pays: 201) but its answer is dropped before the page sees it. The
//    page must retry with the SAME key, get the stored answer replayed
//    (`Idempotent-Replayed: true`, byte for byte the dropped body) and show the payment.
//    The second click joins the pending call: exactly two POSTs, both with the page's key.
//    Ledger: 1 payment for the claim; bank: 1 payout.
// B. Bank unavailable + lost answer. New intent (new claim, new key); the bank fails the
//    next N payouts; the first 2xx answer is dropped too. The page must show 503 attempts
//    retried after Retry-After, then the network error, then the replayed payment; one
//    key throughout. Ledger 1, payouts 1. Screenshot: out/final.png.
// C. Pay again after success (same payload): a new key, the service answers 200 with the
//    existing payment; still 1 payment and 1 payout.
// D. Another amount for the paid claim: a new key, 409 claim-already-paid, NOT retried
//    (one attempt, the page shows the error); still 1 payment and 1 payout.
// E. GET /api/payments/{claimId} through the same origin returns the payment.
import { spawn } from 'node:child_process';
import { createReadStream, existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, extname, join, normalize, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const WEB = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const DIST = join(WEB, 'dist', 'claims-payments-web', 'browser');
const OUT = resolve(process.env.E2E_OUT ?? join(WEB, 'e2e', 'out'));
const SERVICE_URL = process.env.SERVICE_URL;
const BANK_FAILURES = Number(process.env.E2E_BANK_FAILURES ?? 1);
const REQUIRE_CLIENT_503 = (process.env.E2E_REQUIRE_CLIENT_503 ?? '1') !== '0';
const OK_STATUSES = (process.env.E2E_OK_STATUSES ?? 'paid,recorded').split(',').map((s) => s.trim());
const TIMEOUT_MS = Number(process.env.E2E_TIMEOUT_MS ?? 120_000);

// ---------------------------------------------------------------- adapters

/** Make the sandbox bank fail its next `count` payouts. */
async function bankFailNext(count) {
  if (process.env.BANK_FAIL_HOOK_CMD) {
    await sh(process.env.BANK_FAIL_HOOK_CMD.replaceAll('{count}', String(count)), { BANK_FAIL_COUNT: String(count) });
    return;
  }
  if (process.env.BANK_CONTROL_URL) {
    const r = await fetch(process.env.BANK_CONTROL_URL, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ count }),
    });
    if (!r.ok) throw new Error(`BANK_CONTROL_URL answered ${r.status}: ${await r.text()}`);
    return;
  }
  throw new Error('set BANK_FAIL_HOOK_CMD or BANK_CONTROL_URL (make the sandbox bank fail the next N payouts)');
}

/** Payments the service recorded for `claimId`. */
async function ledgerPaymentCount(claimId) {
  if (!process.env.LEDGER_CHECK_CMD) throw new Error('set LEDGER_CHECK_CMD (prints the payment count of {claimId})');
  return lastInteger(await sh(process.env.LEDGER_CHECK_CMD.replaceAll('{claimId}', claimId), { CLAIM_ID: claimId }));
}

/** Payouts the sandbox bank made for `claimId`. */
async function bankPayoutCount(claimId) {
  if (process.env.BANK_PAYOUTS_CMD) {
    return lastInteger(await sh(process.env.BANK_PAYOUTS_CMD.replaceAll('{claimId}', claimId), { CLAIM_ID: claimId }));
  }
  if (process.env.BANK_PAYOUTS_URL) {
    const url = new URL(process.env.BANK_PAYOUTS_URL);
    url.searchParams.set('claimId', claimId);
    const r = await fetch(url);
    if (!r.ok) throw new Error(`BANK_PAYOUTS_URL answered ${r.status}`);
    const v = await r.json();
    if (typeof v === 'number') return v;
    if (typeof v?.count === 'number') return v.count;
    const list = Array.isArray(v) ? v : Array.isArray(v?.payouts) ? v.payouts : null;
    if (!list) throw new Error(`BANK_PAYOUTS_URL: unexpected answer ${JSON.stringify(v).slice(0, 200)}`);
    return list.filter((p) => p?.claimId === undefined || String(p.claimId).toLowerCase() === claimId).length;
  }
  throw new Error('set BANK_PAYOUTS_URL or BANK_PAYOUTS_CMD (count the sandbox bank payouts of a claim)');
}

function sh(command, env) {
  return new Promise((res, rej) => {
    const child = spawn('sh', ['-c', command], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('error', rej);
    child.on('close', (code) =>
      code === 0 ? res(out) : rej(new Error(`\`${command}\` exited ${code}: ${err.trim().slice(0, 500)}`)),
    );
  });
}

function lastInteger(text) {
  const all = text.match(/-?\d+/g);
  if (!all) throw new Error(`expected a count, got: ${JSON.stringify(text.slice(0, 200))}`);
  return Number(all.at(-1));
}

// ---------------------------------------------------------------- static server + /api proxy

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.ico': 'image/x-icon',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer'];

function startServer(serviceUrl) {
  const target = new URL(serviceUrl);
  const server = http.createServer((req, res) => {
    if (req.url.startsWith('/api/') || req.url === '/api') return proxy(req, res);
    return serveStatic(req, res);
  });

  function proxy(req, res) {
    const headers = { ...req.headers, host: target.host };
    for (const h of HOP_BY_HOP) delete headers[h];
    const upstream = http.request(
      {
        protocol: target.protocol,
        hostname: target.hostname,
        port: target.port,
        method: req.method,
        path: target.pathname.replace(/\/$/, '') + req.url,
        headers,
      },
      (up) => {
        const h = { ...up.headers };
        for (const k of HOP_BY_HOP) delete h[k];
        res.writeHead(up.statusCode ?? 502, h);
        up.pipe(res);
      },
    );
    upstream.on('error', (e) => {
      // The service hung up: mirror it (the browser sees a network error), as a gateway would.
      if (res.headersSent) return res.destroy();
      res.writeHead(502, { 'Content-Type': 'application/problem+json' });
      res.end(JSON.stringify({ type: 'about:blank', title: 'Bad Gateway', status: 502, detail: e.message }));
    });
    req.pipe(upstream);
  }

  function serveStatic(req, res) {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    let file = normalize(join(DIST, path));
    if (!file.startsWith(DIST)) {
      res.writeHead(403).end();
      return;
    }
    if (!existsSync(file) || statSync(file).isDirectory()) file = join(DIST, 'index.html'); // SPA fallback
    res.writeHead(200, { 'Content-Type': TYPES[extname(file)] ?? 'application/octet-stream', 'Cache-Control': 'no-store' });
    createReadStream(file).pipe(res);
  }

  return new Promise((res) =>
    server.listen(Number(process.env.E2E_PORT ?? 0), '127.0.0.1', () =>
      res({ server, url: `http://127.0.0.1:${server.address().port}` }),
    ),
  );
}

// ---------------------------------------------------------------- assertions

let passed = 0;
let failed = 0;
const t0 = Date.now();
const elapsed = () => `${((Date.now() - t0) / 1000).toFixed(1)} s`;
function check(name, ok, detail = '') {
  if (ok) {
    passed++;
    console.log(`  ok   ${name}`);
  } else {
    failed++;
    console.log(`  FAIL ${name}${detail ? `: ${detail}` : ''}`);
  }
  return ok;
}
function eq(name, actual, expected) {
  return check(name, actual === expected, `expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
}

// ---------------------------------------------------------------- page helpers

const tid = (page, id) => page.getByTestId(id);
/** Text of the first element with this test id; '' when there is none (never waits). */
const text = async (page, id) => ((await tid(page, id).allTextContents())[0] ?? '').trim();

async function attemptsOf(page) {
  return page.$$eval('[data-testid="attempt-row"]', (rows) =>
    rows.map((r) => ({
      attempt: Number(r.getAttribute('data-attempt')),
      status: Number(r.getAttribute('data-status')),
      replayed: r.getAttribute('data-replayed') === 'true',
      decision: r.getAttribute('data-decision'),
      shown: r.querySelector('[data-testid="attempt-status"]')?.textContent?.trim(),
      wait: r.querySelector('[data-testid="attempt-wait"]')?.textContent?.trim(),
    })),
  );
}

/** Wait until the page shows a final outcome (payment or error). */
async function waitForOutcome(page) {
  await page.waitForSelector('[data-testid="payment-result"], [data-testid="payment-error"]', { timeout: 60_000 });
}

/** POSTs to /api/payments that the page itself sent, with their Idempotency-Key. */
function recordPosts(page) {
  const posts = [];
  page.on('request', (r) => {
    if (r.method() === 'POST' && new URL(r.url()).pathname === '/api/payments') {
      posts.push({ key: r.headers()['idempotency-key'], body: r.postData() });
    }
  });
  return posts;
}

/** Response bodies the page read for POST /api/payments (dropped ones never arrive here). */
function recordResponses(page) {
  const seen = [];
  page.on('response', async (r) => {
    if (r.request().method() === 'POST' && new URL(r.url()).pathname === '/api/payments') {
      seen.push({ status: r.status(), replayed: r.headers()['idempotent-replayed'], body: await r.text().catch(() => null) });
    }
  });
  return seen;
}

async function counts(claimId) {
  return { ledger: await ledgerPaymentCount(claimId), payouts: await bankPayoutCount(claimId) };
}

// ---------------------------------------------------------------- scenarios

async function scenarioLostAnswerDoubleClick(page) {
  console.log(`[${elapsed()}] A. double click + first answer lost`);
  const claimId = (await tid(page, 'claim-id').inputValue()).toLowerCase();
  const key = await text(page, 'idempotency-key');
  const posts = recordPosts(page);
  const responses = recordResponses(page);

  // Drop the answer of the first POST: the request reaches the server (route.fetch), the
  // browser gets a connection reset instead of the answer.
  let dropped = null;
  await page.route('**/api/payments', async (route) => {
    if (route.request().method() !== 'POST' || dropped) return route.continue();
    dropped = { status: 'pending' };
    const answer = await route.fetch();
    dropped = { status: answer.status(), body: await answer.text() };
    await route.abort('connectionreset');
  });

  await tid(page, 'pay').dblclick();
  await waitForOutcome(page);
  await page.unrouteAll({ behavior: 'wait' });

  const rows = await attemptsOf(page);
  check('the page shows the payment', (await tid(page, 'payment-result').count()) === 1,
    `error shown: ${await text(page, 'error-message')}`);
  check(`final status is one of ${OK_STATUSES}`, OK_STATUSES.includes(await text(page, 'payment-status')),
    await text(page, 'payment-status'));
  eq('payment is for the claim', (await text(page, 'payment-claim-id')).toLowerCase(), claimId);
  check('amount is 125', Number(await text(page, 'payment-amount')) === 125, await text(page, 'payment-amount'));
  eq('the server processed the dropped first POST (201)', dropped?.status, 201);
  eq('double click: 2 clicks registered', await text(page, 'clicks'), '2');
  eq('double click: the second click joined the pending call', await text(page, 'joined'), '1');
  eq('2 POSTs in all (dropped one + one retry)', posts.length, 2);
  check('every POST carried the intent key shown on the page', posts.every((p) => p.key === key),
    JSON.stringify(posts.map((p) => p.key)));
  check('every POST carried the same body', posts.every((p) => p.body === posts[0].body));
  eq('attempts shown', rows.length, 2);
  check('attempt 1: network error, retried', rows[0]?.status === 0 && rows[0]?.decision === 'retry', JSON.stringify(rows[0]));
  check('attempt 2: replayed 2xx, done',
    rows[1]?.replayed === true && rows[1]?.decision === 'done' && rows[1]?.status >= 200 && rows[1]?.status < 300,
    JSON.stringify(rows[1]));
  eq('page marks the result replayed', await text(page, 'payment-replayed'), 'yes');
  eq('the replay has the stored status', responses[0]?.status, dropped?.status);
  eq('the replay is the stored body byte for byte', responses[0]?.body, dropped?.body);
  const c = await counts(claimId);
  eq('ledger: exactly one payment for the claim', c.ledger, 1);
  eq('bank: exactly one payout for the claim', c.payouts, 1);
  await page.screenshot({ path: join(OUT, 'lost-answer.png'), fullPage: true });
  return claimId;
}

async function scenarioBankUnavailable(page, previousKey) {
  console.log(`[${elapsed()}] B. bank fails the next ${BANK_FAILURES} payout(s) + first 2xx answer lost`);
  await tid(page, 'new-payment').click();
  // The click's handler changes the key; the page renders it on its next change detection,
  // so wait for the rendered key to change instead of reading it at once (a read right after
  // the click could still see the previous intent's key on a loaded machine).
  const rendered = await page
    .waitForFunction(
      (k) => {
        const shown = document.querySelector('[data-testid="idempotency-key"]')?.textContent?.trim();
        return shown && shown !== k ? shown : null;
      },
      previousKey,
      { timeout: 10_000 },
    )
    .then(() => true, () => false);
  const claimId = (await tid(page, 'claim-id').inputValue()).toLowerCase();
  const key = await text(page, 'idempotency-key');
  check('a new intent gets a new key', rendered && key !== previousKey && key.length > 0, key);
  const posts = recordPosts(page);

  let droppedOk = null;
  await page.route('**/api/payments', async (route) => {
    if (route.request().method() !== 'POST' || droppedOk) return route.continue();
    const answer = await route.fetch();
    if (answer.status() >= 200 && answer.status() < 300) {
      droppedOk = { status: answer.status() };
      return route.abort('connectionreset');
    }
    return route.fulfill({ response: answer });
  });

  await bankFailNext(BANK_FAILURES);
  await tid(page, 'pay').click();
  await waitForOutcome(page);
  await page.unrouteAll({ behavior: 'wait' });

  const rows = await attemptsOf(page);
  const unavailable = rows.filter((r) => r.status === 503);
  check('the page shows the payment', (await tid(page, 'payment-result').count()) === 1,
    `error shown: ${await text(page, 'error-message')}`);
  check(`final status is one of ${OK_STATUSES}`, OK_STATUSES.includes(await text(page, 'payment-status')),
    await text(page, 'payment-status'));
  eq('payment is for the claim', (await text(page, 'payment-claim-id')).toLowerCase(), claimId);
  if (REQUIRE_CLIENT_503) {
    check('the page saw the 503 from the unavailable bank', unavailable.length >= 1, JSON.stringify(rows));
  }
  check('every 503 was retried', unavailable.every((r) => r.decision === 'retry'), JSON.stringify(unavailable));
  check('waits after a 503 honour Retry-After (>= 1 s)',
    unavailable.every((r) => Number.parseFloat(r.wait) >= 1), JSON.stringify(unavailable.map((r) => r.wait)));
  eq('the service paid once the bank was back (201, answer dropped)', droppedOk?.status, 201);
  const afterDrop = rows.findIndex((r) => r.status === 0);
  check('the dropped answer shows as a network error, retried', afterDrop >= 0 && rows[afterDrop].decision === 'retry',
    JSON.stringify(rows));
  const last = rows.at(-1);
  check('the last attempt is the replayed 2xx', last?.replayed === true && last?.decision === 'done', JSON.stringify(last));
  eq('one POST per attempt', posts.length, rows.length);
  check('every POST carried the intent key', posts.every((p) => p.key === key), JSON.stringify(posts.map((p) => p.key)));
  const c = await counts(claimId);
  eq('ledger: exactly one payment for the claim', c.ledger, 1);
  eq('bank: exactly one payout for the claim', c.payouts, 1);
  await page.screenshot({ path: join(OUT, 'final.png'), fullPage: true });
  return { claimId, key };
}

async function scenarioPayAgain(page, { claimId, key }) {
  console.log(`[${elapsed()}] C. Pay again after success, same payload`);
  await tid(page, 'pay').click();
  await page.waitForFunction(
    (k) => document.querySelector('[data-testid="idempotency-key"]')?.textContent?.trim() !== k &&
      document.querySelector('[data-testid="phase"]')?.textContent?.trim() !== 'pending',
    key,
  );
  await waitForOutcome(page);
  const newKey = await text(page, 'idempotency-key');
  check('a settled intent is not reused: new key', newKey !== key, newKey);
  eq('the service answers 200 with the existing payment', await text(page, 'payment-http-status'), '200');
  eq('same claim', (await text(page, 'payment-claim-id')).toLowerCase(), claimId);
  const c = await counts(claimId);
  eq('ledger: still one payment', c.ledger, 1);
  eq('bank: still one payout', c.payouts, 1);
  return newKey;
}

async function scenarioOtherAmount(page, { claimId, key }) {
  console.log(`[${elapsed()}] D. another amount for the paid claim`);
  const posts = recordPosts(page);
  await tid(page, 'amount').fill('126.00');
  await tid(page, 'pay').click();
  await page.waitForSelector('[data-testid="payment-error"]', { timeout: 30_000 });
  const rows = await attemptsOf(page);
  check('a changed payload gets a new key', (await text(page, 'idempotency-key')) !== key);
  eq('409 claim-already-paid', await text(page, 'error-status'), '409');
  eq('problem type', await text(page, 'error-type'), 'https://claims-payments/problems/claim-already-paid');
  eq('not retried: one attempt', rows.length, 1);
  eq('not retried: one POST', posts.length, 1);
  eq('decision give-up', rows[0]?.decision, 'give-up');
  const c = await counts(claimId);
  eq('ledger: still one payment', c.ledger, 1);
  eq('bank: still one payout', c.payouts, 1);
}

async function scenarioGet(baseUrl, claimId) {
  console.log(`[${elapsed()}] E. GET /api/payments/{claimId}`);
  const r = await fetch(`${baseUrl}/api/payments/${claimId}`);
  eq('GET answers 200', r.status, 200);
  const body = await r.json().catch(() => null);
  eq('GET returns the claim', body?.claimId?.toLowerCase(), claimId);
  check('GET status is final', OK_STATUSES.includes(body?.status), body?.status);
}

// ---------------------------------------------------------------- main

async function main() {
  if (!SERVICE_URL) throw new Error('set SERVICE_URL (e.g. http://127.0.0.1:3000)');
  if (!existsSync(join(DIST, 'index.html'))) throw new Error(`no build at ${DIST}: run \`npm run build\` first`);
  mkdirSync(OUT, { recursive: true });
  const { server, url } = await startServer(SERVICE_URL);
  console.log(`page ${url} -> /api proxied to ${SERVICE_URL}`);

  const profile = mkdtempSync(join(tmpdir(), 'payments-e2e-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROME_BIN ?? '/usr/bin/chromium',
    headless: process.env.E2E_HEADED !== '1',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ].filter((a) => a !== '--headless' || process.env.E2E_HEADED !== '1'),
    viewport: { width: 1100, height: 900 },
  });
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.on('pageerror', (e) => console.log(`  page error: ${e.message}`));
    await page.goto(url);
    await tid(page, 'pay').waitFor();

    const keyA = await text(page, 'idempotency-key');
    const claimA = await scenarioLostAnswerDoubleClick(page);
    const b = await scenarioBankUnavailable(page, keyA);
    const keyC = await scenarioPayAgain(page, b);
    await scenarioOtherAmount(page, { claimId: b.claimId, key: keyC });
    await scenarioGet(url, claimA);
    const a = await counts(claimA);
    eq('claim A still has exactly one payment and one payout', `${a.ledger}/${a.payouts}`, '1/1');
  } catch (e) {
    failed++;
    console.log(`  FAIL ${e.stack ?? e}`);
    const page = context.pages()[0];
    await page?.screenshot({ path: join(OUT, 'failure.png'), fullPage: true }).catch(() => {});
  } finally {
    await context.close();
    server.close();
    rmSync(profile, { recursive: true, force: true });
  }
  console.log(`[${elapsed()}] screenshots in ${OUT}`);
  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed === 0 && passed > 0 ? 0 : 1;
}

const guard = setTimeout(() => {
  console.log(`FAIL: the run took longer than ${TIMEOUT_MS} ms`);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
}, TIMEOUT_MS);
guard.unref();

main().catch((e) => {
  console.error(e.stack ?? e);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
