//! Service Bus and the Functions host around the product's router.
//!
//! The queue is peek-lock: a receive locks a message and counts a delivery; a 2xx
//! completes it, anything else abandons it (redelivered at once), a lock that runs out
//! makes it visible again, and a message whose deliveries reach `maxDeliveryCount` is
//! dead-lettered. Duplicate detection drops a MessageId sent again within its window.
//! The host hands a message to an instance with a free call and judges its answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use claims_payments_testkit::host::{envelope, DataType, DeliveryFields};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

use super::check::Violation;
use super::faults::Fault;
use super::hot::BURST_GAP_MS;
use super::state::*;
use super::timings::*;
use super::world::{self};
use crate::sim::scenario::CopyKind;
use crate::trace_event;

/// How the host judges an invocation's answer: 2xx with a JSON object completes it.
pub(super) fn judge(status: StatusCode, body: &[u8]) -> (bool, String) {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let label = parsed
        .as_ref()
        .and_then(|v| v.pointer("/ReturnValue/outcome"))
        .and_then(|v| v.as_str())
        .unwrap_or("-")
        .to_owned();
    let completes = status.is_success() && parsed.as_ref().is_some_and(|v| v.is_object());
    (completes, label)
}

/// Outcomes that redelivery cannot change (the message belongs in the DLQ).
pub(super) fn is_permanent(label: &str) -> bool {
    matches!(label, "conflict" | "invalid-message" | "store-failure")
}

impl Sim {
    /// The lock of `i` ends without a completion: visible again, or dead-lettered when
    /// its deliveries are spent.
    pub(super) fn release(&self, books: &mut Books, i: usize, token: u64, why: &str) {
        let calm = books.calm;
        let q = &mut books.queue[i];
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
        if q.delivery_count >= MAX_DELIVERY_COUNT {
            q.state = QueueState::DeadLettered;
            q.dead_lettered_calm = calm && !is_permanent(&q.last_outcome);
            books.dead_lettered += 1;
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
        let now = Instant::now();
        let wall = world::wall_at(self.start);
        let mut books = self.books();
        if books
            .sent_at
            .get(message_id)
            .is_some_and(|at| now < *at + DUPLICATE_WINDOW)
        {
            trace_event!(self.trace, "broker drops duplicate {message_id}");
            return;
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
            redriven: false,
        });
        books.ready.push_back(i);
        drop(books);
        self.wake.notify_one();
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
            tokio::time::sleep(pause).await;
            self.publish(&c.message_id, c.body.clone(), self.claim_of(copy), c.kind);
            if let Some(payment) = self.hot.http.get(&copy) {
                let (sim, payment) = (self.clone(), payment.clone());
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

    /// The dead-letter re-drive: every dead letter sent again under its MessageId.
    pub(super) fn redrive(&self) {
        let now = Instant::now();
        let letters: Vec<(String, Vec<u8>, Option<String>, CopyKind)> = {
            let mut books = self.books();
            let Books { queue, sent_at, .. } = &mut *books;
            queue
                .iter_mut()
                // As `dead-letters resubmit`: only once the duplicate-detection window of
                // its MessageId has passed (the broker would drop it silently before).
                .filter(|q| {
                    q.state == QueueState::DeadLettered
                        && !q.redriven
                        && sent_at
                            .get(&q.message_id)
                            .is_none_or(|at| *at + DUPLICATE_WINDOW <= now)
                })
                .map(|q| {
                    q.redriven = true;
                    (
                        q.message_id.clone(),
                        q.body.clone(),
                        q.claim.clone(),
                        q.kind,
                    )
                })
                .collect()
        };
        self.books().redriven += letters.len() as u64;
        for (id, body, claim, kind) in letters {
            self.publish(&id, body, claim, kind);
        }
    }

    /// After the retention: a sample of originals sent again (their inbox records are
    /// purged; the payment must still guard).
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
                    let q = &mut books.queue[i];
                    q.delivery_count += 1;
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
            let body = envelope(&fields, DataType::Binary, "ClaimApproved").to_string();
            let request = Request::post("/ClaimApproved")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("a request");
            (request, q.claim.clone(), q.message_id.clone())
        };
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
            let (completes, label) = match answered {
                Ok(Some((status, body))) => {
                    let (completes, label) = judge(status, &body);
                    (completes, format!("{label} {}", status.as_u16()))
                }
                Ok(None) => (false, "no-answer".into()),
                Err(_) => {
                    // The host restarts the handler: every invocation in flight on the
                    // instance fails with this one (this task ends here too).
                    trace_event!(sim.trace, "function timeout #{i} {message_id} slot {slot}");
                    sim.crash(slot, true);
                    return;
                }
            };
            trace_event!(
                sim.trace,
                "answer #{i} {message_id} claim {} {label}",
                claim.as_deref().unwrap_or("-")
            );
            if completes {
                sim.check_durable(claim.as_deref(), &message_id).await;
            }
            sim.settle(slot, i, token, completes, label);
        };
        let mut books = self.books();
        books.instances[slot].tasks.spawn(task);
    }

    /// The host's verdict on invocation `token` of message `i`.
    pub(super) fn settle(&self, slot: usize, i: usize, token: u64, completes: bool, label: String) {
        let mut books = self.books();
        let kind = label.split(' ').next().unwrap_or("-").to_owned();
        *books.outcomes.entry(kind.clone()).or_default() += 1;
        if books.instances[slot].in_flight > 0 {
            books.instances[slot].in_flight -= 1;
        }
        let holds =
            matches!(books.queue[i].state, QueueState::Locked { token: t, .. } if t == token);
        books.queue[i].last_outcome = kind;
        if holds {
            if completes {
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
        let inbox = self.memory.inbox_snapshot();
        let done = inbox.iter().any(|r| {
            r.consumer == CONSUMER
                && r.claim_id.to_string() == claim
                && r.message_id.as_str() == message_id
                && r.status == claims_payments::seams::store::InboxStatus::Completed
        });
        let paid = self
            .memory
            .payments_snapshot()
            .iter()
            .any(|p| p.claim_id.to_string() == claim);
        if !done || !paid {
            self.checks.fail(Violation::new(
                "2xx-is-durable",
                Some(claim),
                format!("message {message_id} completed with inbox record completed: {done}, payment stored: {paid}"),
            ));
        }
    }
}
