//! A local Application Insights ingestion endpoint: what `serve`'s exporter posts to
//! `IngestionEndpoint` + `/v2/track` (or `/v2.1/track`), gzip-decoded, kept for a test
//! to read. It answers as the service does (`itemsReceived`, `itemsAccepted`).
//!
//! Point the service at it with [`Ingestion::connection_string`] in
//! `APPLICATIONINSIGHTS_CONNECTION_STRING`.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// The instrumentation key of the connection string [`Ingestion`] hands out.
pub const INSTRUMENTATION_KEY: &str = "5e1d7c3a-0b4f-4c8e-9a2d-6f7e8d9c0b1a";

#[derive(Default)]
struct Received {
    /// Every telemetry item (envelope), in arrival order.
    items: Vec<Value>,
    /// Every request body as text, decoded: what a secret must never be found in.
    texts: Vec<String>,
    posts: usize,
    /// Bytes of the bodies as they arrived (gzip), and decoded.
    bytes_sent: usize,
    bytes_decoded: usize,
}

/// A running ingestion endpoint on a loopback port. Stops when dropped.
pub struct Ingestion {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    server: JoinHandle<()>,
}

impl Drop for Ingestion {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Ingestion {
    pub async fn start() -> Ingestion {
        let received = Arc::new(Mutex::new(Received::default()));
        let app = Router::new()
            .route("/v2/track", post(track))
            .route("/v2.1/track", post(track))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("a loopback port for the ingestion endpoint");
        let addr = listener.local_addr().expect("its address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ingestion {
            addr,
            received,
            server,
        }
    }

    /// `InstrumentationKey=<guid>;IngestionEndpoint=http://127.0.0.1:<port>/`.
    pub fn connection_string(&self) -> String {
        format!(
            "InstrumentationKey={INSTRUMENTATION_KEY};IngestionEndpoint=http://{}/",
            self.addr
        )
    }

    fn received(&self) -> std::sync::MutexGuard<'_, Received> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every item received so far.
    pub fn items(&self) -> Vec<Value> {
        self.received().items.clone()
    }

    /// How many uploads arrived.
    pub fn posts(&self) -> usize {
        self.received().posts
    }

    /// Bytes received as sent (the gzip bodies) and decoded (the JSON).
    pub fn bytes(&self) -> (usize, usize) {
        let r = self.received();
        (r.bytes_sent, r.bytes_decoded)
    }

    /// Everything received, as decoded text.
    pub fn text(&self) -> String {
        self.received().texts.join("\n")
    }

    /// The items of one type: `RequestData`, `RemoteDependencyData`, `MetricData`,
    /// `MessageData`, `ExceptionData`.
    pub fn of_type(&self, base_type: &str) -> Vec<Value> {
        self.items()
            .into_iter()
            .filter(|i| i["data"]["baseType"] == base_type)
            .collect()
    }

    /// The metric data points named `name`: `(value, properties)` of each.
    pub fn metric(&self, name: &str) -> Vec<(f64, Value)> {
        self.of_type("MetricData")
            .iter()
            .flat_map(|item| {
                let data = &item["data"]["baseData"];
                let properties = data["properties"].clone();
                data["metrics"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|m| m["name"] == name)
                    .map(move |m| (m["value"].as_f64().unwrap_or(0.0), properties.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// `ai.operation.id` of an item: the trace id.
pub fn operation_id(item: &Value) -> &str {
    item["tags"]["ai.operation.id"].as_str().unwrap_or("")
}

/// A custom property of an item.
pub fn property<'a>(item: &'a Value, name: &str) -> &'a Value {
    &item["data"]["baseData"]["properties"][name]
}

async fn track(
    State(received): State<Arc<Mutex<Received>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let gzip = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let text = if gzip {
        let mut text = String::new();
        if flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .is_err()
        {
            return (StatusCode::BAD_REQUEST, "not gzip").into_response();
        }
        text
    } else {
        String::from_utf8_lossy(&body).into_owned()
    };
    // A JSON array of envelopes, or newline-delimited envelopes.
    let items: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(items)) => items,
        Ok(item @ Value::Object(_)) => vec![item],
        _ => text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    };
    let n = items.len();
    let mut r = received.lock().unwrap_or_else(|e| e.into_inner());
    r.posts += 1;
    r.bytes_sent += body.len();
    r.bytes_decoded += text.len();
    r.items.extend(items);
    r.texts.push(text);
    Json(json!({"itemsReceived": n, "itemsAccepted": n, "errors": []})).into_response()
}
