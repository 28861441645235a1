//! The operator's dead-letter tool, `claims-payments dead-letters list | resubmit |
//! discard`: what each dead letter is, what the store knows about its claim and
//! message, a [`verdict`] on it, and a safe re-drive.
//!
//! Safety rules, each tested (tests/product/dead_letters.rs):
//! - **a copy can never be dropped by duplicate detection.** The broker answers a send
//!   whose MessageId it saw inside its window with 201 and drops it, and the window runs
//!   on the broker's clock. So no clock is consulted at all: the copy is sent under a
//!   MessageId of its own, derived from the dead letter ([`redrive::copy_message_id`]),
//!   and names the original in [`redrive::ORIGINAL_MESSAGE_ID`]; the consumer keys its
//!   inbox by the original. The only send the broker can drop is a second copy of the
//!   same dead letter, which means the first was accepted;
//! - a copy is sent first and the dead letter removed **only after the broker accepted
//!   the send**: a crash or a lost lock between the two leaves a duplicate (recognised
//!   by the consumer), never a loss;
//! - one dead letter at a time: lock, examine, send, delete, then the next, so no lock
//!   waits on the others' requests; the ones not sent stay locked (so the broker hands
//!   out the next) and are given back at the end;
//! - the verdict applies the consumer's own acceptance rules (a message it refuses on
//!   every delivery is permanent), and permanent (and unknown, needs-reconciliation)
//!   verdicts are refused unless the message is named with `--message-id`;
//! - a broker answer about one dead letter that does not read is that dead letter's
//!   `unreadable` line, and the run goes on: only what concerns the whole run (401/403,
//!   a quota, throttling after retries, the namespace unreachable) ends it, after which
//!   nothing more is sent or removed;
//! - reaching `--limit` is said, and is not "nothing left";
//! - `discard` records the decision before it removes the dead letter: a completed inbox
//!   record with the outcome `discarded` (so a re-send completes as a duplicate, unpaid)
//!   and a warning line; if the store cannot record it, nothing is removed.
//!
//! The broker is reached through [`Broker`]; the store through [`Store`]: reads, and
//! `discard`'s one [`Store::record_handled`].

pub mod verdict;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::consumer::decide::missing_payee;
use crate::domain::{redrive, ClaimApproved, MessageId, OutcomeKind, PayloadHash, Purpose};
use crate::lease::{self, Terms};
use crate::servicebus::{
    bounded, Broker, BrokerMessageId, BusError, DeadLetter, Lock, Locked, Outgoing, Property,
    Unreadable,
};
use crate::store::{AttemptId, DynStore, InboxKey, InboxStatus, InsertResult, Store};
use verdict::{Body, Facts, Judgement, Known, PaymentFact, Verdict};

/// The custom property a re-drive adds to the copy: when, by whom, the original
/// DeliveryCount and reason (a JSON object).
pub const REDRIVE_PROPERTY: &str = "ClaimsPaymentsRedrive";
/// The properties the broker adds when it dead-letters a message; not copied.
const DEAD_LETTER_PROPERTIES: &[&str] = &["DeadLetterReason", "DeadLetterErrorDescription"];

/// `dead-letters`' exit code when something needs a person (a dead letter listed, one
/// refused or kept, the limit reached); as `reconcile`'s.
pub const EXIT_NEEDS_A_PERSON: u8 = 3;

/// What every subcommand needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The consumer name of the inbox keys (CONSUMER_NAME).
    pub consumer: String,
    /// At most this many dead letters are examined in one run.
    pub limit: usize,
    /// How long the inbox record `discard` writes is kept (INBOX_RETENTION_DAYS).
    pub retention: Duration,
    /// Whether the consumer pays out (BANK_API_URL set): its acceptance rules depend on it.
    pub payouts_enabled: bool,
    /// The clock the re-drive and discard records are stamped with.
    pub ambient: crate::ambient::Ambient,
}

