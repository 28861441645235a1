//! Service Bus and the Functions host around the product's router.
//!
//! The queue is peek-lock: a receive locks a message and counts a delivery; a 2xx
//! completes it, anything else abandons it (redelivered at once), a lock that runs out
//! makes it visible again, and a message whose deliveries reach `maxDeliveryCount` is
//! dead-lettered. Duplicate detection drops a MessageId sent again within its window,
//! judged on the broker's clock. The host hands a message to an instance with a free call
//! and judges its answer. The dead-letter queue is the product's `servicebus::Broker` for
//! the operator's own tool (`dead_letters`): peek-lock, unlock, delete and send.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use claims_payments_testkit::host::{envelope, DataType, DeliveryFields};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

use claims_payments::seams::store::{InboxKey, InboxStatus};
use claims_payments::{ClaimId, MessageId, Purpose};

use super::check::Violation;
use super::faults::Fault;
use super::hot::BURST_GAP_MS;
use super::invariants::Cause;
use super::state::*;
use super::timings::*;
use super::world::{self};
use crate::sim::scenario::CopyKind;
use crate::trace_event;
use async_trait::async_trait;
use claims_payments::redrive;
use claims_payments::seams::servicebus::{
    unquote, Broker, BrokerMessageId, BusError, BusErrorKind, DeadLetter, Lock, LockToken, Locked,
    Outgoing, Property,
};

/// How the host judges an invocation's answer: 2xx with a JSON object completes it.
/// Also its outcome label and `ReturnValue.detail` (why a delivery failed).
pub(super) fn judge(status: StatusCode, body: &[u8]) -> (bool, String, String) {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.pointer(&format!("/ReturnValue/{name}")))
            .and_then(|v| v.as_str())
            .unwrap_or("-")
            .to_owned()
    };
    let completes = status.is_success() && parsed.as_ref().is_some_and(|v| v.is_object());
    (completes, field("outcome"), field("detail"))
}

/// Outcomes that redelivery cannot change (the message belongs in the DLQ).
pub(super) fn is_permanent(label: &str) -> bool {
    matches!(label, "conflict" | "invalid-message" | "store-failure")
}

impl Sim {
    /// The lock of `i` ends without a completion: visible again, or dead-lettered when
    /// its deliveries are spent.
    pub(super) fn release(&self, books: &mut Books, i: usize, token: u64, why: &str) {
        let q = &mut books.queue[i];
        // Judged by when the delivery began: one begun under faults may have met them,
        // though its lock ran out after they stopped (seed 839).
        let calm = q.delivered_calm;
        if q.state
            != (QueueState::Locked {
                token,
                instance: match q.state {
                    QueueState::Locked { instance, .. } => instance,
                    _ => usize::MAX,
                },
            })
        {
            return;
        }
        let ended_early = match why {
            "lock-expired" => Some(Cause::LockLost),
            "handler-crashed" => Some(Cause::HostCut),
            _ => None,
        };
        if let Some(cause) = ended_early {
            // The delivery ended before its answer: counted here, not when it settles.
            q.failures.push(cause);
            if !calm {
                books.transient.faulted_deliveries += 1;
            }
        }
        if q.delivery_count >= MAX_DELIVERY_COUNT {
            q.state = QueueState::DeadLettered;
            q.dead_lettered_calm = calm && !is_permanent(&q.last_outcome);
            // A message answered a permanent outcome once (a conflict) is no transient
            // dead letter, whatever its last delivery met.
            let transient =
                !is_permanent(&q.last_outcome) && !q.failures.contains(&Cause::Permanent);
            if !calm && transient {
                let unexplained = q.failures.contains(&Cause::Unexplained);
                if unexplained {
                    self.checks.fail(Violation::new(
                        "transient-dead-letters-met-faults",
                        q.claim.as_deref(),
                        format!(
                            "message {} was dead-lettered while faults fired, and a delivery of it failed for no injected fault ({:?})",
                            q.message_id, q.failures
                        ),
                    ));
                }
                books.transient.dead_letters += 1;
            }
            books.dead_lettered += 1;
            // The copy a re-drive sends is named after the dead letter and its
            // SequenceNumber: kept once, so that a send finds its dead letter at once.
            let copy = redrive::copy_message_id(&q.message_id, Some(i as i64 + 1));
            books.dlq.insert(i);
            books.copies.insert(copy, i);
            let q = &books.queue[i];
            trace_event!(
                self.trace,
                "dead-letter {} claim {} after {} deliveries ({why}, last {})",
                q.message_id,
                q.claim.as_deref().unwrap_or("-"),
                q.delivery_count,
                q.last_outcome
            );
        } else {
            q.state = QueueState::Ready;
            books.ready.push_back(i);
        }
    }

