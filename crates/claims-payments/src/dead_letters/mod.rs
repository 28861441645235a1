//! The operator's dead-letter tool, `claims-payments dead-letters list | resubmit |
//! discard`: what each dead letter is, what the store knows about its claim and
//! message, a [`verdict`] on it, and a safe re-drive.
//!
//! Safety rules, each tested (tests/dead_letters.rs):
//! - a copy is sent first and the dead letter removed **only after the broker accepted
//!   the send**: a crash or a lost lock between the two leaves a duplicate (recognised
//!   by the consumer), never a loss;
//! - a dead letter inside the duplicate-detection window is not sent (the broker would
//!   drop it silently); `--wait` waits for the window to end;
//! - permanent (and unknown, needs-reconciliation) verdicts are refused unless the
//!   message is named with `--message-id`;
//! - a broker answer about one dead letter that does not read is that dead letter's
//!   `unreadable` line, and the run goes on: only what concerns the whole run (401/403,
//!   throttling, the namespace unreachable) ends it;
//! - `discard` records the decision before it removes the dead letter: a completed inbox
//!   record with the outcome `discarded` (so a re-send completes as a duplicate, unpaid)
//!   and a warning line; if the store cannot record it, nothing is removed.
//!
//! The broker is reached through [`Broker`]; the store through [`Store`]: reads, and
//! `discard`'s one [`Store::record_handled`].

pub mod verdict;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::domain::{ClaimApproved, MessageId, OutcomeKind, PayloadHash, Purpose};
use crate::lease::{self, Terms};
use crate::servicebus::{
    bounded, Broker, BusError, DeadLetter, Lock, Locked, Outgoing, Property, Unreadable,
};
use crate::store::{AttemptId, DynStore, InboxKey, InboxStatus, InsertResult, Store};
use verdict::{Body, Facts, Judgement, Known, PaymentFact, Verdict};

/// The custom property a re-drive adds to the copy: when, by whom, the original
/// DeliveryCount and reason (a JSON object).
pub const REDRIVE_PROPERTY: &str = "ClaimsPaymentsRedrive";
/// The properties the broker adds when it dead-letters a message; not copied.
const DEAD_LETTER_PROPERTIES: &[&str] = &["DeadLetterReason", "DeadLetterErrorDescription"];

/// `dead-letters`' exit code when something needs a person (a dead letter listed, one
/// refused, waiting or kept); as `reconcile`'s.
pub const EXIT_NEEDS_A_PERSON: u8 = 3;

/// What every subcommand needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The consumer name of the inbox keys (CONSUMER_NAME).
    pub consumer: String,
    /// The queue's duplicate-detection window (SERVICEBUS_DUPLICATE_WINDOW_MS).
    pub window: Duration,
    /// At most this many dead letters are locked and examined at once.
    pub limit: usize,
    /// How long the inbox record `discard` writes is kept (INBOX_RETENTION_DAYS).
    pub retention: Duration,
}

/// Which dead letters `resubmit` sends.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Named explicitly: sent whatever the verdict, except inside the window.
    pub message_ids: Vec<String>,
    /// Every dead letter with this verdict name (only sendable ones are sent).
    pub verdict: Option<String>,
    /// Every sendable dead letter.
    pub all: bool,
}

/// One dead letter, examined: the broker's facts, the store's, the verdict.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    pub message_id: Option<String>,
    pub claim_id: Option<String>,
    pub tenant: Option<String>,
    pub amount: Option<String>,
    pub currency: Option<String>,
    /// The broker's DeliveryCount minus the tool's own lock.
    pub delivery_count: u32,
    pub dead_letter_reason: Option<String>,
    pub dead_letter_error_description: Option<String>,
    pub enqueued_at: Option<String>,
    /// The broker gives no dead-lettering time (neither REST nor AMQP): always null.
    pub dead_lettered_at: Option<String>,
    pub payment_status: Option<String>,
    pub inbox_outcome: Option<String>,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub reason: String,
    /// What `resubmit` or `discard` did (absent for `list`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// The counts printed after the lines.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Summary {
    pub verdicts: BTreeMap<String, usize>,
    pub actions: BTreeMap<String, usize>,
    /// Whether anything is left for a person.
    pub needs_a_person: bool,
}

