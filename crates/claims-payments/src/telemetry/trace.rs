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
//!   it carries `traceparent` so the bank's side joins the trace. A store call is no
//!   `tracing` span: it is timed around the call ([`observe_call`]) and its record added
//!   under the current span or invocation ([`record_call`]), which costs a fraction of a
//!   span's creation, enter and exit at every poll, and close.
//! - Attributes: claimId, messageId, deliveryCount, outcome, takeover, bank answer class.
//!   Never a secret, a payee account, a request body or the bank's answer text.
//!
//! - Spans are plain records ([`super::record::Recorded`]: name, ids, start and end,
//!   attributes, status, logged warnings). A `ClaimApproved` invocation's is carried by
//!   its task ([`Invocation`]), with no `tracing` span at all; the other spans (the other
//!   routes', Reconcile's, a bank request's) are `tracing` spans whose records
//!   [`Recorder`] keeps in their extensions, a span opened in an invocation's task going
//!   under the invocation. An invocation's records wait in its root until it ends, and
//!   only a trace the sampling keeps becomes OpenTelemetry spans ([`super::sampling`]).
//!
//! When telemetry is not exported ([`super::enabled`] is false) none of this creates a
//! span or a record: the functions return [`Span::none`], an empty [`Invocation`], or go
//! straight to the call.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use futures::future::Either;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Event, SpanId, SpanKind, Status, TraceContextExt, TraceState};
use opentelemetry::{Array, Key, KeyValue, StringValue, Value};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Instrument, Span, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::Context as LayerContext;
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::Layer;

use super::metrics;
use super::record::Recorded;
use super::sampling::{Policy, Tail};

/// At most this many finished spans wait under one open span (a long timer run's store
/// and bank calls); more are dropped and counted in `telemetryDropped`.
pub(crate) const MAX_UNDER: usize = 4096;

/// A span still open: its record, and the finished spans under it (at any depth).
struct Open {
    span: Recorded,
    under: Vec<Recorded>,
    /// Parented on the task's invocation record ([`Invocation`]) rather than on a span.
    in_invocation: bool,
}

/// The layer that records spans cheaply ([`Recorded`], in the span's extensions) and, when
/// a local root ends, hands it with every span under it to the sampling's [`Tail`]. It
/// replaces `tracing-opentelemetry`, which builds an OpenTelemetry span (sampler, span
/// processors, attribute copies) for every span, and activates an OpenTelemetry context at
/// every poll, whether or not the trace is exported.
pub(crate) struct Recorder {
    tail: Arc<Tail>,
    ids: RandomIdGenerator,
}

impl Recorder {
    pub(crate) fn new(tail: Arc<Tail>) -> Self {
        Recorder {
            tail,
            ids: RandomIdGenerator::default(),
        }
    }
}

/// The recording layer: spans of this crate at INFO and above, and its WARN and ERROR
/// events (they become span events, traces under the operation; the host forwards every
/// log line anyway). Behind a filter of its own ([`Recordable`]) so that it widens no
/// other callsite: unfiltered, a layer is interested in everything, which enables every
/// `debug!` and `trace!` of the libraries on the request path (their events built and
/// dispatched, their spans created). The filter looks a span up again at each enter and
/// exit, but an invocation is no span ([`Invocation`]), so that is only the rare spans.
pub(crate) fn layer<S>(recorder: Recorder) -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    recorder.with_filter(Recordable)
}

/// What the recorder sees: decided once per callsite ([`recorded`]).
struct Recordable;

impl<S> tracing_subscriber::layer::Filter<S> for Recordable {
    fn enabled(&self, meta: &tracing::Metadata<'_>, _: &LayerContext<'_, S>) -> bool {
        recorded(meta)
    }

    fn callsite_enabled(&self, meta: &'static tracing::Metadata<'static>) -> Interest {
        if recorded(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }
}

/// Whether a span or event is one the recorder keeps.
fn recorded(meta: &tracing::Metadata<'_>) -> bool {
    let level = if meta.is_span() {
        tracing::Level::INFO
    } else {
        tracing::Level::WARN
    };
    *meta.level() <= level
        && meta
            .target()
            .strip_prefix("claims_payments")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

/// The nearest ancestor of `span` that the recorder keeps, with its record.
fn recorded_parent<'a, S>(
    span: &tracing_subscriber::registry::SpanRef<'a, S>,
) -> Option<tracing_subscriber::registry::SpanRef<'a, S>>
where
    S: Subscriber + for<'b> LookupSpan<'b>,
{
    span.scope()
        .skip(1)
        .find(|ancestor| ancestor.extensions().get::<Open>().is_some())
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        if !recorded(attrs.metadata()) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let parent = recorded_parent(&span).and_then(|parent| {
            parent.extensions().get::<Open>().map(|open| {
                let p = &open.span;
                (p.trace_id, p.span_id, p.sampled, p.trace_state.clone())
            })
        });
        let mut in_invocation = false;
        let parent = parent.or_else(|| {
            let p = with_invocation(|open| {
                let p = &open.span;
                (p.trace_id, p.span_id, p.sampled, p.trace_state.clone())
            });
            in_invocation = p.is_some();
            p
        });
        let (trace_id, parent_span_id, sampled, trace_state) = match parent {
            Some(inherited) => inherited,
            None => {
                let trace_id = self.ids.new_trace_id();
                let sampled = self.tail.policy.head_decision(trace_id, None);
                (trace_id, SpanId::INVALID, sampled, TraceState::default())
            }
        };
        let mut record = Recorded::new(
            Cow::Borrowed(attrs.metadata().name()),
            SpanKind::Internal,
            Vec::with_capacity(attrs.fields().len()),
        );
        (
            record.trace_id,
            record.parent_span_id,
            record.sampled,
            record.trace_state,
        ) = (trace_id, parent_span_id, sampled, trace_state);
        record.span_id = self.ids.new_span_id();
        attrs.record(&mut SpanFields(&mut record));
        // A root gathers the spans under it: room for a delivery's usual handful.
        let under = if parent_span_id == SpanId::INVALID {
            Vec::with_capacity(8)
        } else {
            Vec::new()
        };
        span.extensions_mut().insert(Open {
            span: record,
            under,
            in_invocation,
        });
    }

