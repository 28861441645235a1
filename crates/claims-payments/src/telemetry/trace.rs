//! One trace per claim: the spans, their parents, and what they carry.
//!
//! - Every invocation is a **server span** (a request in Application Insights): the
//!   `ClaimApproved` function opens its own ([`invocation_span`]) once the envelope is
//!   read, parented on the host's `traceparent` header or else the message's
//!   `Diagnostic-Id` application property (set by Service Bus SDKs on send), so the
//!   producer's send and our processing are one operation; the other routes get theirs
//!   from [`layer_http`], parented on `traceparent`.
//! - Every store call is a **client span** (a dependency; `store::traced`) with the
//!   Cosmos request charge it cost; every bank request is one too ([`bank_call`]), and
//!   it carries `traceparent` so the bank's side joins the trace.
//! - Attributes: claimId, messageId, deliveryCount, outcome, takeover, bank answer class.
//!   Never a secret, a payee account, a request body or the bank's answer text.
//!
//! When telemetry is not exported ([`super::enabled`] is false) none of this creates a
//! span: the functions return [`Span::none`] or go straight to the call.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{filter_fn, FilterExt, Targets};
use tracing_subscriber::Layer;

use super::metrics;

/// The OpenTelemetry layer: spans of this crate at INFO and above, and its WARN and ERROR
/// events (they become traces under the operation; the host forwards every log line
/// anyway). No code locations, threads or busy/idle timings: less work per span.
pub(crate) fn layer<S>(tracer: opentelemetry_sdk::trace::Tracer) -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    let ours = Targets::new().with_target("claims_payments", tracing::Level::INFO);
    let spans_and_warnings =
        filter_fn(|meta| meta.is_span() || *meta.level() <= tracing::Level::WARN);
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(ours.and(spans_and_warnings))
}

/// The parent a caller handed us in W3C Trace Context headers (`traceparent`).
pub(crate) fn parent_from_headers(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    valid(TraceContextPropagator::new().extract(&HeaderExtractor(headers)))
}

/// The parent a Service Bus SDK put into the message's `Diagnostic-Id` (a W3C
/// `traceparent` value in current SDKs; older hierarchical ids are ignored).
pub(crate) fn parent_from_diagnostic_id(diagnostic_id: &str) -> Option<opentelemetry::Context> {
    let carrier = HashMap::from([("traceparent".to_owned(), diagnostic_id.trim().to_owned())]);
    valid(TraceContextPropagator::new().extract(&carrier))
}

fn valid(cx: opentelemetry::Context) -> Option<opentelemetry::Context> {
    cx.span().span_context().is_valid().then_some(cx)
}

/// The server span of one `ClaimApproved` invocation, parented on the host's
/// `traceparent` when it sent one, else on the message's `Diagnostic-Id`. The fields
/// are filled in as the invocation learns them ([`record_outcome`]).
pub(crate) fn invocation_span(
    function: &'static str,
    headers: &HeaderMap,
    diagnostic_id: Option<&str>,
    message_id: &str,
    delivery_count: u32,
) -> Span {
    if !super::enabled() {
        return Span::none();
    }
    let span = server_span(function, "pubsub");
    span.record("messaging.system", "servicebus");
    span.record("messageId", message_id);
    span.record("deliveryCount", delivery_count);
    let parent =
        parent_from_headers(headers).or_else(|| diagnostic_id.and_then(parent_from_diagnostic_id));
    if let Some(parent) = parent {
        let _ = span.set_parent(parent);
    }
    span
}

/// A timer invocation's server span (Reconcile): a root unless the host sent a parent.
pub(crate) fn timer_span(function: &'static str, headers: &HeaderMap) -> Span {
    if !super::enabled() {
        return Span::none();
    }
    let span = server_span(function, "timer");
    if let Some(parent) = parent_from_headers(headers) {
        let _ = span.set_parent(parent);
    }
    span
}

/// One invocation's server span, its message fields left for a Service Bus trigger to fill.
fn server_span(function: &'static str, trigger: &'static str) -> Span {
    tracing::info_span!(
        "invocation",
        otel.name = function,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        faas.trigger = trigger,
        messaging.system = tracing::field::Empty,
        messageId = tracing::field::Empty,
        deliveryCount = tracing::field::Empty,
        claimId = tracing::field::Empty,
        outcome = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    )
}

/// Records how an invocation ended on its span: the outcome label, the status the host
/// gets, and an error status when the host is told to fail the invocation.
pub(crate) fn record_outcome(span: &Span, claim_id: Option<&str>, outcome: &str, status: u16) {
    if span.is_none() {
        return;
    }
    if let Some(claim_id) = claim_id {
        span.record("claimId", claim_id);
    }
    span.record("outcome", outcome);
    span.record("http.response.status_code", status);
    span.record(
        "otel.status_code",
        if (200..300).contains(&status) {
            "ok"
        } else {
            "error"
        },
    );
}

/// Sets `flag = true` on the current span (the invocation's: counters are counted
/// between store and bank calls), e.g. `takeover` when a delivery took over a lease.
pub(crate) fn flag_current_span(flag: &'static str) {
    if super::enabled() {
        Span::current().set_attribute(flag, true);
    }
}

