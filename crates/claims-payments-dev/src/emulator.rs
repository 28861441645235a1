//! The SDK's in-process Cosmos DB emulator, for tests and local runs (never in the
//! deployed package).
//!
//! The emulator replaces only the HTTP transport: routing, sessions, retries, fault
//! injection and serialization run as in production. [`InProcessEmulator`] wires it into
//! real clients; [`serve`] puts it behind a loopback HTTP port so another process (the
//! service, `func start`) can use it with an ordinary endpoint and key.
//!
//! Fidelity limits worth knowing (see the team's SDK notes): no TTL expiry, no throttling
//! of batches, fixed RU figures, and every batch copies its physical partition, so test
//! data must stay small. The emulator does not check key signatures; any base64 key works.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use azure_core::credentials::Secret;
use azure_core::http::Url;
use azure_data_cosmos::fault_injection::FaultInjectionRule;
use azure_data_cosmos::options::Region;
use azure_data_cosmos::{
    AccountEndpoint, AccountReference, ContainerClient, CosmosClient, CosmosClientBuilder,
    CosmosRuntimeBuilder, RoutingStrategy,
};
pub use azure_data_cosmos_driver::in_memory_emulator::RequestObserver;
use azure_data_cosmos_driver::in_memory_emulator::{
    InMemoryEmulatorHttpClient, VirtualAccountConfig, VirtualRegion,
};

use claims_payments_cosmos::settings::operation_options;
use claims_payments_cosmos::CosmosStore;
use claims_payments_cosmos::{provision_with_client, ProvisionReport};
use claims_payments_settings::names;

/// The key printed by the `cosmos-emulator` binary: the well-known public key of the
/// Azure Cosmos DB emulator (the in-process emulator accepts any base64 key).
pub const EMULATOR_KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

/// The region the emulator's one virtual region is called.
const REGION_NAME: &str = "East US";

/// Requests larger than this are refused by the front itself. It is above Cosmos DB's own
/// 2 MB item and batch limits, so those limits answer (413) as they would in Azure.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// One in-memory Cosmos DB account. Clients built from it share its data.
#[derive(Clone)]
pub struct InProcessEmulator {
    http: Arc<InMemoryEmulatorHttpClient>,
    url: Url,
}

impl InProcessEmulator {
    /// An account reachable (in-process only) at `https://eastus.emulator.local/`.
    pub fn new() -> anyhow::Result<Self> {
        Self::at(Url::parse("https://eastus.emulator.local/")?)
    }

    /// An account whose one region is advertised at `url`. When the emulator is served
    /// over HTTP this must be the server's own address: after reading the account, the
    /// SDK sends every request to the advertised region URL.
    pub fn at(url: Url) -> anyhow::Result<Self> {
        Self::build(url, None)
    }

    /// Like [`InProcessEmulator::at`], with `observer` called for every request the
    /// emulator receives (tests count requests on the wire with it).
    pub fn observed(url: Url, observer: Arc<dyn RequestObserver>) -> anyhow::Result<Self> {
        Self::build(url, Some(observer))
    }

    fn build(url: Url, observer: Option<Arc<dyn RequestObserver>>) -> anyhow::Result<Self> {
        let config = VirtualAccountConfig::new(vec![VirtualRegion::new(REGION_NAME, url.clone())])?;
        let mut http = InMemoryEmulatorHttpClient::try_new(config)?;
        if let Some(observer) = observer {
            http = http.with_request_observer(observer);
        }
        Ok(InProcessEmulator {
            http: Arc::new(http),
            url,
        })
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    pub fn http_client(&self) -> &Arc<InMemoryEmulatorHttpClient> {
        &self.http
    }

    /// A client of this account with the service's operation options, and the given fault
    /// injection rules (empty for none) evaluated before each request reaches the emulator.
    pub async fn client(
        &self,
        rules: Vec<Arc<FaultInjectionRule>>,
    ) -> anyhow::Result<CosmosClient> {
        let runtime = CosmosRuntimeBuilder::from(self.http.runtime_builder())
            .build()
            .await?;
        let account = AccountReference::with_authentication_key(
            self.url.as_str().parse::<AccountEndpoint>()?,
            Secret::new(EMULATOR_KEY),
        );
        let mut builder = CosmosClientBuilder::new()
            .with_runtime(runtime)
            .with_default_operation_options(operation_options());
        if !rules.is_empty() {
            builder = builder.with_fault_injection_rules(rules)?;
        }
        Ok(builder
            .build(account, RoutingStrategy::ProximityTo(Region::EAST_US))
            .await?)
    }

    /// Creates `database` and `container` with the service's container definition.
    pub async fn provision(
        &self,
        database: &str,
        container: &str,
    ) -> anyhow::Result<ProvisionReport> {
        let client = self.client(Vec::new()).await?;
        provision_with_client(&client, database, container).await
    }

    /// A container client through a client with `rules`.
    pub async fn container(
        &self,
        database: &str,
        container: &str,
        rules: Vec<Arc<FaultInjectionRule>>,
    ) -> anyhow::Result<ContainerClient> {
        let client = self.client(rules).await?;
        Ok(client
            .database_client(database)
            .container_client(container, None)
            .await?)
    }

    /// A [`CosmosStore`] on an already provisioned container, through a client with `rules`.
    pub async fn store(
        &self,
        database: &str,
        container: &str,
        retention: std::time::Duration,
        rules: Vec<Arc<FaultInjectionRule>>,
    ) -> anyhow::Result<CosmosStore> {
        CosmosStore::from_container(self.container(database, container, rules).await?, retention)
    }
}

/// Serves `emulator` over plain HTTP (HTTP/1.1 and HTTP/2 prior knowledge, which the SDK
/// tries first) on `listener`, until the returned future is dropped or fails. The
/// emulator must have been created with [`InProcessEmulator::at`] the listener's address.
pub async fn serve(
    emulator: InProcessEmulator,
    listener: tokio::net::TcpListener,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .fallback(forward)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::new(emulator));
    axum::serve(listener, app).await
}

