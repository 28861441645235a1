/**
 * Idempotent requests to the claims-payments API: the rules, as pure functions.
 *
 * Copy this file together with `idempotency.interceptor.ts` and `payment-api.ts`.
 * Everything that decides "retry or not, and after how long" lives here so it can be
 * unit-tested without HTTP; the interceptor only runs the loop.
 *
 * The contract these rules follow (see web/README.md, "Client pattern"):
 * - One `Idempotency-Key` per user intent, minted when the intent starts, sent on every
 *   attempt. The server pays at most once per key, so re-sending the same key is always
 *   safe; sending a new key for the same intent is what could pay twice (the server's
 *   per-claim check is the second line of defence, not the first).
 * - Retry (same key) when the outcome is unknown or the server said "later": network
 *   failure/timeout (status 0), 409 `request-in-flight`, 429, 502, 503, 504.
 * - Never retry when the request itself is wrong or the answer is final: 400, 413, 422,
 *   409 `claim-already-paid`, any other 4xx, 500 (a bug: surface it; the key stays
 *   usable, so pressing Pay again is still safe).
 * - A 2xx is success, including a replay (`Idempotent-Replayed: true`): the replay is the
 *   stored answer of the first attempt whose response we lost.
 * - The two 409s are told apart by the problem `type` (the body), never by the status
 *   alone: the body is always readable, while custom headers may be hidden by CORS.
 */
import { HttpContextToken, HttpHeaders } from '@angular/common/http';

/** Problem type URIs shared with the Rust service (RFC 9457 `type`). */
export const PROBLEM_TYPES = {
  /** 409: the same key is being processed right now. Retry later with the SAME key. */
  requestInFlight: 'https://claims-payments/problems/request-in-flight',
  /** 409: the claim already has a payment with another payload. Final: do NOT retry. */
  claimAlreadyPaid: 'https://claims-payments/problems/claim-already-paid',
} as const;

/** Header carrying the key. Bare token on the wire (the server also accepts an sf-string). */
export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';
/** Set by the server on a replayed answer (Stripe's name). */
export const REPLAYED_HEADER = 'Idempotent-Replayed';

/** How the interceptor retries. All times in milliseconds. */
export interface RetryPolicy {
  /** Total attempts, first one included. Bounded: a payment form must end in a known state. */
  maxAttempts: number;
  /** First backoff step; doubles per retry (exponential), jittered. */
  baseDelayMs: number;
  /** Upper bound of one backoff step. */
  maxDelayMs: number;
  /**
   * Upper bound applied to a server's `Retry-After`. The server's hint wins over our
   * backoff, but a misconfigured "Retry-After: 3600" must not freeze the page for an hour:
   * we wait at most this long, and the attempt budget still applies.
   */
  maxRetryAfterMs: number;
  /**
   * One attempt gives up after this long and counts as a network failure (status 0). The
   * server may still complete it: that is exactly the case the key covers, the next attempt
   * gets 409 in-flight or the replay.
   */
  attemptTimeoutMs: number;
}

export const DEFAULT_RETRY_POLICY: RetryPolicy = {
  maxAttempts: 5,
  baseDelayMs: 300,
  maxDelayMs: 5_000,
  maxRetryAfterMs: 10_000,
  attemptTimeoutMs: 15_000,
};

/** What one attempt ended with, reported to the caller (the page shows these). */
export interface AttemptReport {
  /** 1-based. */
  attempt: number;
  /** HTTP status, or 0 for a network error or a timeout. */
  status: number;
  /** `network-error` / `timeout` when no HTTP answer was read. */
  outcome: 'success' | 'network-error' | 'timeout' | 'http-error';
  /** The server replayed a stored answer (`Idempotent-Replayed: true`). */
  replayed: boolean;
  /** RFC 9457 `type` of an error answer, when there was one. */
  problemType?: string;
  /** Decision taken after this attempt. */
  decision: 'done' | 'retry' | 'give-up';
  /** Why (human-readable, for logs and the page). */
  reason: string;
  /** Wait before the next attempt, when `decision === 'retry'`. */
  retryInMs?: number;
  /** The server's `Retry-After`, in ms, if it sent one we could read. */
  retryAfterMs?: number;
}

export type AttemptListener = (report: AttemptReport) => void;

/**
 * The intent's key. Put it on the request with
 * `new HttpContext().set(IDEMPOTENCY_KEY, key)`: the interceptor then sets the header and
 * owns the retry loop. A request without it passes through the interceptor untouched (no
 * header, no retries): retrying a POST without a key is how double payments happen.
 */
