//! The `ClaimApproved` message contract: its wire shape, how it is parsed, the payload
//! hash that tells two different payments apart, and the payout request it becomes.

use std::str::FromStr;

use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::money::parse_amount;
use super::{
    json_error, json_type, ClaimId, Currency, IdempotencyKey, InvalidMessage, Money, PayeeRef,
    PayloadHash, TenantId,
};

/// The wire shape. Unknown fields are ignored so producers can add fields
/// without breaking this consumer; they do not count towards the payload hash.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireClaimApproved<'a> {
    #[serde(borrow)]
    claim_id: Option<&'a RawValue>,
    #[serde(borrow)]
    amount: Option<&'a RawValue>,
    currency: Option<serde_json::Value>,
    tenant_id: Option<serde_json::Value>,
    payee: Option<serde_json::Value>,
    approved_at: Option<serde_json::Value>,
}

/// A valid `ClaimApproved` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimApproved {
    pub claim_id: ClaimId,
    pub money: Money,
    pub tenant: Option<TenantId>,
    pub payee: Option<PayeeRef>,
    approved_at: Option<OffsetDateTime>,
}

fn optional_string(
    field: &'static str,
    value: Option<serde_json::Value>,
) -> Result<Option<String>, InvalidMessage> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(InvalidMessage::new(
            field,
            format!("must be a string, got {}", json_type(&other)),
        )),
    }
}

impl ClaimApproved {
    /// Parses the message body (UTF-8 JSON text).
    pub fn parse(body: &str) -> Result<Self, InvalidMessage> {
        // serde reads a struct from a JSON array too, field by field in order: a message
        // is an object with named fields, never a positional list.
        if !body.trim_start().starts_with('{') {
            return Err(InvalidMessage::new("body", "is not a JSON object"));
        }
        let wire: WireClaimApproved =
            serde_json::from_str(body).map_err(|e| InvalidMessage::new("body", json_error(&e)))?;

        let claim_raw = wire
            .claim_id
            .ok_or_else(|| InvalidMessage::new("claimId", "is missing"))?;
        let claim_text: String = serde_json::from_str(claim_raw.get()).map_err(|_| {
            let got = serde_json::from_str(claim_raw.get())
                .map(|v| json_type(&v))
                .unwrap_or("not JSON");
            InvalidMessage::new(
                "claimId",
                format!("must be a string holding a UUID, got {got}"),
            )
        })?;
        let claim_id = ClaimId::parse(&claim_text)?;

        let currency = optional_string("currency", wire.currency)?
            .ok_or_else(|| InvalidMessage::new("currency", "is missing"))?;
        let currency = Currency::parse(&currency)?;
        let amount = wire
            .amount
            .filter(|raw| raw.get() != "null")
            .ok_or_else(|| InvalidMessage::new("amount", "is missing"))?;
        let money = Money::new(parse_amount(amount)?, currency)?;

        let tenant = optional_string("tenantId", wire.tenant_id)?
            .map(|t| TenantId::parse(&t))
            .transpose()?;
        let payee = optional_string("payee", wire.payee)?
            .map(|p| PayeeRef::parse(&p))
            .transpose()?;
        let approved_at = optional_string("approvedAt", wire.approved_at)?
            .map(|t| {
                OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339)
                    .map_err(|_| InvalidMessage::new("approvedAt", "is not an RFC 3339 timestamp"))
            })
            .transpose()?;

        Ok(ClaimApproved {
            claim_id,
            money,
            tenant,
            payee,
            approved_at,
        })
    }

    /// Hash of the fields that decide the payment: claim, amount, currency, tenant, payee.
    /// `approvedAt` is left out on purpose: a re-sent approval with a new timestamp is
    /// still the same payment.
    pub fn payload_hash(&self) -> PayloadHash {
        // serde_json's map is sorted by key, so this is canonical JSON.
        let canonical = self.payment_fields("tenantId", self.tenant.as_ref().map(TenantId::as_str));
        let digest = Sha256::digest(format!("claim-approved/v1\n{canonical}").as_bytes());
        PayloadHash(format!("sha256:{}", hex::encode(digest)))
    }

    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::for_payout(self.tenant.as_ref(), self.claim_id)
    }

    /// The exact bytes of the bank payout request, built once, stored with the payment
    /// and re-sent unchanged on every retry. It carries
    /// the Idempotency-Key as `reference`, so the bank can be asked what it holds under
    /// that reference even after it forgot the key (see `reconcile`).
    pub fn payout_request_body(&self) -> String {
        self.payment_fields("reference", Some(self.idempotency_key().as_str()))
            .to_string()
    }

    /// The fields the payload hash and the payout body both carry, written once so the
    /// two cannot drift apart, plus the one field each adds (`tenantId`, `reference`).
    /// The object is sorted by key, whatever the order the fields are set in.
    fn payment_fields(&self, extra: &str, value: Option<&str>) -> serde_json::Value {
        let mut fields = serde_json::json!({
            "amount": self.money.amount_string(),
            "claimId": self.claim_id.to_string(),
            "currency": self.money.currency().code(),
            "payee": self.payee.as_ref().map(PayeeRef::as_str),
        });
        fields[extra] = value.into();
        fields
    }
}