impl Summary {
    fn of(lines: &[Line], needs_a_person: bool) -> Self {
        let mut s = Summary {
            needs_a_person,
            ..Summary::default()
        };
        for l in lines {
            *s.verdicts.entry(l.verdict.name().to_owned()).or_default() += 1;
            if let Some(action) = &l.action {
                let word = action.split([':', ' ']).next().unwrap_or(action).to_owned();
                *s.actions.entry(word).or_default() += 1;
            }
        }
        s
    }
}

struct Examined {
    /// `None` when the broker's answer for it did not read.
    letter: Option<DeadLetter>,
    /// Where to give it back or delete it; `None`: the lock expires by itself.
    lock: Option<Lock>,
    sequence_number: Option<i64>,
    /// The inbox key and payload hash of a valid ClaimApproved: what `discard` records.
    record: Option<(InboxKey, PayloadHash)>,
    line: Line,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// Parses the body and asks the store; never fails: what cannot be read is a fact.
async fn examine(
    letter: DeadLetter,
    store: &DynStore,
    options: &Options,
    now: OffsetDateTime,
) -> Examined {
    let parsed: Result<(MessageId, ClaimApproved), String> = (|| {
        let id = letter
            .message_id
            .as_ref()
            .ok_or_else(|| "the broker gave no MessageId".to_owned())?;
        let id = MessageId::parse(&id.0).map_err(|e| format!("MessageId: {e}"))?;
        if letter.body_truncated {
            return Err(format!(
                "the body is larger than {} bytes",
                crate::servicebus::MAX_BODY_BYTES
            ));
        }
        let text =
            std::str::from_utf8(&letter.body).map_err(|_| "the body is not UTF-8".to_owned())?;
        let claim = ClaimApproved::parse(text).map_err(|e| format!("not a ClaimApproved: {e}"))?;
        Ok((id, claim))
    })();
    let mut record = None;
    let (body, payment, inbox, claim) = match parsed {
        Err(why) => (
            Body::Invalid(bounded(&why, 200)),
            Known::Absent,
            Known::Absent,
            None,
        ),
        Ok((id, claim)) => {
            let payment = match store.payment(claim.claim_id, Purpose::Payout).await {
                Ok(None) => Known::Absent,
                Ok(Some(p)) => Known::Present(PaymentFact {
                    status: p.record.status,
                    payload_hash: p.record.payload_hash,
                    status_reason: p.record.status_reason,
                }),
                Err(e) => Known::Unreadable(bounded(&e.to_string(), 200)),
            };
            let key = InboxKey {
                consumer: options.consumer.clone(),
                claim_id: claim.claim_id,
                message_id: id,
            };
            let inbox = match store.inbox(&key).await {
                Ok(None) => Known::Absent,
                Ok(Some(r)) => Known::Present(r.record.outcome),
                Err(e) => Known::Unreadable(bounded(&e.to_string(), 200)),
            };
            record = Some((key, claim.payload_hash()));
            (
                Body::ClaimApproved(claim.payload_hash()),
                payment,
                inbox,
                Some(claim),
            )
        }
    };
    let reason_property = |name: &str| letter.property(name).map(|v| bounded(&v, 200));
    let facts = Facts {
        body,
        // EnqueuedTimeUtc comes in whole seconds (RFC 1123): the broker may have seen the
        // MessageId up to a second later than it says.
        enqueued_at: letter.enqueued_at.map(|t| t + Duration::from_secs(1)),
        dead_letter_reason: reason_property("DeadLetterReason"),
        payment,
        inbox,
    };
    let Judgement { verdict, reason } = verdict::judge(&facts, now, options.window);
    let line = Line {
        message_id: letter.message_id.as_ref().map(|m| bounded(&m.0, 128)),
        claim_id: claim.as_ref().map(|c| c.claim_id.to_string()),
        tenant: claim
            .as_ref()
            .and_then(|c| c.tenant.as_ref().map(|t| t.as_str().to_owned())),
        amount: claim.as_ref().map(|c| c.money.amount_string()),
        currency: claim.as_ref().map(|c| c.money.currency().code().to_owned()),
        delivery_count: letter.delivery_count.saturating_sub(1),
        dead_letter_reason: facts.dead_letter_reason.clone(),
        dead_letter_error_description: reason_property("DeadLetterErrorDescription"),
        enqueued_at: letter.enqueued_at.map(rfc3339),
        dead_lettered_at: None,
        payment_status: match &facts.payment {
            Known::Present(p) => Some(p.status.as_str().to_owned()),
            Known::Absent => None,
            Known::Unreadable(_) => Some("unreadable".into()),
        },
        inbox_outcome: match &facts.inbox {
            Known::Present(Some(o)) => Some(bounded(o.as_str(), 64)),
            Known::Present(None) => Some("in progress".into()),
            Known::Absent => None,
            Known::Unreadable(_) => Some("unreadable".into()),
        },
        verdict,
        reason,
        action: None,
    };
    Examined {
        lock: Some(letter.lock.clone()),
        sequence_number: letter.sequence_number,
        letter: Some(letter),
        record,
        line,
    }
}

/// The line of a dead letter whose broker answer did not read: what it named, and why.
fn examine_unreadable(u: Unreadable, options: &Options, now: OffsetDateTime) -> Examined {
    let facts = Facts {
        body: Body::Unreadable(u.problem),
        enqueued_at: None,
        dead_letter_reason: None,
        payment: Known::Absent,
        inbox: Known::Absent,
    };
    let Judgement { verdict, reason } = verdict::judge(&facts, now, options.window);
    let line = Line {
        message_id: u.message_id.as_ref().map(|m| bounded(&m.0, 128)),
        claim_id: None,
        tenant: None,
        amount: None,
        currency: None,
        delivery_count: 0,
        dead_letter_reason: None,
        dead_letter_error_description: None,
        enqueued_at: None,
        dead_lettered_at: None,
        payment_status: None,
        inbox_outcome: None,
        verdict,
        reason,
        action: None,
    };
    Examined {
        letter: None,
        lock: u.lock,
        sequence_number: u.sequence_number,
        record: None,
        line,
    }
}

/// Locks and examines up to `options.limit` dead letters. A broker error before the
/// first one is the command's error (401, 403 with the reason); after it, the ones
/// locked so far are unlocked first.
async fn lock_all(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
) -> Result<Vec<Examined>, BusError> {
    let mut examined: Vec<Examined> = Vec::new();
    while examined.len() < options.limit {
        let next = match broker.lock_next_dead_letter().await {
            Ok(Some(Locked::Letter(letter))) => {
                examine(letter, store, options, OffsetDateTime::now_utc()).await
            }
            // One dead letter's answer does not read: its line says why; the run goes on.
            Ok(Some(Locked::Unreadable(u))) => {
                examine_unreadable(u, options, OffsetDateTime::now_utc())
            }
            Ok(None) => break,
            Err(e) => {
                unlock_all(broker, &examined).await;
                return Err(e);
            }
        };
        // A lock of ours expired (lockDuration) and the broker handed the same dead
        // letter out again: every one has been seen.
        if next.sequence_number.is_some()
            && examined
                .iter()
                .any(|e| e.sequence_number == next.sequence_number)
        {
            release(broker, &next).await;
            break;
        }
        examined.push(next);
    }
    Ok(examined)
}

/// Gives one dead letter's lock back, if there is one to give.
async fn release(broker: &dyn Broker, e: &Examined) {
    if let Some(lock) = &e.lock {
        if let Err(err) = broker.unlock(lock).await {
            // The lock then expires by itself (lockDuration): nothing is lost.
            tracing::warn!(error = %err, "cannot unlock a dead letter; its lock will expire");
        }
    }
}

async fn unlock_all(broker: &dyn Broker, examined: &[Examined]) {
    for e in examined {
        release(broker, e).await;
    }
}

/// `dead-letters list`: every dead letter (up to the limit) with its verdict; nothing is
/// removed. Returns the lines and the summary.
pub async fn list(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
) -> Result<(Vec<Line>, Summary), BusError> {
    let examined = lock_all(broker, store, options).await?;
    unlock_all(broker, &examined).await;
    let lines: Vec<Line> = examined.into_iter().map(|e| e.line).collect();
    let needs = !lines.is_empty();
    let summary = Summary::of(&lines, needs);
    Ok((lines, summary))
}

/// What happened to one dead letter in a resubmit round.
enum Handled {
    Done(String),
    /// Left for a person.
    Open(String),
    /// Inside the window, to be tried again at this time (`--wait`).
    Waiting(OffsetDateTime, String),
}

/// The copy of a dead letter: same MessageId, body, content type and application
/// properties, plus [`REDRIVE_PROPERTY`].
fn copy_of(
    letter: &DeadLetter,
    line: &Line,
    principal: &str,
    now: OffsetDateTime,
) -> Option<Outgoing> {
    let message_id = letter.message_id.clone()?;
    let mut properties: Vec<Property> = letter
        .properties
        .iter()
        .filter(|p| {
            !DEAD_LETTER_PROPERTIES
                .iter()
                .chain([REDRIVE_PROPERTY].iter())
                .any(|n| p.name.eq_ignore_ascii_case(n))
        })
        .cloned()
        .collect();
    let ascii = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect()
    };
    let record = serde_json::json!({
        "at": rfc3339(now),
        "by": ascii(principal),
        "originalDeliveryCount": line.delivery_count,
        "originalReason": line.dead_letter_reason.as_deref().map(ascii),
    })
    .to_string();
    properties.push(Property {
        name: REDRIVE_PROPERTY.to_owned(),
        value: serde_json::Value::String(record).to_string(),
    });
    Some(Outgoing {
        message_id,
        content_type: letter.content_type.clone(),
        properties,
        body: letter.body.clone(),
    })
}

