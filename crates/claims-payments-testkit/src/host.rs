//! The invocation envelope the Functions host POSTs to a custom handler for one Service
//! Bus delivery, built in one place for the tests, the simulator and the benchmark. The
//! shape follows the host's own code (`../shared/reference/functions-custom-handler.md`):
//! string and number metadata are JSON texts inside JSON strings.

use base64::Engine;
use serde::Serialize;
use serde_json::{json, Value};
use time::macros::format_description;
use time::OffsetDateTime;
use uuid::Uuid;

/// How the trigger hands the body over (`dataType` in function.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataType {
    /// `"dataType": "binary"` (ours): the body bytes as one base64 string.
    Binary,
    /// No dataType: the body as a UTF-8 string, JSON-encoded a second time.
    String,
}

/// What the host knows about one delivery.
#[derive(Debug, Clone)]
pub struct DeliveryFields<'a> {
    pub body: &'a [u8],
    pub message_id: &'a str,
    pub delivery_count: u32,
    pub lock_token: Uuid,
    pub sequence_number: u64,
    pub enqueued_at: OffsetDateTime,
}

impl<'a> DeliveryFields<'a> {
    /// A delivery with a fresh lock token, enqueued now.
    pub fn new(body: &'a [u8], message_id: &'a str, delivery_count: u32) -> Self {
        DeliveryFields {
            body,
            message_id,
            delivery_count,
            lock_token: Uuid::new_v4(),
            sequence_number: 1,
            enqueued_at: OffsetDateTime::now_utc(),
        }
    }
}

fn host_time(t: OffsetDateTime) -> String {
    t.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second]"
    ))
    .unwrap_or_default()
}

fn utc_now_7() -> String {
    OffsetDateTime::now_utc()
        .format(format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:7]Z"
        ))
        .unwrap_or_default()
}

/// A JSON text inside a JSON string: how the host encodes string and number metadata.
fn encoded(value: impl Serialize) -> Value {
    Value::String(serde_json::to_string(&value).unwrap_or_default())
}

/// The invocation envelope for `delivery` to the function `function_name`, whose binding
/// is called `msg`.
pub fn envelope(delivery: &DeliveryFields<'_>, data_type: DataType, function_name: &str) -> Value {
    let msg = match data_type {
        DataType::Binary => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(delivery.body))
        }
        DataType::String => encoded(String::from_utf8_lossy(delivery.body)),
    };
    let application_properties = json!({"eventType": "ClaimApproved"});
    json!({
        "Data": { "msg": msg },
        "Metadata": {
            "MessageReceiver": {},
            "MessageSession": {},
            "MessageActions": {},
            "SessionActions": {},
            "ReceiveActions": {},
            "Client": {
                "FullyQualifiedNamespace": "sb-claims-sim.servicebus.windows.net",
                "IsClosed": false,
                "TransportType": 0,
                "Identifier": "sb-claims-sim-receiver"
            },
            "DeliveryCount": encoded(delivery.delivery_count),
            "LockToken": encoded(delivery.lock_token.to_string()),
            "ExpiresAtUtc": "9999-12-31T23:59:59",
            "ExpiresAt": "9999-12-31T23:59:59+00:00",
            "EnqueuedTimeUtc": host_time(delivery.enqueued_at),
            "EnqueuedTime": format!("{}+00:00", host_time(delivery.enqueued_at)),
            "MessageId": encoded(delivery.message_id),
            "ContentType": encoded("application/json"),
            "SequenceNumber": encoded(delivery.sequence_number),
            "Subject": encoded("ClaimApproved"),
            "Label": encoded("ClaimApproved"),
            "ApplicationProperties": application_properties.clone(),
            "UserProperties": application_properties,
            "sys": {
                "MethodName": function_name,
                "UtcNow": utc_now_7(),
                "RandGuid": Uuid::new_v4().to_string()
            }
        }
    })
}