impl FromStr for ClaimApproved {
    type Err = InvalidMessage;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClaimApproved::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::MessageId;
    use rust_decimal::Decimal;

    const CLAIM: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn parse(body: serde_json::Value) -> Result<ClaimApproved, InvalidMessage> {
        ClaimApproved::parse(&body.to_string())
    }

    #[test]
    fn accepts_amount_as_string_or_number_without_float_rounding() {
        let a = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":"1250.10","currency":"EUR"}}"#
        ))
        .unwrap();
        let b = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":1250.1,"currency":"EUR"}}"#
        ))
        .unwrap();
        assert_eq!(a.money.amount_string(), "1250.10");
        assert_eq!(a.payload_hash(), b.payload_hash());
        // 0.1 + 0.2 style values survive exactly: f64 would print 9007199254740993 as ...992.
        let big = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{CLAIM}","amount":900719925474.99,"currency":"EUR"}}"#
        ))
        .unwrap();
        assert_eq!(big.money.amount_string(), "900719925474.99");
    }

    #[test]
    fn a_positional_array_is_not_a_message() {
        // The fields in WireClaimApproved's order: serde would read this as a message.
        let array = format!(r#"["{CLAIM}", "10.00", "EUR", null, "NL91ABNA0417164300", null]"#);
        let err = ClaimApproved::parse(&array).unwrap_err();
        assert_eq!(err.to_string(), "body: is not a JSON object");
        assert!(ClaimApproved::parse(&format!(
            "  \n{{\"claimId\":\"{CLAIM}\",\"amount\":\"1\",\"currency\":\"EUR\"}}"
        ))
        .is_ok());
    }

    #[test]
    fn each_violation_names_its_field() {
        let names = |body: serde_json::Value, field: &str| {
            let err = parse(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.field, field, "{body}: {err}");
        };
        // Each case is one valid message with one field removed or set to a bad value.
        let valid = serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "EUR"});
        for field in ["claimId", "amount", "currency"] {
            let mut body = valid.clone();
            body.as_object_mut().unwrap().remove(field);
            names(body, field);
        }
        for (field, values) in [
            (
                "claimId",
                serde_json::json!(["nope", "00000000-0000-0000-0000-000000000000"]),
            ),
            (
                "amount",
                serde_json::json!(["0", "-5", "1.001", "abc", true]),
            ),
            ("currency", serde_json::json!(["eur", "XAU"])),
            ("tenantId", serde_json::json!(["a b"])),
            ("payee", serde_json::json!([""])),
            ("approvedAt", serde_json::json!(["yesterday"])),
        ] {
            for value in values.as_array().unwrap() {
                let mut body = valid.clone();
                body[field] = value.clone();
                names(body, field);
            }
        }
        names(
            serde_json::json!({"claimId": CLAIM, "amount": "1.5", "currency": "JPY"}),
            "amount",
        );
        names(serde_json::json!([1, 2]), "body");
    }

    /// A refusal names the field and what is wrong with it, never the value: the reason
    /// reaches the invocation log, exported telemetry and the dead-letter listing, and a
    /// value may be an account number or a person's name.
    #[test]
    fn a_refusal_never_repeats_the_value_it_refuses() {
        const IBAN: &str = "DE89370400440532013000";
        const NAME: &str = "Erika Mustermann";
        const DIGITS: &str = "31415926535";
        let secrets = [IBAN, NAME, DIGITS, "89370400"];
        let wrong_values = [
            serde_json::json!({"iban": IBAN, "name": NAME}),
            serde_json::json!([IBAN, NAME]),
            serde_json::json!(format!("{IBAN} {NAME}")),
            serde_json::json!(format!("{NAME}\u{7}{IBAN}")),
            serde_json::json!(format!("{IBAN}{}", "9".repeat(70))),
            serde_json::json!(format!("{DIGITS}.897")),
            serde_json::json!(format!("-{DIGITS}")),
            serde_json::json!(format!("{DIGITS}e3")),
            serde_json::from_str::<serde_json::Value>(&format!("{DIGITS}.897")).unwrap(),
            serde_json::from_str::<serde_json::Value>(&format!("-{DIGITS}")).unwrap(),
            serde_json::from_str::<serde_json::Value>(&format!("{DIGITS}{DIGITS}")).unwrap(),
            serde_json::json!(true),
        ];
        let valid = serde_json::json!({"claimId": CLAIM, "amount": "1", "currency": "EUR"});
        let mut refused = 0;
        for field in [
            "claimId",
            "amount",
            "currency",
            "tenantId",
            "payee",
            "approvedAt",
        ] {
            for value in &wrong_values {
                let mut body = valid.clone();
                body[field] = value.clone();
                let Err(err) = parse(body.clone()) else {
                    continue;
                };
                refused += 1;
                assert_eq!(err.field, field, "{body}: {err}");
                let text = err.to_string();
                for secret in secrets {
                    assert!(!text.contains(secret), "{field} = {value}: {text}");
                }
            }
        }
        // Every field refuses every wrong type; only strings and numbers of the right
        // form may pass for some of them.
        assert!(refused >= 6 * 3, "{refused}");
        // An object under a field must say so by its JSON type.
        let mut body = valid.clone();
        body["payee"] = wrong_values[0].clone();
        assert_eq!(
            parse(body).unwrap_err().to_string(),
            "payee: must be a string, got an object"
        );
        // Bodies that are not JSON, or not the expected shape.
        for body in [
            format!(r#"{{"claimId":"{CLAIM}","payee":"{IBAN}"#),
            format!(r#"{{"claimId":"{CLAIM}","payee":{IBAN}x}}"#),
            format!(r#"{{"payee":"{IBAN}","payee":"{NAME}"}}"#),
            format!(r#"{{"claimId":"{CLAIM}","amount":"1","currency":"EUR","payee":"{IBAN}\x"}}"#),
        ] {
            let err = ClaimApproved::parse(&body).expect_err(&body);
            assert_eq!(err.field, "body", "{body}: {err}");
            for secret in secrets {
                assert!(!err.to_string().contains(secret), "{body}: {err}");
            }
        }
        // Values read back from the store are refused the same way.
        for err in [
            PayeeRef::from_stored(&format!(" {IBAN}")).unwrap_err(),
            PayeeRef::from_stored(&format!("{IBAN}\u{7}")).unwrap_err(),
            TenantId::from_stored(NAME).unwrap_err(),
            Money::from_stored(&format!("{DIGITS}.5"), "EUR").unwrap_err(),
            Money::from_stored(&format!("0{DIGITS}.50"), "EUR").unwrap_err(),
            Money::from_stored("1.00", IBAN).unwrap_err(),
            ClaimId::parse(IBAN).unwrap_err(),
        ] {
            for secret in secrets {
                assert!(!err.to_string().contains(secret), "{err}");
            }
        }
    }

    #[test]
    fn amounts_follow_one_strict_grammar() {
        let amount = |raw: &str| {
            ClaimApproved::parse(&format!(
                r#"{{"claimId":"{CLAIM}","amount":{raw},"currency":"EUR"}}"#
            ))
            .map(|m| m.money.amount_string())
        };
        for ok in [
            r#""5""#,
            r#""5.5""#,
            r#""0.01""#,
            "5",
            "5.25",
            r#""007.50""#,
        ] {
            assert!(amount(ok).is_ok(), "{ok}: {:?}", amount(ok));
        }
        for bad in [
            r#""1_000""#,
            r#""+5""#,
            r#"".5""#,
            r#""5.""#,
            r#""1e2""#,
            r#"" 5""#,
            r#""5 ""#,
            r#""1,000.00""#,
            r#""0x10""#,
            r#""5..1""#,
            r#""-""#,
            r#""""#,
            "1e2",
            "1.5E1",
            "-0.5",
        ] {
            let err = amount(bad).expect_err(bad);
            assert_eq!(err.field, "amount", "{bad}: {err}");
        }
    }

    #[test]
    fn hash_ignores_envelope_noise_but_not_business_fields() {
        let base = serde_json::json!({"claimId": CLAIM, "amount": "10.00", "currency": "EUR", "payee": "NL91ABNA0417164300"});
        let h = parse(base.clone()).unwrap().payload_hash();
        let mut with_extra = base.clone();
        with_extra["approvedAt"] = "2026-01-01T00:00:00Z".into();
        with_extra["note"] = "ignored".into();
        assert_eq!(parse(with_extra).unwrap().payload_hash(), h);
        let mut other_amount = base.clone();
        other_amount["amount"] = "10.01".into();
        assert_ne!(parse(other_amount).unwrap().payload_hash(), h);
        let mut other_payee = base;
        other_payee["payee"] = "DE89370400440532013000".into();
        assert_ne!(parse(other_payee).unwrap().payload_hash(), h);
    }

    /// The payload hash is stored with every inbox record and payment, and the payout
    /// body is stored and re-sent: both must stay byte-for-byte what they were.
    #[test]
    fn stored_hash_and_payout_body_are_pinned() {
        let bare = serde_json::json!({"claimId": CLAIM, "amount": "10.00", "currency": "EUR"});
        let mut full = bare.clone();
        full["tenantId"] = "acme".into();
        full["payee"] = "NL91ABNA0417164300".into();
        for (body, hash, payout) in [
            (
                bare,
                "sha256:53c4fe2eb35dfa2da6a2a9d20127398abe3ff6596d7fcc5ffe826fb5677a0fc3",
                r#"{"amount":"10.00","claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","currency":"EUR","payee":null,"reference":"claim-payment-6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"}"#,
            ),
            (
                full,
                "sha256:b9fed0e0db6171950934085432eeb07bc58f98c959118d4a3a8b24e62cb8e823",
                r#"{"amount":"10.00","claimId":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","currency":"EUR","payee":"NL91ABNA0417164300","reference":"acme:claim-payment-6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"}"#,
            ),
        ] {
            let m = parse(body).unwrap();
            assert_eq!(m.payload_hash().as_str(), hash);
            assert_eq!(m.payout_request_body(), payout);
        }
    }

    #[test]
    fn idempotency_key_is_deterministic_and_tenant_scoped() {
        let claim = ClaimId::parse(CLAIM).unwrap();
        assert_eq!(
            IdempotencyKey::for_payout(None, claim).as_str(),
            format!("claim-payment-{CLAIM}")
        );
        let tenant = TenantId::parse("acme").unwrap();
        assert_eq!(
            IdempotencyKey::for_payout(Some(&tenant), claim).as_str(),
            format!("acme:claim-payment-{CLAIM}")
        );
    }

    #[test]
    fn stored_values_read_back_only_in_the_form_they_were_written() {
        let eur = Currency::parse("EUR").unwrap();
        let money = Money::from_stored("12.50", "EUR").unwrap();
        assert_eq!(money, Money::new(Decimal::new(125, 1), eur).unwrap());
        assert_eq!(money.amount_string(), "12.50");
        assert_eq!(
            Money::from_stored("1000", "JPY").unwrap().amount_string(),
            "1000"
        );
        for (amount, currency, field) in [
            ("12.5", "EUR", "amount"),
            ("012.50", "EUR", "amount"),
            ("1e2", "EUR", "amount"),
            ("-1.00", "EUR", "amount"),
            ("0.00", "EUR", "amount"),
            ("12.50", "eur", "currency"),
            ("12.50", "", "currency"),
            ("", "EUR", "amount"),
        ] {
            let err = Money::from_stored(amount, currency).expect_err(amount);
            assert_eq!(err.field, field, "{amount} {currency}: {err}");
        }
        assert_eq!(TenantId::from_stored("acme").unwrap().as_str(), "acme");
        assert_eq!(
            TenantId::from_stored(" acme").unwrap_err().field,
            "tenantId"
        );
        assert_eq!(TenantId::from_stored("a b").unwrap_err().field, "tenantId");
        let iban = "NL91ABNA0417164300";
        assert_eq!(PayeeRef::from_stored(iban).unwrap().as_str(), iban);
        assert_eq!(PayeeRef::from_stored("x ").unwrap_err().field, "payee");
        assert_eq!(PayeeRef::from_stored("").unwrap_err().field, "payee");
    }

    #[test]
    fn message_id_bounds() {
        assert!(MessageId::parse("").is_err());
        assert!(MessageId::parse(&"x".repeat(128)).is_ok());
        assert!(MessageId::parse(&"x".repeat(129)).is_err());
        assert!(MessageId::parse("a/b?c#d\\e").is_ok());
    }
}
