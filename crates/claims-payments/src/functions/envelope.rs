//! The invocation envelope of the Azure Functions custom-handler protocol, as the host
//! really speaks it: what every function's request body holds.
//!
//! The host POSTs `{"Data": {...}, "Metadata": {...}}`. What it puts inside is not what
//! the official docs show (see the host's own code and tests):
//! - the trigger value `Data.msg` is the message body as JSON text encoded *again* as a
//!   JSON string (default data type), a single base64 string (`dataType: binary`), or,
//!   from other hosts and tools, the object itself;
//! - Metadata strings are JSON-encoded inside strings (`"\"abc\""`) and numbers arrive as
//!   strings (`"3"`); we accept the plain forms too;
//! - with the default data type, top-level body fields are copied into Metadata and can
//!   overwrite real keys case-insensitively. `function.json` uses `dataType: binary`.
//!
//! A timer trigger's envelope carries `Data.timer` (read into [`TimerInvocation`]). The
//! answers are in [`super::answer`].

use std::borrow::Cow;
use std::collections::HashMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::domain::{redrive, MessageId};

/// The binding name in `function.json`.
pub(crate) const TRIGGER_BINDING: &str = "msg";

/// Why an invocation envelope cannot be used. Permanent: the same envelope will fail again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct EnvelopeError {
    field: String,
    problem: String,
}

impl EnvelopeError {
    fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        EnvelopeError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(rename = "Data", alias = "data", borrow, default)]
    data: HashMap<String, &'a RawValue>,
    #[serde(rename = "Metadata", alias = "metadata", borrow, default)]
    metadata: TrustedMetadata<'a>,
}

/// The Metadata entries we read, still encoded; the host sends a score of others (actions,
/// client, properties), which are skipped without being decoded.
#[derive(Default)]
struct TrustedMetadata<'a> {
    message_id: Option<Entry<'a>>,
    delivery_count: Option<Entry<'a>>,
    /// `ApplicationProperties` (extension 5.x), else `UserProperties` (older): only their
    /// `Diagnostic-Id` is read, for the trace.
    application_properties: Option<&'a RawValue>,
    user_properties: Option<&'a RawValue>,
}

/// A Metadata value and whether its key matched exactly (which beats a match ignoring case).
#[derive(Clone, Copy)]
struct Entry<'a> {
    value: &'a RawValue,
    exact: bool,
}

impl<'a> TrustedMetadata<'a> {
    fn slot(&mut self, key: &str) -> Option<(&mut Option<Entry<'a>>, bool)> {
        let [message_id, delivery_count] = TRUSTED_METADATA;
        if key.eq_ignore_ascii_case(message_id) {
            Some((&mut self.message_id, key == message_id))
        } else if key.eq_ignore_ascii_case(delivery_count) {
            Some((&mut self.delivery_count, key == delivery_count))
        } else {
            None
        }
    }
}

/// A map key, borrowed from the request unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for TrustedMetadata<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
            type Value = TrustedMetadata<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("the Metadata object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut found = TrustedMetadata::default();
                while let Some(Key(key)) = map.next_key()? {
                    if key == "ApplicationProperties" {
                        found.application_properties = Some(map.next_value()?);
                        continue;
                    }
                    if key == "UserProperties" {
                        found.user_properties = Some(map.next_value()?);
                        continue;
                    }
                    match found.slot(&key) {
                        Some((slot, exact)) => {
                            let value: &'de RawValue = map.next_value()?;
                            if slot.is_none_or(|earlier| !earlier.exact) {
                                *slot = Some(Entry { value, exact });
                            }
                        }
                        None => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(found)
            }
        }
        deserializer.deserialize_map(Visitor(std::marker::PhantomData))
    }
}

