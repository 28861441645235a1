//! The instances: processes that start (a new boot, fresh memory, a registration),
//! crash (every task dropped where it waits: the host's and the product's own, see
//! `Work`) and stop cleanly (in-flight work drains), and pause: for tens of seconds no
//! call of theirs reaches the store or the bank ([`Pause`]), longer than their
//! registration lasts, while they hold leases; then they run on.
//! A process that follows a crash on its slot ends its predecessor's registration first,
//! as `serve` does on its port.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use claims_payments::seams::ambient::Ambient;
use claims_payments::seams::bank::transport::{
    BankAnswer, BankCall, BankTransport, TransportFailure,
};
use claims_payments::seams::startup::Composition;
use claims_payments::seams::store::{DynStore, Store, StoreCall, StoreDecorator, StoreResult};
use claims_payments::seams::{self, Registered};
use tokio::time::Instant;

use super::clocks;
use super::faults::Fault;
use super::state::*;
use super::timings::*;
use crate::trace_event;

impl Sim {
    /// Starts (or restarts) the process in `slot`: a new boot, fresh memory. A process
    /// that follows a crash on the same slot ends its predecessor's registration first,
    /// as `serve` does on its port.
    pub(super) async fn start_instance(self: Arc<Self>, slot: usize) {
        let (process, crashed) = {
            let mut books = self.books();
            let instance = &mut books.instances[slot];
            if instance.alive || instance.starting {
                return;
            }
            instance.starting = true;
            let crashed = instance.crashed_boot.take();
            books.processes += 1;
            (books.processes, crashed)
        };
        let clock = clocks::ClockProfile::draw(&self.chaos, &self.dice, self.elapsed(), process);
        let skew = clock.describe();
        let ambient = clocks::ambient(self.start, process, clock, &self.chaos, &self.dice);
        if let Some(boot) = crashed {
            let _ = seams::end_registration_of(self.store.as_ref(), boot, ambient.now()).await;
        }
        // Everything the process sends goes through its pause.
        let pause = Arc::new(Pause::default());
        let store: DynStore = Arc::new(PausedStore {
            inner: self.faulty.session(process),
            pause: pause.clone(),
        });
        let bank = Arc::new(PausedBank {
            inner: self.bank.clone(),
            pause: pause.clone(),
        });
        let registered = loop {
            match Registered::register(store.clone(), RETENTION, ambient.clone()).await {
                Ok(registered) => break registered,
                // `serve` exits and the host starts it again.
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        // Wired by the product's composition root, on the simulator's store, clock and bank.
        let Composition {
            services, router, ..
        } = Composition::new(
            &settings(self.signed_in),
            store,
            seams::Seams {
                ambient: Some(ambient.clone()),
                bank_transport: Some(bank),
                ..seams::Seams::default()
            },
        )
        .expect("the simulated deployment's settings are valid");
        trace_event!(
            self.trace,
            "start slot {slot} process {process} boot {} clock {skew}",
            ambient.boot()
        );
        let mut books = self.books();
        let instance = &mut books.instances[slot];
        instance.process = process;
        instance.ambient = Some(ambient);
        instance.router = Some(router);
        instance.registered = Some(registered);
        instance.work = Some(services.work().clone());
        instance.pause = pause;
        instance.alive = true;
        instance.starting = false;
        instance.in_flight = 0;
        drop(books);
        self.wake.notify_one();
    }

    /// A clean stop: in-flight work drains, the registration ends.
    pub(super) async fn stop_instance(&self, slot: usize) {
        let (mut tasks, work, registered) = {
            let mut books = self.books();
            let instance = &mut books.instances[slot];
            instance.alive = false;
            instance.router = None;
            (
                std::mem::take(&mut instance.tasks),
                instance.work.take(),
                instance.registered.take(),
            )
        };
        while tasks.join_next().await.is_some() {}
        if let Some(work) = work {
            work.drain().await;
        }
        if let Some(registered) = registered {
            registered.end().await;
        }
        trace_event!(self.trace, "stop slot {slot}");
    }

    /// A crash: every task of the process is dropped where it waits, its memory is
    /// gone. `host_alive`: the host saw the handler die and abandons its invocations at
    /// once; otherwise the whole instance is gone and their locks run out.
    pub(super) fn crash(self: &Arc<Self>, slot: usize, host_alive: bool) {
        let mut books = self.books();
        let instance = &mut books.instances[slot];
        if !instance.alive {
            return;
        }
        instance.tasks.abort_all();
        // The product's own tasks die with the process too.
        if let Some(work) = instance.work.take() {
            work.abort_all();
        }
        instance.alive = false;
        instance.router = None;
        instance.in_flight = 0;
        instance.registered = None;
        instance.crashed_boot = if host_alive {
            instance.ambient.as_ref().map(Ambient::boot)
        } else {
            None
        };
        let process = instance.process;
        trace_event!(
            self.trace,
            "crash slot {slot} process {process} host_alive {host_alive}"
        );
        if host_alive {
            let held = locked_on(&books, slot);
            for (i, token) in held {
                self.release(&mut books, i, token, "handler-crashed");
            }
        }
        drop(books);
        let delay = if host_alive {
            self.dice.millis(250, 3_000)
        } else {
            self.dice.millis(5_000, 120_000)
        };
        let sim = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            sim.start_instance(slot).await;
        });
    }