    fn on_record(&self, id: &Id, values: &tracing::span::Record<'_>, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(open) = extensions.get_mut::<Open>() {
            values.record(&mut SpanFields(&mut open.span));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: LayerContext<'_, S>) {
        if !recorded(event.metadata()) {
            return;
        }
        let error = *event.metadata().level() == tracing::Level::ERROR;
        // Logged inside a store call: the call's warning, as a span's would be.
        let in_call = IN_CALL.try_with(|call| {
            let (recorded, status) = self.event_record(event);
            let mut call = call.borrow_mut();
            call.error |= error || status.is_some();
            call.events.push(recorded);
        });
        if in_call.is_ok() {
            return;
        }
        let span = match event.parent() {
            Some(parent) => ctx.span(parent),
            None if event.is_contextual() => ctx.lookup_current(),
            None => None,
        };
        // An event in a span of another crate goes to the nearest recorded one; outside
        // every recorded span, to the task's invocation record; outside that too, to the
        // logs only.
        let span = span.and_then(|span| {
            if span.extensions().get::<Open>().is_some() {
                Some(span)
            } else {
                recorded_parent(&span)
            }
        });
        let Some(span) = span else {
            if in_invocation() {
                let (recorded, status) = self.event_record(event);
                with_invocation(|open| open.add_event(recorded, status, error));
            }
            return;
        };
        let (recorded, status) = self.event_record(event);
        let mut extensions = span.extensions_mut();
        let Some(open) = extensions.get_mut::<Open>() else {
            return;
        };
        open.add_event(recorded, status, error);
    }

    fn on_close(&self, id: Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(mut open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        open.span.end = SystemTime::now();
        // A child always ends before its parent (the registry keeps the parent open), so
        // the parent's record is still there to take it.
        if let Some(parent) = recorded_parent(&span) {
            if let Some(into) = parent.extensions_mut().get_mut::<Open>() {
                into.take(open.span, open.under);
                return;
            }
        }
        // A span opened under the task's invocation record goes back under it.
        let Open {
            span,
            under,
            in_invocation,
        } = open;
        let mut finished = Some((span, under));
        if in_invocation {
            with_invocation(|into| {
                if let Some((span, under)) = finished.take() {
                    into.take(span, under);
                }
            });
        }
        if let Some((span, under)) = finished {
            self.tail.finish(span, under);
        }
    }
}

impl Open {
    /// A warning or error logged in this span, as its event, with the status it sets.
    fn add_event(&mut self, event: Event, status: Option<Status>, error: bool) {
        if error {
            self.span.set_status(Status::error(""));
        }
        if let Some(status) = status {
            self.span.set_status(status);
        }
        self.span.events.push(event);
    }

    /// Takes a finished span, and the spans under it, under this one (at most
    /// [`MAX_UNDER`]; more are counted as dropped).
    fn take(&mut self, span: Recorded, mut under: Vec<Recorded>) {
        self.under.push(span);
        self.under.append(&mut under);
        if self.under.len() > MAX_UNDER {
            let lost = self.under.len() - MAX_UNDER;
            self.under.truncate(MAX_UNDER);
            super::counters().telemetry_dropped.add(lost as u64);
        }
    }
}

impl Recorder {
    /// A warning's or error's record as a span event, with the status it sets, if any.
    fn event_record(&self, event: &tracing::Event<'_>) -> (Event, Option<Status>) {
        let meta = event.metadata();
        let mut recorded = Event::new(
            String::new(),
            SystemTime::now(),
            vec![
                KeyValue::new("level", meta.level().as_str()),
                KeyValue::new("target", meta.target()),
            ],
            0,
        );
        let mut status = None;
        event.record(&mut EventFields {
            event: &mut recorded,
            status: &mut status,
        });
        if recorded.name.is_empty() {
            recorded.name = Cow::Borrowed(meta.name());
        }
        (recorded, status)
    }
}

/// A span's fields as attributes; `otel.name`, `otel.kind`, `otel.status_code` and
/// `otel.status_description` set the name, kind and status instead (as
/// `tracing-opentelemetry` reads them). Unsigned integers are text, as there.
struct SpanFields<'a>(&'a mut Recorded);

impl SpanFields<'_> {
    fn push(&mut self, field: &Field, value: Value) {
        self.0.attributes.push(KeyValue::new(field.name(), value));
    }

    fn text(&mut self, field: &Field, value: Cow<'_, str>) {
        match field.name() {
            "otel.name" => {
                self.0.name = match known("otel.name", &value) {
                    Some(fixed) => Cow::Borrowed(fixed),
                    None => Cow::Owned(value.into_owned()),
                }
            }
            "otel.kind" => {
                if let Some(kind) = span_kind(&value) {
                    self.0.kind = kind;
                }
            }
            "otel.status_code" => self.0.set_status(status_of(&value)),
            "otel.status_description" => self.0.set_status(Status::error(value.into_owned())),
            name => {
                let value = match known(name, &value) {
                    Some(fixed) => StringValue::from(fixed),
                    None => value.into_owned().into(),
                };
                self.push(field, Value::String(value));
            }
        }
    }
}

/// Every store operation's `db.operation.name`, in the order of the traced store's
/// operation indices (`store::traced`).
pub(crate) const STORE_OPERATIONS: [&str; 11] = [
    "claim",
    "read inbox",
    "read payment",
    "record handled",
    "replace inbox",
    "finalize",
    "list payments",
    "list unsettled payments",
    "count payments",
    "list inbox",
    "purge",
];