/// Sends the copy, and removes the dead letter only once the send was accepted.
async fn send_then_delete(broker: &dyn Broker, e: &Examined, principal: &str) -> Handled {
    let Some(letter) = &e.letter else {
        release(broker, e).await;
        return Handled::Open("not sent: the broker's answer for it does not read".into());
    };
    let Some(copy) = copy_of(letter, &e.line, principal, OffsetDateTime::now_utc()) else {
        release(broker, e).await;
        return Handled::Open("not sent: no MessageId".into());
    };
    match broker.send(&copy).await {
        Ok(()) => match broker.delete(&letter.lock).await {
            Ok(()) => Handled::Done("sent: the dead letter was removed".into()),
            Err(err) => Handled::Open(format!(
                "sent: but the dead letter is kept ({err}); the copy is a duplicate the consumer recognises: run list again and discard it"
            )),
        },
        Err(err) => {
            release(broker, e).await;
            let what = match err.kind {
                crate::servicebus::BusErrorKind::Timeout => {
                    "unsure: the send timed out and may have been accepted; the dead letter is kept (a second send is a duplicate, safe)"
                }
                _ => "not sent: the dead letter is kept",
            };
            Handled::Open(format!("{what} ({err})"))
        }
    }
}

/// `dead-letters resubmit`: sends the selected dead letters again (see the module's
/// rules), waits for the window with `wait`. Returns the lines of the last round and
/// the summary.
pub async fn resubmit(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
    selection: &Selection,
    dry_run: bool,
    wait: bool,
) -> Result<(Vec<Line>, Summary), BusError> {
    let principal = broker.principal().await;
    let mut done: Vec<Line> = Vec::new();
    // MessageIds this run sent, and when: a second dead letter with the same MessageId
    // (a producer's re-send) is inside the window from that send on.
    let mut sent: BTreeMap<String, OffsetDateTime> = BTreeMap::new();
    loop {
        let examined = lock_all(broker, store, options).await?;
        let mut lines = Vec::new();
        let mut next: Option<OffsetDateTime> = None;
        let mut open = false;
        let mut unselected = false;
        for mut e in examined {
            let named = e
                .line
                .message_id
                .as_ref()
                .is_some_and(|id| selection.message_ids.iter().any(|m| m == id));
            let by_verdict = selection.verdict.as_deref().is_some_and(|v| {
                v == e.line.verdict.name()
                    || (v == "inside-window"
                        && matches!(e.line.verdict, Verdict::InsideWindow { .. }))
            });
            let selected = named || selection.all || by_verdict;
            if let Some(at) = e.line.message_id.as_ref().and_then(|id| sent.get(id)) {
                let until = *at + options.window;
                if OffsetDateTime::now_utc() < until {
                    e.line.verdict = match e.line.verdict.sendable() {
                        Some(then) => Verdict::InsideWindow { until, then },
                        None => e.line.verdict,
                    };
                    if matches!(e.line.verdict, Verdict::InsideWindow { .. }) {
                        e.line.reason = format!(
                            "inside the duplicate-detection window until {}: this run sent a copy with the same MessageId",
                            rfc3339(until)
                        );
                    }
                }
            }
            let handled = if !selected {
                unselected = true;
                release(broker, &e).await;
                lines.push(e.line);
                continue;
            } else {
                match e.line.verdict {
                    // Nothing is sent that did not read, named or not.
                    Verdict::Unreadable => {
                        release(broker, &e).await;
                        Handled::Open("not sent: the broker's answer for it does not read".into())
                    }
                    Verdict::InsideWindow { until, .. } => {
                        release(broker, &e).await;
                        Handled::Waiting(
                            until,
                            format!("not sent: inside the duplicate-detection window; it can be sent from {}", rfc3339(until)),
                        )
                    }
                    v if v.sendable().is_none() && !named => {
                        release(broker, &e).await;
                        Handled::Open(format!(
                            "refused: the verdict is {}; name it with --message-id to send it anyway",
                            v.name()
                        ))
                    }
                    _ if dry_run => {
                        release(broker, &e).await;
                        Handled::Done("would send (dry run)".into())
                    }
                    _ => {
                        let handled = send_then_delete(broker, &e, &principal).await;
                        if let (Some(id), Handled::Done(_) | Handled::Open(_)) =
                            (&e.line.message_id, &handled)
                        {
                            sent.insert(id.clone(), OffsetDateTime::now_utc());
                        }
                        handled
                    }
                }
            };
            match handled {
                Handled::Done(a) => {
                    e.line.action = Some(a);
                    done.push(e.line);
                }
                Handled::Open(a) => {
                    open = true;
                    e.line.action = Some(a);
                    lines.push(e.line);
                }
                Handled::Waiting(until, a) => {
                    next = Some(next.map_or(until, |n| n.min(until)));
                    e.line.action = Some(a);
                    lines.push(e.line);
                }
            }
        }
        match next {
            Some(until) if wait && !dry_run => {
                let left = until - OffsetDateTime::now_utc();
                let left: Duration = left.try_into().unwrap_or(Duration::ZERO);
                tracing::info!(until = %rfc3339(until), "waiting for the duplicate-detection window");
                tokio::time::sleep(left + Duration::from_millis(1)).await;
            }
            waiting => {
                // Anything still in the dead-letter queue is left for a person.
                let needs = open || unselected || waiting.is_some();
                let mut all = done;
                all.extend(lines);
                let summary = Summary::of(&all, needs);
                return Ok((all, summary));
            }
        }
    }
}

