//! Settling one payment: hold its message's lease (the same conditional write a delivery
//! uses to take over), re-read the payment under it, ask the bank, pay now if the bank
//! holds nothing, and finalize conditional on both records read; or give the lease back
//! as it was found (also after a store error under the lease).

use crate::bank::{Lookup, PayoutOutcome, SendWindow};
use crate::consumer::OutcomeKind;
use crate::lease::liveness::GoneOwners;
use crate::lease::{self, Acquired, Bid, Lease, Seen};
use crate::store::{
    Finalize, InboxKey, InboxRecord, PaymentRecord, PaymentStatus, StoreError, Versioned,
};

use super::lookup::{judge, payable_request, Decision, Finding};
use super::report::{line, Line, Settlement};
use super::{Options, Reconciler};

/// The message's lease, held by this run: the record as written, its version, and
/// what to write back when nothing is settled.
struct Held {
    lease: Lease,
    /// The record as found; for a record this run created (the old one had expired),
    /// the new one with a lease that ran out when the payment was last touched, so the
    /// payment looks exactly as idle to the next run as it did to this one.
    give_back: InboxRecord,
}

impl Reconciler {
    /// Settles one listed payment, or with `--dry-run` says how a run would settle it.
    /// `gone`: the owners the run already found ended for this payment, so taking its
    /// lease reads no registration twice.
    pub(super) async fn settle(
        &self,
        listed: Versioned<PaymentRecord>,
        inbox: Option<Versioned<InboxRecord>>,
        gone: &GoneOwners,
        options: Options,
    ) -> Result<Line, StoreError> {
        if options.dry_run {
            // The same decision a real run makes, without the lease, the payout or a write.
            let p = &listed.record;
            let decision = match self.ask(p).await {
                Finding::NoneHeld => match payable_request(p) {
                    Ok(_) => Decision {
                        result: Settlement::PaidNow,
                        status: PaymentStatus::Paid,
                        bank_payment_id: None,
                        evidence: "the bank holds nothing under the reference: would pay now"
                            .into(),
                    },
                    Err(reason) => Decision::unknown(reason.to_string()),
                },
                finding => Decision::from_finding(finding),
            };
            return Ok(line(
                p,
                decision.result,
                decision.status,
                format!("dry run, nothing written: {}", decision.evidence),
            ));
        }
        let Some(held) = self.hold(&listed.record, inbox, gone).await? else {
            return Ok(line(
                &listed.record,
                Settlement::Skipped,
                listed.record.status,
                "a live delivery or another reconcile run holds the message".into(),
            ));
        };
        // Under the lease, the payment as it is now, not as the listing saw it: another
        // run or a delivery may have settled it since.
        let store = &self.store;
        // A store error under the lease gives the lease back first: held until it ran
        // out, the payment would wait for the lease (and, for a record this run created,
        // the minimum age) before the next run could try it again.
        let payment = match store
            .payment(listed.record.claim_id, listed.record.purpose)
            .await
        {
            Ok(Some(payment)) => payment,
            Ok(None) => {
                self.release(&held).await;
                return Err(StoreError::Permanent(format!(
                    "the payment of claim {} vanished during reconciliation",
                    listed.record.claim_id
                )));
            }
            Err(e) => {
                self.release(&held).await;
                return Err(e);
            }
        };
        let p = &payment.record;
        if !matches!(
            p.status,
            PaymentStatus::InProgress | PaymentStatus::NeedsReconciliation
        ) {
            self.release(&held).await;
            return Ok(line(
                p,
                Settlement::Skipped,
                p.status,
                format!(
                    "settled meanwhile by another run or a delivery (now {})",
                    p.status.as_str()
                ),
            ));
        }
        let decision = match self.ask(p).await {
            Finding::NoneHeld => self.pay_now(p).await,
            finding => Decision::from_finding(finding),
        };
        if decision.result == Settlement::StillUnknown {
            self.release(&held).await;
            return Ok(line(
                p,
                Settlement::StillUnknown,
                p.status,
                decision.evidence,
            ));
        }
        let now = self.ambient.now();
        let how = match decision.result {
            Settlement::PaidByLookup => "paid by lookup",
            Settlement::PaidNow => "paid now",
            Settlement::Rejected => "rejected",
            _ => "mismatch: needs a person",
        };
        let reason = format!("reconciled at {now} ({how}): {}", decision.evidence);
        let final_payment = PaymentRecord {
            status: decision.status,
            bank_payment_id: decision.bank_payment_id.or(p.bank_payment_id.clone()),
            status_reason: Some(reason.clone()),
            updated_at: now,
            ..p.clone()
        };
        let outcome = match decision.status {
            PaymentStatus::Paid => OutcomeKind::Paid,
            PaymentStatus::Rejected => OutcomeKind::Rejected,
            _ => OutcomeKind::NeedsReconciliation,
        };
        let final_inbox = lease::completed(&held.lease.record, outcome.into(), now);
        match store
            .finalize(Finalize {
                inbox: &final_inbox,
                inbox_version: &held.lease.version,
                payment: &final_payment,
                payment_version: Some(&payment.version),
            })
            .await
        {
            Ok(()) => Ok(line(p, decision.result, decision.status, reason)),
            // A redelivery took the message over, or the payment changed, meanwhile;
            // they finish it. Nothing was lost: our bank call, if any, was under the
            // same key too.
            Err(StoreError::PreconditionFailed) => Ok(line(
                p,
                Settlement::Skipped,
                p.status,
                "a live delivery or another run changed the records meanwhile; it settles them"
                    .into(),
            )),
            // Whether the finalize landed is unknown: giving the lease back is conditional
            // on the version we hold, so it is refused if it did, and leaves the records
            // as found (for the next run to ask the bank again) if it did not.
            Err(e) => {
                self.release(&held).await;
                Err(e)
            }
        }
    }

