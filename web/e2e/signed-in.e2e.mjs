#!/usr/bin/env node
// Signed-in browser test: the payment page behind a local stand-in for Azure Static Web
// Apps (e2e/swa-standin.mjs: sign-in, principal forwarding, route roles), in front of a
// real `serve` with HTTP_AUTH=appservice and the sandbox bank. Three users sign in
// through the stand-in's sign-in page, each in a browser context of its own:
//
//   alice  roles Payments.Pay                pays claim A on the page
//   bob    roles Payments.Pay                pays claim B on the page
//   carol  roles Payments.Read (no Pay)      may read any payment, may pay nothing
//
// What it asserts (the service's caller contract under HTTP_AUTH=appservice):
//   1. alice pays claim A on the page (201); her retry with the same key is her stored
//      answer replayed (Idempotent-Replayed: true, same body).
//   2. bob sends alice's key with alice's body: not a replay of alice's answer (no
//      Idempotent-Replayed, none of her payment's details); the claim is paid by another
//      principal, so 409 claim-already-paid. Still one payment and one payout for A.
//   3. bob pays claim B on the page (201); alice sending bob's key and body gets 409
//      claim-already-paid, not bob's answer.
//   4. GET: alice (no Payments.Read) reads her own payment (200) but not bob's; carol
//      (Payments.Read) reads both.
//   5. carol presses Pay: 403 forbidden, shown, not retried; nothing paid for her claim.
//   6. Without a session the stand-in answers 401 before the backend (route roles), a
//      forged X-MS-CLIENT-PRINCIPAL from the browser is dropped, and the service itself,
//      asked directly without a principal, answers 401 caller-unknown.
//   Ledger and bank: exactly one payment and one payout for A and for B.
//
// Environment: SERVICE_URL (serve with HTTP_AUTH=appservice), LEDGER_CHECK_CMD,
// BANK_PAYOUTS_URL or BANK_PAYOUTS_CMD (as for e2e/payments.e2e.mjs), CHROME_BIN, E2E_OUT,
// E2E_TIMEOUT_MS. Prints one line per check, ends with "N passed, M failed".
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

import { startSwaStandin } from './swa-standin.mjs';

const WEB = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const OUT = resolve(process.env.E2E_OUT ?? join(WEB, 'e2e', 'out'));
const SERVICE_URL = process.env.SERVICE_URL;
const TIMEOUT_MS = Number(process.env.E2E_TIMEOUT_MS ?? 120_000);
const PROBLEM = 'https://claims-payments/problems/';

let passed = 0;
let failed = 0;
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
const eq = (name, actual, expected) =>
  check(name, actual === expected, `expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);

function sh(command, env) {
  return new Promise((res, rej) => {
    const child = spawn('sh', ['-c', command], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('error', rej);
    child.on('close', (code) => (code === 0 ? res(out) : rej(new Error(`\`${command}\` exited ${code}: ${err.trim().slice(0, 500)}`))));
  });
}
const lastInteger = (t) => Number((t.match(/-?\d+/g) ?? [NaN]).at(-1));

async function ledger(claimId) {
  return lastInteger(await sh(process.env.LEDGER_CHECK_CMD.replaceAll('{claimId}', claimId), { CLAIM_ID: claimId }));
}
async function payouts(claimId) {
  if (process.env.BANK_PAYOUTS_CMD) {
    return lastInteger(await sh(process.env.BANK_PAYOUTS_CMD.replaceAll('{claimId}', claimId), { CLAIM_ID: claimId }));
  }
  const url = new URL(process.env.BANK_PAYOUTS_URL);
  url.searchParams.set('claimId', claimId);
  const v = await (await fetch(url)).json();
  return typeof v === 'number' ? v : v.count;
}

const tid = (page, id) => page.getByTestId(id);
const text = async (page, id) => ((await tid(page, id).allTextContents())[0] ?? '').trim();

/** A browser context signed in through the stand-in's sign-in page, on the payment page. */
async function signIn(browser, base, { userId, name, roles }) {
  const context = await browser.newContext({ viewport: { width: 1100, height: 900 } });
  const page = await context.newPage();
  page.on('pageerror', (e) => console.log(`  page error (${name}): ${e.message}`));
  await page.goto(`${base}/.auth/login/aad?post_login_redirect_uri=/`);
  await tid(page, 'login-user-id').fill(userId);
  await tid(page, 'login-user-details').fill(name);
  await tid(page, 'login-roles').fill(roles.join(','));
  await tid(page, 'login-submit').click();
  await tid(page, 'pay').waitFor();
  const me = await page.evaluate(async () => (await fetch('/.auth/me')).json());
  eq(`${name} is signed in (/.auth/me)`, me?.clientPrincipal?.userId, userId);
  return { context, page, name };
}