/// What `discard` left in the store for the dead letter it removes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StoreRecord {
    /// A completed inbox record with the outcome `discarded`, kept until then.
    Written(OffsetDateTime),
    /// The message already had an inbox record (this outcome, or `None`: in progress):
    /// it is kept as it is, since it already decides what a re-send does.
    Kept(Option<String>),
    /// No record: the body is not a valid ClaimApproved, so there is no claim to key one
    /// by (and a re-send of it can never be paid).
    NoKey,
}

impl StoreRecord {
    /// The word of the warning line's `store_record` field.
    fn word(&self) -> &'static str {
        match self {
            StoreRecord::Written(_) => "written",
            StoreRecord::Kept(_) => "kept",
            StoreRecord::NoKey => "none",
        }
    }
}

impl std::fmt::Display for StoreRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreRecord::Written(until) => write!(
                f,
                "recorded in the store as discarded (inbox record, kept until {}): a re-send completes as a duplicate",
                rfc3339(*until)
            ),
            StoreRecord::Kept(Some(outcome)) => write!(
                f,
                "the store's record of this message ({outcome}) is kept: a re-send completes as a duplicate"
            ),
            StoreRecord::Kept(None) => f.write_str(
                "the store's record of this message is in progress and is kept: its payout is settled by the consumer or reconcile",
            ),
            StoreRecord::NoKey => f.write_str(
                "no store record: the body is not a valid ClaimApproved (no claim to key it by; a re-send cannot be paid); the warning line is the record",
            ),
        }
    }
}

