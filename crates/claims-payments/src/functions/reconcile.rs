//! The `Reconcile` function: a timer trigger (`%RECONCILE_SCHEDULE%`) that settles
//! unknown and orphaned payouts by asking the bank (see [`crate::reconcile`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tracing::Instrument;

use super::AppState;
use crate::host::{Ended, OutcomeSummary, TimerOutcome};
use crate::http::invocation_answer;
use crate::reconcile::{self, Reconciler, RunLease};
use crate::telemetry;

/// The function's folder in function-app/, which is the route the host calls.
pub(crate) const FUNCTION_NAME: &str = "Reconcile";
/// A timer run stops taking up new payments after this, well inside functionTimeout
/// (3 min); the rest wait for the next run.
pub(crate) const RUN_BUDGET: Duration = Duration::from_secs(90);

/// The `Reconcile` timer invocation: settles unknown and orphaned payouts (see
/// [`crate::reconcile`]), one run at a time across instances, and answers the host with
/// the summary. The timer info under `Data.timer` is only logged: a past-due run does
/// the same work as a punctual one.
pub(crate) async fn invoke(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let span = telemetry::trace::timer_span(FUNCTION_NAME, &headers);
    let response = run(state, body).instrument(span.clone()).await;
    let outcome = response
        .extensions()
        .get::<TimerOutcome>()
        .copied()
        .unwrap_or(TimerOutcome::Reconciled);
    let label = Ended::Timer(outcome).as_str();
    telemetry::trace::record_outcome(&span, None, label, response.status().as_u16());
    response
}

async fn run(state: Arc<AppState>, body: Bytes) -> Response {
    let past_due = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/Data/timer/IsPastDue").and_then(|d| d.as_bool()))
        .unwrap_or(false);
    let summary_answer = |status: StatusCode, outcome: TimerOutcome, detail: String| {
        let mut answer = invocation_answer(status, OutcomeSummary::of_timer(outcome, detail));
        // For the span: how the run ended.
        answer.extensions_mut().insert(outcome);
        answer
    };
    let Some(reconciler) = Reconciler::new(state.consumer.clone()) else {
        return summary_answer(
            StatusCode::OK,
            TimerOutcome::ReconcileSkipped,
            "ledger-only mode: no bank to reconcile with".into(),
        );
    };
    let lease = match RunLease::take(&state.consumer, RUN_BUDGET * 2).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            tracing::info!(
                trigger = "timer",
                pastDue = past_due,
                "another instance is reconciling; this run is skipped"
            );
            return summary_answer(
                StatusCode::OK,
                TimerOutcome::ReconcileSkipped,
                "another instance holds the reconcile run lease".into(),
            );
        }
        Err(e) => {
            tracing::error!(trigger = "timer", error = %e, "reconcile could not take its run lease");
            return summary_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                TimerOutcome::ReconcileFailed,
                e.to_string(),
            );
        }
    };
    let options = reconcile::Options {
        min_age: state.reconcile_min_age,
        dry_run: false,
        budget: Some(RUN_BUDGET),
    };
    let result = reconciler.run(options).await;
    lease.release(&state.consumer).await;
    match result {
        Ok(summary) => {
            reconcile::log_summary(&summary, "timer");
            let n = |v: usize| v as u64;
            telemetry::metrics::reconcile_run(&telemetry::metrics::ReconcileRun {
                paid_by_lookup: n(summary.paid_by_lookup),
                paid_now: n(summary.paid_now),
                rejected: n(summary.rejected),
                still_unknown: n(summary.still_unknown),
                mismatches: n(summary.mismatches),
                double_payments: n(summary.double_payments),
                skipped: n(summary.skipped),
                waiting: n(summary.waiting),
                not_reached: n(summary.not_reached),
                needs_a_person: n(summary.needs_a_person),
                needs_reconciliation_before: n(summary.needs_reconciliation_before),
                orphaned_in_progress_before: n(summary.orphaned_in_progress_before),
            });
            summary_answer(StatusCode::OK, TimerOutcome::Reconciled, summary.counts())
        }
        Err(e) => {
            tracing::error!(trigger = "timer", error = %e, "reconcile failed");
            summary_answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                TimerOutcome::ReconcileFailed,
                e.to_string(),
            )
        }
    }
}
