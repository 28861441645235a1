//! The HTTPS transport's tests against a local server: answers beyond the contract's size
//! are cut off, and a timeout is named a timeout.

use std::time::Duration;

use time::OffsetDateTime;

use super::*;
use crate::domain::IdempotencyKey;

const KEY: &str = "tenant-a:claim-payment-1";

/// Serves `app` on a free local port; returns its address.
async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A client of the bank at `url`, without a credential.
fn client(url: &str, timeout: Duration) -> BankClient {
    https_client(&BankSettings {
        url: url.parse().unwrap(),
        api_key: None,
        timeout,
        key_window: Duration::from_secs(3600),
    })
    .unwrap()
}

/// A bank answer larger than any the contract allows is never read whole: a lookup
/// is unknown, with the reason; a payout success is asked again.
#[tokio::test]
async fn oversized_answers_are_cut_off_and_read_as_unknown() {
    use axum::routing::get;
    let big = || "[".to_owned() + &"{\"paymentId\":\"p\"},".repeat(40_000) + "{}]";
    let app = axum::Router::new()
        .route(
            "/sized/payments",
            get(move || async move { big() }).post(|| async {
                (
                    axum::http::StatusCode::CREATED,
                    "{\"paymentId\":\"".to_owned() + &"x".repeat(MAX_ANSWER_BYTES) + "\"}",
                )
            }),
        )
        // Chunked, without a Content-Length: the cap holds while streaming.
        .route(
            "/streamed/payments",
            get(move || async move {
                let chunks = (0..1000).map(|_| Ok::<_, std::io::Error>("[{}],".repeat(100)));
                axum::body::Body::from_stream(futures::stream::iter(chunks))
            }),
        );
    let addr = serve(app).await;
    let key = IdempotencyKey::from_stored(KEY.into());
    for path in ["sized", "streamed"] {
        let client = client(&format!("http://{addr}/{path}"), Duration::from_secs(10));
        match client.lookup(&key).await {
            Lookup::Unknown { reason } => {
                assert!(reason.contains("more than 65536 bytes"), "{path}: {reason}")
            }
            other => panic!("{path}: {other:?}"),
        }
        if path == "sized" {
            let window = SendWindow::new(
                Duration::from_millis(50),
                OffsetDateTime::now_utc(),
                Duration::from_secs(3600),
            );
            match client.pay(&key, "{}", window).await {
                PayoutOutcome::GaveUp { last_error, .. } => {
                    assert!(last_error.contains("more than"), "{last_error}")
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

/// A lookup that times out says so (and never reads as "not paid").
#[tokio::test]
async fn a_lookup_that_times_out_is_named_a_timeout() {
    let app = axum::Router::new().route(
        "/payments",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "[]"
        }),
    );
    let addr = serve(app).await;
    let client = client(&format!("http://{addr}/"), Duration::from_millis(100));
    match client
        .lookup(&IdempotencyKey::from_stored(KEY.into()))
        .await
    {
        Lookup::Unknown { reason } => assert_eq!(reason, "lookup timed out after 100 ms"),
        other => panic!("{other:?}"),
    }
}