/// The value of a field whose values are a few fixed words, as that word (no copy): most
/// of what a span records is one of these.
fn known(field: &str, value: &str) -> Option<&'static str> {
    if field == "outcome" {
        return crate::domain::OutcomeKind::ALL
            .iter()
            .map(crate::domain::OutcomeKind::as_str)
            .find(|word| *word == value);
    }
    let words: &[&'static str] = match field {
        // The functions' own server spans.
        "otel.name" => &["ClaimApproved", "Reconcile"],
        "faas.trigger" => &["pubsub", "timer", "http"],
        "messaging.system" => &["servicebus"],
        "db.system.name" => &["sqlite", "cosmosdb", "postgresql"],
        "db.operation.name" => &STORE_OPERATIONS,
        "store.result" => &["ok", "precondition-failed", "transient", "permanent"],
        "bank.operation" => &["payout", "lookup"],
        "bank.answer" => &[
            "success",
            "rejected",
            "transient",
            "key-mismatch",
            "service-fault",
            "timeout",
            "connection-error",
        ],
        "http.request.method" => &["POST", "GET"],
        _ => return None,
    };
    words.iter().copied().find(|word| *word == value)
}

impl Visit for SpanFields<'_> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::I64(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::F64(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, Cow::Borrowed(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, Cow::Owned(format!("{value:?}")));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let (message, chain) = error_chain(value);
        self.0
            .attributes
            .push(KeyValue::new("exception.message", message.clone()));
        self.0.attributes.push(KeyValue::new(
            "exception.stacktrace",
            Value::Array(Array::String(chain.clone())),
        ));
        self.push(field, Value::String(message.into()));
        self.0.attributes.push(KeyValue::new(
            format!("{}.chain", field.name()),
            Value::Array(Array::String(chain)),
        ));
    }
}

/// An error's text and the texts of its sources.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> (String, Vec<StringValue>) {
    let mut chain = Vec::new();
    let mut next = error.source();
    while let Some(source) = next {
        chain.push(source.to_string().into());
        next = source.source();
    }
    (error.to_string(), chain)
}

/// A warning's or error's fields as a span event: `message` is its name, an `error`
/// field makes it an `exception` and the span's status an error (as
/// `tracing-opentelemetry` records them).
struct EventFields<'a> {
    event: &'a mut Event,
    status: &'a mut Option<Status>,
}

impl EventFields<'_> {
    fn text(&mut self, field: &Field, value: String) {
        match field.name() {
            "message" => self.event.name = Cow::Owned(value),
            "error" if self.event.name.is_empty() => {
                let described = format!("{value:?}");
                *self.status = Some(Status::error(described.clone()));
                self.event.name = Cow::Borrowed("exception");
                self.event
                    .attributes
                    .push(KeyValue::new("exception.message", described));
            }
            name => self.event.attributes.push(KeyValue::new(name, value)),
        }
    }

    fn value(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => self.event.name = Cow::Owned(value.to_string()),
            name => self.event.attributes.push(KeyValue::new(name, value)),
        }
    }
}

impl Visit for EventFields<'_> {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.value(field, Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.value(field, Value::I64(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.value(field, Value::F64(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, format!("{value:?}"));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let (message, chain) = error_chain(value);
        let attributes = &mut self.event.attributes;
        attributes.push(KeyValue::new("exception.message", message.clone()));
        attributes.push(KeyValue::new(
            "exception.stacktrace",
            Value::Array(Array::String(chain.clone())),
        ));
        attributes.push(KeyValue::new(field.name(), message));
        attributes.push(KeyValue::new(
            Key::new(format!("{}.chain", field.name())),
            Value::Array(Array::String(chain)),
        ));
    }
}

fn span_kind(text: &str) -> Option<SpanKind> {
    [
        ("server", SpanKind::Server),
        ("client", SpanKind::Client),
        ("producer", SpanKind::Producer),
        ("consumer", SpanKind::Consumer),
        ("internal", SpanKind::Internal),
    ]
    .into_iter()
    .find_map(|(name, kind)| text.eq_ignore_ascii_case(name).then_some(kind))
}

fn status_of(text: &str) -> Status {
    if text.eq_ignore_ascii_case("ok") {
        Status::Ok
    } else if text.eq_ignore_ascii_case("error") {
        Status::error("")
    } else {
        Status::Unset
    }
}

/// Runs `f` on `span`'s record, if it is one the recording layer keeps.
fn with_record<R>(span: &Span, f: impl FnOnce(&mut Recorded, &Recorder) -> R) -> Option<R> {
    let mut f = Some(f);
    span.with_subscriber(|(id, dispatch)| {
        let recorder = dispatch.downcast_ref::<Recorder>()?;
        let registry = dispatch.downcast_ref::<Registry>()?;
        let data = registry.span(id)?;
        let mut extensions = data.extensions_mut();
        let open = extensions.get_mut::<Open>()?;
        f.take().map(|f| f(&mut open.span, recorder))
    })
    .flatten()
}

/// Makes a caller's span the parent of `span` (a local root): its trace, its trace state,
/// and the head decision under its `sampled` flag. Call before any span under it starts.
fn set_parent(span: &Span, parent: &opentelemetry::Context) {
    with_record(span, |record, recorder| {
        adopt_parent(record, &recorder.tail.policy, parent)
    });
}

/// A local root's record joins a caller's trace: the caller's trace id, span as parent,
/// trace state, and the head decision its `sampled` flag asks for.
fn adopt_parent(record: &mut Recorded, policy: &Policy, parent: &opentelemetry::Context) {
    let span = parent.span();
    let remote = span.span_context();
    record.trace_id = remote.trace_id();
    record.parent_span_id = remote.span_id();
    record.parent_remote = true;
    record.trace_state = remote.trace_state().clone();
    record.sampled = policy.head_decision(remote.trace_id(), Some(remote));
}

