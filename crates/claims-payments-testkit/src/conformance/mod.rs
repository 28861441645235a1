//! The store conformance suite: the same scenarios, with the same expected answers,
//! for every store adapter. Store-level scenarios pin the port's contract; consumer-
//! level scenarios run the real state machine on top of it with a fake bank.
//!
//! A store's test file instantiates it with
//! `claims_payments_testkit::store_conformance!(make_store);` where
//! `async fn make_store() -> (DynStore, Keep)` builds a fresh, empty store, or with
//! `claims_payments_testkit::store_conformance!(make_store, if ready);` where
//! `fn ready() -> bool` says whether the store can run here at all (a test returns at
//! once when it is false: the store's own gate prints why, and fails instead under CI).
//! The macro writes one `#[tokio::test]` per scenario in the caller, so the caller's
//! crate needs `tokio` (with `macros` and `rt-multi-thread`) among its dependencies.
//!
//! Each scenario is a `pub async fn(DynStore)` here, by concern:
//!
//! - `store.rs`: the store port's answers, conditional writes and races;
//! - `contract.rs`: the port's contract with whole-record assertions;
//! - `consumer.rs`: the consumer's state machine on top of the store, with a fake bank;
//! - `reconcile.rs`: settling payments whose outcome could not be known;
//! - `payments_api.rs`: the HTTP payments API's idempotency keys;
//! - `once.rs`: the once-guard's capability (`OnceStore`), a suite of its own
//!   (`once_conformance!`) for the adapters that have it.

use claims_payments::ClaimId;

mod consumer;
mod contract;
mod once;
mod payments_api;
mod reconcile;
mod store;

pub use consumer::*;
pub use contract::*;
pub use once::*;
pub use payments_api::*;
pub use reconcile::*;
pub use store::*;

/// Whatever must stay alive as long as the store (a temp dir, an emulator).
pub type Keep = Box<dyn std::any::Any + Send>;

/// One `#[tokio::test]` per scenario of the suite, in the calling test crate, each on a
/// fresh store from `$make` (see the [module](crate::conformance) documentation).
#[macro_export]
macro_rules! store_conformance {
    ($make:path) => {
        $crate::store_conformance!($make, if (|| true));
    };
    ($make:path, if $ready:expr) => {
        $crate::store_conformance!(@tests $make, $ready;
            claim_creates_both_records,
            second_claim_of_a_message_returns_its_inbox_record,
            claim_of_a_paid_claim_by_another_message_writes_nothing,
            concurrent_claims_of_one_message_exactly_one_wins,
            concurrent_claims_of_one_claim_exactly_one_wins,
            replace_inbox_is_conditional,
            concurrent_takeovers_exactly_one_wins,
            finalize_is_conditional_and_atomic,
            record_handled_refuses_a_second_record,
            unusual_message_ids_round_trip,
            listings_return_what_was_stored,
            purge_never_touches_live_records_or_payments,
            five_deliveries_make_one_payment,
            crash_after_commit_then_redelivery_is_a_duplicate,
            concurrent_deliveries_pay_exactly_once,
            same_message_id_with_another_payload_is_a_conflict,
            same_claim_under_a_new_message_is_a_business_duplicate,
            same_claim_with_another_amount_is_a_conflict,
            crash_after_claim_then_takeover_pays_once,
            crash_after_bank_call_then_takeover_pays_once,
            lost_bank_answer_is_retried_under_the_same_key,
            transient_bank_failures_are_retried,
            bank_rejection_is_recorded_and_final,
            bank_outage_releases_the_lease_for_the_next_delivery,
            live_lease_makes_a_duplicate_wait_for_the_result,
            takeover_while_the_first_worker_is_alive_pays_once,
            business_duplicate_finishes_an_orphaned_payout,
            a_business_duplicate_that_loses_an_adopted_payout_defers_to_its_new_owner,
            a_later_delivery_takes_over_a_dead_attempt_at_once,
            a_bank_fault_of_our_own_never_rejects_the_payment,
            no_payout_request_leaves_after_the_key_window,
            reconcile_marks_paid_what_the_bank_holds,
            reconcile_pays_now_only_when_the_bank_holds_none,
            reconcile_never_pays_a_mismatch,
            reconcile_records_a_refusal_as_rejected,
            reconcile_leaves_a_payment_unknown_when_the_lookup_fails,
            reconcile_settles_an_orphaned_payout_and_leaves_live_ones_alone,
            reconcile_racing_a_live_redelivery_pays_once,
            two_reconcile_runs_racing_settle_once,
            a_mismatch_is_never_paid_later_nor_examined_again,
            lookup_references_differing_in_case_are_ours_and_missing_ones_are_unusable,
            a_double_payment_at_the_bank_needs_a_person,
            a_pending_entry_beside_a_refusal_stays_unknown,
            a_stalled_run_never_overwrites_what_another_run_settled,
            mismatches_do_not_starve_newer_payments,
            a_failed_lookup_leaves_an_orphaned_payout_visible_to_the_next_run,
            a_payment_whose_inbox_record_expired_stays_visible_after_a_failed_lookup,
            a_store_error_on_one_payment_does_not_end_the_run,
            a_claim_and_its_finalize_read_back_whole,
            a_duplicate_claim_returns_the_stored_record_and_writes_nothing,
            a_business_duplicate_returns_the_stored_payment_then_records_the_message,
            listings_are_oldest_first_bounded_and_whole,
            replace_inbox_needs_the_current_version_of_an_existing_record,
            api_first_request_replay_and_mismatch,
            api_request_cut_mid_payout_resumes_under_the_same_key,
        );
    };
    (@tests $make:path, $ready:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                if !($ready)() {
                    return;
                }
                let (store, _keep) = $make().await;
                $crate::conformance::$name(store).await;
            }
        )*
    };
}

fn claim_id(s: &str) -> ClaimId {
    ClaimId::parse(s).unwrap()
}