/// How the message body was encoded in `Data.msg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BodyEncoding {
    /// A JSON object in the envelope.
    Object,
    /// JSON text in a JSON string.
    String,
    /// JSON text in a JSON string in a JSON string (the host's default data type).
    DoubleString,
    /// Base64 of the raw bytes (`dataType: binary`).
    Base64,
}

/// A decoded invocation: the body text and the delivery facts from Metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub body: String,
    pub encoding: BodyEncoding,
    /// The message's identity: the broker's MessageId, or for a re-drive copy the
    /// original it names ([`redrive::identity`]).
    pub message_id: MessageId,
    /// A re-drive copy's own MessageId (the broker's), when it differs from `message_id`.
    pub delivered_as: Option<MessageId>,
    /// 0 when the host did not send one.
    pub delivery_count: u32,
    /// Top-level body fields that may have overwritten Service Bus metadata on the way
    /// (only possible when the body did not arrive as base64).
    pub(crate) shadowed_metadata: Vec<String>,
    /// The message's `Diagnostic-Id` application property: the producer's trace context
    /// (a W3C `traceparent` value), set by Service Bus SDKs on send.
    pub(crate) diagnostic_id: Option<String>,
}

/// An application property's text, its name matched ignoring case (the REST runtime API
/// carries properties as HTTP headers, whose names arrive lower-cased): from the
/// application-properties object in Metadata (a real JSON object, whose string values may
/// still arrive JSON-encoded once more). `None` when absent or not a string.
fn application_property(properties: Option<&RawValue>, name: &str) -> Option<String> {
    let properties: HashMap<String, serde_json::Value> =
        serde_json::from_str(properties?.get()).ok()?;
    let value = properties
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)?;
    let text = value.as_str()?;
    Some(match serde_json::from_str::<String>(text) {
        Ok(inner) => inner,
        Err(_) => text.to_owned(),
    })
}

/// `Diagnostic-Id`: the producer's trace context.
fn diagnostic_id(properties: Option<&RawValue>) -> Option<String> {
    let text = application_property(properties, "Diagnostic-Id")?;
    // A traceparent is 55 characters; anything far longer is not one.
    (!text.trim().is_empty() && text.len() <= 256).then(|| text.trim().to_owned())
}

/// Metadata keys we rely on; a body field with the same name (any case) shadows them.
const TRUSTED_METADATA: [&str; 2] = ["MessageId", "DeliveryCount"];

