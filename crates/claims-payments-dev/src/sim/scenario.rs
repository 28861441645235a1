//! The producer: which `ClaimApproved` messages the simulated upstream system sends.
//!
//! A plan is generated from the seed alone, so a run can be repeated message for
//! message. It holds the claims (with every payload the producer ever sent for each,
//! which is what the verifier compares the ledger and the bank against) and the
//! queue copies in send order:
//! - originals: one fresh claim each, with a Service Bus MessageId (mostly GUIDs, some
//!   unusual but legal ids: slashes, `?`, `#`, backslashes, non-ASCII, 128 characters,
//!   and pairs like `x/1` and `x%2F1` that collide under a careless encoding);
//! - producer re-sends: the same MessageId and the same bytes again, some right behind
//!   the original (racing it) and some much later;
//! - business duplicates: a new MessageId for a claim already sent, same payment;
//! - conflicting payloads: the same MessageId with a different amount;
//! - invalid bodies: each breaks the contract in one named way.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rust_decimal::Decimal;
use time::OffsetDateTime;
use uuid::Uuid;

/// The payment a message asks for: the business fields the service hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub claim_id: String,
    pub amount: Decimal,
    pub currency: &'static str,
    pub tenant: Option<String>,
    pub payee: Option<String>,
}

impl Payload {
    /// Identity of the requested payment; `12.50` and `12.5` are the same amount.
    pub fn identity(&self) -> String {
        format!(
            "{}|{}|{}|{:?}|{:?}",
            self.claim_id,
            self.amount.normalize(),
            self.currency,
            self.tenant,
            self.payee
        )
    }

    fn fraction_digits(&self) -> u32 {
        if self.currency == "JPY" {
            0
        } else {
            2
        }
    }

    /// The JSON body. `amount_as_number` writes the amount as a JSON number in its
    /// shortest form (`12.5`), otherwise as a string with the currency's digits (`"12.50"`).
    fn body(&self, approved_at: OffsetDateTime, amount_as_number: bool) -> String {
        let amount = if amount_as_number {
            self.amount.normalize().to_string()
        } else {
            let mut a = self.amount;
            a.rescale(self.fraction_digits());
            json_str(&a.to_string())
        };
        let mut body = format!(
            "{{\"claimId\":{},\"amount\":{amount},\"currency\":{}",
            json_str(&self.claim_id),
            json_str(self.currency)
        );
        if let Some(tenant) = &self.tenant {
            body.push_str(&format!(",\"tenantId\":{}", json_str(tenant)));
        }
        if let Some(payee) = &self.payee {
            body.push_str(&format!(",\"payee\":{}", json_str(payee)));
        }
        body.push_str(&format!(
            ",\"approvedAt\":{}}}",
            json_str(&rfc3339(approved_at))
        ));
        body
    }
}

fn json_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyKind {
    Original,
    ProducerResend,
    BusinessDuplicate,
    ConflictingPayload,
    Invalid,
}

/// One message the producer puts on the queue.
#[derive(Debug, Clone)]
pub struct MessageCopy {
    pub message_id: String,
    pub body: Vec<u8>,
    pub kind: CopyKind,
    /// Index into [`Plan::claims`]; `None` for invalid bodies.
    pub claim: Option<usize>,
    /// Index into that claim's `payloads`.
    pub payload: usize,
    /// For invalid bodies: what is wrong with it.
    pub invalid_reason: Option<&'static str>,
}

/// A claim and every distinct payload the producer sent for it (more than one only
/// when a conflicting payload was sent under an existing MessageId).
#[derive(Debug, Clone)]
pub struct Claim {
    pub claim_id: String,
    pub payloads: Vec<Payload>,
}

