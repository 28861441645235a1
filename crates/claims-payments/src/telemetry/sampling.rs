//! Which traces leave the process: every failure whole, a share of the plain successes.
//!
//! Two parts, because one decision is known when an invocation starts and the other only
//! when it ends:
//!
//! - [`HeadSampler`] (the SDK's sampler) records every span, so a failure can always be
//!   exported, and sets the W3C `sampled` flag to the *success* decision: a caller's
//!   sampled `traceparent` (unless `OTEL_TRACES_SAMPLER=traceidratio`), else the trace
//!   id's score under `TELEMETRY_SAMPLE_PERCENT`, computed as the Application Insights
//!   SDKs do ([`sampling_score`]), so the host, the producer and this process keep or drop
//!   the same traces. The bank sees that flag in our `traceparent`.
//! - [`TailSampler`] (a span processor in front of the export queue) holds the spans of
//!   each invocation until its root span (the invocation's server span, or any span
//!   without a local parent) ends, then forwards the whole set or drops it
//!   ([`Policy::verdict`]): kept whole, at sample rate 100, when anything went other than
//!   plainly well; kept at the configured rate when the `sampled` flag says so.
//!
//! Every kept span carries `microsoft.sample_rate` (a percentage; the attribute the Azure
//! Monitor exporters read), which the Application Insights export turns into each item's
//! `sampleRate`, so the portal's counts are estimated totals. Metrics never pass through
//! here: they count everything. What the processor holds is bounded ([`MAX_HELD`]) and
//! spans whose root never ends are let go after [`HOLD_PERIOD`]; both are counted as
//! dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{
    SamplingDecision, SamplingResult, ShouldSample, Span, SpanData, SpanProcessor,
};

use super::counters;

/// The share of plain successes kept when nothing is set.
pub(crate) const DEFAULT_PERCENT: f64 = 5.0;
/// An invocation slower than this is kept whatever its outcome.
pub(crate) const DEFAULT_SLOW: Duration = Duration::from_secs(2);
/// At most this many finished spans wait for their root's end.
pub(crate) const MAX_HELD: usize = 4096;
/// Spans whose root has not ended within one to two of these are let go (a root always
/// ends sooner: functionTimeout is minutes, the timer functions stop at 90 s).
pub(crate) const HOLD_PERIOD: Duration = Duration::from_secs(300);
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
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> anyhow::Result<Policy> {
        let set = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut policy = Policy::default();
        let percent = set("TELEMETRY_SAMPLE_PERCENT");
        let ratio = set("OTEL_TRACES_SAMPLER_ARG");
        match (percent, ratio) {
            (Some(_), Some(_)) => anyhow::bail!(
                "TELEMETRY_SAMPLE_PERCENT and OTEL_TRACES_SAMPLER_ARG both set: set one"
            ),
            (Some(p), None) => {
                policy.percent = bounded(&p, 100.0).ok_or_else(|| {
                    anyhow::anyhow!(
                        "TELEMETRY_SAMPLE_PERCENT must be a number from 0 to 100, not {p:?}"
                    )
                })?;
            }
            (None, Some(r)) => {
                policy.percent = 100.0
                    * bounded(&r, 1.0).ok_or_else(|| {
                        anyhow::anyhow!(
                            "OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1, not {r:?}"
                        )
                    })?;
            }
            (None, None) => {}
        }
        match set("OTEL_TRACES_SAMPLER").as_deref() {
            None | Some("parentbased_traceidratio") => policy.honour_parent = true,
            Some("traceidratio") => policy.honour_parent = false,
            Some(other) => anyhow::bail!(
                "OTEL_TRACES_SAMPLER {other:?} is not supported: use parentbased_traceidratio \
                 (the default) or traceidratio; failures are kept whatever it says, and \
                 TELEMETRY_SAMPLE_PERCENT sets the share of successes"
            ),
        }
        if let Some(ms) = set("TELEMETRY_SLOW_MS") {
            let parsed = ms
                .parse::<u64>()
                .ok()
                .filter(|ms| (1..=3_600_000).contains(ms));
            let Some(parsed) = parsed else {
                anyhow::bail!(
                    "TELEMETRY_SLOW_MS must be milliseconds from 1 to 3600000, not {ms:?}"
                )
            };
            policy.slow = Duration::from_millis(parsed);
        }
        Ok(policy)
    }

    /// Whether a plain success of this trace is kept, by its id alone.
    pub(crate) fn keeps_share(&self, trace_id: TraceId) -> bool {
        keeps_share(trace_id, self.percent)
    }

    /// What to do with a finished invocation: its root span and every span under it.
    pub(crate) fn verdict(&self, root: &SpanData, under: &[SpanData]) -> Verdict {
        if let Some(reason) = self.reason_to_keep(root, under) {
            return Verdict::Keep(reason);
        }
        if root.span_context.is_sampled() {
            Verdict::Sampled
        } else {
            Verdict::Drop
        }
    }

    fn reason_to_keep(&self, root: &SpanData, under: &[SpanData]) -> Option<&'static str> {
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
                ("http.response.status_code", Value::I64(status)) if *status >= 400 => {
                    return Some("status");
                }
                _ => {}
            }
        }
        let took = root
            .end_time
            .duration_since(root.start_time)
            .unwrap_or_default();
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
fn unusual(span: &SpanData, is_root: bool) -> Option<&'static str> {
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

