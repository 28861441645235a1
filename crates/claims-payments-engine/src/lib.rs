//! The guarantee: each approved claim paid exactly once, although the broker that asks
//! for the payment delivers at least once, processes crash between any two steps, and
//! the bank may answer late or not at all.
//!
//! # The contract
//!
//! A consumer built on this crate provides:
//! - a [`store::Store`]: the inbox and payment records, created together in one atomic
//!   step under keys the database keeps unique, and every later write conditional on the
//!   version read (the adapters for SQLite, Cosmos DB and PostgreSQL are crates of their
//!   own, `claims-payments-{sqlite,cosmos,postgres}`; each passes the testkit's conformance
//!   suite);
//! - optionally a [`bank::BankClient`] on a [`bank::transport::BankTransport`]: one request
//!   out, one bounded answer back (without a bank, payments are recorded, none is paid out);
//! - an [`ambient::Ambient`]: the wall clock, randomness and the process's identity
//!   (production reads the system; a simulator replaces them);
//! - a [`consumer::Policy`]: the consumer's name, the lease, the bounded wait for another
//!   attempt, the retry budget, the bank's key window and the inbox retention;
//! - each delivery: the parsed [`domain::ClaimApproved`] and its [`consumer::Delivery`]
//!   (message id and delivery count), given to [`consumer::Consumer::handle`].
//!
//! It is guaranteed, whatever the redeliveries, crashes between any two steps and
//! concurrent attempts:
//! - one payment per claim and purpose: a redelivered message is a duplicate, another
//!   message for a claim already recorded is a business duplicate, another body under
//!   the same message id is a conflict; none of them pays;
//! - every payout request carries the payment's stored Idempotency-Key and stored body,
//!   byte for byte, and none leaves after the bank's key window (less a margin) or on a
//!   clock too far from the bank's;
//! - an attempt's work is taken over only when its lease ran out or its process is
//!   known to have ended ([`lease`]);
//! - nothing is deleted once the bank may have been called; an answer never read makes
//!   the payment `needs_reconciliation`, which [`reconcile`] settles by asking the bank,
//!   never by a second payout;
//! - the [`consumer::Outcome`] says whether the message may be completed, must be retried
//!   later, or belongs on the dead-letter queue.
//!
//! # Other consumers: the once-guard
//!
//! A consumer of the same messages whose work is one record (the claim-approved letter,
//! a notice to publish) uses [`once::OnceGuard`] instead of the payment consumer. It
//! provides:
//! - a store with the [`store::once::OnceStore`] capability (the SQLite, PostgreSQL and
//!   Cosmos DB adapters have it; each passes the testkit's `once_conformance!` suite);
//! - its kind ([`store::once::EffectKind`], also the consumer name of its inbox
//!   records; not the payment consumer's), and the inbox retention (longer than the
//!   broker may redeliver);
//! - each delivery: the parsed [`domain::ClaimApproved`], its [`consumer::Delivery`], and
//!   the effect to record: its key ([`store::once::EffectKey`], which effect of the claim)
//!   and its body ([`store::once::EffectBody`], a bounded JSON object).
//!
//! It is guaranteed, whatever the redeliveries, lost answers and crashes:
//! - at most one effect per message and per (kind, claim, key): the effect and the
//!   message's inbox record are written in one atomic step, or neither is, under keys the
//!   database keeps unique; and one effect for every message answered
//!   [`once::Outcome::Done`], [`Duplicate`](once::Outcome::Duplicate) or
//!   [`AlreadyRecorded`](once::Outcome::AlreadyRecorded), the answers that complete it;
//! - a write whose answer was lost is recognised by its attempt when it committed
//!   (`Done`), and by any later delivery (`Duplicate`);
//! - the same MessageId with another payload, or another effect under a key already
//!   taken, is a [`Conflict`](once::Outcome::Conflict), never a second effect.
//!
//! The effects are an outbox ([`store::once::OnceStore::effects`]): what carries them out
//! (a print run, a mailer) goes by their key to do each once, as the bank goes by the
//! payment's Idempotency-Key. The example `claim_letters` in the `claims-payments` crate,
//! on this crate and the SQLite adapter alone, is such a consumer.
//!
//! Layout: [`domain`] (the message contract), [`ambient`], [`store`] (the port and its
//! decorator), [`lease`] (the takeover rule and the processes behind leases), [`bank`]
//! (the payout client on a transport, answers classified, the clock check),
//! [`consumer`] (the decisions), [`once`] (the once-guard), [`reconcile`], [`services`]
//! (what one process's parts share) and [`telemetry`] (the engine's counters).

pub mod ambient;
pub mod bank;
pub mod consumer;
pub mod domain;
pub mod lease;
pub mod once;
pub mod reconcile;
pub mod services;
pub mod store;
pub mod telemetry;
