//! What every function's request must keep to: how long its headers and body may take,
//! how large its body may be, reading a body within those limits, and which bodies the
//! payments API reads (JSON, not content-coded).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};

/// Service Bus messages are at most 256 KB (Standard) and base64 adds a third.
pub(crate) const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// A connection must deliver its request headers within this time. The host sends
/// them at once; a caller that trickles them is cut off instead of holding a socket.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The whole request body must arrive within this time after the headers.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request body is not one this service reads: the detail of a 415.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnsupportedBody {
    #[error("Content-Type is missing; send application/json")]
    NoContentType,
    #[error("send exactly one Content-Type: application/json")]
    SeveralContentTypes,
    #[error("Content-Type is not visible ASCII; send application/json")]
    ContentTypeNotAscii,
    #[error("the body must be application/json")]
    NotJson,
    #[error("the body must be UTF-8 (charset=utf-8 or none)")]
    NotUtf8,
    #[error("Content-Encoding is not supported; send the body without a content coding")]
    ContentCoded,
}

/// Whether a request body is one this service reads: JSON (`application/json`, or
/// `application/<something>+json`), UTF-8 if a charset is named, and not content-coded
/// (nothing here decompresses: a gzip body would be refused as "not JSON" at best).
pub(crate) fn json_request(headers: &HeaderMap) -> Result<(), UnsupportedBody> {
    let mut types = headers.get_all(header::CONTENT_TYPE).iter();
    let content_type = match (types.next(), types.next()) {
        (None, _) => return Err(UnsupportedBody::NoContentType),
        (Some(_), Some(_)) => return Err(UnsupportedBody::SeveralContentTypes),
        (Some(v), None) => v
            .to_str()
            .map_err(|_| UnsupportedBody::ContentTypeNotAscii)?,
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if !json {
        return Err(UnsupportedBody::NotJson);
    }
    for param in parts {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        if name.trim().eq_ignore_ascii_case("charset")
            && !value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        {
            return Err(UnsupportedBody::NotUtf8);
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
            return Err(UnsupportedBody::ContentCoded);
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
        for (bad, why) in [
            (with(&[]), UnsupportedBody::NoContentType),
            (
                with(&[
                    ("content-type", "application/json"),
                    ("content-type", "application/json"),
                ]),
                UnsupportedBody::SeveralContentTypes,
            ),
            (
                with(&[("content-type", "text/plain")]),
                UnsupportedBody::NotJson,
            ),
            (
                with(&[("content-type", "application/x-www-form-urlencoded")]),
                UnsupportedBody::NotJson,
            ),
            (
                with(&[("content-type", "application/json; charset=latin1")]),
                UnsupportedBody::NotUtf8,
            ),
            (
                with(&[
                    ("content-type", "application/json"),
                    ("content-encoding", "gzip"),
                ]),
                UnsupportedBody::ContentCoded,
            ),
            (
                with(&[
                    ("content-type", "application/json"),
                    ("content-encoding", "br, identity"),
                ]),
                UnsupportedBody::ContentCoded,
            ),
        ] {
            assert_eq!(json_request(&bad), Err(why), "{bad:?}");
        }
    }
}