/// The SDK's sampler: records every span (so the tail can keep a failure) and sets the
/// `sampled` flag to whether a plain success of this trace is kept.
#[derive(Debug, Clone)]
pub(crate) struct HeadSampler {
    pub(crate) policy: Policy,
}

impl ShouldSample for HeadSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        _name: &str,
        _span_kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> SamplingResult {
        let parent = parent_context.map(|cx| cx.span().span_context().clone());
        let parent = parent.filter(SpanContext::is_valid);
        let sampled = match &parent {
            // Inside an invocation: its decision.
            Some(p) if !p.is_remote() => p.is_sampled(),
            // A caller's sampled trace stays whole; an unsampled one gets our share.
            Some(p) if self.policy.honour_parent && p.is_sampled() => true,
            _ => self.policy.keeps_share(trace_id),
        };
        SamplingResult {
            decision: if sampled {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::RecordOnly
            },
            attributes: Vec::new(),
            trace_state: parent.map(|p| p.trace_state().clone()).unwrap_or_default(),
        }
    }
}

/// Finished spans waiting for their root, by parent span id, in two generations: what
/// is still in `previous` when a generation ends was never claimed and is let go.
#[derive(Debug, Default)]
struct Held {
    current: HashMap<SpanId, Vec<SpanData>>,
    previous: HashMap<SpanId, Vec<SpanData>>,
    count: usize,
    generation_start: Option<SystemTime>,
}

impl Held {
    /// Takes every span under `root`, at any depth.
    fn take_under(&mut self, root: SpanId, into: &mut Vec<SpanData>) {
        let mut parents = vec![root];
        while let Some(parent) = parents.pop() {
            for map in [&mut self.current, &mut self.previous] {
                if let Some(children) = map.remove(&parent) {
                    self.count -= children.len();
                    parents.extend(children.iter().map(|c| c.span_context.span_id()));
                    into.extend(children);
                }
            }
        }
    }

    /// Starts a new generation when the current one is older than [`HOLD_PERIOD`] (by
    /// the spans' own end times: no clock read); returns how many spans were let go.
    fn age(&mut self, now: SystemTime) -> usize {
        let start = *self.generation_start.get_or_insert(now);
        if now.duration_since(start).unwrap_or_default() < HOLD_PERIOD {
            return 0;
        }
        let expired: usize = self.previous.values().map(Vec::len).sum();
        self.previous = std::mem::take(&mut self.current);
        self.count -= expired;
        self.generation_start = Some(now);
        expired
    }
}

