//! The `Purge` function: a timer trigger (`%PURGE_SCHEDULE%`, daily by default) that
//! applies `INBOX_RETENTION_DAYS` on the stores without a TTL of their own (PostgreSQL,
//! SQLite), in bounded batches; on Cosmos DB the documents' `ttl` does it and the run says
//! so. Payments are never purged.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::answer::{TimerEnd, TimerOutcome};
use super::AppState;

/// The function's folder in function-app/, which is the route the host calls.
pub(crate) const FUNCTION_NAME: &str = "Purge";
/// Rows per delete: each batch is its own short transaction, so invocations interleave.
pub(crate) const BATCH: usize = 500;
/// A run stops starting new batches after this, well inside functionTimeout; what is left
/// waits for the next run (the batches done stay done).
pub(crate) const RUN_BUDGET: Duration = Duration::from_secs(90);

/// The `Purge` timer invocation.
pub(crate) async fn invoke(State(state): State<Arc<AppState>>, body: Body) -> Response {
    match super::timer_invocation(body, TimerOutcome::PurgeFailed).await {
        Ok(_) => run(&state).await.answer(),
        Err(refused) => refused.answer(),
    }
}

async fn run(state: &AppState) -> TimerEnd {
    let store = &state.services.store;
    if store.expires_by_itself() {
        return TimerEnd::new(
            StatusCode::OK,
            TimerOutcome::PurgeSkipped,
            "the store expires inbox records by itself (Cosmos DB ttl)",
        );
    }
    let now = state.services.ambient.now();
    match tokio::time::timeout(RUN_BUDGET, store.purge_expired(now, BATCH)).await {
        Ok(Ok(removed)) => {
            tracing::info!(trigger = "timer", removed, "purge finished");
            TimerEnd::new(
                StatusCode::OK,
                TimerOutcome::Purged,
                format!("removed {removed} expired inbox record(s)"),
            )
        }
        Ok(Err(e)) => {
            tracing::error!(trigger = "timer", error = %e, "purge failed");
            TimerEnd::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                TimerOutcome::PurgeFailed,
                e.to_string(),
            )
        }
        Err(_) => {
            tracing::warn!(
                trigger = "timer",
                budgetSeconds = RUN_BUDGET.as_secs(),
                "purge stopped at its time budget; the next run goes on"
            );
            TimerEnd::new(
                StatusCode::OK,
                TimerOutcome::Purged,
                format!(
                    "stopped after {} s with more to remove; the next run goes on",
                    RUN_BUDGET.as_secs()
                ),
            )
        }
    }
}