/** A fetch from inside the signed-in page (same origin, the session cookie), with explicit headers. */
async function call(page, method, path, { key, body, headers = {} } = {}) {
  return page.evaluate(
    async ({ method, path, key, body, headers }) => {
      const h = { ...headers };
      if (body !== undefined) h['Content-Type'] = 'application/json';
      if (key !== undefined) h['Idempotency-Key'] = key;
      const r = await fetch(path, { method, headers: h, body: body === undefined ? undefined : body });
      return { status: r.status, replayed: r.headers.get('Idempotent-Replayed'), body: await r.text() };
    },
    { method, path, key, body, headers },
  );
}
const problemType = (r) => {
  try {
    return JSON.parse(r.body).type;
  } catch {
    return undefined;
  }
};

/** Pay on the page: the form's claim id, amount 125 and payee; returns what the page showed. */
async function payOnPage(page) {
  const posts = [];
  const answers = [];
  page.on('request', (r) => {
    if (r.method() === 'POST' && new URL(r.url()).pathname === '/api/payments') posts.push({ key: r.headers()['idempotency-key'], body: r.postData() });
  });
  page.on('response', async (r) => {
    if (r.request().method() === 'POST' && new URL(r.url()).pathname === '/api/payments') answers.push({ status: r.status(), body: await r.text().catch(() => null) });
  });
  const claimId = (await tid(page, 'claim-id').inputValue()).toLowerCase();
  const key = await text(page, 'idempotency-key');
  await tid(page, 'pay').click();
  await page.waitForSelector('[data-testid="payment-result"], [data-testid="payment-error"]', { timeout: 60_000 });
  return { claimId, key, posts, answers };
}

