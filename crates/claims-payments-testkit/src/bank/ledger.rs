//! The bank's books: every request as it arrived and as it was answered, the payouts
//! made (from the validated request, [`ValidRequest`]), the state of each
//! Idempotency-Key, what the lookup lists and the fault state of `faults`. One mutex
//! guards them all, so a request's records, key state and the fault it takes change
//! together. Also the state the handle and the handlers share ([`Bank`]). Uses `faults`
//! only; `routes` serves these books over HTTP.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rust_decimal::Decimal;
use serde::Serialize;

use super::faults::{BankFault, FaultState};
use super::{BankAnswer, BankRequest, FakeBankSettings, MidPayoutHook};

/// One effective payout: money that left the bank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Payout {
    pub payment_id: String,
    pub idempotency_key: String,
    /// The request's `reference` (the service sends its Idempotency-Key).
    pub reference: Option<String>,
    pub claim_id: String,
    pub amount: Decimal,
    pub currency: String,
    pub payee: Option<String>,
}

/// A payout request whose body keeps the contract, as the bank pays it.
#[derive(Debug, Clone)]
pub(super) struct ValidRequest {
    pub(super) claim_id: String,
    pub(super) amount: Decimal,
    pub(super) currency: String,
    pub(super) payee: Option<String>,
    pub(super) reference: Option<String>,
}

/// A request as it arrived, before the bank did anything with it.
#[derive(Debug, Clone)]
pub(super) struct Arrival {
    pub(super) idempotency_key: Option<String>,
    pub(super) body: Vec<u8>,
    pub(super) authorization: Option<String>,
    /// The W3C trace context the caller sent (`traceparent`).
    pub(super) traceparent: Option<String>,
    pub(super) at: time::OffsetDateTime,
}

/// Everything the bank saw and did.
#[derive(Debug, Clone, Default)]
pub struct BankLedger {
    pub payouts: Vec<Payout>,
    pub requests: Vec<BankRequest>,
}

#[derive(Debug, Clone)]
pub(super) enum KeyState {
    Processing,
    Paid(String),
    Rejected,
}

#[derive(Debug)]
pub(super) struct KeyEntry {
    pub(super) request: serde_json::Value,
    pub(super) body: Vec<u8>,
    pub(super) state: KeyState,
    pub(super) first_seen: std::time::Instant,
}

#[derive(Debug, Default)]
pub(super) struct Books {
    pub(super) keys: HashMap<String, KeyEntry>,
    pub(super) lookups: u64,
    /// What tests scripted and the attempt counts of the seeded faults: under the same
    /// lock, so a request's arrival and the fault it takes are recorded together.
    pub(super) faults: FaultState,
    /// Payments the lookup lists beyond the bank's own: (reference, entry).
    pub(super) held: Vec<(String, serde_json::Value)>,
    /// Keys forgotten after the key window, and how often a forgotten key came back.
    pub(super) forgotten_keys: u64,
    pub(super) arrivals: Vec<Arrival>,
    pub(super) payouts: Vec<Payout>,
    pub(super) requests: Vec<BankRequest>,
}

/// What a valid request under a key meets, decided under the books' lock.
pub(super) enum Step {
    New,
    Replay(String),
    RejectedReplay,
    InProgress,
    Reused,
}

impl Books {
    /// Records a payout request as it arrived and returns the scripted fault it takes:
    /// both under the one lock, so arrivals and scripted faults pair up in order.
    pub(super) fn arrive(&mut self, arrival: Arrival) -> Option<BankFault> {
        self.arrivals.push(arrival);
        self.faults.next_payout_fault()
    }

    /// Counts a lookup: its number (from 1) and whether it takes one of the failing
    /// lookups a test asked for.
    pub(super) fn count_lookup(&mut self) -> (u64, bool) {
        self.lookups += 1;
        let failing = self.faults.take_failing_lookup();
        (self.lookups, failing)
    }

