/**
 * The payment page: one form = one user intent = one idempotency key.
 *
 * The key is minted when the page opens (and for each new intent), shown on the page, and
 * reused for every attempt, every retry and every extra click until the intent has a
 * definitive outcome. It is replaced only when:
 * - the intent settled (success, or a final 4xx), and the user pays again; or
 * - the payload changed (same key + another payload would be a 422 from the server).
 * After an unknown outcome (no answer, 409 in-flight, 5xx after the last attempt) the key is
 * KEPT: pressing Pay again re-sends it and gets the stored answer instead of paying twice.
 *
 * The Pay button stays clickable while a request is pending on purpose: the guarantee must
 * not depend on disabling a button (Enter in a field, a script, a slow change detection can
 * all submit twice). A second click joins the pending call (`PaymentApi` shares it by key).
 */
import { Component, inject, signal } from '@angular/core';
import { FormBuilder, ReactiveFormsModule, Validators } from '@angular/forms';

import { AttemptReport, newIdempotencyKey } from '../payments/idempotency';
import { PaymentApi, PaymentFailure, PaymentRequest, PaymentResult } from '../payments/payment-api';

interface Intent {
  key: string;
  /** Canonical payload last sent with this key, null before the first send. */
  payload: string | null;
  /** True once the intent had a definitive outcome: the next Pay is a new intent. */
  settled: boolean;
}

type Phase = 'idle' | 'pending' | 'succeeded' | 'failed';

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

@Component({
  selector: 'app-payment-page',
  imports: [ReactiveFormsModule],
  templateUrl: './payment-page.html',
  styleUrl: './payment-page.css',
})
export class PaymentPage {
  private readonly api = inject(PaymentApi);

  // The claim id is prefilled with a random UUID (a demo; a real page gets it from the claim).
  protected readonly form = inject(FormBuilder).nonNullable.group({
    claimId: [newIdempotencyKey(), [Validators.required, Validators.pattern(UUID)]],
    amount: ['125.00', [Validators.required, Validators.pattern(/^\d{1,15}(\.\d{1,4})?$/)]],
    currency: ['EUR', [Validators.required, Validators.pattern(/^[A-Z]{3}$/)]],
    payee: ['NL91ABNA0417164300', [Validators.maxLength(70)]],
  });

  private intent: Intent = { key: newIdempotencyKey(), payload: null, settled: false };
  private pending: ReturnType<PaymentApi['pay']> | null = null;

  protected readonly key = signal(this.intent.key);
  protected readonly phase = signal<Phase>('idle');
  protected readonly clicks = signal(0);
  /** Clicks that joined an already pending call instead of starting one. */
  protected readonly joined = signal(0);
  protected readonly attempts = signal<AttemptReport[]>([]);
  protected readonly result = signal<PaymentResult | null>(null);
  protected readonly failure = signal<PaymentFailure | null>(null);
  protected readonly otherError = signal<string | null>(null);

  protected pay(): void {
    this.clicks.update((n) => n + 1);
    if (this.form.invalid) {
      this.form.markAllAsTouched();
      return;
    }
    const request = this.request();
    const payload = JSON.stringify(request);
    if (this.intent.settled || (this.intent.payload !== null && this.intent.payload !== payload)) {
      this.startIntent();
    }
    this.intent.payload = payload;

    const call = this.api.pay(request, this.intent.key, {
      onAttempt: (report) => this.attempts.update((list) => [...list, report]),
    });
    if (call === this.pending) {
      // Double click: same key, same in-flight call; nothing new is sent.
      this.joined.update((n) => n + 1);
      return;
    }
    this.pending = call;
    this.phase.set('pending');
    this.attempts.set([]);
    this.result.set(null);
    this.failure.set(null);
    this.otherError.set(null);

    const intent = this.intent;
    call.subscribe({
      next: (result) => {
        intent.settled = true;
        this.pending = null;
        this.result.set(result);
        this.phase.set('succeeded');
      },
      error: (err: unknown) => {
        this.pending = null;
        if (err instanceof PaymentFailure) {
          // Unknown outcome: keep the key so that Pay again is safe. Final: next Pay = new key.
          intent.settled = !err.outcomeUnknown;
          this.failure.set(err);
        } else {
          this.otherError.set(err instanceof Error ? err.message : String(err));
        }
        this.phase.set('failed');
      },
    });
  }

  /** A new intent: new claim id and new key (what "open the form again" would do). */
  protected newPayment(): void {
    if (this.phase() === 'pending') return;
    this.form.controls.claimId.setValue(newIdempotencyKey());
    this.startIntent();
    this.phase.set('idle');
    this.clicks.set(0);
    this.joined.set(0);
    this.attempts.set([]);
    this.result.set(null);
    this.failure.set(null);
    this.otherError.set(null);
  }

  protected describeStatus(a: AttemptReport): string {
    if (a.outcome === 'timeout') return 'timeout';
    if (a.status === 0) return 'network error';
    return String(a.status);
  }

  protected seconds(ms: number | undefined): string {
    return ms === undefined ? '—' : `${(ms / 1000).toFixed(2)} s`;
  }

  private startIntent(): void {
    this.intent = { key: newIdempotencyKey(), payload: null, settled: false };
    this.key.set(this.intent.key);
  }

  private request(): PaymentRequest {
    const v = this.form.getRawValue();
    const request: PaymentRequest = {
      claimId: v.claimId.trim().toLowerCase(),
      amount: v.amount.trim(),
      currency: v.currency.trim(),
    };
    if (v.payee.trim() !== '') request.payee = v.payee.trim();
    return request;
  }
}
