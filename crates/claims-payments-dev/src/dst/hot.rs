//! Hot claims: the scenario's messages arrive spread out, so without help few deliveries
//! ever meet another attempt on their claim. A share of the claims is made hot: right
//! behind its original the producer sends a burst of business duplicates (the same
//! payment under new MessageIds), and for some of them an HTTP client pays the same
//! claim at the same moment (now and then asking another amount), half of them just
//! before the original, half during its burst. The attempts then race for the claim's
//! payment, its lease and the bank's Idempotency-Key; whichever the product accepts
//! first is paid, and the others end as duplicates or conflicts (`invariants`).

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;

use super::world::Dice;
use crate::sim::scenario::{CopyKind, MessageCopy, Plan};

/// Share of the scenario's claims that are hot.
const HOT_SHARE: f64 = 0.2;
/// The most business duplicates one burst adds (at least one).
const MAX_BURST: u64 = 2;
/// Share of hot claims an HTTP client pays too, during the burst.
const HTTP_SHARE: f64 = 0.4;
/// Share of those HTTP payments that ask another amount (a conflict).
const HTTP_OTHER_AMOUNT: f64 = 0.1;
/// Share of those HTTP payments sent just before the original, not during its burst:
/// the request, not the message, is then most often the first one accepted.
const HTTP_FIRST: f64 = 0.5;
/// The most time between two sends of a burst, and before its HTTP request.
pub(super) const BURST_GAP_MS: u64 = 30;

/// An HTTP payment of a claim the queue also pays.
#[derive(Debug, Clone)]
pub(super) struct HotPayment {
    pub(super) claim: String,
    pub(super) amount: String,
    pub(super) body: String,
    /// Sent just before the claim's original message, not behind it.
    pub(super) first: bool,
}

/// What heating added to the plan.
#[derive(Debug, Default)]
pub(super) struct Hot {
    /// Copies sent right behind the one before them, not after the producer's usual pause.
    pub(super) follows: BTreeSet<usize>,
    /// Original (copy index) -> the HTTP payment sent with its burst.
    pub(super) http: BTreeMap<usize, HotPayment>,
}

/// Makes a share of the plan's claims hot: adds each one's burst of business duplicates
/// right behind its original in the send order, and picks the HTTP payments.
pub(super) fn heat(plan: &mut Plan, dice: &Dice) -> Hot {
    let mut hot = Hot::default();
    let mut order = Vec::with_capacity(plan.send_order.len());
    for &copy in &plan.send_order.clone() {
        order.push(copy);
        let c = &plan.copies[copy];
        let Some(claim) = c.claim.filter(|_| c.kind == CopyKind::Original) else {
            continue;
        };
        if !dice.hit(HOT_SHARE) {
            continue;
        }
        let body = c.body.clone();
        for _ in 0..dice.range(1, MAX_BURST) {
            let id = uuid::Uuid::from_u64_pair(dice.u64(), dice.u64()).to_string();
            hot.follows.insert(plan.copies.len());
            order.push(plan.copies.len());
            plan.copies.push(MessageCopy {
                message_id: id,
                body: body.clone(),
                kind: CopyKind::BusinessDuplicate,
                claim: Some(claim),
                payload: 0,
                invalid_reason: None,
            });
        }
        if dice.hit(HTTP_SHARE) {
            let payload = &plan.claims[claim].payloads[0];
            let mut amount = payload.amount;
            if dice.hit(HTTP_OTHER_AMOUNT) {
                amount += Decimal::new(1_000, 2);
                amount.rescale(payload.amount.scale());
            }
            let amount = amount.to_string();
            let mut body = serde_json::json!({
                "claimId": payload.claim_id,
                "amount": amount,
                "currency": payload.currency,
                "payee": payload.payee,
            });
            if let Some(tenant) = &payload.tenant {
                body["tenantId"] = tenant.as_str().into();
            }
            hot.http.insert(
                copy,
                HotPayment {
                    claim: payload.claim_id.clone(),
                    amount,
                    body: body.to_string(),
                    first: dice.hit(HTTP_FIRST),
                },
            );
        }
    }
    plan.send_order = order;
    hot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::scenario;

    #[test]
    fn a_burst_follows_its_original_and_pays_the_same_claim() {
        let mut plan = scenario::plan(&crate::dst::run::scenario_settings(200, 7));
        let before = plan.copies.len();
        let hot = heat(&mut plan, &Dice::new(7));
        assert!(plan.copies.len() > before && !hot.http.is_empty());
        // Some requests go just before their original, some during its burst.
        assert!(hot.http.values().any(|p| p.first) && hot.http.values().any(|p| !p.first));
        assert_eq!(plan.send_order.len(), plan.copies.len());
        for (at, copy) in plan.send_order.iter().enumerate() {
            if hot.follows.contains(copy) {
                let before = &plan.copies[plan.send_order[at - 1]];
                assert_eq!(before.claim, plan.copies[*copy].claim);
                assert_eq!(plan.copies[*copy].kind, CopyKind::BusinessDuplicate);
            }
        }
        for (copy, payment) in &hot.http {
            let claim = plan.copies[*copy]
                .claim
                .expect("an original names its claim");
            assert_eq!(payment.claim, plan.claims[claim].claim_id);
            let parsed = claims_payments::ClaimApproved::parse(&payment.body).expect("valid");
            assert_eq!(parsed.claim_id.to_string(), payment.claim);
        }
    }
}
