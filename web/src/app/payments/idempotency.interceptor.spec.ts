import {
  HttpClient,
  HttpContext,
  HttpErrorResponse,
  HttpHeaders,
  provideHttpClient,
  withInterceptors,
} from '@angular/common/http';
import { HttpTestingController, TestRequest, provideHttpClientTesting } from '@angular/common/http/testing';
import { TestBed } from '@angular/core/testing';
import { firstValueFrom } from 'rxjs';

import {
  ATTEMPT_LISTENER,
  AttemptReport,
  DEFAULT_RETRY_POLICY,
  IDEMPOTENCY_KEY,
  PROBLEM_TYPES,
  RETRY_POLICY,
  RetryPolicy,
  classifyError,
  isValidIdempotencyKey,
  newIdempotencyKey,
  parseRetryAfter,
  retryDelayMs,
} from './idempotency';
import { idempotencyInterceptor } from './idempotency.interceptor';
import { PaymentApi, PaymentFailure, PaymentResult } from './payment-api';

const URL = '/api/payments';
const POLICY: RetryPolicy = { maxAttempts: 4, baseDelayMs: 100, maxDelayMs: 1_000, maxRetryAfterMs: 5_000, attemptTimeoutMs: 10_000 };
const BODY = { claimId: '8e03978e-40d5-43e8-bc93-6894a57f9324', amount: '125.00', currency: 'EUR' };
const PAYMENT = { ...BODY, status: 'paid', bankPaymentId: 'b1', createdAt: 'x', updatedAt: 'x' };
const problem = (type: string, status: number) => ({ type, title: 't', status, detail: 'd' });
const problemHeaders = (extra: Record<string, string> = {}) =>
  new HttpHeaders({ 'Content-Type': 'application/problem+json', ...extra });

describe('idempotency rules (pure)', () => {
  it('reads Retry-After as seconds or an HTTP date', () => {
    const now = Date.parse('Wed, 21 Oct 2015 07:28:00 GMT');
    expect(parseRetryAfter('2', now)).toBe(2000);
    expect(parseRetryAfter(' 0 ', now)).toBe(0);
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:28:03 GMT', now)).toBe(3000);
    expect(parseRetryAfter('Wed, 21 Oct 2015 07:27:00 GMT', now)).toBe(0); // past = now
    expect(parseRetryAfter('soon', now)).toBeUndefined();
    expect(parseRetryAfter('-1', now)).toBeUndefined();
    expect(parseRetryAfter('1.5', now)).toBeUndefined();
    expect(parseRetryAfter(null, now)).toBeUndefined();
  });

  it('waits at least the server Retry-After, capped, plus jitter', () => {
    expect(retryDelayMs(1, POLICY, 2000, () => 0)).toBe(2000);
    expect(retryDelayMs(1, POLICY, 2000, () => 0.999)).toBeLessThanOrEqual(2000 + POLICY.baseDelayMs);
    expect(retryDelayMs(1, POLICY, 3_600_000, () => 0)).toBe(POLICY.maxRetryAfterMs);
  });

  it('backs off exponentially with jitter, capped', () => {
    const lo = (n: number) => retryDelayMs(n, POLICY, undefined, () => 0);
    const hi = (n: number) => retryDelayMs(n, POLICY, undefined, () => 1);
    expect([lo(1), hi(1)]).toEqual([50, 100]);
    expect([lo(2), hi(2)]).toEqual([100, 200]);
    expect([lo(3), hi(3)]).toEqual([200, 400]);
    expect(hi(10)).toBe(POLICY.maxDelayMs);
  });

  it('retries only what is safe and useful to retry', () => {
    const retried = (status: number, type?: string) => classifyError(status, type).retry;
    expect(retried(0)).toBe(true);
    expect(retried(409, PROBLEM_TYPES.requestInFlight)).toBe(true);
    expect(retried(503)).toBe(true);
    expect(retried(502)).toBe(true);
    expect(retried(504)).toBe(true);
    expect(retried(429)).toBe(true);
    expect(retried(409, PROBLEM_TYPES.claimAlreadyPaid)).toBe(false);
    expect(retried(409)).toBe(false);
    expect(retried(400)).toBe(false);
    expect(retried(413)).toBe(false);
    expect(retried(422)).toBe(false);
    expect(retried(404)).toBe(false);
    expect(retried(500)).toBe(false);
  });

  it('mints valid, distinct keys and validates keys like the server', () => {
    const a = newIdempotencyKey();
    expect(a).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(newIdempotencyKey()).not.toBe(a);
    expect(isValidIdempotencyKey(a)).toBe(true);
    expect(isValidIdempotencyKey('')).toBe(false);
    expect(isValidIdempotencyKey('x'.repeat(256))).toBe(false);
    expect(isValidIdempotencyKey('é')).toBe(false);
    expect(isValidIdempotencyKey('a\nb')).toBe(false);
    // Not a bare token: the server would read these as two keys, parameters or bytes.
    expect(isValidIdempotencyKey('a, b')).toBe(false);
    expect(isValidIdempotencyKey('abc;x=1')).toBe(false);
    expect(isValidIdempotencyKey(':YWJj:')).toBe(false);
  });
});

