//! Where telemetry goes, and how it never gets in the way.
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` set: OTLP over HTTP (protobuf) to it (a collector, the
//!   Functions host's OpenTelemetry mode); the standard `OTEL_EXPORTER_OTLP_*` variables
//!   apply.
//! - otherwise `APPLICATIONINSIGHTS_CONNECTION_STRING` set: Application Insights, at the
//!   connection string's ingestion endpoint (`/v2/track`, gzip). When
//!   `APPLICATIONINSIGHTS_AUTHENTICATION_STRING` is `Authorization=AAD` (the resource
//!   disables local auth, as infra/ deploys it), every upload carries an Entra token of
//!   the app's managed identity (`ClientId=` names the user-assigned one).
//! - neither: nothing is exported, no span is created, no metric instrument exists.
//!
//! Spans first pass the sampling ([`super::sampling`]): each invocation's spans wait for
//! its end, as records, and leave whole or not at all. Then they are batched on the SDK's own thread
//! and leave through a queue of at most [`QUEUE_CAPACITY`] spans: a span that finds the
//! queue full is dropped and counted (`telemetryDropped` in `/metrics` and the counters
//! log line), never waited for, and spans of an export that failed are counted the same
//! way. Uploads run on the service's runtime with a timeout of [`UPLOAD_TIMEOUT`], follow
//! no redirect and read at most [`MAX_ANSWER_BYTES`] of an answer; a failed one is
//! counted in `telemetryExportFailures`. Losses are logged at most once a minute
//! ([`report_loss`]). Metrics are aggregated in memory (bounded by the SDK's cardinality
//! limit) and exported every `OTEL_METRIC_EXPORT_INTERVAL` ms (60 000); they are never
//! sampled.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::credentials::TokenCredential;
use opentelemetry::Context;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;

use super::counters;
use super::sampling::{Policy, Tail, SAMPLE_RATE_ATTRIBUTE};
use super::trace::Recorder;
use crate::entra::{self, EntraIdentity, Fallback};
use crate::env_setting::ConfigError;

/// The settings this module and the sampling read (the dev tools remove them from what
/// they inherit).
pub const SETTINGS: [&str; 7] = [
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    super::sampling::SETTINGS[0],
    super::sampling::SETTINGS[1],
    super::sampling::SETTINGS[2],
    super::sampling::SETTINGS[3],
];

/// At most this many finished spans wait for export; more are dropped and counted.
pub(crate) const QUEUE_CAPACITY: usize = 2048;
/// One upload of telemetry may take this long.
pub(crate) const UPLOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this much of an ingestion endpoint's answer is read (its real answers are a
/// few hundred bytes); a longer one fails the upload instead of filling memory.
pub(crate) const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// At most one log line about lost telemetry per this period.
pub(crate) const LOSS_LOG_PERIOD: Duration = Duration::from_secs(60);
/// How long the exporters get at shutdown to send what they hold.
pub(crate) const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);
/// The scope of an Entra token for Application Insights ingestion.
const MONITOR_SCOPE: &str = "https://monitor.azure.com//.default";

static METER_PROVIDER: std::sync::OnceLock<SdkMeterProvider> = std::sync::OnceLock::new();

/// Turns the instruments on without an exporter, for the metric path's own test.
#[cfg(test)]
pub(crate) fn enable_for_test() {
    claims_payments_engine::telemetry::enable(
        super::trace::flag_current_span,
        super::trace::add_request_charge,
    );
}

/// Whether telemetry is exported. When false, no span is created and no instrument exists.
pub(crate) fn enabled() -> bool {
    claims_payments_engine::telemetry::enabled()
}

/// Where telemetry goes, from the environment.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum TelemetrySettings {
    Off,
    Otlp,
    AppInsights {
        connection_string: String,
        /// `Some`: authenticate with this (managed) identity.
        entra: Option<EntraIdentity>,
    },
}

impl std::fmt::Debug for TelemetrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TelemetrySettings {
    /// Reads the settings through `get` (the process's settings read them with the others).
    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let set = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        if set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
            return Ok(TelemetrySettings::Otlp);
        }
        let Some(connection_string) = set("APPLICATIONINSIGHTS_CONNECTION_STRING") else {
            return Ok(TelemetrySettings::Off);
        };
        // Checked now, so a bad value stops the start (its value is never echoed).
        opentelemetry_application_insights::Exporter::new_from_connection_string(
            &connection_string,
            NoClient,
        )
        .map_err(|e| {
            ConfigError::new(
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                format!("is not a connection string: {e}"),
            )
        })?;
        let entra = match set("APPLICATIONINSIGHTS_AUTHENTICATION_STRING") {
            None => None,
            Some(auth) => {
                let mut aad = false;
                let mut client_id = None;
                for part in auth.split(';').map(str::trim).filter(|p| !p.is_empty()) {
                    let (key, value) = part.split_once('=').unwrap_or((part, ""));
                    if key.trim().eq_ignore_ascii_case("Authorization") {
                        aad = value.trim().eq_ignore_ascii_case("AAD");
                    } else if key.trim().eq_ignore_ascii_case("ClientId") {
                        client_id = Some(value.trim().to_owned());
                    }
                }
                if !aad {
                    return Err(ConfigError::new(
                        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
                        "must say Authorization=AAD (and may name ClientId=)",
                    ));
                }
                Some(entra::choose(&set, client_id, Fallback::Never))
            }
        };
        Ok(TelemetrySettings::AppInsights {
            connection_string,
            entra,
        })
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            TelemetrySettings::Off => "off",
            TelemetrySettings::Otlp => "otlp",
            TelemetrySettings::AppInsights { entra: None, .. } => "application-insights",
            TelemetrySettings::AppInsights { entra: Some(_), .. } => {
                "application-insights (Entra ID)"
            }
        }
    }
}

/// Flushes and stops the exporters when the service stops.
pub struct TelemetryGuard {
    spans: Arc<Tail>,
    meter_provider: SdkMeterProvider,
}

impl TelemetryGuard {
    /// Exports what is still queued, within [`SHUTDOWN_FLUSH`], off the runtime's workers.
    pub async fn shutdown(self) {
        let work = tokio::task::spawn_blocking(move || {
            let _ = self.spans.shutdown_with_timeout(SHUTDOWN_FLUSH);
            let _ = self.meter_provider.shutdown_with_timeout(SHUTDOWN_FLUSH);
        });
        // A hung endpoint must not hold the exit: past the bound, what is left is lost.
        let _ = tokio::time::timeout(SHUTDOWN_FLUSH * 2, work).await;
    }
}

/// Exports the metrics now, off the caller's thread (an upload waits on the runtime).
pub(crate) fn flush_metrics() {
    if let Some(provider) = METER_PROVIDER.get() {
        let provider = provider.clone();
        std::thread::spawn(move || {
            let _ = provider.force_flush();
        });
    }
}

/// Builds the exporters the settings name and installs the metrics provider; the span
/// recorder goes to [`super::init_with`]. Call inside the runtime (uploads run on it).
pub(crate) fn init_exporter(
    settings: &TelemetrySettings,
    policy: Policy,
) -> anyhow::Result<Option<(Recorder, TelemetryGuard)>> {
    let client = ExportClient::new(settings)?;
    let resource = resource();
    let pending = Arc::new(AtomicUsize::new(0));
    let (spans, meter_provider) = match settings {
        TelemetrySettings::Off => return Ok(None),
        TelemetrySettings::Otlp => {
            use opentelemetry_otlp::WithHttpConfig;
            let spans = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client.clone())
                .build()?;
            let metrics = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(client)
                .build()?;
            providers(spans, metrics, resource, pending, policy)
        }
        TelemetrySettings::AppInsights {
            connection_string, ..
        } => {
            let mut exporter =
                opentelemetry_application_insights::Exporter::new_from_connection_string(
                    connection_string,
                    client,
                )
                .map_err(|e| anyhow::anyhow!("APPLICATIONINSIGHTS_CONNECTION_STRING: {e}"))?;
            // The exporter upgrades every endpoint to https, as the official SDKs do; a
            // plain-http endpoint on this machine (a local collector, the tests' endpoint)
            // is taken as written.
            if let Some(local) = loopback_http_endpoint(connection_string) {
                // Deprecated in favour of the connection string, which cannot say http.
                #[allow(deprecated)]
                let local_exporter = exporter
                    .with_endpoint(&local)
                    .map_err(|e| anyhow::anyhow!("APPLICATIONINSIGHTS_CONNECTION_STRING: {e}"))?;
                exporter = local_exporter;
            }
            // Kept failures go at sample rate 100, the sampled share at its own.
            let spans = Rated {
                share: exporter.clone().with_sample_rate(policy.percent / 100.0),
                full: exporter.clone(),
            };
            providers(spans, exporter, resource, pending, policy)
        }
    };
    opentelemetry::global::set_meter_provider(meter_provider.clone());
    let _ = METER_PROVIDER.set(meter_provider.clone());
    // The engine's counters too: each count reaches its metric, flags its span, and a
    // request charge reaches the store call in progress.
    claims_payments_engine::telemetry::enable(
        super::trace::flag_current_span,
        super::trace::add_request_charge,
    );
    Ok(Some((
        Recorder::new(spans.clone()),
        TelemetryGuard {
            spans,
            meter_provider,
        },
    )))
}

/// `IngestionEndpoint` when it is plain http on a loopback address.
fn loopback_http_endpoint(connection_string: &str) -> Option<String> {
    let endpoint = connection_string.split(';').find_map(|part| {
        let (key, value) = part.split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("IngestionEndpoint")
            .then(|| value.trim().to_owned())
    })?;
    let url = reqwest::Url::parse(&endpoint).ok()?;
    let host = url.host_str()?;
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (url.scheme() == "http" && loopback).then_some(endpoint)
}

fn providers<S, M>(
    spans: S,
    metrics: M,
    resource: Resource,
    pending: Arc<AtomicUsize>,
    policy: Policy,
) -> (Arc<Tail>, SdkMeterProvider)
where
    S: SpanExporter + 'static,
    M: opentelemetry_sdk::metrics::exporter::PushMetricExporter,
{
    let mut batch = BatchSpanProcessor::builder(Counted {
        inner: spans,
        pending: pending.clone(),
    })
    .with_batch_config(
        BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE_CAPACITY)
            .build(),
    )
    .build();
    batch.set_resource(&resource);
    // No SDK tracer: the recorder builds the spans of kept traces itself and the tail
    // hands them to the queue (nothing reads OTEL_TRACES_SAMPLER but our policy).
    let spans = Arc::new(Tail::new(
        Bounded {
            inner: batch,
            pending,
        },
        policy,
    ));
    let meter_provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics).build())
        .with_resource(resource)
        .build();
    (spans, meter_provider)
}

/// `service.name` becomes the cloud role in Application Insights: the function app's
/// name in Azure (the host's own telemetry uses it too), `claims-payments` elsewhere.
fn resource() -> Resource {
    let name = std::env::var("WEBSITE_SITE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "claims-payments".to_owned());
    let mut builder = Resource::builder().with_service_name(name);
    if let Ok(instance) = std::env::var("WEBSITE_INSTANCE_ID") {
        builder = builder.with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            instance,
        ));
    }
    builder
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

/// The span queue's bound: a span that would make more than [`QUEUE_CAPACITY`] wait is
/// dropped here and counted, so the SDK's own queue never fills and nothing waits.
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    pending: Arc<AtomicUsize>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= QUEUE_CAPACITY {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            counters().telemetry_dropped.inc();
            return;
        }
        self.inner.on_end(span);
    }

    super::forward_lifecycle_to_inner!();
}

/// The exporter behind the queue: frees the queue's places of what it exported, and
/// counts the spans of a failed export as dropped.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    pending: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let export = self.inner.export(batch);
        let pending = self.pending.clone();
        async move {
            let result = export.await;
            pending.fetch_sub(n, Ordering::AcqRel);
            if result.is_err() {
                counters().telemetry_dropped.add(n as u64);
                report_loss();
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The Application Insights span exporter, twice: spans kept whatever the sampling
/// (failures, slow, timer runs) go out with `sampleRate` 100, the sampled share of
/// successes with the configured rate, so the portal's totals are estimates of all.
/// Which is which the sampling wrote on each span ([`SAMPLE_RATE_ATTRIBUTE`]), taken
/// off here: the envelope's `sampleRate` says it.
#[derive(Debug)]
struct Rated<E> {
    full: E,
    share: E,
}

impl<E: SpanExporter> SpanExporter for Rated<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let (mut full, mut share) = (Vec::new(), Vec::new());
        for mut span in batch {
            let rate = take_rate(&mut span);
            if rate < 100.0 {
                share.push(span);
            } else {
                full.push(span);
            }
        }
        let mut result = Ok(());
        if !full.is_empty() {
            result = self.full.export(full).await;
        }
        if !share.is_empty() {
            let shared = self.share.export(share).await;
            if shared.is_err() {
                result = shared;
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let full = self.full.shutdown_with_timeout(timeout);
        let share = self.share.shutdown_with_timeout(timeout);
        full.and(share)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.full.force_flush().and(self.share.force_flush())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.full.set_resource(resource);
        self.share.set_resource(resource);
    }
}

/// Removes the sample rate the sampling wrote on a span and returns it (100 if none).
fn take_rate(span: &mut SpanData) -> f64 {
    let mut rate = 100.0;
    span.attributes.retain(|kv| {
        if kv.key.as_str() != SAMPLE_RATE_ATTRIBUTE {
            return true;
        }
        if let opentelemetry::Value::F64(r) = kv.value {
            rate = r;
        }
        false
    });
    rate
}

/// Logs that telemetry is being lost, with the totals so far, at most once per
/// [`LOSS_LOG_PERIOD`]: an endpoint that fails every upload must not flood the log.
/// Called from the export path only (never inside the span machinery, whose callbacks
/// must not log). No endpoint, error text or item content: counts.
pub(crate) fn report_loss() {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let next = NEXT.load(Ordering::Relaxed);
    if now < next
        || NEXT
            .compare_exchange(
                next,
                now + LOSS_LOG_PERIOD.as_secs(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return;
    }
    let c = counters();
    tracing::warn!(
        telemetryDropped = c.telemetry_dropped.get(),
        telemetryExportFailures = c.telemetry_export_failures.get(),
        "telemetry is being lost: the ingestion endpoint is failing or slow (logged at most once a minute)"
    );
}

/// The HTTP client of both exporters: the service's reqwest (rustls), each upload run on
/// the service's runtime (the SDK's export threads have none) with a timeout, and an
/// Entra token when the ingestion endpoint requires one.
#[derive(Clone)]
struct ExportClient {
    http: reqwest::Client,
    runtime: Option<tokio::runtime::Handle>,
    credential: Option<Arc<dyn TokenCredential>>,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportClient")
            .field("entra", &self.credential.is_some())
            .finish()
    }
}

impl ExportClient {
    fn new(settings: &TelemetrySettings) -> anyhow::Result<Self> {
        let credential: Option<Arc<dyn TokenCredential>> =
            match settings {
                TelemetrySettings::AppInsights {
                    entra: Some(identity),
                    ..
                } => Some(entra::credential(identity).map_err(|e| {
                    anyhow::anyhow!("APPLICATIONINSIGHTS_AUTHENTICATION_STRING: {e}")
                })?),
                _ => None,
            };
        Ok(ExportClient {
            http: reqwest::Client::builder()
                .timeout(UPLOAD_TIMEOUT)
                // A redirect would send the telemetry (and a token) somewhere unchecked.
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(UPLOAD_TIMEOUT.min(Duration::from_secs(3)))
                .pool_idle_timeout(Duration::from_secs(30))
                .build()?,
            runtime: tokio::runtime::Handle::try_current().ok(),
            credential,
        })
    }

    async fn upload(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut outgoing = self
            .http
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body);
        if let Some(credential) = &self.credential {
            let token = credential.get_token(&[MONITOR_SCOPE], None).await?;
            outgoing = outgoing.bearer_auth(token.token.secret());
        }
        let mut answer = outgoing.send().await?;
        let mut response = Response::builder().status(answer.status());
        if let Some(headers) = response.headers_mut() {
            *headers = answer.headers().clone();
        }
        // Read as it comes, up to the bound: a hostile or broken endpoint's endless
        // answer costs at most MAX_ANSWER_BYTES.
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(format!("answer longer than {MAX_ANSWER_BYTES} bytes").into());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(response.body(Bytes::from(body))?)
    }
}

#[async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let this = self.clone();
        let upload = async move { this.upload(request).await };
        let result = match &self.runtime {
            Some(runtime) => runtime
                .spawn(upload)
                .await
                .unwrap_or_else(|e| Err(Box::new(e) as HttpError)),
            None => Err("no async runtime for telemetry uploads".into()),
        };
        let failed = match &result {
            Ok(response) => !response.status().is_success(),
            Err(_) => true,
        };
        if failed {
            counters().telemetry_export_failures.inc();
            report_loss();
        }
        result
    }
}

/// Only to validate a connection string: never sends.
#[derive(Debug)]
struct NoClient;

#[async_trait]
impl HttpClient for NoClient {
    async fn send_bytes(&self, _request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        Err("not a client".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<TelemetrySettings, ConfigError> {
        TelemetrySettings::from_lookup(crate::telemetry::lookup(pairs))
    }

    #[test]
    fn which_exporter_the_environment_names() {
        assert_eq!(settings(&[]).unwrap(), TelemetrySettings::Off);
        let cs = "InstrumentationKey=00000000-0000-0000-0000-000000000001;IngestionEndpoint=http://127.0.0.1:9/";
        assert!(matches!(
            settings(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", cs)]).unwrap(),
            TelemetrySettings::AppInsights { entra: None, .. }
        ));
        assert_eq!(
            settings(&[
                ("APPLICATIONINSIGHTS_CONNECTION_STRING", cs),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            ])
            .unwrap(),
            TelemetrySettings::Otlp,
            "OTLP wins: the host's OpenTelemetry mode or a collector"
        );
        match settings(&[
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", cs),
            (
                "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
                "ClientId=abc;Authorization=AAD",
            ),
        ])
        .unwrap()
        {
            TelemetrySettings::AppInsights { entra, .. } => {
                assert_eq!(
                    entra,
                    Some(EntraIdentity::ManagedIdentity {
                        client_id: Some("abc".to_owned())
                    })
                )
            }
            other => panic!("{other:?}"),
        }
    }

    /// Records the batches it is given.
    #[derive(Debug, Default, Clone)]
    struct Recording(Arc<std::sync::Mutex<Vec<Vec<SpanData>>>>);

    impl SpanExporter for Recording {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().push(batch);
            Ok(())
        }
    }

    fn span_with(attributes: Vec<opentelemetry::KeyValue>) -> SpanData {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
        SpanData {
            span_context: SpanContext::empty_context(),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Server,
            name: "s".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn each_span_goes_out_at_the_rate_the_sampling_wrote_and_without_it() {
        use opentelemetry::KeyValue;
        let (full, share) = (Recording::default(), Recording::default());
        let rated = Rated {
            full: full.clone(),
            share: share.clone(),
        };
        let batch = vec![
            span_with(vec![KeyValue::new(SAMPLE_RATE_ATTRIBUTE, 100.0)]),
            span_with(vec![
                KeyValue::new("outcome", "paid"),
                KeyValue::new(SAMPLE_RATE_ATTRIBUTE, 5.0),
            ]),
            span_with(vec![]),
        ];
        futures::executor::block_on(rated.export(batch)).unwrap();
        let full = full.0.lock().unwrap();
        let share = share.0.lock().unwrap();
        assert_eq!((full.len(), full[0].len()), (1, 2));
        assert_eq!((share.len(), share[0].len()), (1, 1));
        for span in full.iter().chain(share.iter()).flatten() {
            assert!(span
                .attributes
                .iter()
                .all(|kv| kv.key.as_str() != SAMPLE_RATE_ATTRIBUTE));
        }
        assert_eq!(share[0][0].attributes.len(), 1, "other attributes stay");
    }

    #[test]
    fn only_a_loopback_endpoint_may_be_plain_http() {
        let cs = |e: &str| format!("InstrumentationKey=k;IngestionEndpoint={e}");
        assert_eq!(
            loopback_http_endpoint(&cs("http://127.0.0.1:4000/")).as_deref(),
            Some("http://127.0.0.1:4000/")
        );
        assert!(loopback_http_endpoint(&cs("http://localhost:4000/")).is_some());
        assert!(loopback_http_endpoint(&cs("http://[::1]:4000/")).is_some());
        assert!(loopback_http_endpoint(&cs(
            "http://westeurope-5.in.applicationinsights.azure.com/"
        ))
        .is_none());
        assert!(loopback_http_endpoint(&cs("https://127.0.0.1:4000/")).is_none());
        assert!(loopback_http_endpoint("InstrumentationKey=k").is_none());
    }

    #[test]
    fn a_bad_setting_is_refused_without_its_value() {
        let e = settings(&[(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "secret-looking-text",
        )])
        .unwrap_err()
        .to_string();
        assert!(e.contains("APPLICATIONINSIGHTS_CONNECTION_STRING"), "{e}");
        assert!(!e.contains("secret-looking-text"), "{e}");
        let cs = "InstrumentationKey=00000000-0000-0000-0000-000000000001";
        let e = settings(&[
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", cs),
            (
                "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
                "Authorization=Basic",
            ),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("APPLICATIONINSIGHTS_AUTHENTICATION_STRING"),
            "{e}"
        );
    }
}