export const IDEMPOTENCY_KEY = new HttpContextToken<string | null>(() => null);
/** Override the retry policy for one request. */
export const RETRY_POLICY = new HttpContextToken<RetryPolicy>(() => DEFAULT_RETRY_POLICY);
/** Optional per-request listener told about each attempt (for progress UI, logs). */
export const ATTEMPT_LISTENER = new HttpContextToken<AttemptListener | null>(() => null);

/**
 * A fresh key for a new user intent: a random (v4) UUID.
 * `crypto.randomUUID()` exists only in secure contexts (https, or http on localhost /
 * 127.0.0.1); elsewhere the same 122 random bits come from `crypto.getRandomValues()`,
 * which every browser has. Never `Math.random()`: a guessable key could collide with
 * another user's and replay their answer.
 */
export function newIdempotencyKey(): string {
  if (typeof crypto.randomUUID === 'function') return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/**
 * The key goes on the wire bare (unquoted), and the server reads a bare key only if it is
 * an RFC 9110 token (letters, digits and !#$%&'*+-.^_`|~), 1 to 255 characters: anything
 * else (a space, a comma, ';', ':') could be a merged header or another Structured Field.
 * UUIDs from `newIdempotencyKey()` always are.
 */
export function isValidIdempotencyKey(key: string): boolean {
  return key.length >= 1 && key.length <= 255 && /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/.test(key);
}

/**
 * `Retry-After` in milliseconds from now: delta-seconds ("2") or an HTTP-date
 * ("Wed, 21 Oct 2015 07:28:00 GMT"). `undefined` when absent or unreadable (then our own
 * backoff applies). A date in the past means "now" (0).
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value == null) return undefined;
  const v = value.trim();
  if (v === '') return undefined;
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  // Only accept something that looks like an HTTP-date, not any string Date.parse likes.
  if (!/[A-Za-z]{3}/.test(v)) return undefined;
  const at = Date.parse(v);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - nowMs);
}

/**
 * Wait before retry number `retry` (1 = the wait after the first attempt).
 *
 * Without `Retry-After`: exponential backoff with "equal jitter", half fixed and half
 * random, so clients that failed together (a 503 burst) do not come back together, and
 * the wait never collapses to ~0 as "full jitter" can.
 * With `Retry-After`: the server's value (capped at `maxRetryAfterMs`) plus up to one
 * base step of jitter, never less than the server asked for, except when capped.
 */
export function retryDelayMs(
  retry: number,
  policy: RetryPolicy,
  retryAfterMs: number | undefined,
  random: () => number = Math.random,
): number {
  if (retryAfterMs !== undefined) {
    return Math.round(Math.min(retryAfterMs, policy.maxRetryAfterMs) + random() * policy.baseDelayMs);
  }
  const step = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (retry - 1));
  return Math.round(step / 2 + random() * (step / 2));
}

/** The RFC 9457 `type` of an error body, whether Angular parsed it or left it as text. */
export function problemTypeOf(body: unknown): string | undefined {
  let value = body;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value);
    } catch {
      return undefined;
    }
  }
  if (value && typeof value === 'object' && typeof (value as { type?: unknown }).type === 'string') {
    return (value as { type: string }).type;
  }
  return undefined;
}

export interface Classification {
  retry: boolean;
  reason: string;
}

/**
 * Retry or not, for an error answer (non-2xx) or a network failure (status 0).
 * This is the whole retry rule set; keep it in one place.
 */
export function classifyError(status: number, problemType: string | undefined): Classification {
  switch (status) {
    case 0:
      return { retry: true, reason: 'no answer (network error or timeout): outcome unknown, retry with the same key' };
    case 409:
      if (problemType === PROBLEM_TYPES.requestInFlight) {
        return { retry: true, reason: 'the first request with this key is still in flight' };
      }
      if (problemType === PROBLEM_TYPES.claimAlreadyPaid) {
        return { retry: false, reason: 'the claim already has a different payment: final' };
      }
      // Unknown 409: we cannot tell which one it is. Do not loop on it; the key is kept,
      // so the user can safely try again.
      return { retry: false, reason: 'conflict of an unknown type: not retried' };
    case 429:
      return { retry: true, reason: 'rate limited' };
    case 502:
    case 503:
    case 504:
      return { retry: true, reason: 'service or bank unavailable: the key stays usable' };
    case 400:
      return { retry: false, reason: 'invalid request or key: fix it, then a new key' };
    case 413:
      return { retry: false, reason: 'request too large' };
    case 422:
      return { retry: false, reason: 'key already used with another payload: a client bug' };
    default:
      return { retry: false, reason: status >= 500 ? 'server error: not retried automatically' : 'client error' };
  }
}

/** True when a response (success or error) carries `Idempotent-Replayed: true`. */
export function isReplayed(headers: HttpHeaders | null | undefined): boolean {
  return headers?.get(REPLAYED_HEADER)?.trim().toLowerCase() === 'true';
}

