//! The services of one process, built once by the composition root (`startup`, or the
//! simulator through `seams`): the store, the bank client when payouts are on, the
//! consumer's policy, the ambient (clock, randomness, process identity), what is
//! known about the processes behind leases, and the process's own [`Work`]: the tasks
//! its requests run on. Each part takes from them only what it uses.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use crate::ambient::Ambient;
use crate::bank::BankClient;
use crate::consumer::{Consumer, Policy};
use crate::lease::liveness::Owners;
use crate::store::DynStore;

/// What the parts of one process share.
#[derive(Clone)]
pub struct Services {
    pub store: DynStore,
    /// `None` in ledger-only mode.
    pub bank: Option<BankClient>,
    pub policy: Policy,
    pub ambient: Ambient,
    /// Whether the processes behind live leases are still running: one view per
    /// process, shared by the consumer, the payments API and reconcile.
    pub owners: Arc<Owners>,
    /// The tasks the functions run their work on, owned by the process.
    pub work: Work,
}

impl Services {
    pub fn new(
        store: DynStore,
        bank: Option<BankClient>,
        policy: Policy,
        ambient: Ambient,
    ) -> Self {
        Services {
            owners: Arc::new(Owners::new(store.clone(), ambient.clone())),
            work: Work::default(),
            store,
            bank,
            policy,
            ambient,
        }
    }

    /// The tasks this process's requests run on.
    pub fn work(&self) -> &Work {
        &self.work
    }

    /// Whether payouts are on (a bank is configured).
    pub fn pays_out(&self) -> bool {
        self.bank.is_some()
    }

    /// The consumer on these services.
    pub fn consumer(&self) -> Consumer {
        Consumer::with_owners(
            self.store.clone(),
            self.bank.clone(),
            self.policy.clone(),
            self.ambient.clone(),
            self.owners.clone(),
        )
    }
}

/// The tasks a process runs its requests' work on (a delivery, an HTTP payment), so that
/// a request whose connection drops does not cut its work half-way. They belong to the
/// process, not to the runtime: a clean stop waits for them ([`Work::drain`]), and
/// whatever ends the process ends them too ([`Work::abort_all`], and dropping the last
/// handle), as the host's restart of the handler does. Work detached from the process
/// would outlive it: a successor that ended its registration would meet a dead
/// process's payout still running.
#[derive(Clone, Default)]
pub struct Work {
    tasks: Arc<Mutex<JoinSet<()>>>,
}

impl Work {
    fn tasks(&self) -> std::sync::MutexGuard<'_, JoinSet<()>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `work` on a task of the process; its result, or `None` if the task ended
    /// without one (it panicked, or the process is ending).
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut tasks = self.tasks();
            // Finished tasks are reaped here, so the set holds only running ones.
            while tasks.try_join_next().is_some() {}
            tasks.spawn(async move {
                let _ = tx.send(work.await);
            });
        }
        rx.await.ok()
    }

    /// How many tasks are still running.
    pub fn running(&self) -> usize {
        let mut tasks = self.tasks();
        while tasks.try_join_next().is_some() {}
        tasks.len()
    }

    /// Ends every task where it waits: the process ends.
    pub fn abort_all(&self) {
        self.tasks().abort_all();
    }

    /// Waits for every task running now to finish (a clean stop).
    pub async fn drain(&self) {
        let mut tasks = std::mem::take(&mut *self.tasks());
        while tasks.join_next().await.is_some() {}
    }
}