/// The tail of the sampling: holds each invocation's spans until its root ends, then
/// forwards all of them to `inner` (the export queue) or none.
#[derive(Debug)]
pub(crate) struct TailSampler<P> {
    inner: P,
    policy: Policy,
    held: Mutex<Held>,
}

impl<P: SpanProcessor> TailSampler<P> {
    pub(crate) fn new(inner: P, policy: Policy) -> Self {
        TailSampler {
            inner,
            policy,
            held: Mutex::new(Held::default()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn root_ended(&self, root: SpanData) {
        let mut under = Vec::new();
        self.held()
            .take_under(root.span_context.span_id(), &mut under);
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
            self.inner.on_end(exportable(span, rate));
        }
    }
}

/// A kept span as the export queue takes it: `sampled`, with its sample rate.
fn exportable(mut span: SpanData, rate: f64) -> SpanData {
    if !span.span_context.is_sampled() {
        let sc = &span.span_context;
        span.span_context = SpanContext::new(
            sc.trace_id(),
            sc.span_id(),
            TraceFlags::SAMPLED,
            sc.is_remote(),
            sc.trace_state().clone(),
        );
    }
    span.attributes
        .push(KeyValue::new(SAMPLE_RATE_ATTRIBUTE, rate));
    span
}

impl<P: SpanProcessor> SpanProcessor for TailSampler<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // A local root: no parent, or a parent in another process.
        if span.parent_span_id == SpanId::INVALID || span.parent_span_is_remote {
            self.root_ended(span);
            return;
        }
        let mut held = self.held();
        let expired = held.age(span.end_time);
        let full = held.count >= MAX_HELD;
        if !full {
            held.count += 1;
            held.current
                .entry(span.parent_span_id)
                .or_default()
                .push(span);
        }
        drop(held);
        let lost = expired + usize::from(full);
        if lost > 0 {
            counters().telemetry_dropped.add(lost as u64);
        }
    }

    super::forward_lifecycle_to_inner!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceState;
    use opentelemetry_sdk::error::OTelSdkResult;
    use std::sync::Arc;

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
    struct Queue(Arc<Mutex<Vec<SpanData>>>);

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

    fn span_context(trace: TraceId, id: u64, sampled: bool, remote: bool) -> SpanContext {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanContext::new(
            trace,
            SpanId::from(id),
            flags,
            remote,
            TraceState::default(),
        )
    }