#[derive(Debug, Clone)]
pub struct ScenarioSettings {
    pub messages: usize,
    pub duplicate_rate: f64,
    pub business_duplicate_rate: f64,
    pub conflict_rate: f64,
    pub invalid_rate: f64,
    /// Share of claims whose payee account the sandbox bank refuses (closed account).
    pub closed_account_rate: f64,
    /// Whether a body may be bytes that are not UTF-8 (only a binary trigger delivers them).
    pub allow_non_utf8: bool,
    /// How far behind its original a "racing" re-send is placed (about the worker count).
    pub race_window: usize,
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub claims: Vec<Claim>,
    pub copies: Vec<MessageCopy>,
    /// Indices into `copies`, in the order the producer sends them.
    pub send_order: Vec<usize>,
}

impl Plan {
    pub fn count(&self, kind: CopyKind) -> usize {
        self.copies.iter().filter(|c| c.kind == kind).count()
    }

    pub fn distinct_message_ids(&self) -> usize {
        self.copies
            .iter()
            .filter(|c| {
                !matches!(
                    c.kind,
                    CopyKind::ProducerResend | CopyKind::ConflictingPayload
                )
            })
            .count()
    }
}

const INVALID_KINDS: &[&str] = &[
    "claimId is not a UUID",
    "amount is negative",
    "amount has three fraction digits",
    "currency is missing",
    "body is not JSON",
    "amount is a boolean",
    "body is empty",
    "body is not UTF-8",
];