async function main() {
  if (!SERVICE_URL) throw new Error('set SERVICE_URL (serve with HTTP_AUTH=appservice)');
  if (!process.env.LEDGER_CHECK_CMD || !(process.env.BANK_PAYOUTS_URL || process.env.BANK_PAYOUTS_CMD)) {
    throw new Error('set LEDGER_CHECK_CMD and BANK_PAYOUTS_URL (or BANK_PAYOUTS_CMD)');
  }
  mkdirSync(OUT, { recursive: true });
  const { server, url: base } = await startSwaStandin({ apiUrl: SERVICE_URL });
  console.log(`page ${base} (Static Web Apps stand-in) -> /api with the signed-in principal -> ${SERVICE_URL}`);
  const browser = await chromium.launch({
    executablePath: process.env.CHROME_BIN ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
  const users = [];
  try {
    console.log('0. not signed in');
    const anon = await (await browser.newContext()).newPage();
    await anon.goto(base);
    await tid(anon, 'pay').waitFor();
    const anonBody = JSON.stringify({ claimId: '00000000-0000-4000-8000-0000000000a0', amount: '1.00', currency: 'EUR', payee: 'NL91ABNA0417164300' });
    const anonPost = await call(anon, 'POST', '/api/payments', { key: crypto.randomUUID(), body: anonBody });
    eq('POST without a session: 401 from the platform (route roles), before the backend', anonPost.status, 401);
    const forged = Buffer.from(JSON.stringify({ identityProvider: 'aad', userId: 'alice-oid', userDetails: 'alice', userRoles: ['anonymous', 'authenticated', 'Payments.Pay'] })).toString('base64');
    const forgedPost = await call(anon, 'GET', '/api/payments/00000000-0000-4000-8000-0000000000a0', { headers: { 'X-MS-CLIENT-PRINCIPAL': forged } });
    eq('a principal header forged by the browser does not sign anyone in: 401', forgedPost.status, 401);
    const direct = await fetch(`${SERVICE_URL}/api/payments`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', 'Idempotency-Key': crypto.randomUUID() }, body: anonBody,
    });
    const directBody = await direct.text();
    eq('the service itself, without a principal: 401', direct.status, 401);
    eq('the service itself, without a principal: problem caller-unknown', (() => { try { return JSON.parse(directBody).type; } catch { return directBody.slice(0, 120); } })(), `${PROBLEM}caller-unknown`);
    await anon.context().close();

    const alice = await signIn(browser, base, { userId: 'alice-oid', name: 'alice', roles: ['Payments.Pay'] });
    const bob = await signIn(browser, base, { userId: 'bob-oid', name: 'bob', roles: ['Payments.Pay'] });
    const carol = await signIn(browser, base, { userId: 'carol-oid', name: 'carol', roles: ['Payments.Read'] });
    users.push(alice, bob, carol);

    console.log('1. alice pays claim A on the page; her retry replays her answer');
    const a = await payOnPage(alice.page);
    check('alice: the page shows the payment', (await tid(alice.page, 'payment-result').count()) === 1, await text(alice.page, 'error-message'));
    eq('alice: 201', a.answers[0]?.status, 201);
    const aliceReplay = await call(alice.page, 'POST', '/api/payments', { key: a.key, body: a.posts[0].body });
    eq('alice, same key and body again: her stored status', aliceReplay.status, 201);
    eq('alice, same key and body again: Idempotent-Replayed', aliceReplay.replayed, 'true');
    eq('alice, same key and body again: her stored body, byte for byte', aliceReplay.body, a.answers[0]?.body);

    console.log("2. bob sends alice's key and body");
    const bobWithAliceKey = await call(bob.page, 'POST', '/api/payments', { key: a.key, body: a.posts[0].body });
    check("bob with alice's key: not her replayed answer", bobWithAliceKey.replayed !== 'true' && bobWithAliceKey.body !== a.answers[0]?.body,
      JSON.stringify(bobWithAliceKey).slice(0, 300));
    eq("bob with alice's key: 409", bobWithAliceKey.status, 409);
    eq("bob with alice's key: claim-already-paid", problemType(bobWithAliceKey), `${PROBLEM}claim-already-paid`);
    const aliceStored = JSON.parse(a.answers[0]?.body ?? '{}');
    check("bob learns nothing of alice's payment (no bank payment id, no creation time)",
      !(aliceStored.bankPaymentId && bobWithAliceKey.body.includes(aliceStored.bankPaymentId)) && !(aliceStored.createdAt && bobWithAliceKey.body.includes(aliceStored.createdAt)),
      bobWithAliceKey.body.slice(0, 300));
    eq('claim A: one payment', await ledger(a.claimId), 1);
    eq('claim A: one payout', await payouts(a.claimId), 1);

    console.log('3. bob pays claim B on the page; alice cannot replay his key');
    const b = await payOnPage(bob.page);
    check('bob: the page shows the payment', (await tid(bob.page, 'payment-result').count()) === 1, await text(bob.page, 'error-message'));
    eq('bob: 201', b.answers[0]?.status, 201);
    const bobReplay = await call(bob.page, 'POST', '/api/payments', { key: b.key, body: b.posts[0].body });
    eq('bob, his own key again: replayed', bobReplay.replayed, 'true');
    const aliceWithBobKey = await call(alice.page, 'POST', '/api/payments', { key: b.key, body: b.posts[0].body });
    check("alice with bob's key: not his replayed answer", aliceWithBobKey.replayed !== 'true' && aliceWithBobKey.body !== b.answers[0]?.body,
      JSON.stringify(aliceWithBobKey).slice(0, 300));
    eq("alice with bob's key: 409 claim-already-paid", `${aliceWithBobKey.status} ${problemType(aliceWithBobKey)}`, `409 ${PROBLEM}claim-already-paid`);
    eq('claim B: one payment', await ledger(b.claimId), 1);
    eq('claim B: one payout', await payouts(b.claimId), 1);

    console.log('4. reading payments');
    const aliceOwn = await call(alice.page, 'GET', `/api/payments/${a.claimId}`);
    eq('alice (no Payments.Read) reads her own payment: 200', aliceOwn.status, 200);
    const aliceOther = await call(alice.page, 'GET', `/api/payments/${b.claimId}`);
    check("alice (no Payments.Read) cannot read bob's payment (403 or 404)", aliceOther.status === 403 || aliceOther.status === 404, `${aliceOther.status} ${aliceOther.body.slice(0, 200)}`);
    check("...and learns none of its details", !aliceOther.body.includes(b.claimId) || aliceOther.status !== 200, aliceOther.body.slice(0, 200));
    const carolA = await call(carol.page, 'GET', `/api/payments/${a.claimId}`);
    const carolB = await call(carol.page, 'GET', `/api/payments/${b.claimId}`);
    eq('carol (Payments.Read) reads claim A: 200', carolA.status, 200);
    eq('carol (Payments.Read) reads claim B: 200', carolB.status, 200);

    console.log('5. carol (no Payments.Pay) presses Pay');
    const c = await payOnPage(carol.page);
    eq('carol: the page shows an error', await tid(carol.page, 'payment-error').count(), 1);
    eq('carol: 403', await text(carol.page, 'error-status'), '403');
    eq('carol: problem forbidden', await text(carol.page, 'error-type'), `${PROBLEM}forbidden`);
    eq('carol: not retried (one POST)', c.posts.length, 1);
    eq("carol's claim: no payment", await ledger(c.claimId), 0);
    eq("carol's claim: no payout", await payouts(c.claimId), 0);
    await alice.page.screenshot({ path: join(OUT, 'signed-in-alice.png'), fullPage: true });
    await carol.page.screenshot({ path: join(OUT, 'signed-in-carol-refused.png'), fullPage: true });

    console.log('6. end state');
    eq('claim A: still one payment and one payout', `${await ledger(a.claimId)}/${await payouts(a.claimId)}`, '1/1');
    eq('claim B: still one payment and one payout', `${await ledger(b.claimId)}/${await payouts(b.claimId)}`, '1/1');
  } catch (e) {
    failed++;
    console.log(`  FAIL ${e.stack ?? e}`);
    await users[0]?.page.screenshot({ path: join(OUT, 'signed-in-failure.png'), fullPage: true }).catch(() => {});
  } finally {
    await browser.close();
    server.close();
  }
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