    /// Enqueues a copy, unless duplicate detection drops it.
    pub(super) fn publish(
        &self,
        message_id: &str,
        body: Vec<u8>,
        claim: Option<String>,
        kind: CopyKind,
    ) {
        self.publish_with(message_id, body, claim, kind, Vec::new());
    }

    /// Enqueues a message with its application properties, unless duplicate detection
    /// drops it: a MessageId seen within the window, on the broker's clock, is answered
    /// as accepted and dropped. Whether it was enqueued.
    pub(super) fn publish_with(
        &self,
        message_id: &str,
        body: Vec<u8>,
        claim: Option<String>,
        kind: CopyKind,
        properties: Vec<(String, String)>,
    ) -> bool {
        let now = Instant::now();
        let wall = world::wall_at(self.start);
        let mut books = self.books();
        if books
            .sent_at
            .get(message_id)
            .is_some_and(|at| now < *at + DUPLICATE_WINDOW)
        {
            trace_event!(self.trace, "broker drops duplicate {message_id}");
            return false;
        }
        books.sent_at.insert(message_id.to_owned(), now);
        let i = books.queue.len();
        trace_event!(
            self.trace,
            "publish #{i} {message_id} {kind:?} claim {}",
            claim.as_deref().unwrap_or("-")
        );
        books.queue.push(Queued {
            message_id: message_id.to_owned(),
            body,
            claim,
            kind,
            delivery_count: 0,
            state: QueueState::Ready,
            enqueued_at: wall,
            last_outcome: "-".into(),
            dead_lettered_calm: false,
            delivered_calm: false,
            redriven: false,
            copy_sent: false,
            discarded: false,
            failures: Vec::new(),
            properties,
            dlq_lock: None,
            dlq_locks: 0,
        });
        books.ready.push_back(i);
        drop(books);
        self.wake.notify_one();
        true
    }

    pub(super) fn claim_of(&self, copy: usize) -> Option<String> {
        let copy = &self.plan.copies[copy];
        copy.claim.map(|c| self.plan.claims[c].claim_id.clone())
    }

    /// The producer: the plan's copies in order (a hot claim's burst right behind its
    /// original, with its HTTP payment); re-sends and conflicting copies of a MessageId
    /// partly after the duplicate-detection window (otherwise dropped).
    pub(super) async fn producer(self: Arc<Self>) {
        let mut late = Vec::new();
        let mut payments = JoinSet::new();
        for &copy in &self.plan.send_order {
            let c = &self.plan.copies[copy];
            if matches!(
                c.kind,
                CopyKind::ProducerResend | CopyKind::ConflictingPayload
            ) && self.dice.hit(0.6)
            {
                late.push(copy);
                continue;
            }
            let pause = if self.hot.follows.contains(&copy) {
                self.dice.millis(0, BURST_GAP_MS)
            } else {
                self.dice.millis(0, 400)
            };
            let payment = self.hot.http.get(&copy).cloned();
            if let Some(payment) = payment.as_ref().filter(|p| p.first) {
                let (sim, payment) = (self.clone(), payment.clone());
                let key = format!("intent-{}-hot-{copy}", self.seed);
                payments.spawn(async move {
                    sim.http_payment(
                        1 << 20 | copy,
                        key,
                        payment.claim,
                        payment.amount,
                        payment.body,
                    )
                    .await
                });
            }
            tokio::time::sleep(pause).await;
            self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
            if let Some(payment) = payment.filter(|p| !p.first) {
                let sim = self.clone();
                payments.spawn(async move {
                    tokio::time::sleep(sim.dice.millis(0, BURST_GAP_MS)).await;
                    let key = format!("intent-{}-hot-{copy}", sim.seed);
                    sim.http_payment(
                        1 << 20 | copy,
                        key,
                        payment.claim,
                        payment.amount,
                        payment.body,
                    )
                    .await
                });
            }
        }
        while payments.join_next().await.is_some() {}
        let wait = (DUPLICATE_WINDOW + Duration::from_secs(60)).saturating_sub(self.elapsed());
        tokio::time::sleep(wait).await;
        for copy in late {
            tokio::time::sleep(self.dice.millis(0, 2_000)).await;
            let c = &self.plan.copies[copy];
            self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
        }
    }

