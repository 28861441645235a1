//! Which traces leave the process: every failure whole, a share of the plain successes.
//!
//! Two parts, because one decision is known when an invocation starts and the other only
//! when it ends:
//!
//! - The head decision ([`Policy::head_decision`]), taken when an invocation's root span
//!   is created (or given its remote parent): a caller's sampled `traceparent` (unless
//!   `OTEL_TRACES_SAMPLER=traceidratio`), else the trace id's score under
//!   `TELEMETRY_SAMPLE_PERCENT`, computed as the Application Insights SDKs do
//!   ([`sampling_score`]), so the host, the producer and this process keep or drop the
//!   same traces. It is the W3C `sampled` flag of our `traceparent` to the bank.
//! - The tail decision ([`Tail::finish`]), taken when the root ends with every span under
//!   it ([`Policy::verdict`]): kept whole, at sample rate 100, when anything went other
//!   than plainly well; kept at the configured rate when the head decision says so;
//!   otherwise dropped.
//!
//! Until then an invocation's spans are plain records ([`super::record::Recorded`]: names,
//! times, attributes); OpenTelemetry spans ([`SpanData`]) are built only for a trace that
//! is kept, so a dropped success costs no span at all. Every kept span carries
//! `microsoft.sample_rate` (a percentage; the attribute the Azure Monitor exporters read),
//! which the Application Insights export turns into each item's `sampleRate`, so the
//! portal's counts are estimated totals. Metrics never pass through here: they count
//! everything.

use std::time::Duration;

use opentelemetry::trace::{SpanContext, Status, TraceFlags, TraceId};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks, SpanProcessor};

use super::counters;
use super::record::Recorded;
use crate::env_setting::ConfigError;

/// The share of plain successes kept when nothing is set.
pub(crate) const DEFAULT_PERCENT: f64 = 5.0;
/// An invocation slower than this is kept whatever its outcome.
pub(crate) const DEFAULT_SLOW: Duration = Duration::from_secs(2);
/// The span attribute the Azure Monitor exporters read as an item's sample rate (%).
pub const SAMPLE_RATE_ATTRIBUTE: &str = "microsoft.sample_rate";

/// Outcomes that are a plain success: only these may be sampled away. Anything else,
/// including an outcome added later, is kept.
const PLAIN_OUTCOMES: [&str; 4] = ["paid", "recorded", "duplicate", "noop"];
/// Flags the counters set on a span when something out of the ordinary happened
/// (see `Counter::flagging`): a takeover, a lost race for a message, a gone owner.
const UNUSUAL_FLAGS: [&str; 4] = [
    "takeover",
    "leaseWait",
    "ownWriteRecognised",
    "ownerFoundGone",
];

/// The sampling settings, read once at start-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    /// Share of plain successes kept, 0..=100.
    pub(crate) percent: f64,
    /// Whether a caller's sampled `traceparent` keeps a success.
    pub(crate) honour_parent: bool,
    /// Invocations slower than this are kept.
    pub(crate) slow: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            percent: DEFAULT_PERCENT,
            honour_parent: true,
            slow: DEFAULT_SLOW,
        }
    }
}

/// The settings [`Policy::from_lookup`] reads.
pub(crate) const SETTINGS: [&str; 4] = [
    "TELEMETRY_SAMPLE_PERCENT",
    "TELEMETRY_SLOW_MS",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
];

