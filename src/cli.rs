//! Operator commands on the store: `ledger`, `inbox`, `purge`.
//!
//! Output is a table for people, or one JSON object per line (`--json`) for scripts.

use std::io::Write;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::store::{DynStore, InboxRecord, PaymentRecord};

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// One ledger line, as `ledger --json` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerLine {
    pub claim_id: String,
    pub amount: String,
    pub currency: String,
    pub status: &'static str,
    pub message_id: String,
    pub bank_payment_id: Option<String>,
    pub tenant_id: Option<String>,
    pub status_reason: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&PaymentRecord> for LedgerLine {
    fn from(p: &PaymentRecord) -> Self {
        LedgerLine {
            claim_id: p.claim_id.to_string(),
            amount: p.amount.clone(),
            currency: p.currency.clone(),
            status: p.status.as_str(),
            message_id: p.message_id.to_string(),
            bank_payment_id: p.bank_payment_id.clone(),
            tenant_id: p.tenant_id.clone(),
            status_reason: p.status_reason.clone(),
            created_at: rfc3339(p.created_at),
            updated_at: rfc3339(p.updated_at),
        }
    }
}

/// One inbox line, as `inbox --json` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxLine {
    pub consumer: String,
    pub claim_id: String,
    pub message_id: String,
    pub status: &'static str,
    pub outcome: Option<String>,
    pub owner: String,
    pub lease_until: Option<String>,
    pub first_delivery_count: u32,
    pub last_delivery_count: u32,
    pub payload_hash: String,
    pub created_at: String,
    pub updated_at: String,
    pub expires_at: String,
}

impl From<&InboxRecord> for InboxLine {
    fn from(r: &InboxRecord) -> Self {
        InboxLine {
            consumer: r.consumer.clone(),
            claim_id: r.claim_id.to_string(),
            message_id: r.message_id.to_string(),
            status: r.status.as_str(),
            outcome: r.outcome.clone(),
            owner: r.owner.to_string(),
            lease_until: r.lease_until.map(rfc3339),
            first_delivery_count: r.first_delivery_count,
            last_delivery_count: r.last_delivery_count,
            payload_hash: r.payload_hash.as_str().to_owned(),
            created_at: rfc3339(r.created_at),
            updated_at: rfc3339(r.updated_at),
            expires_at: rfc3339(r.expires_at),
        }
    }
}

fn print_table(out: &mut impl Write, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    writeln!(
        out,
        "{}",
        line(header.iter().map(|h| h.to_string()).collect())
    )?;
    for row in rows {
        writeln!(out, "{}", line(row.clone()))?;
    }
    Ok(())
}

pub async fn ledger(
    store: &DynStore,
    json: bool,
    limit: usize,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let payments = store.list_payments(limit).await?;
    if json {
        for p in &payments {
            writeln!(out, "{}", serde_json::to_string(&LedgerLine::from(p))?)?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = payments
        .iter()
        .map(|p| {
            vec![
                p.claim_id.to_string(),
                p.amount.clone(),
                p.currency.clone(),
                p.status.as_str().to_owned(),
                p.message_id.to_string(),
                p.bank_payment_id.clone().unwrap_or_else(|| "-".into()),
                rfc3339(p.updated_at),
            ]
        })
        .collect();
    print_table(
        out,
        &[
            "CLAIM",
            "AMOUNT",
            "CURRENCY",
            "STATUS",
            "MESSAGE",
            "BANK PAYMENT",
            "UPDATED",
        ],
        &rows,
    )?;
    writeln!(out, "{} payment(s)", payments.len())?;
    Ok(())
}

pub async fn inbox(
    store: &DynStore,
    json: bool,
    limit: usize,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let records = store.list_inbox(limit).await?;
    if json {
        for r in &records {
            writeln!(out, "{}", serde_json::to_string(&InboxLine::from(r))?)?;
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.message_id.to_string(),
                r.claim_id.to_string(),
                r.status.as_str().to_owned(),
                r.outcome.clone().unwrap_or_else(|| "-".into()),
                format!("{}..{}", r.first_delivery_count, r.last_delivery_count),
                r.lease_until.map(rfc3339).unwrap_or_else(|| "-".into()),
                rfc3339(r.expires_at),
            ]
        })
        .collect();
    print_table(
        out,
        &[
            "MESSAGE",
            "CLAIM",
            "STATUS",
            "OUTCOME",
            "DELIVERIES",
            "LEASE UNTIL",
            "EXPIRES",
        ],
        &rows,
    )?;
    writeln!(out, "{} inbox record(s)", records.len())?;
    Ok(())
}

pub async fn purge(store: &DynStore, out: &mut impl Write) -> anyhow::Result<()> {
    let removed = store.purge_expired(OffsetDateTime::now_utc(), 500).await?;
    writeln!(out, "purged {removed} expired inbox record(s)")?;
    Ok(())
}
