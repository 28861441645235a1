#!/usr/bin/env node
// `npm run e2e:fake`: starts the DEVELOPMENT FAKE service (e2e/fake-service.mjs) on a free
// port, runs e2e/payments.e2e.mjs against it with the adapters pointed at the fake's
// control endpoints, then stops the fake. This proves the page and the test; CI runs the
// same test against the real `serve` (see web/README.md).
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));

const fake = spawn(process.execPath, [join(HERE, 'fake-service.mjs'), '--port', '0'], {
  stdio: ['ignore', 'pipe', 'inherit'],
});
const url = await new Promise((resolve, reject) => {
  let buf = '';
  fake.stdout.on('data', (d) => {
    buf += d;
    const m = /listening (http:\/\/\S+)/.exec(buf);
    if (m) resolve(m[1]);
  });
  fake.on('exit', (code) => reject(new Error(`fake service exited (${code}) before listening`)));
  setTimeout(() => reject(new Error('fake service did not start within 10 s')), 10_000).unref();
});
console.log(`fake service (development only): ${url}`);

const fakeCli = `"${process.execPath}" "${join(HERE, 'fake-service.mjs')}"`;
const env = {
  ...process.env,
  SERVICE_URL: url,
  FAKE_URL: url,
  BANK_CONTROL_URL: `${url}/__fake/bank/fail-next`,
  LEDGER_CHECK_CMD: `${fakeCli} ledger-count {claimId}`,
  BANK_PAYOUTS_URL: `${url}/__fake/bank/payouts`,
};
const test = spawn(process.execPath, [join(HERE, 'payments.e2e.mjs')], { env, stdio: 'inherit' });
const code = await new Promise((resolve) => test.on('exit', (c) => resolve(c ?? 1)));
fake.kill('SIGTERM');
process.exit(code);
