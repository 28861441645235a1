//! The operator commands: `ledger`, `inbox`, `purge`, `provision`, `reconcile`,
//! `dead-letters`, shared by
//! the product binary and `claims-payments-dev` (which the simulator runs them through).
//!
//! Output is a table for people, or one JSON object per line (`--json`) for scripts.
//! Stored text comes from messages (MessageId, tenant, payee) and the bank (payment ids,
//! reasons), so the table shows it through [`printable`]: a control character in a cell
//! can neither drive the operator's terminal nor start a forged row.

use std::borrow::Cow;
use std::io::Write;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use std::process::ExitCode;

use std::collections::BTreeMap;

use crate::configuration::{Settings, StoreSettings};
use crate::dead_letters::{self, Line, Summary};
use crate::hooks::Seams;
use crate::reconcile::{self, Reconciler};
use crate::servicebus::settings::{QueueEndpoint, QueueSettings};
use crate::servicebus::Broker;
use crate::startup;
use crate::store::sqlite::Access;
use crate::store::{CorruptRecord, DynStore, InboxRecord, Listed, PaymentRecord};

#[derive(clap::Args)]
pub struct ListArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// At most this many rows.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

#[derive(clap::Args)]
pub struct ReconcileArgs {
    /// One JSON object: the lines and the summary.
    #[arg(long)]
    json: bool,
    /// Ask the bank and report what would be done; write nothing, pay nothing.
    #[arg(long)]
    dry_run: bool,
    /// Only in_progress payments whose lease ran out longer ago than this (30s, 15m, 2h;
    /// at most 10 years). Default: RECONCILE_MIN_AGE_MS (three leases).
    #[arg(long, value_parser = parse_min_age)]
    older_than: Option<std::time::Duration>,
}

/// `--older-than`: a human duration no longer than [`reconcile::MAX_MIN_AGE`], so no
/// date arithmetic can overflow on it.
fn parse_min_age(text: &str) -> Result<std::time::Duration, String> {
    let age =
        humantime::parse_duration(text).map_err(|e| format!("{e} (for example 30s, 15m, 2h)"))?;
    if age > reconcile::MAX_MIN_AGE {
        return Err(format!(
            "{text} is longer than the longest minimum age, {}",
            humantime::format_duration(reconcile::MAX_MIN_AGE)
        ));
    }
    Ok(age)
}

/// `reconcile`'s exit code when something is still open (unknown, mismatched, skipped,
/// not examined). 0: all settled; 1: cannot run (store, bank URL, a failure); 2: usage
/// or an invalid setting.
pub(crate) const EXIT_OPEN_ITEMS: u8 = 3;

/// `ledger`'s and `inbox`'s exit code when some stored rows could not be read (a hand
/// edit, a bug): each is named on stderr with its claim and column, and every other row
/// is still listed. 0: every row read; 1: cannot run; 2: usage or an invalid setting.
pub(crate) const EXIT_UNREADABLE_ROWS: u8 = 4;

/// `dead-letters`: the queue's dead-letter sub-queue, judged against the store.
#[derive(clap::Subcommand)]
pub enum DeadLettersCommand {
    /// Show every dead letter (peeked under a lock and unlocked: nothing is removed) with
    /// what the store knows and a verdict. Exit 0: none; 3: some need a person; 1: cannot
    /// run (401/403 named); 2: usage.
    List(DeadLettersListArgs),
    /// Send copies (a MessageId of their own naming the original, the same body, content
    /// type and properties, plus a re-drive record) one dead letter at a time, and remove
    /// each only after its send was accepted. Permanent, unknown and needs-reconciliation
    /// verdicts only when named with --message-id. Exit 0: all selected sent and removed;
    /// 3: something left for a person (or --limit reached); 1: the run stopped (401/403,
    /// quota, throttling: the reason is printed); 2: usage.
    Resubmit(DeadLettersResubmitArgs),
    /// Remove one dead letter a person decided to drop, after a warning log line with its
    /// identity, the reason and who. Exit 0: removed; 1: not found or cannot run.
    Discard(DeadLettersDiscardArgs),
}