impl Policy {
    /// Reads and checks the settings; a value out of range stops the start.
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Policy, ConfigError> {
        let set = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut policy = Policy::default();
        let percent = set("TELEMETRY_SAMPLE_PERCENT");
        let ratio = set("OTEL_TRACES_SAMPLER_ARG");
        match (percent, ratio) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "TELEMETRY_SAMPLE_PERCENT",
                    "and OTEL_TRACES_SAMPLER_ARG are both set: set one",
                ))
            }
            (Some(p), None) => {
                policy.percent = bounded(&p, 100.0).ok_or_else(|| {
                    ConfigError::new(
                        "TELEMETRY_SAMPLE_PERCENT",
                        format!("must be a number from 0 to 100, not {p:?}"),
                    )
                })?;
            }
            (None, Some(r)) => {
                policy.percent = 100.0
                    * bounded(&r, 1.0).ok_or_else(|| {
                        ConfigError::new(
                            "OTEL_TRACES_SAMPLER_ARG",
                            format!("must be a ratio from 0 to 1, not {r:?}"),
                        )
                    })?;
            }
            (None, None) => {}
        }
        match set("OTEL_TRACES_SAMPLER").as_deref() {
            None | Some("parentbased_traceidratio") => policy.honour_parent = true,
            Some("traceidratio") => policy.honour_parent = false,
            Some(other) => {
                return Err(ConfigError::new(
                    "OTEL_TRACES_SAMPLER",
                    format!(
                        "{other:?} is not supported: use parentbased_traceidratio \
                         (the default) or traceidratio; failures are kept whatever it says, and \
                         TELEMETRY_SAMPLE_PERCENT sets the share of successes"
                    ),
                ))
            }
        }
        if let Some(ms) = set("TELEMETRY_SLOW_MS") {
            let parsed = ms
                .parse::<u64>()
                .ok()
                .filter(|ms| (1..=3_600_000).contains(ms));
            let Some(parsed) = parsed else {
                return Err(ConfigError::new(
                    "TELEMETRY_SLOW_MS",
                    format!("must be milliseconds from 1 to 3600000, not {ms:?}"),
                ));
            };
            policy.slow = Duration::from_millis(parsed);
        }
        Ok(policy)
    }

    /// Whether a plain success of this trace is kept, by its id alone.
    pub(crate) fn keeps_share(&self, trace_id: TraceId) -> bool {
        keeps_share(trace_id, self.percent)
    }

    /// The head decision of a trace: whether a plain success of it is kept. `remote` is
    /// the caller's span context, when there is one.
    pub(crate) fn head_decision(&self, trace_id: TraceId, remote: Option<&SpanContext>) -> bool {
        match remote {
            // A caller's sampled trace stays whole; an unsampled one gets our share.
            Some(p) if self.honour_parent && p.is_sampled() => true,
            _ => self.keeps_share(trace_id),
        }
    }

    /// What to do with a finished invocation: its root span and every span under it.
    pub(crate) fn verdict(&self, root: &Recorded, under: &[Recorded]) -> Verdict {
        if let Some(reason) = self.reason_to_keep(root, under) {
            return Verdict::Keep(reason);
        }
        if root.sampled {
            Verdict::Sampled
        } else {
            Verdict::Drop
        }
    }

    fn reason_to_keep(&self, root: &Recorded, under: &[Recorded]) -> Option<&'static str> {
        if matches!(root.status, Status::Error { .. }) {
            return Some("error");
        }
        for kv in &root.attributes {
            match (kv.key.as_str(), &kv.value) {
                ("outcome", Value::String(outcome))
                    if !PLAIN_OUTCOMES.contains(&outcome.as_str()) =>
                {
                    return Some("outcome");
                }
                ("faas.trigger", Value::String(t)) if t.as_str() == "timer" => {
                    return Some("timer");
                }
                // The recorder records an unsigned status as text (`trace::SpanFields`).
                ("http.response.status_code", Value::String(status))
                    if status.as_str().parse::<u16>().is_ok_and(|s| s >= 400) =>
                {
                    return Some("status");
                }
                ("http.response.status_code", Value::I64(status)) if *status >= 400 => {
                    return Some("status");
                }
                _ => {}
            }
        }
        let took = root.end.duration_since(root.start).unwrap_or_default();
        if took > self.slow {
            return Some("slow");
        }
        std::iter::once(root)
            .chain(under)
            .find_map(|span| unusual(span, std::ptr::eq(span, root)))
    }
}

