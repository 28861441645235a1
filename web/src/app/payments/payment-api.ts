/**
 * `PaymentApi`: the claims-payments HTTP API for a front end.
 *
 * Deliberately thin. It does three things:
 * 1. puts the caller's idempotency key on the request (`HttpContext`), so that
 *    `idempotencyInterceptor` sends it as `Idempotency-Key` and runs the retries;
 * 2. shares one in-flight call per key: a second `pay()` with the same key while the first
 *    is pending (double click, Enter + click, an impatient re-submit) gets the SAME
 *    observable, so it starts no second request chain;
 * 3. turns the final answer into a `PaymentResult` or a `PaymentFailure` that says whether
 *    the outcome is known (so the page knows whether to keep the key).
 *
 * The key itself is the caller's job: mint one with `newIdempotencyKey()` when the user
 * starts an intent (the form opens), keep it until the intent has a definitive outcome,
 * and mint a new one when the payload changes. See web/README.md, "Client pattern".
 */
import { HttpClient, HttpContext, HttpErrorResponse, HttpResponse } from '@angular/common/http';
import { Injectable, InjectionToken, inject } from '@angular/core';
import { Observable, catchError, finalize, map, shareReplay, throwError } from 'rxjs';

import {
  ATTEMPT_LISTENER,
  AttemptListener,
  IDEMPOTENCY_KEY,
  PROBLEM_TYPES,
  RETRY_POLICY,
  RetryPolicy,
  classifyError,
  isReplayed,
  problemTypeOf,
} from './idempotency';

/** Base URL of the API, `/api` by default (same origin; see README for cross-origin). */
export const PAYMENTS_API_BASE_URL = new InjectionToken<string>('PAYMENTS_API_BASE_URL', {
  providedIn: 'root',
  factory: () => '/api',
});

export interface PaymentRequest {
  claimId: string;
  /** Decimal string, e.g. "125.00": never a JS number (no binary floating point for money). */
  amount: string;
  /** ISO 4217, e.g. "EUR". */
  currency: string;
  payee?: string;
  tenantId?: string;
}

export type PaymentStatus = 'paid' | 'recorded' | 'rejected' | 'needs_reconciliation' | 'in_progress' | string;

/** The payment resource, as the server returns it. */
export interface Payment {
  claimId: string;
  amount: string;
  currency: string;
  status: PaymentStatus;
  bankPaymentId: string | null;
  createdAt: string;
  updatedAt: string;
}

export interface PaymentResult {
  payment: Payment;
  /** 201 created by this intent, or 200 when the claim already had this very payment. */
  httpStatus: number;
  /** The answer was a replay of an earlier attempt of this intent (its response was lost). */
  replayed: boolean;
  /** `Location` of the resource, when readable. */
  location: string | null;
}

/** RFC 9457 problem details. */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  [extension: string]: unknown;
}

/** The final failure of a `pay()` call, after the interceptor's retries. */
export class PaymentFailure extends Error {
  constructor(
    /** HTTP status, 0 when no answer could be read. */
    readonly status: number,
    readonly problem: Problem | null,
    /**
     * True when we do not know whether the payment happened (network failure, timeout,
     * 409 in-flight, 5xx after the last attempt). Then KEEP the key: trying again with it
     * is safe and will get the stored answer. False when the answer is final (4xx).
     */
    readonly outcomeUnknown: boolean,
    message: string,
  ) {
    super(message);
    this.name = 'PaymentFailure';
  }

  /** The claim already has a different payment (409 claim-already-paid). */
  get claimAlreadyPaid(): boolean {
    return this.problem?.type === PROBLEM_TYPES.claimAlreadyPaid;
  }
}

export interface PayOptions {
  /** Told about every attempt (status, replayed, wait before the next one). */
  onAttempt?: AttemptListener;
  /** Override the default retry policy. */
  retryPolicy?: RetryPolicy;
}

@Injectable({ providedIn: 'root' })
export class PaymentApi {
  private readonly http = inject(HttpClient);
  private readonly baseUrl = inject(PAYMENTS_API_BASE_URL);
  /** Pending calls by key. An entry lives exactly as long as its request chain. */
  private readonly inFlight = new Map<string, { body: string; result$: Observable<PaymentResult> }>();

  /**
   * Pay a claim once. `key` is the intent's idempotency key (same key for every call made
   * for the same intent). Calling again with the same key while the first call is pending
   * returns the pending observable (options of the second call are ignored).
   */
  pay(request: PaymentRequest, key: string, options: PayOptions = {}): Observable<PaymentResult> {
    const body = JSON.stringify(request);
    const pending = this.inFlight.get(key);
    if (pending) {
      if (pending.body !== body) {
        // The server would answer 422 for this; refuse locally instead of sending it.
        return throwError(() => new Error('this idempotency key is in use with another payload: mint a new key'));
      }
      return pending.result$;
    }

    let context = new HttpContext().set(IDEMPOTENCY_KEY, key);
    if (options.onAttempt) context = context.set(ATTEMPT_LISTENER, options.onAttempt);
    if (options.retryPolicy) context = context.set(RETRY_POLICY, options.retryPolicy);

    const result$ = this.http
      .post<Payment>(`${this.baseUrl}/payments`, request, { observe: 'response', context })
      .pipe(
        map((response: HttpResponse<Payment>) => ({
          payment: response.body as Payment,
          httpStatus: response.status,
          replayed: isReplayed(response.headers),
          location: response.headers.get('Location'),
        })),
        catchError((err: unknown) => throwError(() => toFailure(err))),
        finalize(() => this.inFlight.delete(key)),
        // One request chain, however many subscribers; late subscribers get the outcome.
        shareReplay({ bufferSize: 1, refCount: false }),
      );
    this.inFlight.set(key, { body, result$ });
    return result$;
  }

  /** The payment of a claim (404 when there is none). GET is idempotent: no key needed. */
  get(claimId: string): Observable<Payment> {
    return this.http.get<Payment>(`${this.baseUrl}/payments/${encodeURIComponent(claimId)}`);
  }
}

function toFailure(err: unknown): PaymentFailure | unknown {
  if (!(err instanceof HttpErrorResponse)) return err;
  const problem = err.status === 0 ? null : asProblem(err.error);
  const { retry } = classifyError(err.status, problem?.type ?? problemTypeOf(err.error));
  // Retryable means "we could not learn the outcome"; so does an unknown 409 or a 500.
  const outcomeUnknown =
    retry || (err.status === 409 && problem?.type !== PROBLEM_TYPES.claimAlreadyPaid) || err.status >= 500;
  const message =
    err.status === 0
      ? `no answer from the service (${err.statusText || 'network error'})`
      : `${err.status} ${problem?.title ?? err.statusText}${problem?.detail ? `: ${problem.detail}` : ''}`;
  return new PaymentFailure(err.status, problem, outcomeUnknown, message);
}

function asProblem(body: unknown): Problem | null {
  let value = body;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch {
      return null;
    }
  }
  return value && typeof value === 'object' ? (value as Problem) : null;
}