#[derive(clap::Args)]
pub struct DeadLettersListArgs {
    /// One JSON object per dead letter, then the summary.
    #[arg(long)]
    json: bool,
    /// At most this many dead letters are locked and examined.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true).args(["message_id", "verdict", "all"])))]
pub struct DeadLettersResubmitArgs {
    #[command(flatten)]
    list: DeadLettersListArgs,
    /// A dead letter to send (repeatable; its MessageId, or for a copy the original it
    /// names); named, it is sent whatever its verdict, unless its answer did not read.
    #[arg(long = "message-id")]
    message_id: Vec<String>,
    /// Every dead letter with this verdict (resubmit or already-paid).
    #[arg(long, value_parser = ["resubmit", "already-paid"])]
    verdict: Option<String>,
    /// Every dead letter whose verdict is resubmit or already-paid.
    #[arg(long)]
    all: bool,
    /// Say what would be sent; send and remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// Accepted for runbooks written for older releases, and has no effect: a copy has a
    /// MessageId of its own, so there is no duplicate-detection window to wait for.
    #[arg(long)]
    wait: bool,
}

#[derive(clap::Args)]
pub struct DeadLettersDiscardArgs {
    #[command(flatten)]
    list: DeadLettersListArgs,
    /// A dead letter to drop (repeatable: all are found in one walk of the queue).
    #[arg(long = "message-id", required = true)]
    message_id: Vec<String>,
    /// Why it is dropped (a corrected message was published instead, ...).
    #[arg(long)]
    reason: String,
}

/// The commands an operator runs against the configured store.
#[derive(clap::Subcommand)]
pub enum OperatorCommand {
    /// List payments. Exit 0: every row read; 4: some rows could not be read (each named on
    /// stderr with its claim and column; the others are listed); 1: cannot run; 2: usage or an
    /// invalid setting.
    Ledger(ListArgs),
    /// List inbox records (messages seen and how they ended; process registrations are left
    /// out). Exit codes as for ledger.
    Inbox(ListArgs),
    /// Remove inbox records past INBOX_RETENTION_DAYS now (SQLite, PostgreSQL; Cosmos expires them itself).
    Purge,
    /// Create (or verify) the Cosmos DB database and container, with COSMOS_KEY (emulator, dev
    /// accounts); on PostgreSQL, apply the schema's missing migrations.
    Provision,
    /// Settle payments in needs_reconciliation and orphaned in_progress payouts by asking the bank.
    /// Exit 0: nothing open; 3: something still open (unknown, mismatched, not examined),
    /// --dry-run included; 1: cannot run; 2: usage or an invalid setting.
    Reconcile(ReconcileArgs),
    /// The queue's dead letters: list, resubmit, discard (docs/runbook.md §5).
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
}

/// Runs one operator command with `settings`; the exit code says how it ended.
pub async fn run(command: OperatorCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let stdout = || std::io::stdout().lock();
    let listed = |unreadable: anyhow::Result<usize>| {
        unreadable.map(|n| match n {
            0 => ExitCode::SUCCESS,
            _ => ExitCode::from(EXIT_UNREADABLE_ROWS),
        })
    };
    match command {
        OperatorCommand::Ledger(args) => listed(list(settings, Records::Payments, args).await),
        OperatorCommand::Inbox(args) => listed(list(settings, Records::Inbox, args).await),
        OperatorCommand::Provision => {
            match &settings.store {
                StoreSettings::Cosmos(cosmos) => {
                    let report = crate::store::cosmos::provision(cosmos).await?;
                    println!("{report}");
                }
                StoreSettings::Postgres(postgres) => {
                    let report = crate::store::postgres::provision(postgres).await?;
                    println!("{report}");
                }
                StoreSettings::Sqlite { .. } => anyhow::bail!(
                    "provision creates the Cosmos DB container or the PostgreSQL schema: set \
                     PAYMENTS_STORE=cosmos and COSMOS_*, or PAYMENTS_STORE=postgres and \
                     PAYMENTS_POSTGRES_URL (SQLite needs none: serve creates its file)"
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        OperatorCommand::Purge => {
            let store = startup::open_store(settings, Access::Existing).await?;
            done(purge(&store, &mut stdout()).await)
        }
        OperatorCommand::DeadLetters(command) => {
            // The audit lines (discard's warning) go to stderr; stdout is the report.
            let logs = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(tracing::Level::WARN);
            let _ = match settings.log_format {
                crate::telemetry::LogFormat::Json => logs.json().flatten_event(true).try_init(),
                crate::telemetry::LogFormat::Text => logs.try_init(),
            };
            // `discard` writes its decision into the store (a completed inbox record);
            // `list` and `resubmit` only read it.
            let access = match command {
                DeadLettersCommand::Discard(_) => Access::Existing,
                _ => Access::ReadOnly,
            };
            let store = startup::open_store(settings, access).await?;
            let broker = dead_letters_broker(&settings.dead_letter_queue)?;
            dead_letters_command(command, broker.as_ref(), &store, settings, &mut stdout()).await
        }
        OperatorCommand::Reconcile(args) => {
            if settings.bank.is_none() {
                anyhow::bail!("BANK_API_URL is not set: there is no bank to reconcile with");
            }
            let store = startup::open_store(settings, Access::Existing).await?;
            let services = startup::Composition::new(settings, store, Seams::default())?.services;
            let reconciler = Reconciler::new(&services).ok_or_else(|| {
                anyhow::anyhow!("BANK_API_URL is not set: there is no bank to reconcile with")
            })?;
            let options = reconcile::Options {
                min_age: args.older_than.unwrap_or(settings.reconcile_min_age),
                dry_run: args.dry_run,
                budget: None,
            };
            let summary = reconciler.run(options).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print!("{}", render_reconcile(&summary));
            }
            Ok(match summary.verdict() {
                reconcile::Verdict::Settled => ExitCode::SUCCESS,
                reconcile::Verdict::OpenItemsRemain => ExitCode::from(EXIT_OPEN_ITEMS),
            })
        }
    }
}

/// The Service Bus adapter the settings name: `SERVICEBUS_ENDPOINT` (a loopback
/// stand-in, no token) or the app's namespace with the process's Entra credential (a
/// managed identity when the host provides one, else the developer's `az login`).
fn dead_letters_broker(settings: &QueueSettings) -> anyhow::Result<Box<dyn Broker>> {
    use crate::env_setting::names;
    use crate::servicebus::rest::{Auth, RestBroker};
    let (endpoint, auth) = match &settings.endpoint {
        QueueEndpoint::Loopback(endpoint) => (endpoint.clone(), Auth::LoopbackWithoutToken),
        QueueEndpoint::Namespace {
            namespace,
            identity,
        } => {
            let namespace = namespace.as_ref().ok_or_else(|| {
                anyhow::anyhow!(
                    "{} is not set: the Service Bus namespace, as in the app's settings ({{name}}.servicebus.windows.net)",
                    names::SERVICE_BUS_NAMESPACE
                )
            })?;
            (
                format!("https://{namespace}"),
                Auth::Entra(crate::entra::credential(identity)?),
            )
        }
    };
    Ok(Box::new(RestBroker::new(
        &endpoint,
        &settings.queue,
        auth,
        settings.timeout,
    )?))
}

/// Runs one `dead-letters` subcommand against `broker` and `store`; the output goes to `out`.
pub async fn dead_letters_command(
    command: DeadLettersCommand,
    broker: &dyn Broker,
    store: &DynStore,
    settings: &Settings,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let options = |list: &DeadLettersListArgs| -> anyhow::Result<dead_letters::Options> {
        Ok(dead_letters::Options {
            consumer: settings.consumer_name.clone(),
            limit: list.limit.max(1),
            retention: settings.inbox_retention,
            payouts_enabled: settings.bank.is_some(),
            ambient: crate::ambient::Ambient::system(),
        })
    };
    let code = |summary: &dead_letters::Summary| {
        if let Some(why) = &summary.stopped {
            eprintln!("the run stopped: {why}");
            ExitCode::FAILURE
        } else if summary.needs_a_person {
            ExitCode::from(dead_letters::EXIT_NEEDS_A_PERSON)
        } else {
            ExitCode::SUCCESS
        }
    };
    match command {
        DeadLettersCommand::List(args) => {
            let (lines, summary) = dead_letters::list(broker, store, &options(&args)?).await;
            print_dead_letters(&lines, &summary, args.json, out)?;
            Ok(code(&summary))
        }
        DeadLettersCommand::Resubmit(args) => {
            let selection = dead_letters::Selection {
                message_ids: args.message_id.clone(),
                verdict: args.verdict.clone(),
                all: args.all,
            };
            if args.wait {
                eprintln!("--wait has no effect: a copy has a MessageId of its own, so there is no duplicate-detection window to wait for");
            }
            let (lines, summary) = dead_letters::resubmit(
                broker,
                store,
                &options(&args.list)?,
                &selection,
                args.dry_run,
            )
            .await;
            print_dead_letters(&lines, &summary, args.list.json, out)?;
            Ok(code(&summary))
        }
        DeadLettersCommand::Discard(args) => {
            if args.reason.trim().is_empty() {
                anyhow::bail!("--reason must say why the dead letter is dropped");
            }
            let named: std::collections::BTreeSet<String> =
                args.message_id.iter().cloned().collect();
            let lines = dead_letters::discard_each(
                broker,
                store,
                &options(&args.list)?,
                &named,
                &args.reason,
            )
            .await?;
            let summary = dead_letters::Summary::default();
            print_dead_letters(&lines, &summary, args.list.json, out)?;
            let missing: Vec<String> = named
                .iter()
                .filter(|id| !lines.iter().any(|l| l.message_id.as_deref() == Some(id)))
                .map(|id| format!("{:?}", printable(id)))
                .collect();
            if !missing.is_empty() {
                anyhow::bail!(
                    "no dead letter has MessageId {} (among the first {})",
                    missing.join(", "),
                    args.list.limit
                );
            }
            let all_discarded = lines.iter().all(|l| {
                l.action
                    .as_deref()
                    .is_some_and(|a| a.starts_with("discarded"))
            });
            Ok(if all_discarded {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// Prints `lines` as a table (or JSON lines) and the summary.
pub fn print_dead_letters(
    lines: &[Line],
    summary: &Summary,
    json: bool,
    out: &mut impl Write,
) -> std::io::Result<()> {
    if json {
        for l in lines {
            writeln!(
                out,
                "{}",
                serde_json::to_string(l).map_err(std::io::Error::other)?
            )?;
        }
        writeln!(
            out,
            "{}",
            serde_json::to_string(&serde_json::json!({ "summary": summary }))
                .map_err(std::io::Error::other)?
        )?;
        return Ok(());
    }
    let dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    for l in lines {
        writeln!(
            out,
            "{}  claim {}  tenant {}  {} {}  deliveries {}  {} / {}  enqueued {}  dead-lettered {}  payment {}  inbox {}",
            printable(&match &l.original_message_id {
                Some(original) => format!("{} (copy of {original})", dash(&l.message_id)),
                None => dash(&l.message_id),
            }),
            dash(&l.claim_id),
            printable(&dash(&l.tenant)),
            dash(&l.amount),
            dash(&l.currency),
            l.delivery_count,
            printable(&dash(&l.dead_letter_reason)),
            printable(&dash(&l.dead_letter_error_description)),
            dash(&l.enqueued_at),
            dash(&l.dead_lettered_at),
            dash(&l.payment_status),
            printable(&dash(&l.inbox_outcome)),
        )?;
        writeln!(out, "    {}: {}", l.verdict.name(), printable(&l.reason))?;
        if let Some(a) = &l.action {
            writeln!(out, "    -> {}", printable(a))?;
        }
    }
    let counts = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        out,
        "{} dead letter(s): {}{}{}",
        lines.len(),
        counts(&summary.verdicts),
        if summary.actions.is_empty() {
            String::new()
        } else {
            format!("; {}", counts(&summary.actions))
        },
        if summary.needs_a_person {
            "; something needs a person"
        } else {
            ""
        }
    )?;
    if summary.more_may_be_left {
        writeln!(
            out,
            "more dead letters may be left (the --limit was reached, or the queue's locks expired as fast as the run took them): run again"
        )?;
    }
    if let Some(why) = &summary.stopped {
        writeln!(
            out,
            "the run stopped, nothing more was sent or removed: {why}"
        )?;
    }
    Ok(())
}

/// Renders the report for people: one line per payment, then the summary.
fn render_reconcile(summary: &reconcile::Summary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for l in &summary.lines {
        let _ = writeln!(
            o,
            "{}  {}  {} -> {}  {:?}: {}",
            printable(&l.claim_id),
            printable(&l.message_id),
            l.before,
            l.after,
            l.result,
            printable(&l.detail)
        );
    }
    let _ = writeln!(o, "{}", summary.counts());
    o
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// One ledger line, as `ledger --json` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LedgerLine {
    claim_id: String,
    amount: String,
    currency: String,
    status: &'static str,
    message_id: String,
    bank_payment_id: Option<String>,
    tenant_id: Option<String>,
    status_reason: Option<String>,
    created_at: String,
    updated_at: String,
}

impl From<&PaymentRecord> for LedgerLine {
    fn from(p: &PaymentRecord) -> Self {
        LedgerLine {
            claim_id: p.claim_id.to_string(),
            amount: p.money.amount_string(),
            currency: p.money.currency().code().to_owned(),
            status: p.status.as_str(),
            message_id: p.message_id.to_string(),
            bank_payment_id: p.bank_payment_id.clone(),
            tenant_id: p.tenant_id.as_ref().map(|t| t.as_str().to_owned()),
            status_reason: p.status_reason.clone(),
            created_at: rfc3339(p.created_at),
            updated_at: rfc3339(p.updated_at),
        }
    }
}

/// One inbox line, as `inbox --json` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InboxLine {
    consumer: String,
    claim_id: String,
    message_id: String,
    status: &'static str,
    outcome: Option<String>,
    owner: String,
    lease_until: Option<String>,
    first_delivery_count: u32,
    last_delivery_count: u32,
    payload_hash: String,
    created_at: String,
    updated_at: String,
    expires_at: String,
}

impl From<&InboxRecord> for InboxLine {
    fn from(r: &InboxRecord) -> Self {
        InboxLine {
            consumer: r.consumer.clone(),
            claim_id: r.claim_id.to_string(),
            message_id: r.message_id.to_string(),
            status: r.status.as_str(),
            outcome: r.outcome.as_ref().map(ToString::to_string),
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

/// Text safe to print to a terminal: control characters (C0, DEL, C1: ESC, newline, ...)
/// and the Unicode bidirectional controls that reorder what is displayed are written as
/// Rust escapes (`\u{1b}`, `\n`, `\u{202e}`), and a backslash as `\\` so an escape
/// in the output always stands for one character. Everything else, accents included, is
/// left as it is.
pub(crate) fn printable(s: &str) -> Cow<'_, str> {
    fn needs_escape(c: char) -> bool {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn print_table(out: &mut impl Write, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .map(|cell| printable(cell).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
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
        writeln!(out, "{}", line(row))?;
    }
    Ok(())
}

/// What `ledger` and `inbox` list.
#[derive(Debug, Clone, Copy)]
enum Records {
    Payments,
    Inbox,
}

/// `ledger` and `inbox`: the configured store's records on stdout, the rows that do not
/// read on stderr; returns how many did not.
async fn list(settings: &Settings, records: Records, args: ListArgs) -> anyhow::Result<usize> {
    let store = startup::open_store(settings, Access::ReadOnly).await?;
    let mut stderr = std::io::stderr().lock();
    let mut stdout = std::io::stdout().lock();
    print_records(
        &store,
        records,
        args.json,
        args.limit,
        &mut stdout,
        &mut stderr,
    )
    .await
}

/// Lists `records` on `out` and the rows that do not read on `err`; returns how many
/// did not. Both listings are one [`Listing`], with their own columns and line shape.
async fn print_records(
    store: &DynStore,
    records: Records,
    json: bool,
    limit: usize,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<usize> {
    match records {
        Records::Payments => {
            let payments = store.list_payments(limit).await?;
            LEDGER.print::<LedgerLine>(out, err, json, payments)
        }
        Records::Inbox => {
            let mut records = store.list_inbox(limit).await?;
            // Process registrations share the table but are no message's record.
            records.retain(
                |r| !matches!(r, Ok(record) if record.consumer == crate::lease::liveness::CONSUMER),
            );
            INBOX.print::<InboxLine>(out, err, json, records)
        }
    }
}

/// `ledger`'s table.
const LEDGER: Listing<'static, PaymentRecord> = Listing {
    columns: &[
        ("CLAIM", |p| p.claim_id.to_string()),
        ("AMOUNT", |p| p.money.amount_string()),
        ("CURRENCY", |p| p.money.currency().code().to_owned()),
        ("STATUS", |p| p.status.as_str().to_owned()),
        ("MESSAGE", |p| p.message_id.to_string()),
        ("BANK PAYMENT", |p| {
            p.bank_payment_id.clone().unwrap_or_else(|| "-".into())
        }),
        ("UPDATED", |p| rfc3339(p.updated_at)),
    ],
    counted: "payment(s)",
};

/// `inbox`'s table.
const INBOX: Listing<'static, InboxRecord> = Listing {
    columns: &[
        ("MESSAGE", |r| r.message_id.to_string()),
        ("CLAIM", |r| r.claim_id.to_string()),
        ("STATUS", |r| r.status.as_str().to_owned()),
        ("OUTCOME", |r| {
            r.outcome
                .as_ref()
                .map_or_else(|| "-".into(), ToString::to_string)
        }),
        ("DELIVERIES", |r| {
            format!("{}..{}", r.first_delivery_count, r.last_delivery_count)
        }),
        ("LEASE UNTIL", |r| {
            r.lease_until.map(rfc3339).unwrap_or_else(|| "-".into())
        }),
        ("EXPIRES", |r| rfc3339(r.expires_at)),
    ],
    counted: "inbox record(s)",
};

/// A column of a listing: its header, and how a record shows in it.
type Column<'a, T> = (&'a str, fn(&T) -> String);

/// An operator's listing of stored records: one JSON line each with `--json` (`L`, the
/// record's stable line shape), else a table of its `columns` and a count. A row
/// that does not read is named on the error stream (claim, column, why: as stored text,
/// through [`printable`]), never left out silently and never in the way of the others.
struct Listing<'a, T> {
    columns: &'a [Column<'a, T>],
    counted: &'a str,
}

impl<T> Listing<'_, T> {
    /// Prints `listed`; returns how many rows did not read.
    fn print<L>(
        &self,
        out: &mut impl Write,
        err: &mut impl Write,
        json: bool,
        listed: Vec<Listed<T>>,
    ) -> anyhow::Result<usize>
    where
        L: Serialize + for<'r> From<&'r T>,
    {
        let (records, unreadable): (Vec<_>, Vec<_>) = listed.into_iter().partition(Result::is_ok);
        let records: Vec<T> = records.into_iter().filter_map(Result::ok).collect();
        let unreadable: Vec<CorruptRecord> =
            unreadable.into_iter().filter_map(Result::err).collect();
        if json {
            for record in &records {
                writeln!(out, "{}", serde_json::to_string(&L::from(record))?)?;
            }
        } else {
            let header: Vec<&str> = self.columns.iter().map(|(name, _)| *name).collect();
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|record| self.columns.iter().map(|(_, cell)| cell(record)).collect())
                .collect();
            print_table(out, &header, &rows)?;
            writeln!(out, "{} {}", records.len(), self.counted)?;
        }
        for corrupt in &unreadable {
            writeln!(err, "unreadable {}", printable(&corrupt.to_string()))?;
        }
        if !unreadable.is_empty() {
            writeln!(
                err,
                "{} stored row(s) could not be read and are not in the listing; repair them (exit code {EXIT_UNREADABLE_ROWS})",
                unreadable.len()
            )?;
        }
        Ok(unreadable.len())
    }
}

pub(crate) async fn purge(store: &DynStore, out: &mut impl Write) -> anyhow::Result<()> {
    let removed = store.purge_expired(OffsetDateTime::now_utc(), 500).await?;
    writeln!(out, "purged {removed} expired inbox record(s)")?;
    Ok(())
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::consumer::{Consumer, Delivery};
    use crate::domain::{ClaimApproved, MessageId};

    #[test]
    fn printable_escapes_control_characters_and_keeps_the_rest() {
        assert_eq!(
            printable("evil\u{1b}[2J\r\nrow\t\u{7f}\u{9b}\\u{1b}"),
            r"evil\u{1b}[2J\r\nrow\t\u{7f}\u{9b}\\u{1b}"
        );
        assert_eq!(printable("a\u{202e}b"), r"a\u{202e}b");
        assert!(matches!(printable("Zoë O'Brien 42"), Cow::Borrowed(_)));
    }

    /// A MessageId is any text up to 128 characters. In a table it must neither reach the
    /// terminal as a control sequence (ESC [2J clears the screen) nor start a forged row.
    #[tokio::test]
    async fn tables_print_a_hostile_message_id_escaped_on_one_row() {
        let dir = tempfile::tempdir().unwrap();
        let store: DynStore =
            crate::store::sqlite::SqliteStore::open(dir.path().join("p.db")).unwrap();
        let consumer = Consumer::new(
            store.clone(),
            None,
            Settings::from_lookup(|_| None).unwrap().policy(),
        );
        let hostile = "evil\u{1b}[2J\nfake-claim  999.00  EUR  paid";
        let msg = ClaimApproved::parse(&format!(
            r#"{{"claimId":"{}","amount":"10.00","currency":"EUR"}}"#,
            uuid::Uuid::new_v4()
        ))
        .unwrap();
        let delivery = Delivery {
            message_id: MessageId::parse(hostile).unwrap(),
            delivery_count: 1,
        };
        assert_eq!(consumer.handle(&msg, &delivery).await.label(), "recorded");

        let printed = |records, json| {
            let store = &store;
            async move {
                let mut out = Vec::new();
                print_records(store, records, json, 10, &mut out, &mut Vec::new())
                    .await
                    .unwrap();
                String::from_utf8(out).unwrap()
            }
        };
        let escaped = r"evil\u{1b}[2J\nfake-claim  999.00  EUR  paid";
        for (name, records) in [("ledger", Records::Payments), ("inbox", Records::Inbox)] {
            let table = printed(records, false).await;
            assert!(!table.contains('\u{1b}'), "{name}: raw ESC in {table:?}");
            let lines: Vec<&str> = table.lines().collect();
            assert_eq!(lines.len(), 3, "{name}: header, one row, count: {table:?}");
            assert!(lines[1].contains(escaped), "{name}: {table:?}");
        }

        // JSON lines were already safe: serde escapes control characters.
        let json = printed(Records::Payments, true).await;
        assert_eq!(json.lines().count(), 1, "{json:?}");
        let line: serde_json::Value = serde_json::from_str(json.trim_end()).unwrap();
        assert_eq!(line["messageId"], hostile);
    }
}
