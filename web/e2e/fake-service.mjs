#!/usr/bin/env node
// DEVELOPMENT FAKE of the claims-payments HTTP API. Not the service, not used in CI.
//
// It implements the POST /api/payments and GET /api/payments/{claimId} contract (web/README.md,
// "The API contract") with an in-memory key table, so that the page and the e2e test can be
// developed and self-checked before the Rust endpoint exists. CI runs payments.e2e.mjs
// against the real `serve` (SERVICE_URL); a green run against this fake proves the page and
// the test, not the service.
//
// Usage:
//   node e2e/fake-service.mjs [--port 3000] [--processing-ms 50]   # serve (port 0 = any free port;
//                                                                   # prints "listening <url>")
//   node e2e/fake-service.mjs ledger-count <claimId>                # prints the payment count
//   node e2e/fake-service.mjs payout-count <claimId>                # prints the payout count
//     (both read FAKE_URL, default http://127.0.0.1:3000)
//
// Control endpoints (the real service has none of these):
//   POST /__fake/bank/fail-next   {"count": N}  the next N payouts fail: 503 + Retry-After, key released
//   POST /__fake/store/fail-next  {"count": N}  the next N POSTs fail before any work: 503
//   POST /__fake/drop-next        {"count": N}  the next N POSTs are fully processed, then the
//                                               connection is destroyed (answer lost)
//   GET  /__fake/ledger?claimId=  {"count", "payments": [...]}
//   GET  /__fake/bank/payouts?claimId=  {"count", "payouts": [...]}
//   GET  /__fake/requests         every POST seen: key, status, replayed
//   POST /__fake/reset
import http from 'node:http';
import { createHash } from 'node:crypto';
import { pathToFileURL } from 'node:url';

const PROBLEM = 'https://claims-payments/problems/';
const MAX_BODY = 1024 * 1024;
const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