/// The parent a caller handed us in W3C Trace Context headers (`traceparent`).
pub(crate) fn parent_from_headers(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    // Without the header there is nothing to extract (most deliveries).
    if !headers.contains_key("traceparent") {
        return None;
    }
    valid(TraceContextPropagator::new().extract(&HeaderExtractor(headers)))
}

/// The parent a Service Bus SDK put into the message's `Diagnostic-Id` (a W3C
/// `traceparent` value in current SDKs; older hierarchical ids are ignored).
pub(crate) fn parent_from_diagnostic_id(diagnostic_id: &str) -> Option<opentelemetry::Context> {
    valid(TraceContextPropagator::new().extract(&Traceparent(diagnostic_id.trim())))
}

/// A `traceparent` value alone as a carrier (no map, no copies).
struct Traceparent<'a>(&'a str);

impl Extractor for Traceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        key.eq_ignore_ascii_case("traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

fn valid(cx: opentelemetry::Context) -> Option<opentelemetry::Context> {
    cx.span().span_context().is_valid().then_some(cx)
}

/// The server span of one `ClaimApproved` invocation, parented on the host's
/// `traceparent` when it sent one, else on the message's `Diagnostic-Id`. It is no
/// `tracing` span but its record straight away, carried by the invocation's task
/// ([`Invocation::run`]): a span's registry look-ups at its creation, at every poll's
/// enter and exit and at each field recorded would cost more than the record. The fields
/// learnt later go into it with [`record_invocation_outcome`].
pub(crate) fn invocation_span(
    function: &'static str,
    headers: &HeaderMap,
    diagnostic_id: Option<&str>,
    message_id: &str,
    delivery_count: u32,
) -> Invocation {
    if !super::enabled() {
        return Invocation(None);
    }
    let Some(mut root) = Root::server(function, "pubsub") else {
        return Invocation(None);
    };
    let record = &mut root.open.span;
    // The attributes in the order the span's fields were recorded.
    record
        .attributes
        .push(KeyValue::new("messaging.system", "servicebus"));
    record
        .attributes
        .push(KeyValue::new("messageId", message_id.to_owned()));
    record.attributes.push(KeyValue::new(
        "deliveryCount",
        unsigned_text(delivery_count),
    ));
    let parent =
        parent_from_headers(headers).or_else(|| diagnostic_id.and_then(parent_from_diagnostic_id));
    if let Some(parent) = parent {
        root.set_parent(&parent);
    }
    Invocation(Some(root))
}

/// An unsigned number as text, as the recorder records an unsigned field; the small
/// ones (delivery counts) without a copy.
fn unsigned_text(n: u32) -> StringValue {
    const SMALL: [&str; 11] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];
    match SMALL.get(n as usize) {
        Some(text) => StringValue::from(*text),
        None => n.to_string().into(),
    }
}

/// An HTTP status as text (as a recorded unsigned field), the usual ones without a copy.
fn status_text(status: u16) -> StringValue {
    let fixed = match status {
        200 => "200",
        202 => "202",
        400 => "400",
        408 => "408",
        409 => "409",
        413 => "413",
        422 => "422",
        500 => "500",
        503 => "503",
        _ => return status.to_string().into(),
    };
    StringValue::from(fixed)
}

/// An invocation's server span while it runs, as its record (see [`invocation_span`]);
/// nothing when telemetry is not exported.
pub(crate) struct Invocation(Option<Root>);

/// The record of an invocation in progress, with every span finished under it. Handed to
/// the sampling when it is dropped: when its task ends, or is dropped unfinished (the
/// process ending), as a `tracing` span would be closed.
struct Root {
    open: Open,
    tail: Arc<Tail>,
}

tokio::task_local! {
    /// The record of the invocation this task runs, if telemetry is exported.
    static INVOCATION: RefCell<Root>;
}

impl Root {
    /// A server span's record, a root with its own trace and head decision until a
    /// caller's parent is set; `None` when no recorder is installed.
    fn server(function: &'static str, trigger: &'static str) -> Option<Root> {
        let (tail, trace_id, span_id) = tracing::dispatcher::get_default(|dispatch| {
            let recorder = dispatch.downcast_ref::<Recorder>()?;
            Some((
                recorder.tail.clone(),
                recorder.ids.new_trace_id(),
                recorder.ids.new_span_id(),
            ))
        })?;
        let mut attributes = Vec::with_capacity(10);
        attributes.push(KeyValue::new("faas.trigger", trigger));
        let mut span = Recorded::new(Cow::Borrowed(function), SpanKind::Server, attributes);
        span.trace_id = trace_id;
        span.span_id = span_id;
        span.sampled = tail.policy.head_decision(trace_id, None);
        Some(Root {
            open: Open {
                span,
                // Grown at the first call (room for four): a duplicate makes none.
                under: Vec::new(),
                in_invocation: false,
            },
            tail,
        })
    }

    /// A caller's span as the parent, as [`set_parent`] does for a `tracing` span.
    fn set_parent(&mut self, parent: &opentelemetry::Context) {
        adopt_parent(&mut self.open.span, &self.tail.policy, parent);
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let span = &mut self.open.span;
        span.end = SystemTime::now();
        let span = Recorded {
            name: std::mem::take(&mut span.name),
            kind: std::mem::replace(&mut span.kind, SpanKind::Internal),
            attributes: std::mem::take(&mut span.attributes),
            events: std::mem::take(&mut span.events),
            status: std::mem::replace(&mut span.status, Status::Unset),
            trace_state: std::mem::take(&mut span.trace_state),
            ..*span
        };
        self.tail.finish(span, std::mem::take(&mut self.open.under));
    }
}

impl Invocation {
    /// Runs `work` as this invocation: what it records (store and bank calls, warnings,
    /// flags, the outcome) goes into the invocation's record, which the sampling gets
    /// when `work` ends or is dropped. Without telemetry, `work` itself.
    pub(crate) fn run<F: Future>(self, work: F) -> impl Future<Output = F::Output> {
        match self.0 {
            Some(root) => Either::Left(INVOCATION.scope(RefCell::new(root), work)),
            None => Either::Right(work),
        }
    }