describe('idempotencyInterceptor', () => {
  let http: HttpClient;
  let backend: HttpTestingController;
  let reports: AttemptReport[];

  beforeEach(() => {
    vi.useFakeTimers();
    vi.spyOn(Math, 'random').mockReturnValue(0);
    TestBed.configureTestingModule({
      providers: [provideHttpClient(withInterceptors([idempotencyInterceptor])), provideHttpClientTesting()],
    });
    http = TestBed.inject(HttpClient);
    backend = TestBed.inject(HttpTestingController);
    reports = [];
  });

  afterEach(() => {
    backend.verify();
    vi.useRealTimers();
    vi.restoreAllMocks();
  });

  /** POST with a key; returns the settled outcome as a promise-like record. */
  function post(key = 'key-1', policy = POLICY) {
    const context = new HttpContext()
      .set(IDEMPOTENCY_KEY, key)
      .set(RETRY_POLICY, policy)
      .set(ATTEMPT_LISTENER, (r) => reports.push(r));
    const outcome: { value?: unknown; error?: unknown; done: boolean } = { done: false };
    http.post(URL, BODY, { context, observe: 'response' }).subscribe({
      next: (v) => Object.assign(outcome, { value: v, done: true }),
      error: (e) => Object.assign(outcome, { error: e, done: true }),
    });
    return outcome;
  }

  function expectOne(key = 'key-1'): TestRequest {
    const req = backend.expectOne(URL);
    expect(req.request.headers.get('Idempotency-Key')).toBe(key);
    expect(req.request.body).toEqual(BODY);
    return req;
  }

  it('passes a request without a key through: no header, no retry', () => {
    let error: HttpErrorResponse | undefined;
    http.post(URL, BODY).subscribe({ error: (e) => (error = e) });
    const req = backend.expectOne(URL);
    expect(req.request.headers.has('Idempotency-Key')).toBe(false);
    req.flush(null, { status: 503, statusText: 'Unavailable', headers: { 'Retry-After': '1' } });
    vi.advanceTimersByTime(60_000);
    backend.expectNone(URL);
    expect(error?.status).toBe(503);
  });

  it('re-sends the same key through 503, network error, then the replayed success', () => {
    const out = post();
    expectOne().flush(problem('https://claims-payments/problems/bank-unavailable', 503), {
      status: 503, statusText: 'Service Unavailable', headers: problemHeaders({ 'Retry-After': '1' }),
    });
    vi.advanceTimersByTime(999);
    backend.expectNone(URL); // Retry-After honoured
    vi.advanceTimersByTime(1);
    expectOne().error(new ProgressEvent('error')); // answer lost
    vi.advanceTimersByTime(POLICY.baseDelayMs * 2 ** 1);
    expectOne().flush(PAYMENT, { status: 201, statusText: 'Created', headers: { 'Idempotent-Replayed': 'true' } });

    expect(out.done).toBe(true);
    expect(out.error).toBeUndefined();
    expect(reports.map((r) => [r.attempt, r.status, r.decision, r.replayed])).toEqual([
      [1, 503, 'retry', false],
      [2, 0, 'retry', false],
      [3, 201, 'done', true],
    ]);
    expect(reports[0].retryAfterMs).toBe(1000);
    expect(reports[0].retryInMs).toBe(1000);
  });

  it('retries 409 request-in-flight with the same key', () => {
    const out = post();
    expectOne().flush(problem(PROBLEM_TYPES.requestInFlight, 409), {
      status: 409, statusText: 'Conflict', headers: problemHeaders({ 'Retry-After': '2' }),
    });
    vi.advanceTimersByTime(2000);
    expectOne().flush(PAYMENT, { status: 201, statusText: 'Created' });
    expect(out.error).toBeUndefined();
    expect(reports.map((r) => r.decision)).toEqual(['retry', 'done']);
  });

  it('caps an HTTP-date Retry-After far in the future', () => {
    post();
    const later = new Date(Date.now() + 3_600_000).toUTCString();
    expectOne().flush(null, { status: 503, statusText: 'Unavailable', headers: { 'Retry-After': later } });
    vi.advanceTimersByTime(POLICY.maxRetryAfterMs);
    expectOne().flush(PAYMENT, { status: 201, statusText: 'Created' });
    expect(reports[0].retryInMs).toBe(POLICY.maxRetryAfterMs);
  });

  for (const [status, type] of [
    [400, 'https://claims-payments/problems/invalid-request'],
    [413, 'https://claims-payments/problems/payload-too-large'],
    [422, 'https://claims-payments/problems/idempotency-key-reused'],
    [409, PROBLEM_TYPES.claimAlreadyPaid],
  ] as const) {
    it(`does not retry ${status} ${type.split('/').pop()}`, () => {
      const out = post();
      expectOne().flush(problem(type, status), { status, statusText: 'x', headers: problemHeaders({ 'Retry-After': '1' }) });
      vi.advanceTimersByTime(60_000);
      backend.expectNone(URL);
      expect((out.error as HttpErrorResponse).status).toBe(status);
      expect(reports).toHaveLength(1);
      expect(reports[0].decision).toBe('give-up');
      expect(reports[0].problemType).toBe(type);
    });
  }

  it('reads the problem type from a text body too', () => {
    const out = post();
    expectOne().flush(JSON.stringify(problem(PROBLEM_TYPES.claimAlreadyPaid, 409)), {
      status: 409, statusText: 'Conflict', headers: problemHeaders(),
    });
    vi.advanceTimersByTime(60_000);
    backend.expectNone(URL);
    expect((out.error as HttpErrorResponse).status).toBe(409);
  });

  it('gives up after maxAttempts, each with the same key', () => {
    const out = post();
    for (let i = 1; i <= POLICY.maxAttempts; i++) {
      expectOne().flush(null, { status: 503, statusText: 'Unavailable' });
      vi.advanceTimersByTime(POLICY.maxDelayMs + POLICY.baseDelayMs);
    }
    backend.expectNone(URL);
    expect((out.error as HttpErrorResponse).status).toBe(503);
    expect(reports.map((r) => r.decision)).toEqual(['retry', 'retry', 'retry', 'give-up']);
  });

  it('treats a hung attempt as a network failure and retries it', () => {
    const out = post();
    const first = expectOne();
    vi.advanceTimersByTime(POLICY.attemptTimeoutMs);
    expect(first.cancelled).toBe(true);
    expect(reports[0]).toMatchObject({ status: 0, outcome: 'timeout', decision: 'retry' });
    vi.advanceTimersByTime(POLICY.baseDelayMs);
    expectOne().flush(PAYMENT, { status: 201, statusText: 'Created' });
    expect(out.error).toBeUndefined();
  });

  it('refuses an invalid key without sending anything', () => {
    const out = post('bad\nkey');
    backend.expectNone(URL);
    expect(out.error).toBeInstanceOf(Error);
  });

  it('uses the default policy when none is set', () => {
    expect(DEFAULT_RETRY_POLICY.maxAttempts).toBeGreaterThan(1);
    const context = new HttpContext().set(IDEMPOTENCY_KEY, 'k');
    http.post(URL, BODY, { context }).subscribe({ error: () => undefined });
    const req = backend.expectOne(URL);
    expect(req.request.headers.get('Idempotency-Key')).toBe('k');
    req.flush(PAYMENT, { status: 201, statusText: 'Created' });
  });
});