/// Headers that describe one hop, not the request.
fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn forward(
    State(emulator): State<Arc<InProcessEmulator>>,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(e) => {
            return (axum::http::StatusCode::PAYLOAD_TOO_LARGE, e.to_string()).into_response()
        }
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let base = emulator.url.as_str().trim_end_matches('/');
    let url = match Url::parse(&format!("{base}{path_and_query}")) {
        Ok(url) => url,
        Err(e) => {
            return (
                axum::http::StatusCode::BAD_REQUEST,
                format!("bad request target: {e}"),
            )
                .into_response()
        }
    };
    let method: azure_core::http::Method = match parts.method.as_str().parse() {
        Ok(method) => method,
        Err(_) => return axum::http::StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    let mut forwarded = azure_core::http::Request::new(url, method);
    for (name, value) in &parts.headers {
        if is_hop_by_hop(name.as_str()) {
            continue;
        }
        if let Ok(value) = value.to_str() {
            forwarded.insert_header(name.as_str().to_owned(), value.to_owned());
        }
    }
    forwarded.set_body(body.to_vec());

    let response = match emulator.http.execute_request(&forwarded).await {
        Ok(response) => response,
        Err(e) => {
            let code = axum::http::StatusCode::from_u16(u16::from(e.status().status_code()))
                .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
            return (code, e.to_string()).into_response();
        }
    };
    let (status, headers, body) = response.deconstruct();
    let body = match body.collect().await {
        Ok(body) => body,
        Err(e) => return (axum::http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let mut answer = Response::new(Body::from(body.to_vec()));
    *answer.status_mut() = axum::http::StatusCode::from_u16(u16::from(status))
        .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
    for (name, value) in headers.iter() {
        if is_hop_by_hop(name.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_str().as_bytes()),
            axum::http::HeaderValue::from_str(value.as_str()),
        ) {
            answer.headers_mut().append(name, value);
        }
    }
    answer
}

/// An emulator account served over loopback HTTP from a thread of its own (with its own
/// runtime), provisioned with the service's default database and container: what a
/// `serve` process started by a test connects to. It stops when dropped.
pub struct ServedEmulator {
    endpoint: Url,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServedEmulator {
    /// Starts, provisions and waits until the endpoint serves.
    pub fn start() -> anyhow::Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<Url>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("cosmos-emulator".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let started = async {
                        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                        let endpoint = Url::parse(&format!("http://{}/", listener.local_addr()?))?;
                        let emulator = InProcessEmulator::at(endpoint.clone())?;
                        emulator
                            .provision(
                                claims_payments_cosmos::container::DEFAULT_DATABASE,
                                claims_payments_cosmos::container::DEFAULT_CONTAINER,
                            )
                            .await?;
                        anyhow::Ok((endpoint, emulator, listener))
                    };
                    match started.await {
                        Ok((endpoint, emulator, listener)) => {
                            let _ = ready_tx.send(Ok(endpoint));
                            tokio::select! {
                                _ = serve(emulator, listener) => {}
                                _ = stopped => {}
                            }
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })?;
        let endpoint = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the emulator thread ended before it was ready"))??;
        Ok(ServedEmulator {
            endpoint,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// What a `serve` process needs to use this account: `PAYMENTS_STORE=cosmos`, the
    /// endpoint and the emulator's key.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (names::PAYMENTS_STORE.into(), "cosmos".into()),
            (names::COSMOS_ENDPOINT.into(), self.endpoint.to_string()),
            (names::COSMOS_KEY.into(), EMULATOR_KEY.into()),
        ]
    }
}

impl Drop for ServedEmulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