/// The server span of the other HTTP routes (`POST /api/payments`, `GET
/// /api/payments/{claimId}`), parented on `traceparent`, and the answer counted by route
/// and status for every route. `ClaimApproved` opens its own span (its parent may be in
/// the body), so here it is only counted.
pub(crate) async fn layer_http(
    State(own_spans): State<&'static [&'static str]>,
    request: Request,
    next: Next,
) -> Response {
    if !super::enabled() {
        return next.run(request).await;
    }
    // The matched pattern, shared (no copy per request).
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let own_span = own_spans.contains(&route);
    let response = if own_span {
        next.run(request).await
    } else {
        let method = request.method().as_str().to_owned();
        let span = tracing::info_span!(
            "request",
            otel.name = format!("{method} {route}"),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            http.request.method = method,
            http.route = route,
            url.path = request.uri().path(),
            http.response.status_code = tracing::field::Empty,
            faas.trigger = tracing::field::Empty,
        );
        // The Purge timer arrives here: a timer run, which the sampling always keeps.
        if TIMER_ROUTES.contains(&route) {
            span.record("faas.trigger", "timer");
        }
        if let Some(parent) = parent_from_headers(request.headers()) {
            let _ = span.set_parent(parent);
        }
        let response = next.run(request).instrument(span.clone()).await;
        let status = response.status().as_u16();
        span.record("http.response.status_code", status);
        span.record(
            "otel.status_code",
            if status >= 500 { "error" } else { "ok" },
        );
        response
    };
    metrics::http_answer(route, response.status().as_u16());
    response
}

/// Timer functions that have no span of their own (the handler's HTTP span is theirs).
const TIMER_ROUTES: [&str; 1] = ["/Purge"];

/// The class of a bank answer, as DESIGN.md §8 sorts them (for span attributes and the
/// latency metric's dimension; the bank client's own `classify` decides what to do).
pub(crate) fn bank_answer_class(status: u16) -> &'static str {
    match status {
        200..=299 => "success",
        400 | 402 => "rejected",
        408 | 409 | 429 | 500..=599 => "transient",
        422 => "key-mismatch",
        _ => "service-fault",
    }
}

/// Sends one bank request as a dependency span of the current invocation, with
/// `traceparent` (and `tracestate`) injected, and records its duration and answer class.
/// Without telemetry it only sends.
pub(crate) async fn bank_call(
    operation: &'static str,
    request: reqwest::RequestBuilder,
) -> reqwest::Result<reqwest::Response> {
    if !super::enabled() {
        return request.send().await;
    }
    let invocation = Span::current();
    let span = tracing::info_span!(
        "bank",
        otel.name = tracing::field::Empty,
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        http.request.method = tracing::field::Empty,
        server.address = tracing::field::Empty,
        server.port = tracing::field::Empty,
        url.full = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        bank.operation = operation,
        bank.answer = tracing::field::Empty,
    );
    let (client, built) = request.build_split();
    let mut built = match built {
        Ok(built) => built,
        Err(e) => return Err(e),
    };
    let url = built.url();
    span.record(
        "otel.name",
        format!("{} {}", built.method(), url.path()).as_str(),
    );
    span.record("http.request.method", built.method().as_str());
    if let Some(host) = url.host_str() {
        span.record("server.address", host);
    }
    if let Some(port) = url.port_or_known_default() {
        span.record("server.port", port);
    }
    // Scheme, host and path only: never the query (a reference) or credentials.
    span.record(
        "url.full",
        format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.path()
        )
        .as_str(),
    );
    TraceContextPropagator::new()
        .inject_context(&span.context(), &mut HeaderInjector(built.headers_mut()));
    let started = Instant::now();
    let result = client.execute(built).instrument(span.clone()).await;
    let millis = started.elapsed().as_secs_f64() * 1000.0;
    let answer = match &result {
        Ok(response) => {
            let status = response.status().as_u16();
            span.record("http.response.status_code", status);
            bank_answer_class(status)
        }
        Err(e) if e.is_timeout() => "timeout",
        Err(_) => "connection-error",
    };
    span.record("bank.answer", answer);
    span.record(
        "otel.status_code",
        if answer == "success" { "ok" } else { "error" },
    );
    invocation.set_attribute("bankAnswer", answer);
    metrics::bank_duration(operation, answer, millis);
    result
}

tokio::task_local! {
    /// The request units charged to the store call in progress.
    static REQUEST_CHARGE: Cell<f64>;
}

/// Adds a Cosmos request charge to the store call in progress, if one is traced.
pub(crate) fn add_request_charge(ru: f64) {
    let _ = REQUEST_CHARGE.try_with(|c| c.set(c.get() + ru));
}

/// Runs a store call and returns what it charged, in Cosmos request units (0 elsewhere).
pub(crate) async fn charged<T>(work: impl std::future::Future<Output = T>) -> (T, f64) {
    REQUEST_CHARGE
        .scope(Cell::new(0.0), async {
            let result = work.await;
            (result, REQUEST_CHARGE.with(|c| c.get()))
        })
        .await
}

/// Marks `span` failed with `label`.
pub(crate) fn fail(span: &Span, label: &'static str) {
    span.set_status(Status::error(label));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_w3c_diagnostic_id_is_a_parent_and_a_legacy_one_is_not() {
        let parent =
            parent_from_diagnostic_id("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                .expect("a traceparent");
        assert_eq!(
            parent.span().span_context().trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(parent_from_diagnostic_id("|a1b2c3.4d5e6f_").is_none());
        assert!(parent_from_diagnostic_id("").is_none());
    }

    #[test]
    fn bank_answers_are_classed_as_the_contract_sorts_them() {
        assert_eq!(bank_answer_class(201), "success");
        assert_eq!(bank_answer_class(402), "rejected");
        assert_eq!(bank_answer_class(409), "transient");
        assert_eq!(bank_answer_class(503), "transient");
        assert_eq!(bank_answer_class(422), "key-mismatch");
        assert_eq!(bank_answer_class(401), "service-fault");
        assert_eq!(bank_answer_class(302), "service-fault");
    }
}
