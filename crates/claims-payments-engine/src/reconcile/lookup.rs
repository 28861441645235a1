//! What the bank's answers mean for one payment: the entries it holds under our
//! reference judged against the ledger (`judge`), the decision each finding leads to,
//! and whether a payout the bank never received may be sent now (`payable_request`).
//! Pure: nothing here reads or writes.

use crate::bank::{BankPayment, BankStatus};
use crate::store::{PaymentRecord, PaymentStatus};

use super::report::Settlement;

/// What the bank's lookup means for one payment.
pub(super) enum Finding {
    Paid {
        payment_id: String,
        evidence: String,
    },
    Mismatch {
        evidence: String,
        double_payment: bool,
    },
    Rejected {
        evidence: String,
    },
    NoneHeld,
    Unknown {
        reason: String,
    },
}

/// What settling decided: the result, the payment's new status, its bank id and why.
pub(super) struct Decision {
    pub(super) result: Settlement,
    pub(super) status: PaymentStatus,
    pub(super) bank_payment_id: Option<String>,
    pub(super) evidence: String,
}

impl Decision {
    pub(super) fn unknown(reason: String) -> Self {
        Decision {
            result: Settlement::StillUnknown,
            status: PaymentStatus::NeedsReconciliation,
            bank_payment_id: None,
            evidence: reason,
        }
    }

    /// Every finding but `NoneHeld`, which needs a payout first.
    pub(super) fn from_finding(finding: Finding) -> Self {
        match finding {
            Finding::Paid {
                payment_id,
                evidence,
            } => Decision {
                result: Settlement::PaidByLookup,
                status: PaymentStatus::Paid,
                bank_payment_id: Some(payment_id),
                evidence,
            },
            Finding::Mismatch {
                evidence,
                double_payment,
            } => Decision {
                result: if double_payment {
                    Settlement::DoublePayment
                } else {
                    Settlement::Mismatch
                },
                status: PaymentStatus::Mismatched,
                bank_payment_id: None,
                evidence,
            },
            Finding::Rejected { evidence } => Decision {
                result: Settlement::Rejected,
                status: PaymentStatus::Rejected,
                bank_payment_id: None,
                evidence,
            },
            Finding::Unknown { reason } => Decision::unknown(reason),
            Finding::NoneHeld => Decision::unknown("the bank holds nothing yet".into()),
        }
    }
}

/// What the entries the bank holds under our reference mean for `p`. Pure.
pub(super) fn judge(p: &PaymentRecord, held: &[BankPayment]) -> Finding {
    let describe = |b: &BankPayment| {
        format!(
            "{} ({} {} {})",
            b.payment_id, b.status, b.amount, b.currency
        )
    };
    let paid: Vec<&BankPayment> = held
        .iter()
        .filter(|b| b.status == BankStatus::Paid)
        .collect();
    let pending: Vec<&BankPayment> = held
        .iter()
        .filter(|b| b.status == BankStatus::Pending)
        .collect();
    if paid.len() > 1 {
        let list: Vec<String> = paid.iter().map(|b| describe(b)).collect();
        return Finding::Mismatch {
            evidence: format!(
                "double payment at the bank: {} paid entries under the one reference ({}); never settled automatically, check by hand",
                paid.len(),
                list.join("; ")
            ),
            double_payment: true,
        };
    }
    if let Some(paid) = paid.first() {
        if !same_amount(p, paid) {
            return Finding::Mismatch {
                evidence: format!(
                    "bank holds payment {}, but the ledger says {}; never paid again, check by hand",
                    describe(paid),
                    p.money
                ),
                double_payment: false,
            };
        }
        if let Some(other) = pending.first() {
            return Finding::Unknown {
                reason: format!(
                    "bank holds payment {} as paid and {} still pending under the same reference; asked again once it is final",
                    paid.payment_id, other.payment_id
                ),
            };
        }
        return Finding::Paid {
            payment_id: paid.payment_id.clone(),
            evidence: format!("bank holds payment {}", describe(paid)),
        };
    }
    // Pending anywhere: it may still pay, whatever else the bank lists.
    if let Some(pending) = pending.first() {
        return Finding::Unknown {
            reason: format!("bank holds payment {}, not final yet", describe(pending)),
        };
    }
    if let Some(refused) = held.first() {
        return Finding::Rejected {
            evidence: format!("bank holds payment {}", describe(refused)),
        };
    }
    Finding::NoneHeld
}

fn same_amount(p: &PaymentRecord, held: &BankPayment) -> bool {
    held.amount == p.money.amount() && p.money.currency().code() == held.currency
}

/// Why reconciliation may not send a payout that the bank says it never received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum CannotPayNow {
    #[error("no stored payout request")]
    NoStoredRequest,
    #[error("the stored request predates bank references, so the lookup cannot rule out an earlier payout; check the bank by hand")]
    PredatesReferences,
}

/// The stored request, if it may be sent now: only one that carries the reference,
/// since for an older one the lookup could not have seen a payment made without it.
pub(super) fn payable_request(p: &PaymentRecord) -> Result<&str, CannotPayNow> {
    let Some(body) = p.payout_request.as_deref() else {
        return Err(CannotPayNow::NoStoredRequest);
    };
    if !carries_reference(body, p.idempotency_key.as_str()) {
        return Err(CannotPayNow::PredatesReferences);
    }
    Ok(body)
}

fn carries_reference(body: &str, key: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("reference")
                .and_then(|r| r.as_str())
                .map(|r| r == key)
        })
        .unwrap_or(false)
}