/// Unwraps a Metadata value: `"\"abc\""` → `abc`, `"3"` → `3`, plain values unchanged.
/// Anything else is named by its JSON kind, for the error that refuses it.
fn metadata_text(entry: Entry<'_>) -> Result<String, &'static str> {
    match serde_json::from_str::<serde_json::Value>(entry.value.get()) {
        Ok(serde_json::Value::String(s)) => match serde_json::from_str::<serde_json::Value>(&s) {
            Ok(serde_json::Value::String(inner)) => Ok(inner),
            _ => Ok(s),
        },
        Ok(serde_json::Value::Number(n)) => Ok(n.to_string()),
        Ok(serde_json::Value::Object(_)) => Err("a JSON object"),
        Ok(serde_json::Value::Array(_)) => Err("a JSON array"),
        Ok(serde_json::Value::Bool(_)) => Err("a JSON boolean"),
        Ok(serde_json::Value::Null) => Err("null"),
        Err(_) => Err("not JSON"),
    }
}

fn looks_like_object(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

/// Peels the trigger value down to the body's JSON text.
fn decode_body(raw: &RawValue) -> Result<(String, BodyEncoding), EnvelopeError> {
    let field = format!("Data.{TRIGGER_BINDING}");
    let text = raw.get().trim();
    if looks_like_object(text) {
        return Ok((text.to_owned(), BodyEncoding::Object));
    }
    let Ok(once) = serde_json::from_str::<String>(text) else {
        // Named by its JSON type only: the text is the message, and may hold a payee.
        let got = serde_json::from_str(text)
            .map(|v| crate::domain::json_type(&v))
            .unwrap_or("not JSON");
        return Err(EnvelopeError::new(
            field,
            format!("expected a JSON object or a string holding one, got {got}"),
        ));
    };
    if looks_like_object(&once) {
        return Ok((once, BodyEncoding::String));
    }
    if once.trim_start().starts_with('"') {
        if let Ok(twice) = serde_json::from_str::<String>(&once) {
            return Ok((twice, BodyEncoding::DoubleString));
        }
    }
    if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(once.trim()) {
        return String::from_utf8(bytes)
            .map(|s| (s, BodyEncoding::Base64))
            .map_err(|_| EnvelopeError::new(field, "base64 body is not UTF-8 text"));
    }
    Err(EnvelopeError::new(
        field,
        format!(
            "is neither JSON, JSON in a string, nor base64 (a string of {} characters)",
            once.chars().count()
        ),
    ))
}

impl Invocation {
    /// Decodes the request body the host POSTed.
    pub fn decode(request_body: &[u8]) -> Result<Self, EnvelopeError> {
        let envelope: RawEnvelope = serde_json::from_slice(request_body).map_err(|e| {
            EnvelopeError::new(
                "envelope",
                format!(
                    "is not the host's JSON invocation: {}",
                    crate::domain::json_error(&e)
                ),
            )
        })?;

        let raw = envelope
            .data
            .get(TRIGGER_BINDING)
            .copied()
            .or_else(|| (envelope.data.len() == 1).then(|| *envelope.data.values().next().unwrap()))
            .ok_or_else(|| {
                EnvelopeError::new(
                    format!("Data.{TRIGGER_BINDING}"),
                    "is missing; the trigger binding in function.json must be named msg",
                )
            })?;
        let (body, encoding) = decode_body(raw)?;

        let message_id = match envelope.metadata.message_id.map(metadata_text) {
            None => return Err(EnvelopeError::new("Metadata.MessageId", "is missing")),
            Some(Err(kind)) => {
                return Err(EnvelopeError::new(
                    "Metadata.MessageId",
                    format!("is {kind}, not a string"),
                ))
            }
            Some(Ok(text)) => MessageId::parse(&text)
                .map_err(|e| EnvelopeError::new("Metadata.MessageId", e.problem))?,
        };

        // Informational (the broker's count; the consumer only compares counts to let a
        // later delivery take over): an odd value is logged and read as "unknown" (0),
        // never a reason to refuse, and so dead-letter, a valid message.
        let delivery_count = match envelope.metadata.delivery_count {
            None => 0,
            Some(entry) => {
                let count = metadata_text(entry)
                    .ok()
                    .and_then(|t| t.trim().parse::<u32>().ok());
                count.unwrap_or_else(|| {
                    tracing::warn!(
                        messageId = %message_id,
                        deliveryCount = serde_json::from_str(entry.value.get())
                            .map(|v| crate::domain::json_type(&v))
                            .unwrap_or("not JSON"),
                        "Metadata.DeliveryCount is not a count; carrying on as unknown (0)"
                    );
                    0
                })
            }
        };

        let shadowed_metadata = if encoding == BodyEncoding::Base64 {
            Vec::new()
        } else {
            serde_json::from_str::<HashMap<String, serde::de::IgnoredAny>>(&body)
                .map(|fields| {
                    fields
                        .keys()
                        .filter(|k| TRUSTED_METADATA.iter().any(|t| t.eq_ignore_ascii_case(k)))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        };

        let diagnostic_id = diagnostic_id(envelope.metadata.application_properties)
            .or_else(|| diagnostic_id(envelope.metadata.user_properties));

        // A re-drive copy stands for the message it names (domain::redrive).
        let original = application_property(
            envelope.metadata.application_properties,
            redrive::ORIGINAL_MESSAGE_ID,
        )
        .or_else(|| {
            application_property(
                envelope.metadata.user_properties,
                redrive::ORIGINAL_MESSAGE_ID,
            )
        });
        let delivered_as = original.is_some().then(|| message_id.clone());
        let message_id = redrive::identity(message_id, original.as_deref()).map_err(|e| {
            EnvelopeError::new(
                format!("Metadata.ApplicationProperties.{}", e.field),
                e.problem,
            )
        })?;

        Ok(Invocation {
            body,
            encoding,
            message_id,
            delivered_as,
            delivery_count,
            shadowed_metadata,
            diagnostic_id,
        })
    }
}

/// A timer trigger's invocation (`Purge`, `Reconcile`): `Data.timer` as the host sends
/// it. Only `IsPastDue` is read, for the log: a past-due run does the same work.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TimerInvocation {
    #[serde(rename = "Data", alias = "data", default)]
    data: TimerData,
}

#[derive(Debug, Default, Deserialize)]
struct TimerData {
    #[serde(default)]
    timer: TimerInfo,
}

#[derive(Debug, Default, Deserialize)]
struct TimerInfo {
    #[serde(rename = "IsPastDue", default)]
    is_past_due: bool,
}

impl TimerInvocation {
    /// Decodes a timer's request body. A body that does not read as the envelope is a
    /// punctual run: the schedule fired, and what it carries is only logged.
    pub(crate) fn decode(request_body: &[u8]) -> Self {
        serde_json::from_slice(request_body).unwrap_or_default()
    }

    /// Whether the host started this run late (after a missed schedule).
    pub(crate) fn is_past_due(&self) -> bool {
        self.data.timer.is_past_due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str =
        r#"{"claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","amount":"10.00","currency":"EUR"}"#;

    fn envelope(data_msg: serde_json::Value, metadata: serde_json::Value) -> Vec<u8> {
        serde_json::json!({"Data": {"msg": data_msg}, "Metadata": metadata})
            .to_string()
            .into_bytes()
    }

    fn host_metadata() -> serde_json::Value {
        // Exactly how the host encodes them: strings JSON-encoded, numbers as strings.
        serde_json::json!({"MessageId": "\"m-1\"", "DeliveryCount": "3", "LockToken": "\"x\"", "sys": {"MethodName": "ClaimApproved"}})
    }

    /// A re-drive copy stands for the message it names: the inbox is keyed by the
    /// original, whatever case the property's name arrives in; a name that is not a
    /// MessageId is refused, naming the property and never its value.
    #[test]
    fn a_redrive_copy_is_the_message_it_names() {
        let body = serde_json::Value::String(BODY.to_owned());
        for name in [
            "ClaimsPaymentsOriginalMessageId",
            "claimspaymentsoriginalmessageid",
        ] {
            let mut metadata = host_metadata();
            metadata["ApplicationProperties"] = serde_json::json!({ name: "\"m-original\"" });
            let inv = Invocation::decode(&envelope(body.clone(), metadata)).unwrap();
            assert_eq!(inv.message_id.as_str(), "m-original");
            assert_eq!(inv.delivered_as.as_ref().map(|m| m.as_str()), Some("m-1"));
        }
        let inv = Invocation::decode(&envelope(body.clone(), host_metadata())).unwrap();
        assert_eq!((inv.message_id.as_str(), inv.delivered_as), ("m-1", None));
        let mut metadata = host_metadata();
        metadata["ApplicationProperties"] =
            serde_json::json!({ "ClaimsPaymentsOriginalMessageId": "x".repeat(129) });
        let err = Invocation::decode(&envelope(body, metadata)).unwrap_err();
        assert!(
            err.to_string().contains("ClaimsPaymentsOriginalMessageId"),
            "{err}"
        );
        assert!(!err.to_string().contains("xxxx"), "{err}");
    }

    #[test]
    fn decodes_every_body_encoding_the_host_uses() {
        let once = serde_json::Value::String(BODY.to_owned());
        let twice = serde_json::Value::String(serde_json::to_string(BODY).unwrap());
        let b64 = serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(BODY));
        let object: serde_json::Value = serde_json::from_str(BODY).unwrap();
        for (msg, encoding) in [
            (twice, BodyEncoding::DoubleString),
            (b64, BodyEncoding::Base64),
            (once, BodyEncoding::String),
            (object, BodyEncoding::Object),
        ] {
            let inv = Invocation::decode(&envelope(msg, host_metadata())).unwrap();
            assert_eq!(inv.encoding, encoding);
            let parsed: serde_json::Value = serde_json::from_str(&inv.body).unwrap();
            assert_eq!(
                parsed,
                serde_json::from_str::<serde_json::Value>(BODY).unwrap()
            );
            assert_eq!(inv.message_id.as_str(), "m-1");
            assert_eq!(inv.delivery_count, 3);
        }
    }

    #[test]
    fn accepts_plain_metadata_too() {
        let meta = serde_json::json!({"MessageId": "m-2", "DeliveryCount": 1});
        let inv = Invocation::decode(&envelope(BODY.into(), meta)).unwrap();
        assert_eq!(inv.message_id.as_str(), "m-2");
        assert_eq!(inv.delivery_count, 1);
    }

    #[test]
    fn an_exact_metadata_key_beats_one_in_another_case() {
        // `Message\u0049d` is `MessageId` spelled with an escape, which cannot be borrowed.
        for metadata in [
            r#"{"messageid":"\"lower\"","Message\u0049d":"\"exact\"","UserProperties":{"a":[1,{"b":null}]},"deliverycount":"2"}"#,
            r#"{"MessageId":"\"exact\"","UserProperties":{},"messageid":"\"lower\"","deliverycount":"2"}"#,
        ] {
            let body = format!(
                r#"{{"Data":{{"msg":{}}},"Metadata":{metadata}}}"#,
                serde_json::json!(BODY)
            );
            let inv = Invocation::decode(body.as_bytes()).unwrap();
            assert_eq!(inv.message_id.as_str(), "exact", "{metadata}");
            assert_eq!(inv.delivery_count, 2, "{metadata}");
        }
    }

    #[test]
    fn numeric_message_ids_stay_text() {
        let meta = serde_json::json!({"MessageId": "\"12345\"", "DeliveryCount": "1"});
        let inv = Invocation::decode(&envelope(BODY.into(), meta)).unwrap();
        assert_eq!(inv.message_id.as_str(), "12345");
    }

    #[test]
    fn bad_envelopes_name_what_is_wrong() {
        let cases = [
            (b"not json".to_vec(), "envelope"),
            (
                serde_json::json!({"Data": {}, "Metadata": {}})
                    .to_string()
                    .into_bytes(),
                "Data.msg",
            ),
            (envelope(serde_json::json!(42), host_metadata()), "Data.msg"),
            (
                envelope(BODY.into(), serde_json::json!({})),
                "Metadata.MessageId",
            ),
            (
                envelope(BODY.into(), serde_json::json!({"MessageId": "\"\""})),
                "Metadata.MessageId",
            ),
        ];
        for (body, field) in cases {
            let err = Invocation::decode(&body).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    /// The body is the message: a refusal names what it is, never what it says.
    #[test]
    fn a_refused_body_is_never_repeated() {
        const IBAN: &str = "DE89370400440532013000";
        for body in [
            envelope(serde_json::json!(["payee", IBAN]), host_metadata()),
            envelope(serde_json::json!(format!("payee {IBAN}")), host_metadata()),
            format!(r#"{{"Data": "{IBAN}", "Metadata": {{}}}}"#).into_bytes(),
            format!(r#"{{"Data": {{"msg": {IBAN}x}}}}"#).into_bytes(),
        ] {
            let err = Invocation::decode(&body).unwrap_err();
            assert!(!err.to_string().contains("89370400"), "{err}");
        }
    }

    #[test]
    fn a_message_id_that_is_not_text_is_named_for_what_it_is() {
        for (id, kind) in [
            (serde_json::json!({"a": 1}), "a JSON object"),
            (serde_json::json!(["a"]), "a JSON array"),
            (serde_json::json!(true), "a JSON boolean"),
        ] {
            let meta = serde_json::json!({"MessageId": id, "DeliveryCount": "1"});
            let err = Invocation::decode(&envelope(BODY.into(), meta)).unwrap_err();
            assert_eq!(err.field, "Metadata.MessageId");
            assert!(err.problem.contains(kind), "{err}");
            assert!(!err.problem.contains("missing"), "{err}");
        }
    }

    #[test]
    fn an_odd_delivery_count_is_unknown_not_a_refusal() {
        for count in [
            serde_json::json!("many"),
            serde_json::json!(1e3),
            serde_json::json!("4294967296"),
            serde_json::json!(-1),
            serde_json::json!({"n": 1}),
            serde_json::json!(null),
        ] {
            let meta = serde_json::json!({"MessageId": "\"a\"", "DeliveryCount": count});
            let inv = Invocation::decode(&envelope(BODY.into(), meta))
                .unwrap_or_else(|e| panic!("{count}: {e}"));
            assert_eq!(inv.delivery_count, 0, "{count}");
        }
    }

    #[test]
    fn flags_body_fields_that_shadow_metadata() {
        let body = r#"{"claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","amount":"1","currency":"EUR","messageId":"x"}"#;
        let inv = Invocation::decode(&envelope(body.into(), host_metadata())).unwrap();
        assert_eq!(inv.shadowed_metadata, vec!["messageId".to_owned()]);
        let b64 = base64::engine::general_purpose::STANDARD.encode(body);
        let inv = Invocation::decode(&envelope(b64.into(), host_metadata())).unwrap();
        assert!(inv.shadowed_metadata.is_empty());
    }

    #[test]
    fn a_timer_invocation_says_whether_it_is_past_due() {
        let past_due = serde_json::json!({"Data": {"timer": {"IsPastDue": true, "ScheduleStatus": null}}, "Metadata": {}});
        assert!(TimerInvocation::decode(past_due.to_string().as_bytes()).is_past_due());
        for punctual in [
            serde_json::json!({"Data": {"timer": {"IsPastDue": false}}, "Metadata": {}})
                .to_string(),
            serde_json::json!({"Data": {"timer": {"IsPastDue": "yes"}}}).to_string(),
            serde_json::json!({"Data": {}}).to_string(),
            "not json".to_owned(),
            String::new(),
        ] {
            assert!(
                !TimerInvocation::decode(punctual.as_bytes()).is_past_due(),
                "{punctual}"
            );
        }
    }

    #[test]
    fn reads_the_producers_diagnostic_id() {
        let body =
            r#"{"claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","amount":"1","currency":"EUR"}"#;
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut metadata = host_metadata();
        metadata["ApplicationProperties"] =
            serde_json::json!({"Diagnostic-Id": traceparent, "eventType": "ClaimApproved"});
        metadata["UserProperties"] = serde_json::json!({"Diagnostic-Id": "00-other"});
        let inv = Invocation::decode(&envelope(body.into(), metadata)).unwrap();
        assert_eq!(inv.diagnostic_id.as_deref(), Some(traceparent));

        let mut older = host_metadata();
        older["UserProperties"] =
            serde_json::json!({"diagnostic-id": format!("\"{traceparent}\"")});
        let inv = Invocation::decode(&envelope(body.into(), older)).unwrap();
        assert_eq!(inv.diagnostic_id.as_deref(), Some(traceparent));

        let inv = Invocation::decode(&envelope(body.into(), host_metadata())).unwrap();
        assert_eq!(inv.diagnostic_id, None);
    }
}