fn invalid_body(kind: &str, claim: &str) -> Vec<u8> {
    let payee = "NL91ABNA0417164300";
    match kind {
        "claimId is not a UUID" => format!(
            r#"{{"claimId":"CLM-{}","amount":"10.00","currency":"EUR","payee":"{payee}"}}"#,
            &claim[..8]
        )
        .into_bytes(),
        "amount is negative" => format!(
            r#"{{"claimId":"{claim}","amount":"-25.00","currency":"EUR","payee":"{payee}"}}"#
        )
        .into_bytes(),
        "amount has three fraction digits" => format!(
            r#"{{"claimId":"{claim}","amount":"10.005","currency":"EUR","payee":"{payee}"}}"#
        )
        .into_bytes(),
        "currency is missing" => {
            format!(r#"{{"claimId":"{claim}","amount":"10.00","payee":"{payee}"}}"#).into_bytes()
        }
        "body is not JSON" => format!("claim {claim} approved: 10.00 EUR").into_bytes(),
        "amount is a boolean" => {
            format!(r#"{{"claimId":"{claim}","amount":true,"currency":"EUR","payee":"{payee}"}}"#)
                .into_bytes()
        }
        "body is empty" => Vec::new(),
        _ => {
            let mut bytes = vec![0xFF, 0xFE];
            bytes.extend_from_slice(format!(r#"{{"claimId":"{claim}"}}"#).as_bytes());
            bytes
        }
    }
}

fn uuid_from(rng: &mut StdRng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.random()).into_uuid()
}

/// MessageIds: GUIDs, and every eighth one legal in Service Bus but easy to get wrong
/// in storage ids. Kinds 4 and 5 make pairs (`x/7`, `x%2F7`) that collide under a
/// percent-encoding that is not injective.
fn message_id(rng: &mut StdRng, n: usize) -> String {
    if n % 8 != 7 {
        return uuid_from(rng).to_string();
    }
    match (n / 8) % 6 {
        0 => format!("claims/{n}/approved?attempt=1#{n}"),
        1 => format!("ClaimApproved\\{n}"),
        2 => format!("zahlung ä {n} ✓"),
        3 => {
            let suffix = format!("-{n}");
            format!("{}{suffix}", "m".repeat(128 - suffix.len()))
        }
        4 => format!("x/{n}"),
        _ => format!("x%2F{}", n - 8),
    }
}

/// A new claim's payment: its id, currency, amount, tenant and payee (a closed account
/// with `closed_account_rate`), drawn from `rng` in that order.
fn random_payload(rng: &mut StdRng, closed_account_rate: f64) -> Payload {
    let claim_id = uuid_from(rng).to_string();
    let currency = match rng.random_range(0..10) {
        0..=6 => "EUR",
        7 | 8 => "USD",
        _ => "JPY",
    };
    let amount = if currency == "JPY" {
        Decimal::new(rng.random_range(100..=500_000), 0)
    } else {
        Decimal::new(rng.random_range(100..=500_000), 2)
    };
    let tenant = match rng.random_range(0..10) {
        0..=4 => Some("acme".to_owned()),
        5..=7 => Some("globex".to_owned()),
        _ => None,
    };
    let payee = if rng.random_bool(closed_account_rate.clamp(0.0, 1.0)) {
        format!("CLOSED-{:010}", rng.random_range(0..10_000_000_000u64))
    } else {
        format!(
            "NL{:02}SIMB{:010}",
            rng.random_range(10..100),
            rng.random_range(0..10_000_000_000u64)
        )
    };
    Payload {
        claim_id,
        amount,
        currency,
        tenant,
        payee: Some(payee),
    }
}

pub fn plan(settings: &ScenarioSettings) -> Plan {
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let base_time =
        OffsetDateTime::from_unix_timestamp(1_767_225_600).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let mut claims: Vec<Claim> = Vec::new();
    let mut copies: Vec<MessageCopy> = Vec::new();
    // (position, copy index): originals at n * SLOT, extras after their original.
    const SLOT: u64 = 1 << 20;
    let mut positions: Vec<(u64, usize)> = Vec::new();
    let mut used_ids = std::collections::HashSet::new();
    let invalid_kinds: Vec<&str> = INVALID_KINDS
        .iter()
        .copied()
        .filter(|k| settings.allow_non_utf8 || *k != "body is not UTF-8")
        .collect();
    let n_total = settings.messages as u64;

    for n in 0..settings.messages {
        let mut id = message_id(&mut rng, n);
        while !used_ids.insert(id.clone()) {
            id = uuid_from(&mut rng).to_string();
        }
        let approved_at = base_time + time::Duration::minutes(n as i64);
        let position = n as u64 * SLOT;
        let roll: f64 = rng.random();

        if roll < settings.invalid_rate {
            let kind = invalid_kinds[rng.random_range(0..invalid_kinds.len())];
            let claim = uuid_from(&mut rng).to_string();
            positions.push((position, copies.len()));
            copies.push(MessageCopy {
                message_id: id,
                body: invalid_body(kind, &claim),
                kind: CopyKind::Invalid,
                claim: None,
                payload: 0,
                invalid_reason: Some(kind),
            });
            continue;
        }

        if roll < settings.invalid_rate + settings.business_duplicate_rate && !claims.is_empty() {
            // A second event for a claim already sent: same payment, new MessageId.
            let claim = rng.random_range(0..claims.len());
            let body = claims[claim].payloads[0].body(approved_at, rng.random_bool(0.5));
            positions.push((position, copies.len()));
            copies.push(MessageCopy {
                message_id: id,
                body: body.into_bytes(),
                kind: CopyKind::BusinessDuplicate,
                claim: Some(claim),
                payload: 0,
                invalid_reason: None,
            });
            continue;
        }

        let payload = random_payload(&mut rng, settings.closed_account_rate);
        let (claim_id, currency) = (payload.claim_id.clone(), payload.currency);
        let original = payload.body(approved_at, rng.random_bool(0.3));
        let claim = claims.len();
        claims.push(Claim {
            claim_id,
            payloads: vec![payload.clone()],
        });
        positions.push((position, copies.len()));
        copies.push(MessageCopy {
            message_id: id.clone(),
            body: original.clone().into_bytes(),
            kind: CopyKind::Original,
            claim: Some(claim),
            payload: 0,
            invalid_reason: None,
        });

        let later = |rng: &mut StdRng| -> u64 {
            // Half race the original (a few slots behind, while it is in flight), half
            // arrive much later (a producer retry after a timeout, a replayed outbox).
            let gap = if rng.random_bool(0.5) {
                rng.random_range(0..=settings.race_window.max(1) as u64)
            } else {
                rng.random_range(1..=n_total.max(1))
            };
            position + gap * SLOT + rng.random_range(1..SLOT)
        };
        if rng.random_bool(settings.duplicate_rate.clamp(0.0, 1.0)) {
            positions.push((later(&mut rng), copies.len()));
            copies.push(MessageCopy {
                message_id: id.clone(),
                body: original.into_bytes(),
                kind: CopyKind::ProducerResend,
                claim: Some(claim),
                payload: 0,
                invalid_reason: None,
            });
        }
        if rng.random_bool(settings.conflict_rate.clamp(0.0, 1.0)) {
            // A producer bug: the same MessageId, another amount.
            let mut changed = payload;
            changed.amount += if currency == "JPY" {
                Decimal::new(1_000, 0)
            } else {
                Decimal::new(1_000, 2)
            };
            let body = changed.body(approved_at, false);
            claims[claim].payloads.push(changed);
            positions.push((later(&mut rng), copies.len()));
            copies.push(MessageCopy {
                message_id: id,
                body: body.into_bytes(),
                kind: CopyKind::ConflictingPayload,
                claim: Some(claim),
                payload: 1,
                invalid_reason: None,
            });
        }
    }

    positions.sort_unstable();
    Plan {
        claims,
        copies,
        send_order: positions.into_iter().map(|(_, i)| i).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(seed: u64) -> ScenarioSettings {
        ScenarioSettings {
            messages: 400,
            duplicate_rate: 0.2,
            business_duplicate_rate: 0.05,
            conflict_rate: 0.05,
            invalid_rate: 0.05,
            closed_account_rate: 0.02,
            allow_non_utf8: true,
            race_window: 16,
            seed,
        }
    }

    #[test]
    fn same_seed_same_plan() {
        let a = plan(&settings(9));
        let b = plan(&settings(9));
        assert_eq!(a.send_order, b.send_order);
        let ids = |p: &Plan| {
            p.copies
                .iter()
                .map(|c| (c.message_id.clone(), c.body.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b));
        assert_ne!(ids(&a), ids(&plan(&settings(10))));
    }

    #[test]
    fn every_valid_body_is_accepted_by_the_contract_and_invalid_ones_are_not() {
        let p = plan(&settings(3));
        for copy in &p.copies {
            let parsed = std::str::from_utf8(&copy.body)
                .ok()
                .map(claims_payments::ClaimApproved::parse);
            match copy.claim {
                Some(claim) => {
                    let parsed = parsed.expect("utf-8").expect("valid body");
                    let expected = &p.claims[claim].payloads[copy.payload];
                    assert_eq!(parsed.claim_id.to_string(), expected.claim_id);
                    assert_eq!(parsed.money.amount(), expected.amount.normalize());
                }
                None => assert!(!matches!(parsed, Some(Ok(_))), "{:?}", copy.invalid_reason),
            }
            assert!(copy.message_id.chars().count() <= 128);
        }
        // Every extra copy is sent after its original.
        let pos: std::collections::HashMap<usize, usize> = p
            .send_order
            .iter()
            .enumerate()
            .map(|(at, c)| (*c, at))
            .collect();
        for (i, copy) in p.copies.iter().enumerate() {
            if matches!(
                copy.kind,
                CopyKind::ProducerResend | CopyKind::ConflictingPayload
            ) {
                let original = p
                    .copies
                    .iter()
                    .position(|c| c.kind == CopyKind::Original && c.message_id == copy.message_id)
                    .unwrap();
                assert!(pos[&original] < pos[&i]);
            }
        }
        assert!(p.count(CopyKind::ProducerResend) > 0);
        assert!(p.count(CopyKind::ConflictingPayload) > 0);
        assert!(p.count(CopyKind::BusinessDuplicate) > 0);
        assert!(p.count(CopyKind::Invalid) > 0);
    }
}
