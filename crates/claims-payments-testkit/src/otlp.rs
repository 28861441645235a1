//! A local OTLP/HTTP receiver: what `serve`'s exporter posts, with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set, to `/v1/traces` and `/v1/metrics` as protobuf
//! (`application/x-protobuf`), decoded with `opentelemetry-proto` (the version line of the
//! product's exporter) and kept for a test to read. It answers as a collector does (an
//! empty `Export*ServiceResponse`); a body that is not protobuf is refused with 400, so a
//! wrong encoding fails the test rather than passing unread.
//!
//! Point the service at it with [`Otlp::endpoint`] in `OTEL_EXPORTER_OTLP_ENDPOINT`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, NumberDataPoint};
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tokio::task::JoinHandle;

/// One received span, with its ids in lowercase hex as in a `traceparent`.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub kind: SpanKind,
    /// Every attribute's value as text (`true`, `42`, `paid`).
    pub attributes: BTreeMap<String, String>,
    /// The service name of the resource the span came with.
    pub service_name: String,
}

impl ReceivedSpan {
    /// An attribute's value, or "" when the span does not carry it.
    pub fn attribute(&self, key: &str) -> &str {
        self.attributes.get(key).map(String::as_str).unwrap_or("")
    }
}

/// One data point of a sum, gauge or histogram (its count): the value and dimensions.
#[derive(Debug, Clone)]
pub struct ReceivedPoint {
    pub metric: String,
    pub value: f64,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    points: Vec<ReceivedPoint>,
    /// Every body as (lossy) text: protobuf keeps strings as UTF-8, so a secret that was
    /// exported is found here.
    texts: Vec<String>,
    /// The `Content-Type` of every upload.
    content_types: Vec<String>,
}

/// A running OTLP/HTTP receiver on a loopback port. Stops when dropped.
pub struct Otlp {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    server: JoinHandle<()>,
}

impl Drop for Otlp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Otlp {
    pub async fn start() -> Otlp {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .route("/v1/metrics", post(metrics))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a loopback port for the OTLP receiver");
        let addr = listener.local_addr().expect("its address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Otlp {
            addr,
            received,
            server,
        }
    }

    /// `http://127.0.0.1:<port>`: the exporter appends `/v1/traces` and `/v1/metrics`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn received(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received().spans.clone()
    }

    /// The spans of one trace.
    pub fn spans_of(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }

    /// The data points of the metric `name`.
    pub fn metric(&self, name: &str) -> Vec<ReceivedPoint> {
        self.received()
            .points
            .iter()
            .filter(|p| p.metric == name)
            .cloned()
            .collect()
    }

    /// Everything received, as text.
    pub fn text(&self) -> String {
        self.received().texts.join("\n")
    }

    /// The `Content-Type` of every upload.
    pub fn content_types(&self) -> Vec<String> {
        self.received().content_types.clone()
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn keep<'a>(
    received: &'a Mutex<Received>,
    headers: &HeaderMap,
    body: &Bytes,
) -> std::sync::MutexGuard<'a, Received> {
    let mut r = received.lock().unwrap_or_else(|e| e.into_inner());
    r.content_types.push(
        headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
    );
    r.texts.push(String::from_utf8_lossy(body).into_owned());
    r
}

fn protobuf(message: impl Message) -> Response {
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        message.encode_to_vec(),
    )
        .into_response()
}

async fn traces(
    State(received): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(request) = ExportTraceServiceRequest::decode(&body[..]) else {
        return (StatusCode::BAD_REQUEST, "not an OTLP protobuf trace export").into_response();
    };
    let mut r = keep(&received, &headers, &body);
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service_name = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                r.spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified),
                    attributes: attributes(&span.attributes),
                    name: span.name,
                    service_name: service_name.clone(),
                });
            }
        }
    }
    protobuf(ExportTraceServiceResponse::default())
}

fn number(point: &NumberDataPoint) -> f64 {
    match point.value {
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        Some(number_data_point::Value::AsDouble(d)) => d,
        None => 0.0,
    }
}

async fn metrics(
    State(received): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(request) = ExportMetricsServiceRequest::decode(&body[..]) else {
        return (
            StatusCode::BAD_REQUEST,
            "not an OTLP protobuf metrics export",
        )
            .into_response();
    };
    let mut r = keep(&received, &headers, &body);
    for resource_metrics in request.resource_metrics {
        for scope in resource_metrics.scope_metrics {
            for m in scope.metrics {
                let points: Vec<(f64, BTreeMap<String, String>)> = match &m.data {
                    Some(metric::Data::Sum(sum)) => sum
                        .data_points
                        .iter()
                        .map(|p| (number(p), attributes(&p.attributes)))
                        .collect(),
                    Some(metric::Data::Gauge(gauge)) => gauge
                        .data_points
                        .iter()
                        .map(|p| (number(p), attributes(&p.attributes)))
                        .collect(),
                    Some(metric::Data::Histogram(histogram)) => histogram
                        .data_points
                        .iter()
                        .map(|p| (p.count as f64, attributes(&p.attributes)))
                        .collect(),
                    _ => Vec::new(),
                };
                for (value, attributes) in points {
                    r.points.push(ReceivedPoint {
                        metric: m.name.clone(),
                        value,
                        attributes,
                    });
                }
            }
        }
    }
    protobuf(ExportMetricsServiceResponse::default())
}