/// Why a span (any of the trace) makes its trace worth keeping: a failed dependency, a
/// warning or error logged in it, a flag such as a takeover, a lost race at the store.
fn unusual(span: &Recorded, is_root: bool) -> Option<&'static str> {
    if !is_root && matches!(span.status, Status::Error { .. }) {
        return Some("dependency error");
    }
    // Only warnings and errors become span events (trace::layer).
    if !span.events.is_empty() {
        return Some("logged warning");
    }
    span.attributes
        .iter()
        .find_map(|kv| match (kv.key.as_str(), &kv.value) {
            (flag, Value::Bool(true)) if UNUSUAL_FLAGS.contains(&flag) => Some("flagged"),
            ("store.result", Value::String(r)) if r.as_str() == "precondition-failed" => {
                Some("lost race")
            }
            _ => None,
        })
}

/// A finished invocation's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Kept whatever the sampling: exported at sample rate 100.
    Keep(&'static str),
    /// A success in the sampled share: exported at the configured rate.
    Sampled,
    /// A success outside it.
    Drop,
}

/// The Application Insights SDKs' sampling score of a trace, 0..=1: the 32-bit DJB2 hash
/// of the trace id's lowercase hex, absolute, over `i32::MAX` (their
/// `ApplicationInsightsSampler` and `SamplingScoreGenerator`). A trace is in a `p`% share
/// when `score < p / 100`, so a share keeps every trace a smaller one keeps.
pub fn sampling_score(trace_id: TraceId) -> f64 {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hash: i32 = 5381;
    for byte in trace_id.to_bytes() {
        for nibble in [byte >> 4, byte & 0x0f] {
            let c = i32::from(HEX[usize::from(nibble)]);
            hash = (hash << 5).wrapping_add(hash).wrapping_add(c);
        }
    }
    let hash = if hash == i32::MIN {
        i32::MAX
    } else {
        hash.abs()
    };
    f64::from(hash) / f64::from(i32::MAX)
}

/// Whether a trace is in the `percent`% share (100 keeps all, 0 none).
pub fn keeps_share(trace_id: TraceId, percent: f64) -> bool {
    if percent >= 100.0 {
        return true;
    }
    percent > 0.0 && sampling_score(trace_id) * 100.0 < percent
}

fn bounded(text: &str, max: f64) -> Option<f64> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && (0.0..=max).contains(v))
}

/// The tail of the sampling: given each finished invocation, builds the OpenTelemetry
/// spans of a kept one and hands them to `inner` (the export queue); a dropped one is
/// only counted.
pub(crate) struct Tail {
    inner: Box<dyn SpanProcessor>,
    pub(crate) policy: Policy,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("policy", &self.policy)
            .finish()
    }
}

impl Tail {
    pub(crate) fn new(inner: impl SpanProcessor + 'static, policy: Policy) -> Self {
        Tail {
            inner: Box::new(inner),
            policy,
            scope: InstrumentationScope::builder("claims-payments").build(),
        }
    }

    /// A local root ended (the invocation's server span, or any span without a local
    /// parent), with every span under it.
    pub(crate) fn finish(&self, root: Recorded, under: Vec<Recorded>) {
        let rate = match self.policy.verdict(&root, &under) {
            Verdict::Keep(_) => 100.0,
            // At 0% only a caller's sampled flag keeps a success: count it once rather
            // than as 100 / 0.
            Verdict::Sampled if self.policy.percent > 0.0 => self.policy.percent,
            Verdict::Sampled => 100.0,
            Verdict::Drop => {
                counters().telemetry_traces_sampled_out.inc();
                return;
            }
        };
        counters().telemetry_traces_kept.inc();
        for span in under.into_iter().chain(std::iter::once(root)) {
            self.inner.on_end(self.exportable(span, rate));
        }
    }

