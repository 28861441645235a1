//! The guarantee: each approved claim paid exactly once, although the broker that asks
//! for the payment delivers at least once, processes crash between any two steps, and
//! the bank may answer late or not at all.
//!
//! # The contract
//!
//! A consumer built on this crate provides:
//! - a [`store::Store`]: the inbox and payment records, created together in one atomic
//!   step under keys the database keeps unique, and every later write conditional on the
//!   version read (the adapters for SQLite, Cosmos DB and PostgreSQL are in the product
//!   crate; each passes the testkit's conformance suite);
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
//! Layout: [`domain`] (the message contract), [`ambient`], [`store`] (the port and its
//! decorator), [`lease`] (the takeover rule and the processes behind leases), [`bank`]
//! (the payout client on a transport, answers classified, the clock check),
//! [`consumer`] (the decisions), [`reconcile`], [`services`] (what one process's parts
//! share) and [`telemetry`] (the engine's counters).

pub mod ambient;
pub mod bank;
pub mod consumer;
pub mod domain;
pub mod lease;
pub mod reconcile;
pub mod services;
pub mod store;
pub mod telemetry;