    /// After the retention: a sample of originals sent again (their inbox records are
    /// purged; the payment must still guard).
    /// Late re-sends of a sample of originals, spread over `within`: the producer
    /// publishes a message again under its MessageId whenever it likes (an outbox replay,
    /// a person's re-send), also hours after the first, past the broker's duplicate
    /// detection.
    pub(super) async fn resend_late(&self, within: Duration) {
        let mut at: Vec<(u64, usize)> = self
            .plan
            .send_order
            .iter()
            .filter(|&&copy| {
                self.plan.copies[copy].kind == CopyKind::Original && self.dice.hit(0.2)
            })
            .map(|&copy| (self.dice.range(0, within.as_millis() as u64), copy))
            .collect();
        at.sort_unstable();
        let mut elapsed = 0;
        for (ms, copy) in at {
            tokio::time::sleep(Duration::from_millis(ms - elapsed)).await;
            elapsed = ms;
            let c = &self.plan.copies[copy];
            self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
        }
    }

    pub(super) fn resend_old(&self) {
        for &copy in &self.plan.send_order {
            let c = &self.plan.copies[copy];
            if c.kind == CopyKind::Original && self.dice.hit(0.2) {
                self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
            }
        }
    }

    /// Until nothing is ready, locked or in flight (bounded).
    pub(super) async fn drain(&self) {
        let until = Instant::now() + DRAIN_LIMIT;
        loop {
            let busy = {
                let books = self.books();
                !books.ready.is_empty()
                    || !books.locks.is_empty()
                    || books.instances.iter().any(|i| i.in_flight > 0)
            };
            if !busy || Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The host's side: hands ready messages to instances with a free call, and ends
    /// locks that ran out.
    pub(super) async fn dispatcher(self: Arc<Self>) {
        let mut next = 0usize;
        loop {
            let now = Instant::now();
            let mut spawned = Vec::new();
            {
                let mut books = self.books();
                while let Some(&(until, i, token)) = books.locks.iter().next() {
                    if until > now {
                        break;
                    }
                    books.locks.pop_first();
                    if matches!(books.queue[i].state, QueueState::Locked { token: t, .. } if t == token)
                    {
                        trace_event!(self.trace, "lock expired #{i}");
                        self.release(&mut books, i, token, "lock-expired");
                    }
                }
                let slots = books.instances.len();
                for instance in &mut books.instances {
                    while instance.tasks.try_join_next().is_some() {}
                }
                while !books.ready.is_empty() {
                    let free = (0..slots).map(|k| (next + k) % slots).find(|&s| {
                        let inst = &books.instances[s];
                        inst.alive
                            && inst.router.is_some()
                            && inst.in_flight < MAX_CONCURRENT_CALLS
                            && !inst.pause.is_paused()
                    });
                    let Some(slot) = free else { break };
                    next = slot + 1;
                    let Some(i) = books.ready.pop_front() else {
                        break;
                    };
                    books.next_token += 1;
                    let token = books.next_token;
                    books.deliveries += 1;
                    let renewal = if self.chaos.fires(Fault::LockLost, "lock") {
                        self.dice.millis(1_000, LOCK.as_millis() as u64)
                    } else {
                        LOCK_RENEWAL
                    };
                    books.locks.insert((now + renewal, i, token));
                    let calm = books.calm;
                    let q = &mut books.queue[i];
                    q.delivery_count += 1;
                    q.delivered_calm = calm;
                    q.state = QueueState::Locked {
                        token,
                        instance: slot,
                    };
                    spawned.push((slot, i, token, q.delivery_count));
                    books.instances[slot].in_flight += 1;
                }
            }
            for (slot, i, token, count) in spawned {
                self.clone().invoke(slot, i, token, count);
            }
            let next_lock = self.books().locks.iter().next().map(|l| l.0);
            // New work wakes it; otherwise the next lock to end, or a minute.
            let sleep_until = next_lock
                .unwrap_or(now + Duration::from_secs(60))
                .min(now + Duration::from_secs(60));
            tokio::select! {
                biased;
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(sleep_until) => {}
            }
        }
    }

    /// One invocation of `/ClaimApproved` on the instance in `slot`.
    pub(super) fn invoke(self: Arc<Self>, slot: usize, i: usize, token: u64, count: u32) {
        let (request, claim, message_id) = {
            let books = self.books();
            let q = &books.queue[i];
            let lock_token = uuid::Uuid::from_u64_pair(self.seed, token);
            let fields = DeliveryFields {
                body: &q.body,
                message_id: &q.message_id,
                delivery_count: count,
                lock_token,
                sequence_number: i as u64 + 1,
                enqueued_at: q.enqueued_at,
            };
            let mut envelope = envelope(&fields, DataType::Binary, "ClaimApproved");
            for (name, value) in &q.properties {
                for field in ["ApplicationProperties", "UserProperties"] {
                    envelope["Metadata"][field][name] = serde_json::Value::String(value.clone());
                }
            }
            let request = Request::post("/ClaimApproved")
                .header("content-type", "application/json")
                .body(Body::from(envelope.to_string()))
                .expect("a request");
            (request, q.claim.clone(), q.message_id.clone())
        };
        // The message the consumer keys its inbox by: the original a re-drive copy names.
        let identity = self.books().queue[i]
            .properties
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(redrive::ORIGINAL_MESSAGE_ID))
            .map_or_else(|| message_id.clone(), |(_, original)| original.clone());
        let timeout = if self.chaos.fires(Fault::FunctionTimeout, &message_id) {
            self.dice.millis(50, 5_000)
        } else {
            FUNCTION_TIMEOUT
        };
        let Some(router) = self.books().instances[slot].router.clone() else {
            return;
        };
        let sim = self.clone();
        let task = async move {
            let _flight = claim
                .as_deref()
                .map(|c| Flights::begin(&sim.flights, c, true));
            trace_event!(
                sim.trace,
                "deliver #{i} {message_id} count {count} slot {slot} claim {}",
                claim.as_deref().unwrap_or("-")
            );
            let answered = tokio::time::timeout(timeout, async {
                let response = router.oneshot(request).await.ok()?;
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                    .await
                    .ok()?;
                Some((status, body))
            })
            .await;
            let (completes, label, detail) = match answered {
                Ok(Some((status, body))) => {
                    let (completes, label, detail) = judge(status, &body);
                    (completes, format!("{label} {}", status.as_u16()), detail)
                }
                Ok(None) => (false, "no-answer".into(), String::new()),
                Err(_) => {
                    // The host restarts the handler: every invocation in flight on the
                    // instance fails with this one (this task ends here too).
                    trace_event!(sim.trace, "function timeout #{i} {message_id} slot {slot}");
                    sim.crash(slot, true);
                    return;
                }
            };
            let cause = (!completes).then(|| Cause::of(&label, &detail));
            trace_event!(
                sim.trace,
                "answer #{i} {message_id} claim {} {label}",
                claim.as_deref().unwrap_or("-")
            );
            if completes {
                sim.check_durable(claim.as_deref(), &identity).await;
            }
            sim.settle(slot, i, token, completes, label, cause);
        };
        let mut books = self.books();
        books.instances[slot].tasks.spawn(task);
    }

    /// The host's verdict on invocation `token` of message `i`.
    pub(super) fn settle(
        &self,
        slot: usize,
        i: usize,
        token: u64,
        completes: bool,
        label: String,
        cause: Option<Cause>,
    ) {
        let mut books = self.books();
        let kind = label.split(' ').next().unwrap_or("-").to_owned();
        *books.outcomes.entry(kind.clone()).or_default() += 1;
        if books.instances[slot].in_flight > 0 {
            books.instances[slot].in_flight -= 1;
        }
        let holds =
            matches!(books.queue[i].state, QueueState::Locked { token: t, .. } if t == token);
        // A delivery whose lock ran out was counted when it ran out.
        if let Some(cause) = cause.filter(|_| holds) {
            if !books.queue[i].delivered_calm {
                books.transient.faulted_deliveries +=
                    u64::from(!matches!(cause, Cause::Unexplained | Cause::Permanent));
            }
            books.queue[i].failures.push(cause);
        }
        books.queue[i].last_outcome = kind;
        if holds {
            if completes {
                let process = books.instances[slot].process;
                *books.completed_by_process.entry(process).or_default() += 1;
                if self.chaos.fires(Fault::CompleteFails, "complete") {
                    // The lock stays until it runs out; the message comes back then.
                    let until = Instant::now() + LOCK;
                    books.locks.insert((until, i, token));
                } else {
                    books.queue[i].state = QueueState::Completed;
                }
            } else {
                self.release(&mut books, i, token, "abandoned");
            }
        }
        drop(books);
        self.wake.notify_one();
    }

    /// Every 2xx stands for a durable record: the message's inbox record completed, and
    /// its claim's payment stored.
    pub(super) async fn check_durable(&self, claim: Option<&str>, message_id: &str) {
        let Some(claim) = claim else {
            self.checks.fail(Violation::new(
                "2xx-is-durable",
                None,
                format!("message {message_id} without a valid claim was completed"),
            ));
            return;
        };
        let (done, paid) = self.durable(claim, Some(message_id)).await;
        if !done || !paid {
            self.checks.fail(Violation::new(
                "2xx-is-durable",
                Some(claim),
                format!("message {message_id} completed with inbox record completed: {done}, payment stored: {paid}"),
            ));
        }
    }
}

impl Sim {
    /// Whether the records a 2xx stands for are in the store, read by key through the
    /// store without faults (any store): the message's inbox record completed (when a
    /// message is named), and the claim's payment.
    pub(super) async fn durable(&self, claim: &str, message_id: Option<&str>) -> (bool, bool) {
        let Ok(claim_id) = ClaimId::parse(claim) else {
            return (false, false);
        };
        let store = &self.opened.check;
        let done = match message_id {
            None => true,
            Some(id) => match MessageId::parse(id) {
                Ok(message_id) => {
                    let key = InboxKey {
                        consumer: CONSUMER.into(),
                        claim_id,
                        message_id,
                    };
                    matches!(
                        store.inbox(&key).await,
                        Ok(Some(v)) if v.record.status == InboxStatus::Completed
                    )
                }
                Err(_) => false,
            },
        };
        let paid = matches!(store.payment(claim_id, Purpose::Payout).await, Ok(Some(_)));
        (done, paid)
    }
}

/// The broker as the operator's tool meets it: the dead-letter queue by peek-lock (a lock
/// lasts the queue's lockDuration and raises the DeliveryCount, as over REST), unlock,
/// delete, and sends with duplicate detection. Each request takes a network's worth of
/// time, so the tool's runs interleave with deliveries.
pub(super) struct SimBroker(pub(super) Arc<Sim>);

/// Where a dead letter's lock is given back or deleted: its place and its lock's token.
fn location(i: usize, token: u64) -> String {
    format!("dlq/{i}/{token}")
}

fn parse_location(lock: &Lock) -> Option<(usize, u64)> {
    let mut parts = lock.location.strip_prefix("dlq/")?.split('/');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

impl SimBroker {
    async fn latency(&self) {
        tokio::time::sleep(self.0.dice.millis(2, 40)).await;
    }

    /// The dead letter `lock` names, if that lock still holds it.
    fn held(&self, books: &Books, lock: &Lock) -> Option<usize> {
        let (i, token) = parse_location(lock)?;
        let q = books.queue.get(i)?;
        let holds = q.state == QueueState::DeadLettered
            && !q.redriven
            && q.dlq_lock
                .is_some_and(|(t, until)| t == token && Instant::now() < until);
        holds.then_some(i)
    }
}

fn lock_lost() -> BusError {
    BusError::new(BusErrorKind::LockLost, "the dead letter's lock expired")
}

#[async_trait]
impl Broker for SimBroker {
    async fn lock_next_dead_letter(&self) -> Result<Option<Locked>, BusError> {
        self.latency().await;
        let sim = &self.0;
        let now = Instant::now();
        let mut books = sim.books();
        // Locks that ran out give their letters back; then the first letter (in sequence
        // order) that no one holds.
        while let Some(&(until, i, _)) = books.dlq_held.first() {
            if until > now {
                break;
            }
            books.dlq_held.pop_first();
            books.dlq.insert(i);
        }
        let Some(i) = books.dlq.pop_first() else {
            return Ok(None);
        };
        books.next_token += 1;
        let token = books.next_token;
        books.dlq_held.insert((now + LOCK, i, token));
        let q = &mut books.queue[i];
        q.dlq_lock = Some((token, now + LOCK));
        q.dlq_locks += 1;
        let mut properties: Vec<Property> = q
            .properties
            .iter()
            .map(|(name, value)| Property {
                name: name.to_ascii_lowercase(),
                value: serde_json::Value::String(value.clone()).to_string(),
            })
            .collect();
        properties.push(Property {
            name: "deadletterreason".into(),
            value: r#""MaxDeliveryCountExceeded""#.into(),
        });
        Ok(Some(Locked::Letter(DeadLetter {
            message_id: Some(BrokerMessageId(q.message_id.clone())),
            sequence_number: Some(i as i64 + 1),
            lock_token: LockToken(uuid::Uuid::from_u64_pair(sim.seed, token).to_string()),
            lock: Lock {
                location: location(i, token),
            },
            delivery_count: q.delivery_count + q.dlq_locks,
            enqueued_at: Some(q.enqueued_at),
            content_type: Some("application/json".into()),
            properties,
            body: q.body.clone(),
            body_truncated: false,
        })))
    }

    async fn unlock(&self, lock: &Lock) -> Result<(), BusError> {
        self.latency().await;
        let mut books = self.0.books();
        let i = self.held(&books, lock).ok_or_else(lock_lost)?;
        if let Some((token, until)) = books.queue[i].dlq_lock.take() {
            books.dlq_held.remove(&(until, i, token));
        }
        books.dlq.insert(i);
        Ok(())
    }

    async fn delete(&self, lock: &Lock) -> Result<(), BusError> {
        self.latency().await;
        let sim = &self.0;
        if sim.chaos.fires(Fault::RedriveLockLost, &lock.location) {
            return Err(lock_lost());
        }
        let mut books = sim.books();
        let i = self.held(&books, lock).ok_or_else(lock_lost)?;
        if let Some((token, until)) = books.queue[i].dlq_lock.take() {
            books.dlq_held.remove(&(until, i, token));
        }
        let q = &mut books.queue[i];
        // Discarded for a permanent cause: no copy lives on, so the message is still judged
        // as the dead letter it was. Otherwise its copy (or a settled claim) stands for it.
        let discarded = !q.copy_sent && is_permanent(&q.last_outcome);
        if discarded {
            q.discarded = true;
        } else {
            q.redriven = true;
        }
        trace_event!(
            sim.trace,
            "dead letter #{i} {} claim {} {} by the operator",
            q.message_id,
            q.claim.as_deref().unwrap_or("-"),
            if discarded { "discarded" } else { "removed" }
        );
        if !discarded {
            books.redriven += 1;
        }
        Ok(())
    }

    async fn send(&self, message: &Outgoing) -> Result<(), BusError> {
        self.latency().await;
        let sim = &self.0;
        // The dead letter it copies: the one whose MessageId and SequenceNumber give the
        // copy's MessageId. Its claim and kind are the copy's.
        let (claim, kind) = {
            let mut books = sim.books();
            match books.copies.get(&message.message_id.0).copied() {
                Some(i) => {
                    let q = &mut books.queue[i];
                    q.copy_sent = true;
                    (q.claim.clone(), q.kind)
                }
                None => (None, CopyKind::Invalid),
            }
        };
        let properties = message
            .properties
            .iter()
            .map(|p| (p.name.clone(), unquote(&p.value)))
            .collect();
        let accepted = sim.publish_with(
            &message.message_id.0,
            message.body.clone(),
            claim,
            kind,
            properties,
        );
        trace_event!(
            sim.trace,
            "operator sent {} accepted {accepted}",
            message.message_id.0
        );
        if sim
            .chaos
            .fires(Fault::RedriveSendUnsure, &message.message_id.0)
        {
            return Err(BusError::new(BusErrorKind::Timeout, "send timed out"));
        }
        Ok(())
    }

    async fn principal(&self) -> String {
        "dst-operator".into()
    }
}