export function createFakeService({ processingMs = 50, retryAfterSeconds = 1 } = {}) {
  const state = fresh();
  function fresh() {
    return {
      keys: new Map(), // scope\0key -> { fingerprint, inFlight, status, headers, body }
      payments: new Map(), // claimId -> { payment, fingerprint }
      payouts: [],
      requests: [],
      bankFailNext: 0,
      storeFailNext: 0,
      dropNext: 0,
    };
  }

  const server = http.createServer(async (req, res) => {
    try {
      await route(req, res);
    } catch (e) {
      console.error('fake-service:', e);
      if (!res.headersSent) send(res, 500, problemBody('internal', 'Internal error', 500, String(e)));
    }
  });

  async function route(req, res) {
    const url = new URL(req.url, 'http://fake');
    const path = url.pathname;
    if (path.startsWith('/__fake/')) return control(req, res, url);
    if (path === '/api/payments' && req.method === 'POST') return postPayment(req, res);
    const m = /^\/api\/payments\/([^/]+)$/.exec(path);
    if (m && req.method === 'GET') {
      const entry = state.payments.get(decodeURIComponent(m[1]).toLowerCase());
      if (!entry) return send(res, 404, problemBody('not-found', 'No payment for this claim', 404, 'no payment'));
      return send(res, 200, JSON.stringify(entry.payment), { 'Content-Type': 'application/json' });
    }
    if (path === '/api/payments' || m) {
      return send(res, 405, problemBody('method-not-allowed', 'Method not allowed', 405, req.method), {
        Allow: path === '/api/payments' ? 'POST' : 'GET',
      });
    }
    return send(res, 404, problemBody('not-found', 'Not found', 404, path));
  }

  async function postPayment(req, res) {
    const record = { key: null, status: 0, replayed: false, at: new Date().toISOString() };
    state.requests.push(record);
    const answer = (status, body, headers = {}) => {
      record.status = status;
      record.replayed = headers['Idempotent-Replayed'] === 'true';
      return send(res, status, body, headers);
    };

    // 1. Size before anything else (Content-Length, then the bytes actually read).
    const declared = Number(req.headers['content-length'] ?? '0');
    if (declared > MAX_BODY) {
      req.resume();
      return answer(413, problemBody('payload-too-large', 'Request body too large', 413, `limit ${MAX_BODY} bytes`), {
        Connection: 'close',
      });
    }
    const raw = await readBody(req, MAX_BODY);
    if (raw === null) {
      return answer(413, problemBody('payload-too-large', 'Request body too large', 413, `limit ${MAX_BODY} bytes`), {
        Connection: 'close',
      });
    }

    // 2. The key: bare token or sf-string, printable ASCII, 1-255.
    const key = parseKey(req.headers['idempotency-key']);
    record.key = typeof key === 'string' ? key : null;
    if (typeof key !== 'string') {
      return answer(400, problemBody('invalid-idempotency-key', 'Idempotency-Key is missing or malformed', 400, key.error));
    }

    // 3. The body.
    const ct = String(req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
    if (ct !== 'application/json') {
      return answer(400, problemBody('invalid-request', 'Invalid request', 400, 'Content-Type must be application/json'));
    }
    const parsed = validate(raw);
    if (parsed.error) {
      return answer(400, problemBody('invalid-request', 'Invalid request', 400, parsed.error, { field: parsed.field }));
    }
    const p = parsed.value;
    const fingerprint = createHash('sha256').update(JSON.stringify(p)).digest('hex');

    if (state.storeFailNext > 0) {
      state.storeFailNext -= 1;
      return answer(503, problemBody('service-unavailable', 'Store unavailable', 503, 'try again later'), {
        'Retry-After': String(retryAfterSeconds),
      });
    }

    // 4. The key table (keys are scoped by tenant).
    const scoped = `${p.tenantId ?? ''}\u0000${key}`;
    const seen = state.keys.get(scoped);
    if (seen) {
      if (seen.fingerprint !== fingerprint) {
        return answer(422, problemBody('idempotency-key-reused', 'Idempotency-Key already used with another payload', 422,
          'send a new key for a new payload'));
      }
      if (seen.inFlight) {
        return answer(409, problemBody('request-in-flight', 'A request with this Idempotency-Key is in progress', 409,
          'retry later with the same key'), { 'Retry-After': String(retryAfterSeconds) });
      }
      return answer(seen.status, seen.body, { ...seen.headers, 'Idempotent-Replayed': 'true' });
    }
    const entry = { fingerprint, inFlight: true, status: 0, headers: {}, body: '' };
    state.keys.set(scoped, entry);
    const complete = (status, body, headers) => {
      Object.assign(entry, { inFlight: false, status, body, headers });
    };

    await sleep(processingMs);

    // 5. A claim pays once, whatever the key.
    const existing = state.payments.get(p.claimId);
    if (existing) {
      if (existing.fingerprint === fingerprint) {
        complete(200, JSON.stringify(existing.payment), {
          'Content-Type': 'application/json',
          'Content-Location': `/api/payments/${p.claimId}`,
        });
      } else {
        complete(409, problemBody('claim-already-paid', 'Claim already has a payment', 409,
          'the claim has a payment with another amount, currency or payee'), {});
      }
      return finish(res, answer, entry, record);
    }

    // 6. The bank.
    if (state.bankFailNext > 0) {
      state.bankFailNext -= 1;
      state.keys.delete(scoped); // nothing happened: the key stays usable
      return answer(503, problemBody('bank-unavailable', 'Bank unavailable', 503, 'the payout was not made; retry later'), {
        'Retry-After': String(retryAfterSeconds),
      });
    }
    const now = new Date().toISOString();
    const bankPaymentId = `bank_${String(state.payouts.length + 1).padStart(6, '0')}`;
    state.payouts.push({ paymentId: bankPaymentId, idempotencyKey: key, claimId: p.claimId, amount: p.amount,
      currency: p.currency, payee: p.payee ?? null, at: now });
    const payment = { claimId: p.claimId, amount: p.amount, currency: p.currency, status: 'paid', bankPaymentId,
      createdAt: now, updatedAt: now };
    state.payments.set(p.claimId, { payment, fingerprint });
    complete(201, JSON.stringify(payment), {
      'Content-Type': 'application/json',
      Location: `/api/payments/${p.claimId}`,
    });
    return finish(res, answer, entry, record);
  }

  function finish(res, answer, entry, record) {
    if (state.dropNext > 0) {
      state.dropNext -= 1;
      record.status = entry.status;
      record.dropped = true; // processed, answer lost
      res.socket?.destroy();
      return;
    }
    return answer(entry.status, entry.body, entry.headers);
  }

  async function control(req, res, url) {
    const json = (status, v) => send(res, status, JSON.stringify(v), { 'Content-Type': 'application/json' });
    const count = async () => {
      const raw = await readBody(req, 4096);
      const n = Number(JSON.parse(raw || '{}').count ?? 1);
      if (!Number.isInteger(n) || n < 0) throw new Error('count must be a non-negative integer');
      return n;
    };
    const claim = url.searchParams.get('claimId')?.toLowerCase();
    switch (`${req.method} ${url.pathname}`) {
      case 'POST /__fake/bank/fail-next':
        state.bankFailNext = await count();
        return json(200, { bankFailNext: state.bankFailNext });
      case 'POST /__fake/store/fail-next':
        state.storeFailNext = await count();
        return json(200, { storeFailNext: state.storeFailNext });
      case 'POST /__fake/drop-next':
        state.dropNext = await count();
        return json(200, { dropNext: state.dropNext });
      case 'GET /__fake/ledger': {
        const payments = [...state.payments.values()].map((e) => e.payment).filter((x) => !claim || x.claimId === claim);
        return json(200, { count: payments.length, payments });
      }
      case 'GET /__fake/bank/payouts': {
        const payouts = state.payouts.filter((x) => !claim || x.claimId === claim);
        return json(200, { count: payouts.length, payouts });
      }
      case 'GET /__fake/requests':
        return json(200, state.requests);
      case 'POST /__fake/reset':
        Object.assign(state, fresh());
        return json(200, { reset: true });
      default:
        return json(404, { error: 'unknown control endpoint' });
    }
  }

  return { server, state };
}

/** Bare token or RFC 9651 sf-string; printable ASCII, 1-255 characters. */
function parseKey(header) {
  if (header === undefined) return { error: 'the Idempotency-Key header is required' };
  if (Array.isArray(header)) return { error: 'send one Idempotency-Key' };
  let v = header.trim();
  if (v.startsWith('"')) {
    if (v.length < 2 || !v.endsWith('"')) return { error: 'unterminated string' };
    const inner = v.slice(1, -1);
    let out = '';
    for (let i = 0; i < inner.length; i++) {
      const c = inner[i];
      if (c === '\\') {
        const n = inner[++i];
        if (n !== '"' && n !== '\\') return { error: 'bad escape' };
        out += n;
      } else if (c === '"') {
        return { error: 'unescaped quote' };
      } else out += c;
    }
    v = out;
  }
  if (v.length < 1 || v.length > 255) return { error: 'the key must be 1-255 characters' };
  if (!/^[\x20-\x7e]+$/.test(v)) return { error: 'the key must be printable ASCII' };
  return v;
}

function validate(raw) {
  let body;
  try {
    body = JSON.parse(raw);
  } catch {
    return { error: 'the body is not JSON', field: null };
  }
  if (!body || typeof body !== 'object' || Array.isArray(body)) return { error: 'the body must be a JSON object', field: null };
  const bad = (field, why) => ({ error: `${field}: ${why}`, field });
  if (typeof body.claimId !== 'string' || !UUID.test(body.claimId)) return bad('claimId', 'must be a UUID');
  if (typeof body.amount !== 'string' || !/^\d{1,15}(\.\d{1,4})?$/.test(body.amount) || !/[1-9]/.test(body.amount)) {
    return bad('amount', 'must be a positive decimal string, e.g. "125.00"');
  }
  if (typeof body.currency !== 'string' || !/^[A-Z]{3}$/.test(body.currency)) return bad('currency', 'must be an ISO 4217 code');
  if (body.payee !== undefined && (typeof body.payee !== 'string' || !/^[\x20-\x7e]{1,70}$/.test(body.payee))) {
    return bad('payee', 'printable ASCII, up to 70 characters');
  }
  if (body.tenantId !== undefined && (typeof body.tenantId !== 'string' || !/^[A-Za-z0-9._-]{1,64}$/.test(body.tenantId))) {
    return bad('tenantId', 'letters, digits, -_. up to 64');
  }
  const value = { claimId: body.claimId.toLowerCase(), amount: body.amount, currency: body.currency };
  if (body.payee !== undefined) value.payee = body.payee;
  if (body.tenantId !== undefined) value.tenantId = body.tenantId;
  return { value };
}

function problemBody(type, title, status, detail, extra = {}) {
  return JSON.stringify({ type: PROBLEM + type, title, status, detail, ...extra });
}

function send(res, status, body, headers = {}) {
  const h = { ...headers };
  if (body && !Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) {
    h['Content-Type'] = status >= 400 ? 'application/problem+json' : 'application/json';
  }
  res.writeHead(status, h);
  res.end(body);
}

function readBody(req, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let over = false;
    req.on('data', (c) => {
      size += c.length;
      if (size > limit) over = true;
      else chunks.push(c);
    });
    req.on('end', () => resolve(over ? null : Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- CLI ----
async function main(argv) {
  const [cmd, ...rest] = argv;
  if (cmd === 'ledger-count' || cmd === 'payout-count') {
    const claimId = rest[0] ?? process.env.CLAIM_ID;
    if (!claimId) throw new Error(`${cmd} <claimId>`);
    const base = process.env.FAKE_URL ?? 'http://127.0.0.1:3000';
    const path = cmd === 'ledger-count' ? '/__fake/ledger' : '/__fake/bank/payouts';
    const r = await fetch(`${base}${path}?claimId=${encodeURIComponent(claimId)}`);
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    console.log((await r.json()).count);
    return;
  }
  const opt = (name, dflt) => {
    const i = argv.indexOf(name);
    return i >= 0 ? Number(argv[i + 1]) : dflt;
  };
  const port = opt('--port', Number(process.env.PORT ?? 3000));
  const { server } = createFakeService({ processingMs: opt('--processing-ms', 50) });
  server.listen(port, '127.0.0.1', () => {
    console.log(`listening http://127.0.0.1:${server.address().port} (DEVELOPMENT FAKE of claims-payments)`);
  });
  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(e.message);
    process.exit(1);
  });
}