    /// The step for a valid request under `key` and, for a key seen before, whether the
    /// body bytes are the first request's. A new key is entered as Processing.
    pub(super) fn step(
        &mut self,
        key: &str,
        value: serde_json::Value,
        body: &[u8],
        key_window_ms: Option<u64>,
    ) -> (Step, Option<bool>) {
        // Past its window the bank has forgotten the key: the request is a new payout.
        let forget = key_window_ms.is_some_and(|window| {
            self.keys.get(key).is_some_and(|e| {
                !matches!(e.state, KeyState::Processing)
                    && e.first_seen.elapsed() >= Duration::from_millis(window)
            })
        });
        if forget {
            self.keys.remove(key);
            self.forgotten_keys += 1;
        }
        match self.keys.get(key) {
            Some(entry) if entry.request != value => (Step::Reused, None),
            Some(entry) => {
                let identical = Some(entry.body == body);
                match &entry.state {
                    KeyState::Processing => (Step::InProgress, identical),
                    KeyState::Paid(id) => (Step::Replay(id.clone()), identical),
                    KeyState::Rejected => (Step::RejectedReplay, identical),
                }
            }
            None => {
                self.keys.insert(
                    key.to_owned(),
                    KeyEntry {
                        request: value,
                        body: body.to_vec(),
                        state: KeyState::Processing,
                        first_seen: std::time::Instant::now(),
                    },
                );
                (Step::New, None)
            }
        }
    }

    /// Every payment the bank holds under `reference`, as the lookup lists it: its
    /// payouts, its refusals (whether or not it still remembers their keys) and what a
    /// test made it hold.
    pub(super) fn held_under(&self, reference: &str) -> Vec<serde_json::Value> {
        let mut held: Vec<serde_json::Value> = self
            .payouts
            .iter()
            .filter(|p| p.reference.as_deref() == Some(reference))
            .map(|p| {
                serde_json::json!({
                    "paymentId": p.payment_id, "status": "paid", "amount": p.amount.to_string(),
                    "currency": p.currency, "reference": reference,
                })
            })
            .collect();
        for (key, entry) in &self.keys {
            if matches!(entry.state, KeyState::Rejected) && entry.request["reference"] == reference
            {
                held.push(serde_json::json!({
                    "paymentId": format!("rej_{key}"), "status": "rejected",
                    "amount": entry.request["amount"], "currency": entry.request["currency"],
                    "reference": reference,
                }));
            }
        }
        held.extend(
            self.held
                .iter()
                .filter(|(r, _)| *r == reference)
                .map(|(_, v)| v.clone()),
        );
        held
    }
}

/// The state the handle and the handlers share.
pub(super) struct Bank {
    pub(super) settings: FakeBankSettings,
    pub(super) books: Mutex<Books>,
    pub(super) mid_payout: Mutex<Option<MidPayoutHook>>,
}

impl std::fmt::Debug for Bank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bank")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Bank {
    pub(super) fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hook a mid-payout fault calls, if the handle set one.
    pub(super) fn mid_payout_hook(&self) -> Option<MidPayoutHook> {
        self.mid_payout.lock().ok().and_then(|h| h.clone())
    }

    pub(super) fn record(
        &self,
        key: Option<&str>,
        body: &[u8],
        answer: BankAnswer,
        byte_identical: Option<bool>,
    ) {
        self.books().requests.push(BankRequest {
            idempotency_key: key.map(str::to_owned),
            body: body.to_vec(),
            answer,
            byte_identical,
        });
    }

    /// Makes the payout for `key` (which must be Processing) and returns its id.
    pub(super) fn pay(&self, key: &str, request: &ValidRequest) -> String {
        let mut books = self.books();
        let payment_id = format!("pay-{}", books.payouts.len() + 1);
        books.payouts.push(Payout {
            payment_id: payment_id.clone(),
            idempotency_key: key.to_owned(),
            reference: request.reference.clone(),
            claim_id: request.claim_id.clone(),
            amount: request.amount,
            currency: request.currency.clone(),
            payee: request.payee.clone(),
        });
        if let Some(entry) = books.keys.get_mut(key) {
            entry.state = KeyState::Paid(payment_id.clone());
        }
        payment_id
    }
}