/// Writes the decision into the store: a completed inbox record `discarded` for the
/// message's (consumer, claim, MessageId), through the port the consumer uses for a
/// message it recognised ([`Store::record_handled`]). An existing record is never
/// overwritten: it already stops a re-send, and what it says (`paid`, ...) stays true.
async fn record_discard(
    store: &dyn Store,
    options: &Options,
    e: &Examined,
    now: OffsetDateTime,
) -> Result<StoreRecord, String> {
    let Some((key, hash)) = &e.record else {
        return Ok(StoreRecord::NoKey);
    };
    let terms = Terms {
        lease: Duration::ZERO,
        retention: options.retention,
    };
    let record = lease::new_record(
        key,
        hash,
        AttemptId::new(),
        e.line.delivery_count,
        terms,
        now,
        Some(OutcomeKind::Discarded.into()),
    );
    match store.record_handled(&record).await {
        Ok(InsertResult::Inserted(_)) => Ok(StoreRecord::Written(record.expires_at)),
        Ok(InsertResult::AlreadyExists(existing)) => {
            Ok(StoreRecord::Kept(match existing.record.status {
                InboxStatus::Completed => Some(
                    existing
                        .record
                        .outcome
                        .as_ref()
                        .map_or_else(|| "completed".to_owned(), |o| bounded(o.as_str(), 64)),
                ),
                InboxStatus::InProgress => None,
            }))
        }
        Err(err) => Err(bounded(&err.to_string(), 200)),
    }
}