/// Which dead letters `resubmit` sends.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Named explicitly (the broker's MessageId, or the original a copy names): sent
    /// whatever the verdict, except unreadable.
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
    /// The broker's MessageId of the dead letter.
    pub message_id: Option<String>,
    /// For a re-drive copy: the MessageId of the message it stands for (the inbox's key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_message_id: Option<String>,
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
    /// Whether anything is left for a person (exit 3).
    pub needs_a_person: bool,
    /// The run ended before the queue did: `--limit` dead letters were examined, or the
    /// queue's locks expired as fast as the run took them; more may be left.
    pub more_may_be_left: bool,
    /// What ended the run early (401/403, a quota, throttling, the namespace
    /// unreachable): nothing was sent or removed after it (exit 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl Summary {
    fn of(lines: &[Line], walk: &Walk<'_>, open: bool) -> Self {
        let mut s = Summary {
            more_may_be_left: walk.more_may_be_left(),
            stopped: walk.stopped.as_ref().map(ToString::to_string),
            ..Summary::default()
        };
        s.needs_a_person = open || s.more_may_be_left || s.stopped.is_some();
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

/// A dead letter's identity: its own MessageId, and the original it names if it is a
/// re-drive copy. `Err`: why it has none usable.
fn identity(letter: &DeadLetter) -> Result<(MessageId, Option<String>), String> {
    let id = letter
        .message_id
        .as_ref()
        .ok_or_else(|| "the broker gave no MessageId".to_owned())?;
    let id = MessageId::parse(&id.0).map_err(|e| format!("MessageId: {e}"))?;
    let original = letter.property(redrive::ORIGINAL_MESSAGE_ID);
    let key = redrive::identity(id, original.as_deref()).map_err(|e| e.to_string())?;
    Ok((key, original))
}

/// Parses the body and asks the store; never fails: what cannot be read is a fact.
async fn examine(letter: DeadLetter, store: &DynStore, options: &Options) -> Examined {
    let parsed: Result<(MessageId, ClaimApproved), String> =
        identity(&letter).and_then(|(id, _)| {
            if letter.body_truncated {
                return Err(format!(
                    "the body is larger than {} bytes",
                    crate::servicebus::MAX_BODY_BYTES
                ));
            }
            let text = std::str::from_utf8(&letter.body)
                .map_err(|_| "the body is not UTF-8".to_owned())?;
            let claim =
                ClaimApproved::parse(text).map_err(|e| format!("not a ClaimApproved: {e}"))?;
            Ok((id, claim))
        });
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
            // The consumer's own acceptance rule, not a copy of it.
            let body = match missing_payee(&claim, options.payouts_enabled) {
                Some(refusal) => Body::Refused(refusal.to_owned()),
                None => Body::ClaimApproved(claim.payload_hash()),
            };
            (body, payment, inbox, Some(claim))
        }
    };
    let reason_property = |name: &str| letter.property(name).map(|v| bounded(&v, 200));
    let facts = Facts {
        body,
        dead_letter_reason: reason_property("DeadLetterReason"),
        payment,
        inbox,
    };
    let Judgement { verdict, reason } = verdict::judge(&facts);
    let line = Line {
        message_id: letter.message_id.as_ref().map(|m| bounded(&m.0, 128)),
        original_message_id: letter
            .property(redrive::ORIGINAL_MESSAGE_ID)
            .map(|m| bounded(&m, 128)),
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
fn examine_unreadable(u: Unreadable) -> Examined {
    let facts = Facts {
        body: Body::Unreadable(u.problem),
        dead_letter_reason: None,
        payment: Known::Absent,
        inbox: Known::Absent,
    };
    let Judgement { verdict, reason } = verdict::judge(&facts);
    let line = Line {
        message_id: u.message_id.as_ref().map(|m| bounded(&m.0, 128)),
        original_message_id: None,
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

/// The dead letters of one run, met one at a time: each is locked and examined when its
/// turn comes. The ones the run keeps (not sent, or sent but not removed) stay locked, so
/// the broker hands out the next one, and are given back at the end ([`Walk::finish`]).
struct Walk<'a> {
    broker: &'a dyn Broker,
    store: &'a DynStore,
    options: &'a Options,
    /// Locks kept until the end.
    held: Vec<Lock>,
    /// Where in `held` the lock of each SequenceNumber is (a dead letter met again
    /// replaces its expired lock there: no scan, however many the run holds).
    held_at: std::collections::HashMap<i64, usize>,
    /// Dead letters met, by SequenceNumber.
    seen: std::collections::HashSet<i64>,
    examined: usize,
    /// Dead letters met again in a row, with no new one between.
    again_in_a_row: usize,
    /// The broker said there is no dead letter left (unlocked).
    exhausted: bool,
    /// What ended the run early.
    stopped: Option<BusError>,
}

impl<'a> Walk<'a> {
    fn new(broker: &'a dyn Broker, store: &'a DynStore, options: &'a Options) -> Self {
        Walk {
            broker,
            store,
            options,
            held: Vec::new(),
            held_at: Default::default(),
            seen: Default::default(),
            examined: 0,
            again_in_a_row: 0,
            exhausted: false,
            stopped: None,
        }
    }

    /// Whether the walk ended with dead letters possibly left unexamined: at `--limit`, or
    /// when the broker kept handing out dead letters met before.
    fn more_may_be_left(&self) -> bool {
        !self.exhausted && self.stopped.is_none()
    }

    /// The next dead letter not met before in this run, locked and examined; `None` at the
    /// end (none left, the limit, or a failure that ends the run: see `stopped`).
    async fn next(&mut self) -> Option<Examined> {
        while self.stopped.is_none() && self.examined < self.options.limit {
            let examined = match self.broker.lock_next_dead_letter().await {
                Ok(Some(Locked::Letter(letter))) => {
                    if self.met_again(letter.sequence_number, &letter.lock) {
                        if self.cycling() {
                            return None;
                        }
                        continue;
                    }
                    examine(letter, self.store, self.options).await
                }
                Ok(Some(Locked::Unreadable(u))) => {
                    if let Some(lock) = &u.lock {
                        if self.met_again(u.sequence_number, lock) {
                            if self.cycling() {
                                return None;
                            }
                            continue;
                        }
                    }
                    examine_unreadable(u)
                }
                Ok(None) => {
                    self.exhausted = true;
                    return None;
                }
                Err(e) => {
                    self.stopped = Some(e);
                    return None;
                }
            };
            self.examined += 1;
            self.again_in_a_row = 0;
            if let Some(seq) = examined.sequence_number {
                self.seen.insert(seq);
            }
            return Some(examined);
        }
        None
    }

    /// A dead letter this run met before came back: a lock it kept expired (the queue's
    /// lockDuration) or was lost. It is kept under its new lock and not examined again.
    fn met_again(&mut self, sequence_number: Option<i64>, lock: &Lock) -> bool {
        let Some(seq) = sequence_number.filter(|s| self.seen.contains(s)) else {
            return false;
        };
        match self.held_at.get(&seq) {
            Some(&at) => self.held[at] = lock.clone(),
            None => self.hold(Some(seq), lock.clone()),
        }
        true
    }

    /// Whether the broker handed out more dead letters met before, in a row, than the run
    /// keeps: its locks expire as fast as the run takes them (a lockDuration far shorter
    /// than a request), and going on would meet the same ones forever.
    fn cycling(&mut self) -> bool {
        self.again_in_a_row += 1;
        self.again_in_a_row > self.held.len()
    }

    /// Keeps a dead letter locked until the end of the run.
    fn keep(&mut self, e: &Examined) {
        if let Some(lock) = &e.lock {
            self.hold(e.sequence_number, lock.clone());
        }
    }

    fn hold(&mut self, sequence_number: Option<i64>, lock: Lock) {
        if let Some(seq) = sequence_number {
            self.held_at.insert(seq, self.held.len());
        }
        self.held.push(lock);
    }

    /// Ends the run on a failure that concerns all of it.
    fn stop(&mut self, e: BusError) {
        self.stopped = Some(e);
    }

    /// Gives every kept lock back: the dead letters stay for the next reader.
    async fn finish(&mut self) {
        self.held_at.clear();
        for lock in std::mem::take(&mut self.held) {
            if let Err(err) = self.broker.unlock(&lock).await {
                // The lock then expires by itself (lockDuration): nothing is lost.
                tracing::warn!(error = %err, "cannot unlock a dead letter; its lock will expire");
            }
        }
    }
}

/// `dead-letters list`: every dead letter (up to the limit) with its verdict; nothing is
/// removed. Returns the lines and the summary.
pub async fn list(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
) -> (Vec<Line>, Summary) {
    let mut walk = Walk::new(broker, store, options);
    let mut lines = Vec::new();
    while let Some(e) = walk.next().await {
        walk.keep(&e);
        lines.push(e.line);
    }
    walk.finish().await;
    let summary = Summary::of(&lines, &walk, !lines.is_empty());
    (lines, summary)
}

/// What happened to one dead letter in a resubmit run.
enum Handled {
    /// Sent and removed (or a dry run's "would send").
    Done(String),
    /// Left for a person.
    Open(String),
}

/// The copy of a dead letter: a MessageId of its own ([`redrive::copy_message_id`]),
/// the original named in [`redrive::ORIGINAL_MESSAGE_ID`], the same body, content type
/// and application properties, plus [`REDRIVE_PROPERTY`].
fn copy_of(
    letter: &DeadLetter,
    line: &Line,
    principal: &str,
    now: OffsetDateTime,
) -> Option<Outgoing> {
    let (original, _) = identity(letter).ok()?;
    let own = letter.message_id.as_ref()?;
    let mut properties: Vec<Property> = letter
        .properties
        .iter()
        .filter(|p| {
            !DEAD_LETTER_PROPERTIES
                .iter()
                .chain(&[REDRIVE_PROPERTY, redrive::ORIGINAL_MESSAGE_ID])
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
        "deadLetterMessageId": ascii(&own.0),
        "originalDeliveryCount": line.delivery_count,
        "originalReason": line.dead_letter_reason.as_deref().map(ascii),
    })
    .to_string();
    let quoted =
        |text: &str| crate::servicebus::header_json(&serde_json::Value::String(text.to_owned()));
    properties.push(Property {
        name: REDRIVE_PROPERTY.to_owned(),
        value: quoted(&record),
    });
    properties.push(Property {
        name: redrive::ORIGINAL_MESSAGE_ID.to_owned(),
        value: quoted(original.as_str()),
    });
    Some(Outgoing {
        message_id: BrokerMessageId(redrive::copy_message_id(&own.0, letter.sequence_number)),
        content_type: letter.content_type.clone(),
        properties,
        body: letter.body.clone(),
    })
}

/// Sends the copy, and removes the dead letter only once the send was accepted. A
/// failure that concerns the whole run stops the walk.
async fn send_then_delete(walk: &mut Walk<'_>, e: &Examined, principal: &str) -> Handled {
    let Some(letter) = &e.letter else {
        walk.keep(e);
        return Handled::Open("not sent: the broker's answer for it does not read".into());
    };
    let Some(copy) = copy_of(letter, &e.line, principal, walk.options.ambient.now()) else {
        walk.keep(e);
        return Handled::Open("not sent: no usable MessageId".into());
    };
    let copy_id = copy.message_id.0.clone();
    match walk.broker.send(&copy).await {
        Ok(()) => match walk.broker.delete(&letter.lock).await {
            Ok(()) => Handled::Done(format!("sent as {copy_id}: the dead letter was removed")),
            Err(err) => {
                if err.kind.ends_the_run() {
                    walk.stop(err.clone());
                }
                walk.keep(e);
                Handled::Open(format!(
                    "sent as {copy_id}: but the dead letter is kept ({err}); the copy is a duplicate the consumer recognises: run list again and discard it"
                ))
            }
        },
        Err(err) => {
            walk.keep(e);
            if err.kind.ends_the_run() {
                walk.stop(err.clone());
                return Handled::Open(format!("not sent: {err}; the run stops here"));
            }
            let what = match err.kind {
                crate::servicebus::BusErrorKind::Timeout => {
                    "unsure: the send timed out and may have been accepted; the dead letter is kept (sending it again is safe: the same copy MessageId, dropped if the first arrived)"
                }
                _ => "not sent: the dead letter is kept",
            };
            Handled::Open(format!("{what} ({err})"))
        }
    }
}

/// `dead-letters resubmit`: sends the selected dead letters again (see the module's
/// rules), one at a time. Returns every dead letter's line and the summary.
pub async fn resubmit(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
    selection: &Selection,
    dry_run: bool,
) -> (Vec<Line>, Summary) {
    let principal = broker.principal().await;
    let mut walk = Walk::new(broker, store, options);
    let mut lines = Vec::new();
    let mut open = false;
    while let Some(mut e) = walk.next().await {
        let named = [&e.line.message_id, &e.line.original_message_id]
            .into_iter()
            .flatten()
            .any(|id| selection.message_ids.iter().any(|m| m == id));
        let by_verdict = selection.verdict.as_deref() == Some(e.line.verdict.name());
        let handled = if !(named || selection.all || by_verdict) {
            walk.keep(&e);
            // Left in the queue, unselected: still something for a person.
            open = true;
            lines.push(e.line);
            continue;
        } else {
            match e.line.verdict {
                // Nothing is sent that did not read, named or not.
                Verdict::Unreadable => {
                    walk.keep(&e);
                    Handled::Open("not sent: the broker's answer for it does not read".into())
                }
                v if !v.sendable() && !named => {
                    walk.keep(&e);
                    Handled::Open(format!(
                        "refused: the verdict is {}; name it with --message-id to send it anyway",
                        v.name()
                    ))
                }
                _ if dry_run => {
                    walk.keep(&e);
                    Handled::Done("would send (dry run)".into())
                }
                _ => send_then_delete(&mut walk, &e, &principal).await,
            }
        };
        e.line.action = Some(match handled {
            Handled::Done(a) => a,
            Handled::Open(a) => {
                open = true;
                a
            }
        });
        lines.push(e.line);
    }
    walk.finish().await;
    let summary = Summary::of(&lines, &walk, open);
    (lines, summary)
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
/// nothing is removed. Returns its line (the first, when several dead letters have that
/// MessageId: all go), or `None` when no dead letter has it.
pub async fn discard(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
    message_id: &str,
    reason: &str,
) -> Result<Option<Line>, BusError> {
    let one = BTreeSet::from([message_id.to_owned()]);
    Ok(discard_each(broker, store, options, &one, reason)
        .await?
        .into_iter()
        .next())
}

/// [`discard`] of every dead letter named, in one walk of the queue (after a large
/// incident a person may drop thousands: one walk each would lock and pass every dead
/// letter before it again). Every dead letter with a named MessageId goes, copies of one
/// message included (a re-drive sent twice, each dead-lettered). Returns the lines of
/// those found, in queue order.
pub async fn discard_each(
    broker: &dyn Broker,
    store: &DynStore,
    options: &Options,
    message_ids: &BTreeSet<String>,
    reason: &str,
) -> Result<Vec<Line>, BusError> {
    let principal = broker.principal().await;
    let reason = bounded(reason, 500);
    let mut walk = Walk::new(broker, store, options);
    let mut found = Vec::new();
    while let Some(mut e) = walk.next().await {
        match e.line.message_id.as_deref() {
            Some(id) if message_ids.contains(id) => {
                let action = discard_one(&mut walk, options, &e, &reason, &principal);
                e.line.action = Some(action.await);
                found.push(e.line);
            }
            _ => walk.keep(&e),
        }
    }
    walk.finish().await;
    match walk.stopped {
        Some(e) if found.is_empty() => Err(e),
        _ => Ok(found),
    }
}

/// Records, logs and removes one dead letter (see [`discard`]); returns the action.
async fn discard_one(
    walk: &mut Walk<'_>,
    options: &Options,
    e: &Examined,
    reason: &str,
    principal: &str,
) -> String {
    let (Some(_), Some(lock)) = (&e.letter, &e.lock) else {
        walk.keep(e);
        return "not discarded: the broker's answer for it does not read; nothing was recorded or removed".into();
    };
    let recorded = match record_discard(walk.store.as_ref(), options, e, options.ambient.now())
        .await
    {
        Ok(recorded) => recorded,
        Err(why) => {
            walk.keep(e);
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
    match walk.broker.delete(lock).await {
        Ok(()) => format!("discarded: {reason}; {recorded}"),
        // The store already says discarded: a second `discard` finds it kept and removes it.
        Err(err) => format!("not discarded ({err}); {recorded}; run discard again"),
    }
}