describe('PaymentApi', () => {
  let api: PaymentApi;
  let backend: HttpTestingController;

  beforeEach(() => {
    vi.useFakeTimers();
    TestBed.configureTestingModule({
      providers: [provideHttpClient(withInterceptors([idempotencyInterceptor])), provideHttpClientTesting()],
    });
    api = TestBed.inject(PaymentApi);
    backend = TestBed.inject(HttpTestingController);
  });

  afterEach(() => {
    backend.verify();
    vi.useRealTimers();
  });

  it('shares one in-flight call per key (double click)', async () => {
    const first = api.pay(BODY, 'k1');
    const second = api.pay(BODY, 'k1');
    expect(second).toBe(first);
    const results: PaymentResult[] = [];
    first.subscribe((r) => results.push(r));
    second.subscribe((r) => results.push(r));
    backend.expectOne(URL).flush(PAYMENT, { status: 201, statusText: 'Created', headers: { Location: '/api/payments/x' } });
    expect(results).toHaveLength(2);
    expect(results[0]).toMatchObject({ httpStatus: 201, replayed: false, location: '/api/payments/x' });
    // Settled: a later call with the same key is a new request (the server replays it).
    const again = api.pay(BODY, 'k1');
    expect(again).not.toBe(first);
    again.subscribe();
    backend.expectOne(URL).flush(PAYMENT, { status: 201, statusText: 'Created', headers: { 'Idempotent-Replayed': 'true' } });
    expect((await firstValueFrom(again)).replayed).toBe(true);
  });

  it('refuses the same pending key with another payload', () => {
    api.pay(BODY, 'k2').subscribe();
    let error: unknown;
    api.pay({ ...BODY, amount: '1.00' }, 'k2').subscribe({ error: (e) => (error = e) });
    expect(error).toBeInstanceOf(Error);
    backend.expectOne(URL).flush(PAYMENT, { status: 201, statusText: 'Created' });
  });

  it('says when the outcome is unknown (keep the key) or final', () => {
    const failures: PaymentFailure[] = [];
    const policy = { ...POLICY, maxAttempts: 1 };
    api.pay(BODY, 'k3', { retryPolicy: policy }).subscribe({ error: (e) => failures.push(e) });
    backend.expectOne(URL).error(new ProgressEvent('error'));
    api.pay(BODY, 'k4', { retryPolicy: policy }).subscribe({ error: (e) => failures.push(e) });
    backend.expectOne(URL).flush(problem(PROBLEM_TYPES.claimAlreadyPaid, 409), {
      status: 409, statusText: 'Conflict', headers: problemHeaders(),
    });
    api.pay(BODY, 'k5', { retryPolicy: policy }).subscribe({ error: (e) => failures.push(e) });
    backend.expectOne(URL).flush(problem(PROBLEM_TYPES.requestInFlight, 409), {
      status: 409, statusText: 'Conflict', headers: problemHeaders(),
    });
    expect(failures.map((f) => [f.status, f.outcomeUnknown, f.claimAlreadyPaid])).toEqual([
      [0, true, false],
      [409, false, true],
      [409, true, false],
    ]);
  });
});