    /// [`Invocation::run`] for work that does not wait.
    pub(crate) fn run_sync<R>(self, work: impl FnOnce() -> R) -> R {
        match self.0 {
            Some(root) => INVOCATION.sync_scope(RefCell::new(root), work),
            None => work(),
        }
    }
}

/// Whether this task runs an invocation with a record.
fn in_invocation() -> bool {
    INVOCATION.try_with(|_| ()).is_ok()
}

/// Runs `f` on the record of the invocation this task runs, if it has one.
fn with_invocation<R>(f: impl FnOnce(&mut Open) -> R) -> Option<R> {
    INVOCATION
        .try_with(|root| root.try_borrow_mut().ok().map(|mut root| f(&mut root.open)))
        .ok()
        .flatten()
}

/// Records how the invocation this task runs ended (see [`record_outcome`]).
pub(crate) fn record_invocation_outcome(claim_id: Option<&str>, outcome: &str, status: u16) {
    with_invocation(|open| set_outcome(&mut open.span, claim_id, outcome, status));
}

/// A timer invocation's server span (Reconcile): a root unless the host sent a parent.
pub(crate) fn timer_span(function: &'static str, headers: &HeaderMap) -> Span {
    if !super::enabled() {
        return Span::none();
    }
    let span = server_span(function, "timer");
    if let Some(parent) = parent_from_headers(headers) {
        set_parent(&span, &parent);
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
    // Straight into the record, in one look-up: the "invocation finished" log line
    // carries the same fields.
    with_record(span, |record, _| {
        set_outcome(record, claim_id, outcome, status)
    });
}

/// The outcome's attributes and status on an invocation's record.
fn set_outcome(record: &mut Recorded, claim_id: Option<&str>, outcome: &str, status: u16) {
    if let Some(claim_id) = claim_id {
        record
            .attributes
            .push(KeyValue::new("claimId", claim_id.to_owned()));
    }
    let outcome = match known("outcome", outcome) {
        Some(fixed) => StringValue::from(fixed),
        None => outcome.to_owned().into(),
    };
    record.attributes.push(KeyValue::new("outcome", outcome));
    // Text, as a recorded unsigned field is.
    record.attributes.push(KeyValue::new(
        "http.response.status_code",
        status_text(status),
    ));
    record.set_status(if (200..300).contains(&status) {
        Status::Ok
    } else {
        Status::error("")
    });
}

/// Sets `flag = true` on the current span (the invocation's: counters are counted
/// between store and bank calls), e.g. `takeover` when a delivery took over a lease.
pub(crate) fn flag_current_span(flag: &'static str) {
    if super::enabled() {
        set_attribute_here(KeyValue::new(flag, true));
    }
}

/// Sets an attribute on the current span, or else on the record of the invocation this
/// task runs.
fn set_attribute_here(attribute: KeyValue) {
    let mut attribute = Some(attribute);
    with_record(&Span::current(), |record, _| {
        record.attributes.extend(attribute.take())
    });
    if let Some(attribute) = attribute {
        with_invocation(|open| open.span.attributes.push(attribute));
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
            set_parent(&span, &parent);
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

/// The class of a bank answer, as the bank contract sorts them (docs/reference.md §7), for
/// span attributes and the latency metric's dimension; the bank client's own `classify`
/// decides what to do.
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
///
/// Like a store call it is no `tracing` span: its record is made after the answer
/// ([`record_call`]); only its span id is drawn before, for `traceparent`.
pub(crate) async fn bank_call(
    operation: &'static str,
    request: reqwest::RequestBuilder,
) -> reqwest::Result<reqwest::Response> {
    if !super::enabled() {
        return request.send().await;
    }
    let (client, built) = request.build_split();
    let mut built = built?;
    let url = built.url();
    let method = built.method().as_str();
    let name = format!("{method} {}", url.path());
    let mut attributes = Vec::with_capacity(7);
    attributes.push(KeyValue::new("bank.operation", operation));
    attributes.push(KeyValue::new(
        "http.request.method",
        match known("http.request.method", method) {
            Some(fixed) => StringValue::from(fixed),
            None => StringValue::from(method.to_owned()),
        },
    ));
    if let Some(host) = url.host_str() {
        attributes.push(KeyValue::new("server.address", host.to_owned()));
    }
    if let Some(port) = url.port_or_known_default() {
        // Unsigned integers are text, as a span field's are (see `SpanFields`).
        attributes.push(KeyValue::new("server.port", port.to_string()));
    }
    // Scheme, host, port and path only: never the query (a reference) or credentials.
    let (scheme, host, path) = (url.scheme(), url.host_str().unwrap_or(""), url.path());
    attributes.push(KeyValue::new(
        "url.full",
        match url.port() {
            Some(port) => format!("{scheme}://{host}:{port}{path}"),
            None => format!("{scheme}://{host}{path}"),
        },
    ));
    let mut record = Recorded::new(Cow::Owned(name), SpanKind::Client, attributes);
    if let Some(context) = place_here(&mut record) {
        TraceContextPropagator::new().inject_context(
            &opentelemetry::Context::new().with_remote_span_context(context),
            &mut HeaderInjector(built.headers_mut()),
        );
    }
    let started = Instant::now();
    let (result, call) = observe_call(client.execute(built)).await;
    let millis = started.elapsed().as_secs_f64() * 1000.0;
    let answer = match &result {
        Ok(response) => {
            let status = response.status().as_u16();
            record.attributes.push(KeyValue::new(
                "http.response.status_code",
                status.to_string(),
            ));
            bank_answer_class(status)
        }
        Err(e) if e.is_timeout() => "timeout",
        Err(_) => "connection-error",
    };
    record
        .attributes
        .push(KeyValue::new("bank.answer", StringValue::from(answer)));
    record.start = call.start;
    record.end = call.end;
    record.events = call.events;
    if call.error {
        record.set_status(Status::error(""));
    }
    record.set_status(if answer == "success" {
        Status::Ok
    } else {
        Status::error("")
    });
    attach_here(record);
    set_attribute_here(KeyValue::new("bankAnswer", answer));
    metrics::bank_duration(operation, answer, millis);
    result
}

/// Gives `record` (a client call about to start here) its trace, parent and span id: under
/// the innermost recorded span, else under this task's invocation, else a trace of its
/// own. Returns the context to hand to the callee.
fn place_here(record: &mut Recorded) -> Option<opentelemetry::trace::SpanContext> {
    let parent = Span::current()
        .with_subscriber(|(id, dispatch)| {
            let registry = dispatch.downcast_ref::<Registry>()?;
            let span = registry.span(id)?;
            let parent = span
                .scope()
                .find(|s| s.extensions().get::<Open>().is_some())?;
            let extensions = parent.extensions();
            extensions.get::<Open>().map(|open| parentage(&open.span))
        })
        .flatten()
        .or_else(|| with_invocation(|open| parentage(&open.span)));
    let ids = RandomIdGenerator::default();
    match parent {
        Some((trace_id, span_id, sampled, trace_state)) => {
            record.trace_id = trace_id;
            record.parent_span_id = span_id;
            record.sampled = sampled;
            record.trace_state = trace_state;
        }
        None => {
            record.trace_id = ids.new_trace_id();
            record.sampled = tracing::dispatcher::get_default(|dispatch| {
                dispatch
                    .downcast_ref::<Recorder>()
                    .map(|r| r.tail.policy.head_decision(record.trace_id, None))
            })?;
        }
    }
    record.span_id = ids.new_span_id();
    Some(record.context())
}

/// What a span under `span` inherits: its trace, itself as parent, its head decision and
/// trace state.
fn parentage(span: &Recorded) -> (opentelemetry::trace::TraceId, SpanId, bool, TraceState) {
    (
        span.trace_id,
        span.span_id,
        span.sampled,
        span.trace_state.clone(),
    )
}

/// What happened inside a store call in progress: the request units it was charged,
/// the warnings logged in it and whether one of them was an error.
#[derive(Default)]
struct InCall {
    charge: f64,
    events: Vec<Event>,
    error: bool,
}

tokio::task_local! {
    static IN_CALL: RefCell<InCall>;
}

/// Adds a Cosmos request charge to the store call in progress, if one is traced.
pub(crate) fn add_request_charge(ru: f64) {
    let _ = IN_CALL.try_with(|call| call.borrow_mut().charge += ru);
}

/// A finished store call, as [`observe_call`] saw it.
pub(crate) struct Observed {
    start: SystemTime,
    end: SystemTime,
    /// Cosmos request units (0 elsewhere).
    pub(crate) charge: f64,
    events: Vec<Event>,
    error: bool,
}

/// Runs a store call, timing it and gathering what is logged and charged inside it.
pub(crate) async fn observe_call<T>(work: impl std::future::Future<Output = T>) -> (T, Observed) {
    let start = SystemTime::now();
    IN_CALL
        .scope(RefCell::new(InCall::default()), async {
            let result = work.await;
            let call = IN_CALL.with(RefCell::take);
            let observed = Observed {
                start,
                end: SystemTime::now(),
                charge: call.charge,
                events: call.events,
                error: call.error,
            };
            (result, observed)
        })
        .await
}

/// Records a finished store call as a client span under the current span (a root of
/// its own outside every recorded span), failed with `failed` when it is set.
pub(crate) fn record_call(
    name: Cow<'static, str>,
    attributes: Vec<KeyValue>,
    call: Observed,
    failed: Option<&'static str>,
) {
    let mut record = Recorded::new(name, SpanKind::Client, attributes);
    record.start = call.start;
    record.end = call.end;
    record.events = call.events;
    if call.error {
        record.set_status(Status::error(""));
    }
    if let Some(label) = failed {
        record.set_status(Status::error(label));
    }
    attach_here(record);
}

/// Adds a finished client call's record under the current span (a root of its own
/// outside every recorded span). Ids already given ([`place_here`]) are kept.
fn attach_here(record: Recorded) {
    let current = Span::current();
    let mut record = Some(record);
    current.with_subscriber(|(id, dispatch)| {
        let (Some(recorder), Some(registry)) = (
            dispatch.downcast_ref::<Recorder>(),
            dispatch.downcast_ref::<Registry>(),
        ) else {
            return;
        };
        let Some(span) = registry.span(id) else {
            return;
        };
        let Some(parent) = span
            .scope()
            .find(|s| s.extensions().get::<Open>().is_some())
        else {
            return;
        };
        let mut extensions = parent.extensions_mut();
        let Some(open) = extensions.get_mut::<Open>() else {
            return;
        };
        if let Some(mut record) = record.take() {
            adopt(&mut record, &open.span, || recorder.ids.new_span_id());
            open.take(record, Vec::new());
        }
    });
    // Outside every recorded span: under the invocation this task runs, if any.
    if record.is_some() {
        with_invocation(|open| {
            if let Some(mut call) = record.take() {
                adopt(&mut call, &open.span, || {
                    RandomIdGenerator::default().new_span_id()
                });
                open.take(call, Vec::new());
            }
        });
    }
    // Outside that too (a background call): a trace of its own.
    if let Some(mut record) = record {
        tracing::dispatcher::get_default(|dispatch| {
            if let Some(recorder) = dispatch.downcast_ref::<Recorder>() {
                if record.trace_id == opentelemetry::trace::TraceId::INVALID {
                    record.trace_id = recorder.ids.new_trace_id();
                    record.sampled = recorder.tail.policy.head_decision(record.trace_id, None);
                }
                if record.span_id == SpanId::INVALID {
                    record.span_id = recorder.ids.new_span_id();
                }
                recorder.tail.finish(record.clone(), Vec::new());
            }
        });
    }
}

/// `record` goes under `parent`: its trace, head decision and trace state, and a span id
/// of its own unless it has one.
fn adopt(record: &mut Recorded, parent: &Recorded, new_id: impl FnOnce() -> SpanId) {
    (
        record.trace_id,
        record.parent_span_id,
        record.sampled,
        record.trace_state,
    ) = parentage(parent);
    if record.span_id == SpanId::INVALID {
        record.span_id = new_id();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::sampling::tests::{built, rate, Queue};
    use crate::telemetry::sampling::Policy;
    use opentelemetry_sdk::trace::SpanData;
    use tracing_subscriber::layer::SubscriberExt;

    /// What the export queue received while `work` ran under the recording layer, with
    /// `percent` of plain successes sampled.
    fn exported(percent: f64, work: impl FnOnce()) -> Vec<SpanData> {
        let queue = Queue::default();
        let policy = Policy {
            percent,
            ..Policy::default()
        };
        let tail = Arc::new(Tail::new(queue.clone(), policy));
        let subscriber = tracing_subscriber::registry().with(layer(Recorder::new(tail)));
        tracing::subscriber::with_default(subscriber, work);
        let spans = queue.0.lock().unwrap().clone();
        spans
    }

    /// One delivery as `ClaimApproved` records it: its server span, a store call under
    /// it, a warning when it fails, and its outcome.
    fn delivery(outcome: &str, status: u16) {
        let span = server_span("ClaimApproved", "pubsub");
        span.record("messageId", "m-1");
        let _entered = span.enter();
        let store = tracing::info_span!(
            "store",
            otel.name = "sqlite claim",
            otel.kind = "client",
            store.result = tracing::field::Empty,
        );
        store.record("store.result", "ok");
        drop(store);
        if status >= 300 {
            tracing::warn!(outcome, "invocation finished");
        }
        record_outcome(&span, Some("c-1"), outcome, status);
    }

    #[test]
    fn a_success_the_sampling_drops_builds_no_span_and_a_failure_leaves_whole() {
        let before = built();
        let kept = exported(0.0, || delivery("paid", 200));
        assert!(kept.is_empty(), "{kept:#?}");
        assert_eq!(
            built(),
            before,
            "a dropped success built OpenTelemetry spans"
        );

        let kept = exported(0.0, || delivery("retry-later", 503));
        assert_eq!(
            built() - before,
            2,
            "the failure's two spans, built once each"
        );
        let [store, root] = &kept[..] else {
            panic!("{kept:#?}")
        };
        assert_eq!(root.name, "ClaimApproved");
        assert_eq!(root.span_kind, SpanKind::Server);
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        assert!(matches!(root.status, Status::Error { .. }));
        assert_eq!(root.events.len(), 1, "the warning, as a span event");
        assert_eq!(root.events[0].name, "invocation finished");
        let attribute = |span: &SpanData, key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(attribute(root, "outcome").as_deref(), Some("retry-later"));
        assert_eq!(attribute(root, "messageId").as_deref(), Some("m-1"));
        assert_eq!(attribute(root, "claimId").as_deref(), Some("c-1"));
        assert_eq!(store.name, "sqlite claim");
        assert_eq!(store.span_kind, SpanKind::Client);
        assert_eq!(store.parent_span_id, root.span_context.span_id());
        assert_eq!(store.span_context.trace_id(), root.span_context.trace_id());
        assert_eq!(attribute(store, "store.result").as_deref(), Some("ok"));
        assert!(kept.iter().all(|s| s.span_context.is_sampled()));
        assert!(kept.iter().all(|s| rate(s) == Some(100.0)));
        assert!(root.start_time <= store.start_time && store.end_time <= root.end_time);

        // At 100% the same success is exported whole, at rate 100.
        let kept = exported(100.0, || delivery("paid", 200));
        assert_eq!(kept.len(), 2, "{kept:#?}");
    }

    /// A store call as `store::traced` records it: no span, a record under the current one.
    async fn store_call(result: &'static str, warn: bool) {
        let ((), observed) = observe_call(async {
            add_request_charge(2.5);
            if warn {
                tracing::warn!("the store is slow");
            }
        })
        .await;
        let failed = (result != "ok").then_some(result);
        record_call(
            Cow::Borrowed("cosmosdb claim"),
            vec![KeyValue::new("store.result", result)],
            observed,
            failed,
        );
    }

    fn block_on(work: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(work)
    }

    #[test]
    fn a_store_call_is_a_client_span_under_its_invocation_with_what_it_logged() {
        let before = built();
        let kept = exported(0.0, || {
            block_on(async {
                let span = server_span("ClaimApproved", "pubsub");
                async {
                    store_call("ok", false).await;
                    store_call("transient", true).await;
                }
                .instrument(span.clone())
                .await;
                record_outcome(&span, Some("c-1"), "retry-later", 503);
            })
        });
        assert_eq!(built() - before, 3, "the failure's spans, built once each");
        let [fine, failed, root] = &kept[..] else {
            panic!("{kept:#?}")
        };
        assert_eq!(root.name, "ClaimApproved");
        assert!(root.events.is_empty(), "the call's warning is the call's");
        for call in [fine, failed] {
            assert_eq!(call.name, "cosmosdb claim");
            assert_eq!(call.span_kind, SpanKind::Client);
            assert_eq!(call.parent_span_id, root.span_context.span_id());
            assert_eq!(call.span_context.trace_id(), root.span_context.trace_id());
            assert_ne!(call.span_context.span_id(), root.span_context.span_id());
            assert!(root.start_time <= call.start_time && call.end_time <= root.end_time);
        }
        assert_ne!(fine.span_context.span_id(), failed.span_context.span_id());
        assert_eq!(fine.status, Status::Unset);
        assert_eq!(failed.status, Status::error("transient"));
        assert_eq!(failed.events.len(), 1);
        assert_eq!(failed.events[0].name, "the store is slow");

        // A plain success dropped by the sampling builds nothing for its store calls.
        let before = built();
        let kept = exported(0.0, || {
            block_on(async {
                let span = server_span("ClaimApproved", "pubsub");
                store_call("ok", false).instrument(span.clone()).await;
                record_outcome(&span, Some("c-1"), "paid", 200);
            })
        });
        assert!(kept.is_empty(), "{kept:#?}");
        assert_eq!(built(), before);

        // Outside every invocation (a background call), a failed call is a trace of its own.
        let kept = exported(0.0, || block_on(store_call("permanent", false)));
        let [alone] = &kept[..] else {
            panic!("{kept:#?}")
        };
        assert_eq!(alone.parent_span_id, SpanId::INVALID);
        assert!(alone.span_context.trace_id() != opentelemetry::trace::TraceId::INVALID);
    }

    /// One delivery as `ClaimApproved` runs it: its record carried by its task, a store
    /// call, a bank request (a `tracing` span), and for a failure a flag and a warning.
    async fn delivery_as_run(headers: &HeaderMap, outcome: &'static str, status: u16) {
        crate::telemetry::export::enable_for_test();
        let invocation = invocation_span("ClaimApproved", headers, None, "m-1", 1);
        invocation
            .run(async {
                store_call("ok", false).await;
                let bank = tracing::info_span!(
                    "bank",
                    otel.kind = "client",
                    bank.answer = tracing::field::Empty
                );
                bank.record("bank.answer", "success");
                let failed = status >= 300;
                async {
                    if failed {
                        tracing::warn!("the bank is slow");
                    }
                }
                .instrument(bank)
                .await;
                if failed {
                    flag_current_span("takeover");
                    tracing::warn!(outcome, "invocation finished");
                }
                record_invocation_outcome(Some("c-1"), outcome, status);
            })
            .await;
    }

    #[test]
    fn an_invocation_recorded_without_a_span_is_exported_as_its_span_was() {
        let none = HeaderMap::new();
        let before = built();
        let kept = exported(0.0, || block_on(delivery_as_run(&none, "paid", 200)));
        assert!(kept.is_empty(), "{kept:#?}");
        assert_eq!(
            built(),
            before,
            "a dropped success built OpenTelemetry spans"
        );

        let kept = exported(0.0, || block_on(delivery_as_run(&none, "retry-later", 503)));
        assert_eq!(built() - before, 3, "the failure's spans, built once each");
        let [store, bank, root] = &kept[..] else {
            panic!("{kept:#?}")
        };
        assert_eq!(root.name, "ClaimApproved");
        assert_eq!(root.span_kind, SpanKind::Server);
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        assert!(matches!(root.status, Status::Error { .. }));
        assert_eq!(root.events.len(), 1, "the warning, as a span event");
        assert_eq!(root.events[0].name, "invocation finished");
        for call in [store, bank] {
            assert_eq!(call.span_kind, SpanKind::Client);
            assert_eq!(call.parent_span_id, root.span_context.span_id());
            assert_eq!(call.span_context.trace_id(), root.span_context.trace_id());
            assert!(root.start_time <= call.start_time && call.end_time <= root.end_time);
        }
        assert_eq!(store.name, "cosmosdb claim");
        assert_eq!(bank.events.len(), 1, "the bank's warning is the bank's");
        assert!(kept.iter().all(|s| rate(s) == Some(100.0)));

        // The same attributes, in the same order, as the `tracing` span it replaces.
        let as_span = exported(0.0, || {
            let span = server_span("ClaimApproved", "pubsub");
            span.record("messaging.system", "servicebus");
            span.record("messageId", "m-1");
            span.record("deliveryCount", 1u32);
            let entered = span.enter();
            flag_current_span("takeover");
            drop(entered);
            record_outcome(&span, Some("c-1"), "retry-later", 503);
        });
        let [as_span] = &as_span[..] else {
            panic!("{as_span:#?}")
        };
        assert_eq!(root.attributes, as_span.attributes);
        assert_eq!(root.status, as_span.status);

        // A caller's sampled parent: its trace, and a success kept at the caller's word.
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            format!("00-{trace}-00f067aa0ba902b7-01").parse().unwrap(),
        );
        let kept = exported(0.0, || block_on(delivery_as_run(&headers, "paid", 200)));
        let [_, _, root] = &kept[..] else {
            panic!("{kept:#?}")
        };
        assert_eq!(root.span_context.trace_id().to_string(), trace);
        assert_eq!(root.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(root.parent_span_is_remote);
        assert!(kept
            .iter()
            .all(|s| s.span_context.trace_id() == root.span_context.trace_id()));
    }

    #[test]
    fn a_callers_parent_gives_the_trace_and_the_bank_sees_the_head_decision() {
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            format!("00-{trace}-00f067aa0ba902b7-01").parse().unwrap(),
        );
        let mut seen = None;
        let kept = exported(0.0, || {
            let span = server_span("ClaimApproved", "pubsub");
            set_parent(&span, &parent_from_headers(&headers).unwrap());
            let _entered = span.enter();
            let bank = tracing::info_span!("bank", otel.kind = "client");
            seen = with_record(&bank, |record, _| record.context());
            record_outcome(&span, None, "paid", 200);
        });
        let seen = seen.expect("the bank span's context");
        assert_eq!(seen.trace_id().to_string(), trace);
        assert!(seen.is_sampled(), "the caller sampled it");
        let root = kept.iter().find(|s| s.span_kind == SpanKind::Server);
        let root = root.expect("a caller's sampled success is kept");
        assert_eq!(root.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(root.parent_span_is_remote);
        assert_eq!(rate(root), Some(100.0));
    }

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
