//! The services of one process, built once by the composition root (`startup`, or the
//! simulator through `seams`): the store, the bank client when payouts are on, the
//! consumer's policy, the ambient (clock, randomness, process identity) and what is
//! known about the processes behind leases. Each part takes from them only what it uses.

use std::sync::Arc;

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
    pub(crate) owners: Arc<Owners>,
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
            store,
            bank,
            policy,
            ambient,
        }
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