    /// Takes the message's lease with a conditional write, as a delivery would: over
    /// an existing inbox record (its version), or by creating one if it expired.
    /// `None`: someone else moved first.
    async fn hold(
        &self,
        p: &PaymentRecord,
        inbox: Option<Versioned<InboxRecord>>,
        gone: &GoneOwners,
    ) -> Result<Option<Held>, StoreError> {
        let store = self.store.as_ref();
        let policy = &self.policy;
        let now = self.ambient.now();
        let seen = match &inbox {
            Some(seen) => Seen::Record(seen),
            None => {
                // The inbox record expired (retention); the payment is the evidence.
                let key = InboxKey {
                    consumer: policy.consumer_name.clone(),
                    claim_id: p.claim_id,
                    message_id: p.message_id.clone(),
                };
                let terms = policy.terms();
                Seen::Nothing(lease::new_record(
                    &key,
                    &p.payload_hash,
                    self.me,
                    0,
                    terms,
                    now,
                    None,
                ))
            }
        };
        // Not a broker delivery: the lease decides (count 0), unless its process ended.
        let bid = Bid {
            me: self.me,
            delivery: 0,
            now,
        };
        let take = |record: &_| lease::taken_over(record, self.me, 0, policy.terms(), now);
        let lease = match Lease::acquire(store, seen, bid, &self.owners.seen_by(gone), take).await?
        {
            Acquired::Held { lease, .. } => lease,
            Acquired::Live(_) | Acquired::Lost => return Ok(None),
        };
        let give_back = match inbox {
            Some(seen) => seen.record,
            // Created by this run. Not `now`: a lease that ran out now would make the
            // payment look freshly idle, and the next run would wait the minimum age
            // again.
            None => InboxRecord {
                lease_until: Some(p.updated_at.min(lease.record.created_at)),
                ..lease.record.clone()
            },
        };
        Ok(Some(Held { lease, give_back }))
    }

    /// Gives the lease back as the message was found (or, for a record this run
    /// created, as idle as the payment was), so the next run or delivery may try at
    /// once and the payment looks no younger than before: a release must not hide it
    /// from the next run.
    async fn release(&self, held: &Held) {
        held.lease
            .give_back(self.store.as_ref(), held.give_back.clone())
            .await;
    }

    async fn ask(&self, p: &PaymentRecord) -> Finding {
        match self.bank.lookup(&p.idempotency_key).await {
            Lookup::Holds(held) => judge(p, &held),
            Lookup::Unknown { reason } => Finding::Unknown { reason },
        }
    }

    /// The bank holds nothing under the reference: pay now, under the same key and the
    /// same stored bytes.
    async fn pay_now(&self, p: &PaymentRecord) -> Decision {
        let body = match payable_request(p) {
            Ok(body) => body,
            Err(reason) => return Decision::unknown(reason.to_string()),
        };
        let policy = &self.policy;
        // An authoritative "none" means the bank holds nothing under this reference:
        // this request starts a new key window.
        let window = SendWindow::new(
            policy.retry_budget,
            self.ambient.now(),
            policy.bank_key_window,
        );
        match self.bank.pay(&p.idempotency_key, body, window).await {
            PayoutOutcome::Paid { payment_id } => Decision {
                result: Settlement::PaidNow,
                status: PaymentStatus::Paid,
                evidence: format!("bank held nothing under the reference; paid now as {payment_id}"),
                bank_payment_id: Some(payment_id),
            },
            PayoutOutcome::Rejected { reason, .. } => Decision {
                result: Settlement::Rejected,
                status: PaymentStatus::Rejected,
                bank_payment_id: None,
                evidence: format!("bank held nothing; the new request was refused: {reason}"),
            },
            PayoutOutcome::KeyMismatch { reason } => Decision {
                result: Settlement::Mismatch,
                status: PaymentStatus::Mismatched,
                bank_payment_id: None,
                evidence: format!("bank held nothing under the reference, yet refused the key: {reason}; never sent again, check by hand"),
            },
            PayoutOutcome::KeyWindowClosed { last_error, .. }
            | PayoutOutcome::GaveUp { last_error, .. } => {
                Decision::unknown(format!("paying now did not finish: {last_error}"))
            }
            PayoutOutcome::ServiceFault { reason, .. }
            | PayoutOutcome::ClockUntrusted { reason, .. } => Decision::unknown(reason),
        }
    }
}