    /// A kept span as the export queue takes it: `sampled`, with its sample rate.
    fn exportable(&self, span: Recorded, rate: f64) -> SpanData {
        #[cfg(test)]
        tests::BUILT.with(|b| b.set(b.get() + 1));
        let mut attributes = span.attributes;
        attributes.push(KeyValue::new(SAMPLE_RATE_ATTRIBUTE, rate));
        let mut events = SpanEvents::default();
        events.events = span.events;
        SpanData {
            span_context: SpanContext::new(
                span.trace_id,
                span.span_id,
                TraceFlags::SAMPLED,
                false,
                span.trace_state,
            ),
            parent_span_id: span.parent_span_id,
            parent_span_is_remote: span.parent_remote,
            span_kind: span.kind,
            name: span.name,
            start_time: span.start,
            end_time: span.end,
            attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: span.status,
            instrumentation_scope: self.scope.clone(),
        }
    }

    pub(crate) fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, SpanKind, TraceState};
    use opentelemetry::Context;
    use opentelemetry_sdk::trace::Span;
    use std::cell::Cell;
    use std::sync::{Arc, Mutex};
    use std::time::SystemTime;

    thread_local! {
        /// OpenTelemetry spans built on this thread ([`Tail::exportable`]).
        pub(super) static BUILT: Cell<u64> = const { Cell::new(0) };
    }

    pub(crate) fn built() -> u64 {
        BUILT.with(Cell::get)
    }

    fn trace_id(hex: &str) -> TraceId {
        TraceId::from_hex(hex).unwrap()
    }

    #[test]
    fn the_score_is_the_application_insights_djb2_of_the_trace_id() {
        // Computed independently (32-bit DJB2 over the lowercase hex, as the
        // ApplicationInsightsSampler of opentelemetry-dotnet-contrib does).
        let cases = [
            ("4bf92f3577b34da6a3ce929d0e0e4736", SCORE_A),
            ("0af7651916cd43dd8448eb211c80319c", SCORE_B),
            ("00000000000000000000000000000001", SCORE_C),
        ];
        for (hex, expected) in cases {
            let score = sampling_score(trace_id(hex));
            assert!(
                (score - expected).abs() < 1e-12,
                "{hex}: {score} != {expected}"
            );
        }
        assert!(keeps_share(
            trace_id("00000000000000000000000000000001"),
            100.0
        ));
        assert!(!keeps_share(
            trace_id("00000000000000000000000000000001"),
            0.0
        ));
    }

    // Computed with Python: 32-bit wrapping DJB2, abs, over 2^31 - 1.
    const SCORE_A: f64 = 0.33461353850300124;
    const SCORE_B: f64 = 0.5278892803601405;
    const SCORE_C: f64 = 0.02339351457701694;

    #[test]
    fn settings_are_checked_strictly() {
        let policy = |pairs: &[(&str, &str)]| Policy::from_lookup(crate::telemetry::lookup(pairs));
        assert_eq!(policy(&[]).unwrap(), Policy::default());
        assert_eq!(
            policy(&[("TELEMETRY_SAMPLE_PERCENT", "100")])
                .unwrap()
                .percent,
            100.0
        );
        assert_eq!(
            policy(&[("TELEMETRY_SAMPLE_PERCENT", "0.5")])
                .unwrap()
                .percent,
            0.5
        );
        assert_eq!(
            policy(&[("OTEL_TRACES_SAMPLER_ARG", "0.25")])
                .unwrap()
                .percent,
            25.0
        );
        let ratio_only = policy(&[("OTEL_TRACES_SAMPLER", "traceidratio")]).unwrap();
        assert!(!ratio_only.honour_parent);
        assert_eq!(
            policy(&[("TELEMETRY_SLOW_MS", "250")]).unwrap().slow,
            Duration::from_millis(250)
        );
        for bad in [
            vec![("TELEMETRY_SAMPLE_PERCENT", "101")],
            vec![("TELEMETRY_SAMPLE_PERCENT", "-1")],
            vec![("TELEMETRY_SAMPLE_PERCENT", "NaN")],
            vec![("TELEMETRY_SAMPLE_PERCENT", "5%")],
            vec![("OTEL_TRACES_SAMPLER_ARG", "5")],
            vec![
                ("TELEMETRY_SAMPLE_PERCENT", "5"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.05"),
            ],
            vec![("OTEL_TRACES_SAMPLER", "always_off")],
            vec![("TELEMETRY_SLOW_MS", "0")],
            vec![("TELEMETRY_SLOW_MS", "fast")],
        ] {
            assert!(policy(&bad).is_err(), "{bad:?} was accepted");
        }
    }

    /// What reached the export queue.
    #[derive(Debug, Default, Clone)]
    pub(crate) struct Queue(pub(crate) Arc<Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Queue {
        fn on_start(&self, _span: &mut Span, _cx: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    fn span(trace: TraceId, id: u64, parent: u64, sampled: bool) -> Recorded {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        Recorded {
            name: "s".into(),
            kind: SpanKind::Internal,
            trace_id: trace,
            span_id: SpanId::from(id),
            parent_span_id: SpanId::from(parent),
            parent_remote: false,
            sampled,
            trace_state: TraceState::default(),
            start,
            end: start + Duration::from_millis(5),
            attributes: Vec::new(),
            status: Status::Unset,
            events: Vec::new(),
        }
    }

    pub(crate) fn rate(span: &SpanData) -> Option<f64> {
        span.attributes.iter().find_map(|kv| {
            (kv.key.as_str() == SAMPLE_RATE_ATTRIBUTE).then_some(match kv.value {
                Value::F64(r) => r,
                _ => f64::NAN,
            })
        })
    }

    #[test]
    fn a_failure_leaves_whole_at_rate_100_and_a_plain_success_follows_its_flag() {
        let queue = Queue::default();
        let tail = Tail::new(queue.clone(), Policy::default());
        let trace = trace_id("4bf92f3577b34da6a3ce929d0e0e4736");

        // A failed invocation, not in the share: a store call, a bank call under it, the root.
        let mut bank = span(trace, 3, 2, false);
        bank.status = Status::error("transient");
        let mut root = span(trace, 1, 0, false);
        root.attributes
            .push(KeyValue::new("outcome", "needs-reconciliation"));
        tail.finish(root, vec![bank, span(trace, 2, 1, false)]);
        let kept = std::mem::take(&mut *queue.0.lock().unwrap());
        assert_eq!(kept.len(), 3, "{kept:#?}");
        assert!(kept.iter().all(|s| s.span_context.is_sampled()));
        assert!(kept.iter().all(|s| rate(s) == Some(100.0)));
        assert_eq!(
            kept[2].span_context.span_id(),
            SpanId::from(1),
            "the root last"
        );

        // Plain successes of the same trace id (a redelivery shares it): dropped unless
        // flagged sampled, then kept at the configured rate.
        let before = built();
        for (first_id, sampled) in [(10, false), (20, true)] {
            let mut root = span(trace, first_id, 0, sampled);
            root.attributes.push(KeyValue::new("outcome", "paid"));
            tail.finish(root, vec![span(trace, first_id + 1, first_id, sampled)]);
        }
        let kept = std::mem::take(&mut *queue.0.lock().unwrap());
        assert_eq!(kept.len(), 2, "{kept:#?}");
        assert!(kept.iter().all(|s| rate(s) == Some(DEFAULT_PERCENT)));
        assert_eq!(built() - before, 2, "the dropped success built no span");
    }

    #[test]
    fn a_success_a_caller_sampled_at_a_0_percent_share_counts_once() {
        let queue = Queue::default();
        let policy = Policy {
            percent: 0.0,
            ..Policy::default()
        };
        let tail = Tail::new(queue.clone(), policy);
        let trace = trace_id("4bf92f3577b34da6a3ce929d0e0e4736");
        let mut root = span(trace, 1, 9, true);
        root.parent_remote = true;
        root.attributes.push(KeyValue::new("outcome", "paid"));
        tail.finish(root, Vec::new());
        let kept = queue.0.lock().unwrap();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].parent_span_is_remote);
        assert_eq!(rate(&kept[0]), Some(100.0), "never a rate of 0");
    }

    #[test]
    fn unusual_invocations_are_kept_whatever_the_share() {
        let policy = Policy {
            percent: 0.0,
            ..Policy::default()
        };
        let trace = trace_id("00000000000000000000000000000001");
        let root = |attrs: Vec<KeyValue>| {
            let mut s = span(trace, 1, 0, false);
            s.attributes = attrs;
            s
        };
        let plain = root(vec![KeyValue::new("outcome", "paid")]);
        assert_eq!(policy.verdict(&plain, &[]), Verdict::Drop);
        for outcome in [
            "retry-later",
            "needs-reconciliation",
            "conflict",
            "invalid-message",
            "rejected",
            "store-failure",
            "business-duplicate",
        ] {
            let r = root(vec![KeyValue::new("outcome", outcome)]);
            assert!(
                matches!(policy.verdict(&r, &[]), Verdict::Keep(_)),
                "{outcome}"
            );
        }
        let timer = root(vec![KeyValue::new("faas.trigger", "timer")]);
        assert!(matches!(policy.verdict(&timer, &[]), Verdict::Keep(_)));
        // As the recorder records it (text), and as a number.
        for status in [Value::from("409"), Value::I64(409)] {
            let refused = root(vec![KeyValue::new("http.response.status_code", status)]);
            assert!(matches!(policy.verdict(&refused, &[]), Verdict::Keep(_)));
        }
        let answered = root(vec![KeyValue::new("http.response.status_code", "201")]);
        assert_eq!(policy.verdict(&answered, &[]), Verdict::Drop);
        let mut slow = root(vec![KeyValue::new("outcome", "paid")]);
        slow.end = slow.start + DEFAULT_SLOW + Duration::from_millis(1);
        assert!(matches!(policy.verdict(&slow, &[]), Verdict::Keep(_)));
        let takeover = root(vec![
            KeyValue::new("outcome", "paid"),
            KeyValue::new("takeover", true),
        ]);
        assert!(matches!(policy.verdict(&takeover, &[]), Verdict::Keep(_)));
        let mut lost_race = span(trace, 2, 1, false);
        lost_race
            .attributes
            .push(KeyValue::new("store.result", "precondition-failed"));
        assert!(matches!(
            policy.verdict(&plain, &[lost_race]),
            Verdict::Keep(_)
        ));
        let mut failed_dependency = span(trace, 2, 1, false);
        failed_dependency.status = Status::error("transient");
        assert!(matches!(
            policy.verdict(&plain, &[failed_dependency]),
            Verdict::Keep(_)
        ));
    }

    #[test]
    fn the_head_decision_honours_a_callers_flag_and_otherwise_the_share() {
        let trace = trace_id("4bf92f3577b34da6a3ce929d0e0e4736");
        let remote = |sampled: bool| {
            let flags = if sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            };
            SpanContext::new(trace, SpanId::from(7), flags, true, TraceState::default())
        };
        let none = Policy {
            percent: 0.0,
            ..Policy::default()
        };
        let all = Policy {
            percent: 100.0,
            ..Policy::default()
        };
        assert!(!none.head_decision(trace, None));
        assert!(all.head_decision(trace, None));
        assert!(none.head_decision(trace, Some(&remote(true))));
        assert!(!none.head_decision(trace, Some(&remote(false))));
        let ignoring = Policy {
            honour_parent: false,
            ..none
        };
        assert!(!ignoring.head_decision(trace, Some(&remote(true))));
    }
}