/// `dead-letters discard`: removes one dead letter a person decided to drop, after
/// writing the decision where an auditor finds it: in the store ([`record_discard`]) and
/// a warning log line (stderr: the operator commands start no exporter) with its
/// identity, the reason, who, and what the store holds. If the store cannot record it,
/// nothing is removed. Returns its line, or `None` when no dead letter has that MessageId.
pub async fn discard(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
    message_id: &str,
    reason: &str,
) -> Result<Option<Line>, BusError> {
    let principal = broker.principal().await;
    let examined = lock_all(broker, store, options).await?;
    let mut found = None;
    for mut e in examined {
        if found.is_none() && e.line.message_id.as_deref() == Some(message_id) {
            let reason = bounded(reason, 500);
            let action = discard_one(broker, store.as_ref(), options, &e, &reason, &principal);
            e.line.action = Some(action.await);
            found = Some(e.line);
        } else {
            release(broker, &e).await;
        }
    }
    Ok(found)
}

/// Records, logs and removes one dead letter (see [`discard`]); returns the action.
async fn discard_one(
    broker: &dyn Broker,
    store: &dyn Store,
    options: &Options,
    e: &Examined,
    reason: &str,
    principal: &str,
) -> String {
    let (Some(_), Some(lock)) = (&e.letter, &e.lock) else {
        release(broker, e).await;
        return "not discarded: the broker's answer for it does not read; nothing was recorded or removed".into();
    };
    let recorded = match record_discard(store, options, e, OffsetDateTime::now_utc()).await {
        Ok(recorded) => recorded,
        Err(why) => {
            release(broker, e).await;
            return format!(
                "not discarded: the store could not record the decision ({why}); the dead letter is kept"
            );
        }
    };
    tracing::warn!(
        message_id = e.line.message_id.as_deref().unwrap_or("-"),
        claim_id = e.line.claim_id.as_deref().unwrap_or("-"),
        tenant = e.line.tenant.as_deref().unwrap_or("-"),
        verdict = e.line.verdict.name(),
        by = %principal,
        reason = %reason,
        store_record = recorded.word(),
        "dead letter discarded by an operator"
    );
    match broker.delete(lock).await {
        Ok(()) => format!("discarded: {reason}; {recorded}"),
        // The store already says discarded: a second `discard` finds it kept and removes it.
        Err(err) => format!("not discarded ({err}); {recorded}; run discard again"),
    }
}
