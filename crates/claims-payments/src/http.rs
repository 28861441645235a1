//! What every route of the HTTP surface shares: request limits, reading a body within
//! them, and the invocation answer the Functions host reads. The routes themselves are
//! in `functions`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::host::{InvocationResult, OutcomeSummary};

/// Service Bus messages are at most 256 KB (Standard) and base64 adds a third.
pub(crate) const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// A connection must deliver its request headers within this time. The host sends
/// them at once; a caller that trickles them is cut off instead of holding a socket.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole request body must arrive within this time after the headers.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a request body is one this service reads: JSON (`application/json`, or
/// `application/<something>+json`), UTF-8 if a charset is named, and not content-coded
/// (nothing here decompresses: a gzip body would be refused as "not JSON" at best).
/// `Err` is the problem's detail, for a 415.
pub(crate) fn json_request(headers: &HeaderMap) -> Result<(), String> {
    let mut types = headers.get_all(header::CONTENT_TYPE).iter();
    let content_type = match (types.next(), types.next()) {
        (None, _) => return Err("Content-Type is missing; send application/json".into()),
        (Some(_), Some(_)) => return Err("send exactly one Content-Type: application/json".into()),
        (Some(v), None) => v
            .to_str()
            .map_err(|_| "Content-Type is not visible ASCII; send application/json".to_owned())?,
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if !json {
        return Err("the body must be application/json".into());
    }
    for param in parts {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        if name.trim().eq_ignore_ascii_case("charset")
            && !value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        {
            return Err("the body must be UTF-8 (charset=utf-8 or none)".into());
        }
    }
    for coding in headers.get_all(header::CONTENT_ENCODING) {
        let identity = coding
            .to_str()
            .map(|c| {
                c.split(',')
                    .all(|c| c.trim().eq_ignore_ascii_case("identity") || c.trim().is_empty())
            })
            .unwrap_or(false);
        if !identity {
            return Err(
                "Content-Encoding is not supported; send the body without a content coding".into(),
            );
        }
    }
    Ok(())
}

/// Why a request body could not be read.
pub enum BodyError {
    TooLarge,
    Timeout,
}

/// Reads a whole request body, at most [`MAX_REQUEST_BYTES`], within [`BODY_READ_TIMEOUT`]:
/// a caller that trickles its body must not hold a worker.
pub async fn read_body(body: Body) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_REQUEST_BYTES),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Timeout),
    }
}

/// The custom-handler answer to an invocation: `status` and the outcome as JSON.
pub(crate) fn invocation_answer(status: StatusCode, summary: OutcomeSummary) -> Response {
    (status, Json(InvocationResult::new(summary))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn only_uncoded_json_bodies_are_read() {
        for ok in [
            with(&[("content-type", "application/json")]),
            with(&[("content-type", "Application/JSON; charset=UTF-8")]),
            with(&[("content-type", "application/merge-patch+json")]),
            with(&[
                ("content-type", "application/json"),
                ("content-encoding", "identity"),
            ]),
        ] {
            assert_eq!(json_request(&ok), Ok(()), "{ok:?}");
        }
        for bad in [
            with(&[]),
            with(&[("content-type", "text/plain")]),
            with(&[("content-type", "application/x-www-form-urlencoded")]),
            with(&[("content-type", "application/json; charset=latin1")]),
            with(&[
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ]),
            with(&[
                ("content-type", "application/json"),
                ("content-encoding", "br, identity"),
            ]),
        ] {
            assert!(json_request(&bad).is_err(), "{bad:?}");
        }
    }
}
