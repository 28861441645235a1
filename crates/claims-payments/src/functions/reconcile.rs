//! The `Reconcile` function: a timer trigger (`%RECONCILE_SCHEDULE%`) that settles
//! unknown and orphaned payouts by asking the bank (see [`crate::reconcile`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use tracing::Instrument;

use super::answer::{TimerEnd, TimerOutcome};
use super::envelope::TimerInvocation;
use super::AppState;
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
    body: Body,
) -> Response {
    let span = telemetry::trace::timer_span(FUNCTION_NAME, &headers);
    let end = match super::timer_invocation(body, TimerOutcome::ReconcileFailed).await {
        Ok(invocation) => run(&state, invocation).instrument(span.clone()).await,
        Err(refused) => refused,
    };
    telemetry::trace::record_outcome(&span, None, end.label(), end.status.as_u16());
    end.answer()
}

async fn run(state: &AppState, invocation: TimerInvocation) -> TimerEnd {
    let past_due = invocation.is_past_due();
    let Some(reconciler) = Reconciler::new(&state.services) else {
        return TimerEnd::new(
            StatusCode::OK,
            TimerOutcome::ReconcileSkipped,
            "ledger-only mode: no bank to reconcile with",
        );
    };
    let lease = match RunLease::take(&reconciler, RUN_BUDGET * 2).await {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            tracing::info!(
                trigger = "timer",
                pastDue = past_due,
                "another instance is reconciling; this run is skipped"
            );
            return TimerEnd::new(
                StatusCode::OK,
                TimerOutcome::ReconcileSkipped,
                "another instance holds the reconcile run lease",
            );
        }
        Err(e) => {
            tracing::error!(trigger = "timer", error = %e, "reconcile could not take its run lease");
            return TimerEnd::new(
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
    lease.release(&reconciler).await;
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
            TimerEnd::reconciled(&summary)
        }
        Err(e) => {
            tracing::error!(trigger = "timer", error = %e, "reconcile failed");
            TimerEnd::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                TimerOutcome::ReconcileFailed,
                e.to_string(),
            )
        }
    }
}
