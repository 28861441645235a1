//! The Service Bus queue, as far as a peek-lock receiver can tell.
//!
//! - A receive locks one message and increments its DeliveryCount.
//! - Complete settles it, but only with the current lock token: after the lock expired
//!   (and the message went to another receiver) the old token is refused with
//!   "lock lost", exactly what the host sees when it completes too late.
//! - Abandon releases the lock at once and the message is the next one delivered
//!   (Service Bus applies no back-off); once DeliveryCount reached MaxDeliveryCount the
//!   broker moves it to the dead-letter queue instead, with the reason.
//! - A re-drive sends every dead-lettered message again as a new message (same
//!   MessageId and body, DeliveryCount from zero), like an operator resubmitting the DLQ;
//!   `simulate` re-drives through `dead-letters resubmit` instead ([`Queue::dead_letters`],
//!   [`Queue::resend_dead_letter`]: what the command sent, and only that).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use time::OffsetDateTime;
use tokio::sync::Notify;
use uuid::Uuid;

/// One message on the queue.
#[derive(Debug, Clone)]
pub struct Message {
    pub sequence_number: u64,
    /// Which producer copy this is (index into the plan), so outcomes map back.
    pub copy: usize,
    pub message_id: Arc<str>,
    pub body: Arc<[u8]>,
    pub enqueued_at: OffsetDateTime,
    /// Sent again by a dead-letter re-drive.
    pub redrive: bool,
}

/// A locked message handed to a receiver.
#[derive(Debug, Clone)]
pub struct QueueDelivery {
    pub entry: usize,
    pub lock_token: Uuid,
    pub delivery_count: u32,
    pub message: Message,
}

/// Why a delivery failed, as the host saw it. `kind` groups failures for the report
/// (`503 retry-later`, `transport: connection closed`); `detail` is the specific text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: String,
    pub detail: String,
}

impl Failure {
    /// Whether the handler answered at all: a transport failure or a function timeout
    /// is a delivery the handler never answered (its process died, restarted or hung).
    pub fn answered(&self) -> bool {
        !(self.kind.starts_with("transport:") || self.kind == "function timeout")
    }

    fn is_lock_expiry(&self) -> bool {
        self.kind == LOCK_EXPIRED
    }

    /// An answer that refuses the message for good (4xx: conflict, invalid message): it
    /// is dead-lettered whatever else happened to its deliveries.
    fn is_permanent(&self) -> bool {
        self.kind.starts_with('4')
    }
}

/// The failure kind of a delivery whose lock expired while the handler still worked.
pub const LOCK_EXPIRED: &str = "lock expired";

/// Why the broker dead-lettered a message, from every failed delivery it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeadLetterCause {
    /// The handler's own answers decided it: it refused the message for good (a 4xx
    /// on some delivery), or every failed delivery was answered (retry-later until
    /// MaxDeliveryCount, an unreadable body).
    HandlerAnswers,
    /// No failed delivery got an answer (transport failures, function timeouts): the
    /// deliveries were spent on handler processes that died or restarted.
    TransportOnly,
    /// Retryable answers and unanswered deliveries: restarts spent part of the
    /// deliveries of a message the handler had not refused.
    Mixed,
    /// Only expired locks (the handler never got to answer in time).
    LockExpiries,
    /// The scenario dead-lettered it at once (an orphaned payout, see
    /// [`Queue::orphan_claim`]).
    Orphaned,
}

impl DeadLetterCause {
    pub fn as_str(&self) -> &'static str {
        match self {
            DeadLetterCause::HandlerAnswers => "handler answers",
            DeadLetterCause::TransportOnly => "transport only",
            DeadLetterCause::Mixed => "answers and transport",
            DeadLetterCause::LockExpiries => "lock expiries only",
            DeadLetterCause::Orphaned => "orphaned by the scenario",
        }
    }
}

/// The failed deliveries of one message, by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureTally {
    /// The handler answered, but not with a success.
    pub answered: u32,
    /// Of those, answers that refuse the message for good (4xx).
    pub permanent: u32,
    /// No answer: transport failures and function timeouts.
    pub unanswered: u32,
    pub lock_expiries: u32,
}

impl FailureTally {
    fn add(&mut self, failure: &Failure) {
        if failure.is_lock_expiry() {
            self.lock_expiries += 1;
        } else if failure.answered() {
            self.answered += 1;
            self.permanent += u32::from(failure.is_permanent());
        } else {
            self.unanswered += 1;
        }
    }