    fn span(trace: TraceId, id: u64, parent: u64, sampled: bool) -> SpanData {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        SpanData {
            span_context: span_context(trace, id, sampled, false),
            parent_span_id: SpanId::from(parent),
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "s".into(),
            start_time: start,
            end_time: start + Duration::from_millis(5),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    fn rate(span: &SpanData) -> Option<f64> {
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
        let tail = TailSampler::new(queue.clone(), Policy::default());
        let trace = trace_id("4bf92f3577b34da6a3ce929d0e0e4736");

        // A failed invocation, not in the share: a store call, a bank call under it, the root.
        let mut bank = span(trace, 3, 2, false);
        bank.status = Status::error("transient");
        tail.on_end(bank);
        tail.on_end(span(trace, 2, 1, false));
        let mut root = span(trace, 1, 0, false);
        root.attributes
            .push(KeyValue::new("outcome", "needs-reconciliation"));
        tail.on_end(root);
        let kept = std::mem::take(&mut *queue.0.lock().unwrap());
        assert_eq!(kept.len(), 3, "{kept:#?}");
        assert!(kept.iter().all(|s| s.span_context.is_sampled()));
        assert!(kept.iter().all(|s| rate(s) == Some(100.0)));

        // Plain successes of the same trace id (a redelivery shares it): dropped unless
        // flagged sampled, then kept at the configured rate.
        for (first_id, sampled) in [(10, false), (20, true)] {
            tail.on_end(span(trace, first_id + 1, first_id, sampled));
            let mut root = span(trace, first_id, 0, sampled);
            root.attributes.push(KeyValue::new("outcome", "paid"));
            tail.on_end(root);
        }
        let kept = std::mem::take(&mut *queue.0.lock().unwrap());
        assert_eq!(kept.len(), 2, "{kept:#?}");
        assert!(kept.iter().all(|s| rate(s) == Some(DEFAULT_PERCENT)));
        assert_eq!(tail.held().count, 0, "nothing left behind");
    }

    #[test]
    fn a_success_a_caller_sampled_at_a_0_percent_share_counts_once() {
        let queue = Queue::default();
        let policy = Policy {
            percent: 0.0,
            ..Policy::default()
        };
        let tail = TailSampler::new(queue.clone(), policy);
        let trace = trace_id("4bf92f3577b34da6a3ce929d0e0e4736");
        let mut root = span(trace, 1, 9, true);
        root.parent_span_is_remote = true;
        root.attributes.push(KeyValue::new("outcome", "paid"));
        tail.on_end(root);
        let kept = queue.0.lock().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(rate(&kept[0]), Some(100.0), "never a rate of 0");
    }

    #[test]
    fn what_waits_for_a_root_is_bounded_and_let_go_when_the_root_never_ends() {
        let queue = Queue::default();
        let tail = TailSampler::new(queue.clone(), Policy::default());
        let trace = trace_id("0af7651916cd43dd8448eb211c80319c");
        let dropped_before = counters().telemetry_dropped.get();
        for i in 0..(MAX_HELD as u64 + 10) {
            // Children of parents that never end.
            tail.on_end(span(trace, 100_000 + i, 50_000 + i, false));
        }
        assert_eq!(tail.held().count, MAX_HELD);
        assert!(counters().telemetry_dropped.get() - dropped_before >= 10);
        // Two hold periods later the orphans are gone.
        for step in 1..=2u32 {
            let mut late = span(trace, 900 + u64::from(step), 800, false);
            late.end_time += HOLD_PERIOD * step + Duration::from_secs(1);
            tail.on_end(late);
        }
        assert!(tail.held().count <= 2, "{}", tail.held().count);
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
        let refused = root(vec![KeyValue::new("http.response.status_code", 409i64)]);
        assert!(matches!(policy.verdict(&refused, &[]), Verdict::Keep(_)));
        let mut slow = root(vec![KeyValue::new("outcome", "paid")]);
        slow.end_time = slow.start_time + DEFAULT_SLOW + Duration::from_millis(1);
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
    fn the_head_sampler_honours_a_callers_flag_and_otherwise_the_share() {
        use opentelemetry::trace::TraceContextExt as _;
        let trace = trace_id("4bf92f3577b34da6a3ce929d0e0e4736");
        let remote = |sampled: bool| {
            Context::new().with_remote_span_context(span_context(trace, 7, sampled, true))
        };
        let decide = |policy: Policy, cx: Option<&Context>| {
            HeadSampler { policy }
                .should_sample(cx, trace, "x", &SpanKind::Server, &[], &[])
                .decision
        };
        let none = Policy {
            percent: 0.0,
            ..Policy::default()
        };
        let all = Policy {
            percent: 100.0,
            ..Policy::default()
        };
        // Never dropped: a failure must still be recordable.
        assert_eq!(decide(none, None), SamplingDecision::RecordOnly);
        assert_eq!(decide(all, None), SamplingDecision::RecordAndSample);
        assert_eq!(
            decide(none, Some(&remote(true))),
            SamplingDecision::RecordAndSample
        );
        assert_eq!(
            decide(none, Some(&remote(false))),
            SamplingDecision::RecordOnly
        );
        let ignoring = Policy {
            honour_parent: false,
            ..none
        };
        assert_eq!(
            decide(ignoring, Some(&remote(true))),
            SamplingDecision::RecordOnly
        );
    }
}