    /// Process faults: each second of the chaos phase, each live instance may crash.
    pub(super) async fn crashes(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if !self.chaos.is_on() {
                return;
            }
            if self.bank_dark.load(std::sync::atomic::Ordering::Relaxed) {
                // The bank's long outage is about payouts outliving their keys; the
                // processes sit it out (a day of per-second crash draws costs time), and
                // crash again once it is back.
                tokio::time::sleep(Duration::from_secs(60)).await;
                continue;
            }
            let slots = self.books().instances.len();
            for slot in 0..slots {
                if self.chaos.fires(Fault::HandlerCrash, "handler") {
                    self.crash(slot, true);
                } else if self.chaos.fires(Fault::InstanceLost, "instance") {
                    self.crash(slot, false);
                } else if self.chaos.fires(Fault::ProcessPaused, "process") {
                    self.pause(slot);
                }
            }
        }
    }
}

impl Sim {
    /// Pauses the process in `slot` for longer than its registration lasts. Its host is
    /// frozen with it: the locks of its deliveries are no longer renewed and run out
    /// within a lock duration, so their messages go to other instances, which find its
    /// leases held by a process whose registration ran out.
    pub(super) fn pause(&self, slot: usize) {
        let mut books = self.books();
        let instance = &books.instances[slot];
        if !instance.alive || instance.pause.is_paused() {
            return;
        }
        let how_long = self.dice.millis(35_000, 150_000);
        let now = Instant::now();
        instance.pause.until(now + how_long);
        let process = instance.process;
        trace_event!(
            self.trace,
            "pause slot {slot} process {process} for {} ms",
            how_long.as_millis()
        );
        let held = locked_on(&books, slot);
        for (i, token) in held {
            let renewed = self.dice.millis(0, LOCK.as_millis() as u64);
            books.locks.insert((now + renewed, i, token));
        }
    }
}

/// The store as one process reaches it: through its pause.
struct PausedStore {
    inner: DynStore,
    pause: Arc<Pause>,
}

impl StoreDecorator for PausedStore {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    async fn around<T: Send + 'static>(
        &self,
        _call: StoreCall<'_>,
        work: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        self.pause.pass().await;
        let answer = work.await;
        self.pause.pass().await;
        answer
    }
}

/// The bank as one process reaches it: through its pause.
struct PausedBank {
    inner: Arc<super::bank::SimBank>,
    pause: Arc<Pause>,
}

#[async_trait]
impl BankTransport for PausedBank {
    async fn send(&self, call: BankCall<'_>) -> Result<BankAnswer, TransportFailure> {
        self.pause.pass().await;
        let answer = self.inner.send(call).await;
        self.pause.pass().await;
        answer
    }
}

/// The messages locked by invocations on `slot`, with their locks' tokens, in queue
/// order. Every locked message has its lock among `books.locks` (an entry leaves it only
/// when it runs out, and then releases the message), so those are all it looks at, not
/// the whole queue.
fn locked_on(books: &Books, slot: usize) -> Vec<(usize, u64)> {
    let held: BTreeSet<(usize, u64)> = books
        .locks
        .iter()
        .filter(|&&(_, i, token)| {
            books.queue[i].state
                == (QueueState::Locked {
                    token,
                    instance: slot,
                })
        })
        .map(|&(_, i, token)| (i, token))
        .collect();
    held.into_iter().collect()
}