    /// The cause of a dead letter with this history (not orphaned).
    pub fn cause(&self) -> DeadLetterCause {
        match (self.answered > 0, self.unanswered > 0) {
            (true, false) => DeadLetterCause::HandlerAnswers,
            (true, true) if self.permanent > 0 => DeadLetterCause::HandlerAnswers,
            (false, true) => DeadLetterCause::TransportOnly,
            (true, true) => DeadLetterCause::Mixed,
            (false, false) => DeadLetterCause::LockExpiries,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    Completed {
        label: String,
        delivery_count: u32,
    },
    DeadLettered {
        /// The last failure before the broker gave up.
        last: Failure,
        delivery_count: u32,
        /// Why, from all of its failed deliveries.
        cause: DeadLetterCause,
        failures: FailureTally,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockLost;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    Redelivered,
    DeadLettered,
}

#[derive(Debug)]
struct Entry {
    message: Message,
    delivery_count: u32,
    lock: Option<Uuid>,
    last_failure: Option<Failure>,
    failures: FailureTally,
    settled: Option<Settled>,
    /// A re-drive already sent this dead-lettered message again.
    redriven: bool,
    /// Its next failure dead-letters it, and no re-drive sends it again: an operator
    /// who never looked (see [`Queue::orphan_claim`]).
    orphaned: bool,
}

#[derive(Debug, Default)]
struct Inner {
    entries: Vec<Entry>,
    available: VecDeque<usize>,
    active: usize,
}

/// A snapshot of one queue message after the run.
#[derive(Debug, Clone)]
pub struct EntryView {
    pub message: Message,
    pub delivery_count: u32,
    pub settled: Option<Settled>,
    pub redriven: bool,
}

#[derive(Debug)]
pub struct Queue {
    inner: Mutex<Inner>,
    changed: Notify,
    max_delivery_count: u32,
    next_sequence: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlinePassed;

impl Queue {
    pub fn new(max_delivery_count: u32) -> Self {
        Queue {
            inner: Mutex::new(Inner::default()),
            changed: Notify::new(),
            max_delivery_count: max_delivery_count.max(1),
            next_sequence: AtomicU64::new(1),
        }
    }

    pub fn max_delivery_count(&self) -> u32 {
        self.max_delivery_count
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data; keep going with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn send(&self, copy: usize, message_id: &str, body: &[u8], redrive: bool) {
        let message = Message {
            sequence_number: self.next_sequence.fetch_add(1, Ordering::Relaxed),
            copy,
            message_id: Arc::from(message_id),
            body: Arc::from(body),
            enqueued_at: OffsetDateTime::now_utc(),
            redrive,
        };
        let mut inner = self.lock();
        let index = inner.entries.len();
        inner.entries.push(Entry {
            message,
            delivery_count: 0,
            lock: None,
            last_failure: None,
            failures: FailureTally::default(),
            settled: None,
            redriven: false,
            orphaned: false,
        });
        inner.available.push_back(index);
        inner.active += 1;
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Messages not yet completed or dead-lettered.
    pub fn active(&self) -> usize {
        self.lock().active
    }

    /// Locks the next available message. `Ok(None)` once every message is settled;
    /// while some are locked by other receivers, waits for them to settle or return.
    pub async fn receive(
        &self,
        deadline: Instant,
    ) -> Result<Option<QueueDelivery>, DeadlinePassed> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if let Some(index) = inner.available.pop_front() {
                    let entry = &mut inner.entries[index];
                    entry.delivery_count += 1;
                    let token = Uuid::new_v4();
                    entry.lock = Some(token);
                    return Ok(Some(QueueDelivery {
                        entry: index,
                        lock_token: token,
                        delivery_count: entry.delivery_count,
                        message: entry.message.clone(),
                    }));
                }
                if inner.active == 0 {
                    return Ok(None);
                }
            }
            if tokio::time::timeout_at(deadline.into(), notified)
                .await
                .is_err()
            {
                return Err(DeadlinePassed);
            }
        }
    }

    fn holds_lock(entry: &Entry, token: Uuid) -> bool {
        entry.settled.is_none() && entry.lock == Some(token)
    }

    /// Completes the message if `delivery` still holds its lock.
    pub fn complete(&self, delivery: &QueueDelivery, label: &str) -> Result<(), LockLost> {
        let mut inner = self.lock();
        let entry = &mut inner.entries[delivery.entry];
        if !Self::holds_lock(entry, delivery.lock_token) {
            return Err(LockLost);
        }
        entry.lock = None;
        entry.settled = Some(Settled::Completed {
            label: label.to_owned(),
            delivery_count: delivery.delivery_count,
        });
        inner.active -= 1;
        drop(inner);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Releases the lock after a failed delivery: the message is delivered again at
    /// once, or dead-lettered when it has used up MaxDeliveryCount.
    pub fn abandon(
        &self,
        delivery: &QueueDelivery,
        failure: Failure,
    ) -> Result<Abandoned, LockLost> {
        let mut inner = self.lock();
        let entry = &mut inner.entries[delivery.entry];
        if !Self::holds_lock(entry, delivery.lock_token) {
            return Err(LockLost);
        }
        let result = self.release(&mut inner, delivery.entry, failure);
        drop(inner);
        self.changed.notify_waiters();
        Ok(result)
    }

    /// The lock of `delivery` expired while its receiver still works on it: the broker
    /// makes the message available to others. False if it was settled meanwhile.
    pub fn expire_lock(&self, delivery: &QueueDelivery) -> bool {
        let mut inner = self.lock();
        if !Self::holds_lock(&inner.entries[delivery.entry], delivery.lock_token) {
            return false;
        }
        let failure = Failure {
            kind: LOCK_EXPIRED.to_owned(),
            detail: format!(
                "the lock of delivery {} expired while the handler was still working",
                delivery.delivery_count
            ),
        };
        self.release(&mut inner, delivery.entry, failure);
        drop(inner);
        self.changed.notify_waiters();
        true
    }

    fn release(&self, inner: &mut Inner, index: usize, failure: Failure) -> Abandoned {
        let max = self.max_delivery_count;
        let entry = &mut inner.entries[index];
        entry.lock = None;
        entry.failures.add(&failure);
        if entry.delivery_count >= max || entry.orphaned {
            entry.redriven |= entry.orphaned;
            entry.settled = Some(Settled::DeadLettered {
                last: failure,
                delivery_count: entry.delivery_count,
                cause: if entry.orphaned {
                    DeadLetterCause::Orphaned
                } else {
                    entry.failures.cause()
                },
                failures: entry.failures,
            });
            inner.active -= 1;
            Abandoned::DeadLettered
        } else {
            entry.last_failure = Some(failure);
            // Abandon puts the message back at the head: it is the next one delivered.
            inner.available.push_front(index);
            Abandoned::Redelivered
        }
    }

    /// The locked deliveries of `claim_id` end in the dead-letter queue at their next
    /// failure and are never re-driven: a payout orphaned at the bank, which only
    /// `reconcile` can settle. Returns how many were marked.
    pub fn orphan_claim(&self, claim_id: &str) -> usize {
        let needle = format!("\"claimId\":\"{claim_id}\"");
        let mut inner = self.lock();
        let mut marked = 0;
        for entry in inner.entries.iter_mut() {
            let body = String::from_utf8_lossy(&entry.message.body);
            if entry.lock.is_some() && entry.settled.is_none() && body.contains(&needle) {
                entry.orphaned = true;
                marked += 1;
            }
        }
        marked
    }

    /// Sends every dead-lettered message that was not re-driven yet once more.
    /// Returns how many were sent.
    pub fn redrive_dead_letters(&self) -> usize {
        let to_send: Vec<(usize, Message)> = {
            let mut inner = self.lock();
            inner
                .entries
                .iter_mut()
                .enumerate()
                .filter(|(_, e)| {
                    !e.redriven && matches!(e.settled, Some(Settled::DeadLettered { .. }))
                })
                .map(|(i, e)| {
                    e.redriven = true;
                    (i, e.message.clone())
                })
                .collect()
        };
        for (_, message) in &to_send {
            self.send(message.copy, &message.message_id, &message.body, true);
        }
        to_send.len()
    }

    /// The dead letters an operator would see (dead-lettered and not re-driven yet, the
    /// orphaned ones included: the tool's verdict on them is "needs reconciliation
    /// first" while their payout is open): entry index, message, DeliveryCount and the
    /// last failure. Nothing is marked: [`Queue::resend_dead_letter`] does that for what
    /// is sent again.
    pub fn dead_letters(&self) -> Vec<(usize, Message, u32, Failure)> {
        self.lock()
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.settled {
                Some(Settled::DeadLettered {
                    last,
                    delivery_count,
                    ..
                }) if !e.redriven || e.orphaned => {
                    Some((i, e.message.clone(), *delivery_count, last.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// Sends dead letter `entry` again as the operator's tool resubmitted it (a new
    /// message, same copy, MessageId and `body`) and marks it re-driven.
    pub fn resend_dead_letter(&self, entry: usize, body: &[u8]) {
        let (copy, message_id) = {
            let mut inner = self.lock();
            let Some(e) = inner.entries.get_mut(entry) else {
                return;
            };
            e.redriven = true;
            (e.message.copy, e.message.message_id.clone())
        };
        self.send(copy, &message_id, body, true);
    }

    pub fn entries(&self) -> Vec<EntryView> {
        self.lock()
            .entries
            .iter()
            .map(|e| EntryView {
                message: e.message.clone(),
                delivery_count: e.delivery_count,
                settled: e.settled.clone(),
                redriven: e.redriven,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn failure() -> Failure {
        Failure {
            kind: "503 retry-later".into(),
            detail: "busy".into(),
        }
    }

    #[tokio::test]
    async fn abandon_redelivers_then_dead_letters_at_max_delivery_count() {
        let q = Queue::new(3);
        q.send(0, "m", b"{}", false);
        for expected in 1..=3u32 {
            let d = q.receive(soon()).await.unwrap().unwrap();
            assert_eq!(d.delivery_count, expected);
            let r = q.abandon(&d, failure()).unwrap();
            assert_eq!(r == Abandoned::DeadLettered, expected == 3);
        }
        assert!(q.receive(soon()).await.unwrap().is_none());
        let views = q.entries();
        assert!(matches!(
            &views[0].settled,
            Some(Settled::DeadLettered { delivery_count: 3, last, .. }) if last.kind == "503 retry-later"
        ));
        assert_eq!(q.redrive_dead_letters(), 1);
        assert_eq!(q.redrive_dead_letters(), 0);
        let d = q.receive(soon()).await.unwrap().unwrap();
        assert!(d.message.redrive);
        assert_eq!(d.delivery_count, 1);
        q.complete(&d, "paid").unwrap();
        assert_eq!(q.active(), 0);
    }

    #[tokio::test]
    async fn a_dead_letter_names_its_cause_from_every_failed_delivery() {
        let transport = || Failure {
            kind: "transport: connection closed".into(),
            detail: "the handler died".into(),
        };
        let cause_after = |failures: Vec<Failure>| async move {
            let q = Queue::new(failures.len() as u32);
            q.send(0, "m", b"{}", false);
            for f in failures {
                let d = q.receive(soon()).await.unwrap().unwrap();
                q.abandon(&d, f).unwrap();
            }
            match &q.entries()[0].settled {
                Some(Settled::DeadLettered {
                    cause, failures, ..
                }) => (*cause, *failures),
                other => panic!("not dead-lettered: {other:?}"),
            }
        };
        let (cause, tally) = cause_after(vec![transport(), transport()]).await;
        assert_eq!(cause, DeadLetterCause::TransportOnly);
        assert_eq!((tally.answered, tally.unanswered), (0, 2));
        let timeout = Failure {
            kind: "function timeout".into(),
            detail: String::new(),
        };
        let (cause, _) = cause_after(vec![timeout, transport()]).await;
        assert_eq!(cause, DeadLetterCause::TransportOnly);
        let (cause, tally) = cause_after(vec![failure(), transport(), failure()]).await;
        assert_eq!(cause, DeadLetterCause::Mixed);
        assert_eq!((tally.answered, tally.unanswered), (2, 1));
        let (cause, _) = cause_after(vec![failure(), failure()]).await;
        assert_eq!(cause, DeadLetterCause::HandlerAnswers);
        // A conflict is dead-lettered for what the handler said, even if a restart
        // also cut one of its deliveries.
        let conflict = Failure {
            kind: "422 conflict".into(),
            detail: "another payload".into(),
        };
        let (cause, tally) = cause_after(vec![conflict.clone(), transport(), conflict]).await;
        assert_eq!(cause, DeadLetterCause::HandlerAnswers);
        assert_eq!((tally.permanent, tally.unanswered), (2, 1));

        // An orphaned payout is the scenario's doing, whatever its failures were.
        let q = Queue::new(10);
        q.send(0, "m", br#"{"claimId":"c1"}"#, false);
        let d = q.receive(soon()).await.unwrap().unwrap();
        assert_eq!(q.orphan_claim("c1"), 1);
        assert_eq!(q.abandon(&d, transport()), Ok(Abandoned::DeadLettered));
        assert!(matches!(
            q.entries()[0].settled,
            Some(Settled::DeadLettered {
                cause: DeadLetterCause::Orphaned,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn an_expired_lock_goes_to_a_second_receiver_and_the_first_cannot_settle() {
        let q = Queue::new(10);
        q.send(0, "m", b"{}", false);
        let first = q.receive(soon()).await.unwrap().unwrap();
        assert!(q.expire_lock(&first));
        let second = q.receive(soon()).await.unwrap().unwrap();
        assert_eq!(second.delivery_count, 2);
        assert_eq!(q.complete(&first, "paid"), Err(LockLost));
        assert_eq!(q.abandon(&first, failure()), Err(LockLost));
        q.complete(&second, "duplicate").unwrap();
        assert!(!q.expire_lock(&second));
        assert!(q.receive(soon()).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn receive_waits_while_others_hold_locks() {
        let q = Arc::new(Queue::new(10));
        q.send(0, "m", b"{}", false);
        let d = q.receive(soon()).await.unwrap().unwrap();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.receive(soon()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        q.abandon(&d, failure()).unwrap();
        let again = waiter.await.unwrap().unwrap().unwrap();
        assert_eq!(again.delivery_count, 2);
        let err = Queue::new(1)
            .receive(Instant::now() + Duration::from_millis(1))
            .await;
        assert!(matches!(err, Ok(None)));
    }
}
