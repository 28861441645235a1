/**
 * The retry loop for requests that carry an idempotency key.
 *
 * Register once: `provideHttpClient(withInterceptors([idempotencyInterceptor]))`.
 *
 * Why an interceptor and not `retry()` at the call site: a call-site `retry()` re-subscribes
 * the whole chain, and any interceptor that mints a key per request would then send a NEW
 * key on each attempt, which is exactly the double payment the key exists to prevent. Here
 * the key comes from the caller (via `HttpContext`, minted once per user intent), is fixed
 * before the first attempt, and every attempt re-sends the same immutable `HttpRequest`
 * (Angular requests are immutable precisely so that interceptors can re-send them).
 *
 * Requests without `IDEMPOTENCY_KEY` in their context are passed through untouched: no
 * header, no retries. The rules themselves (what is retried, how long to wait) are the
 * pure functions in `idempotency.ts`.
 */
import {
  HttpErrorResponse,
  HttpEvent,
  HttpInterceptorFn,
  HttpResponse,
} from '@angular/common/http';
import { Observable, catchError, defer, switchMap, tap, throwError, timeout, timer } from 'rxjs';

import {
  ATTEMPT_LISTENER,
  AttemptListener,
  AttemptReport,
  IDEMPOTENCY_KEY,
  IDEMPOTENCY_KEY_HEADER,
  RETRY_POLICY,
  classifyError,
  isReplayed,
  isValidIdempotencyKey,
  parseRetryAfter,
  problemTypeOf,
  retryDelayMs,
} from './idempotency';

export const idempotencyInterceptor: HttpInterceptorFn = (req, next) => {
  const key = req.context.get(IDEMPOTENCY_KEY);
  if (key === null) {
    return next(req);
  }
  if (!isValidIdempotencyKey(key)) {
    // A bad key would get a 400 on every attempt; fail before sending anything.
    return throwError(() => new Error('Idempotency-Key must be 1-255 token characters (letters, digits, !#$%&\'*+-.^_`|~)'));
  }
  const policy = req.context.get(RETRY_POLICY);
  const listener = req.context.get(ATTEMPT_LISTENER);
  // Built once: every attempt sends this very request, so the key cannot drift.
  const keyed = req.clone({ headers: req.headers.set(IDEMPOTENCY_KEY_HEADER, key) });

  const attemptOnce = (attempt: number): Observable<HttpEvent<unknown>> =>
    next(keyed).pipe(
      // A hung connection must not hang the form: after `attemptTimeoutMs` without an
      // event the attempt is abandoned (the request is cancelled) and treated like a
      // network failure. The server may still finish it; the next attempt with the same
      // key then gets 409 in-flight or the replayed answer.
      timeout({
        each: policy.attemptTimeoutMs,
        with: () =>
          throwError(
            () =>
              new HttpErrorResponse({
                status: 0,
                statusText: 'Timeout',
                url: keyed.urlWithParams,
                error: new Error(`no answer within ${policy.attemptTimeoutMs} ms`),
              }),
          ),
      }),
      tap((event) => {
        if (event instanceof HttpResponse) {
          notify(listener, {
            attempt,
            status: event.status,
            outcome: 'success',
            replayed: isReplayed(event.headers),
            decision: 'done',
            reason: isReplayed(event.headers)
              ? 'replayed answer of an earlier attempt: success'
              : 'success',
          });
        }
      }),
      catchError((err: unknown) => {
        if (!(err instanceof HttpErrorResponse)) {
          // Not an HTTP outcome (a bug in another interceptor, a cancelled chain...).
          return throwError(() => err);
        }
        const status = err.status;
        const problemType = status === 0 ? undefined : problemTypeOf(err.error);
        const retryAfterMs = status === 0 ? undefined : parseRetryAfter(err.headers?.get('Retry-After'), Date.now());
        const { retry, reason } = classifyError(status, problemType);
        const base: AttemptReport = {
          attempt,
          status,
          outcome: status === 0 ? (err.statusText === 'Timeout' ? 'timeout' : 'network-error') : 'http-error',
          replayed: isReplayed(err.headers),
          problemType,
          retryAfterMs,
          decision: 'give-up',
          reason,
        };
        if (!retry) {
          notify(listener, base);
          return throwError(() => err);
        }
        if (attempt >= policy.maxAttempts) {
          notify(listener, { ...base, reason: `${reason}; no attempts left (${policy.maxAttempts})` });
          return throwError(() => err);
        }
        const wait = retryDelayMs(attempt, policy, retryAfterMs);
        notify(listener, { ...base, decision: 'retry', retryInMs: wait });
        return timer(wait).pipe(switchMap(() => attemptOnce(attempt + 1)));
      }),
    );

  return defer(() => attemptOnce(1));
};

function notify(listener: AttemptListener | null, report: AttemptReport): void {
  if (!listener) return;
  try {
    listener(report);
  } catch (e) {
    // A progress display must never break the payment flow.
    console.error('attempt listener failed', e);
  }
}
