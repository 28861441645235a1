//! The instances: processes that start (a new boot, fresh memory, a registration),
//! crash (every task dropped where it waits) and stop cleanly (in-flight work drains).
//! A process that follows a crash on its slot ends its predecessor's registration first,
//! as `serve` does on its port.

use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::ambient::Ambient;
use claims_payments::seams::bank::BankClient;
use claims_payments::seams::payments_api::CallerAuth;
use claims_payments::seams::services::Services;
use claims_payments::seams::{self, Registered};

use super::faults::Fault;
use super::state::*;
use super::timings::*;
use super::world::{self};
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
        let clock = world::ClockProfile::draw(&self.chaos, &self.dice, self.elapsed(), process);
        let skew = clock.describe();
        let ambient = world::ambient(self.start, process, clock, &self.chaos, &self.dice);
        if let Some(boot) = crashed {
            let _ = seams::end_registration_of(self.store.as_ref(), boot, ambient.now()).await;
        }
        // The process's own client: its session reads back what it wrote.
        let store: claims_payments::seams::store::DynStore = self.faulty.session(process);
        let registered = loop {
            match Registered::register(store.clone(), RETENTION, ambient.clone()).await {
                Ok(registered) => break registered,
                // `serve` exits and the host starts it again.
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        let client =
            BankClient::with_transport(&bank_settings(), self.bank.clone(), ambient.clone());
        let services = Services::new(store, Some(client), policy(), ambient.clone());
        let auth = if self.signed_in {
            CallerAuth::AppService
        } else {
            CallerAuth::FunctionKey
        };
        let router = seams::router(Arc::new(seams::app_state(&services, auth)));
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
        instance.alive = true;
        instance.starting = false;
        instance.in_flight = 0;
        drop(books);
        self.wake.notify_one();
    }

    /// A clean stop: in-flight work drains, the registration ends.
    pub(super) async fn stop_instance(&self, slot: usize) {
        let (mut tasks, registered) = {
            let mut books = self.books();
            let instance = &mut books.instances[slot];
            instance.alive = false;
            instance.router = None;
            (
                std::mem::take(&mut instance.tasks),
                instance.registered.take(),
            )
        };
        while tasks.join_next().await.is_some() {}
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
            let held: Vec<(usize, u64)> = books
                .queue
                .iter()
                .enumerate()
                .filter_map(|(i, q)| match q.state {
                    QueueState::Locked { token, instance } if instance == slot => Some((i, token)),
                    _ => None,
                })
                .collect();
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
                // processes sit it out (and a day of per-second crash draws costs time).
                tokio::time::sleep(KEY_WINDOW).await;
                continue;
            }
            let slots = self.books().instances.len();
            for slot in 0..slots {
                if self.chaos.fires(Fault::HandlerCrash, "handler") {
                    self.crash(slot, true);
                } else if self.chaos.fires(Fault::InstanceLost, "instance") {
                    self.crash(slot, false);
                }
            }
        }
    }
}
