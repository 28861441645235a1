//! One span as recorded by [`super::trace`]'s layer: what its OpenTelemetry span would
//! carry, in plain values. Below both the recorder and the sampling ([`super::sampling`]),
//! which judges a finished trace on these records before any OpenTelemetry span exists.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::KeyValue;

/// One span as recorded: what its OpenTelemetry span would carry, in plain values. Only
/// a trace the sampling keeps becomes OpenTelemetry spans
/// ([`super::sampling::Tail::finish`]).
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) name: Cow<'static, str>,
    pub(crate) kind: SpanKind,
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// `SpanId::INVALID` for a root without a caller.
    pub(crate) parent_span_id: SpanId,
    pub(crate) parent_remote: bool,
    /// The head decision of the trace (see [`super::sampling`]): our `sampled` flag.
    pub(crate) sampled: bool,
    pub(crate) trace_state: TraceState,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    pub(crate) attributes: Vec<KeyValue>,
    pub(crate) status: Status,
    /// Warnings and errors logged in the span.
    pub(crate) events: Vec<Event>,
}

impl Recorded {
    /// A span's record starting now, not yet placed in a trace (no ids, not sampled).
    pub(super) fn new(name: Cow<'static, str>, kind: SpanKind, attributes: Vec<KeyValue>) -> Self {
        let now = SystemTime::now();
        Recorded {
            name,
            kind,
            trace_id: TraceId::INVALID,
            span_id: SpanId::INVALID,
            parent_span_id: SpanId::INVALID,
            parent_remote: false,
            sampled: false,
            trace_state: TraceState::default(),
            start: now,
            end: now,
            attributes,
            status: Status::Unset,
            events: Vec::new(),
        }
    }

    /// Statuses only rise (Unset, then Error, then Ok), as OpenTelemetry's spans do.
    pub(super) fn set_status(&mut self, status: Status) {
        if status > self.status {
            self.status = status;
        }
    }

    pub(super) fn context(&self) -> SpanContext {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanContext::new(
            self.trace_id,
            self.span_id,
            flags,
            false,
            self.trace_state.clone(),
        )
    }
}
