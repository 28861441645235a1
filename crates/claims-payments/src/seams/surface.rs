//! What the development crate, the test kit and the tests may name, module by module:
//! each list below is the whole of what is reachable from outside the product (beside
//! the root's few items and the hooks in [`super`]). The modules keep the names of the
//! product's own, so a path reads the same inside and out.

/// The wall clock, randomness and identity a simulator replaces.
pub mod ambient {
    pub use crate::ambient::{Ambient, Boot, Entropy, WallClock};
}

/// The payout client and the transport a simulated bank stands behind.
pub mod bank {
    pub use crate::bank::{https_client, BankClient, BankSettings, PayoutOutcome, SendWindow};
    /// The one seam below the bank client.
    pub mod transport {
        pub use crate::bank::transport::{
            BankAnswer, BankCall, BankTransport, BodyFailure, TransportFailure,
        };
    }
}

/// The operator commands.
pub mod cli {
    pub use crate::cli::{run, OperatorCommand};
}

/// The process's settings.
pub mod configuration {
    pub use crate::configuration::{Settings, DEV_ONLY_SETTINGS};
}

/// The engine, for tests that drive it without the host.
pub mod consumer {
    pub use crate::consumer::{Consumer, Delivery, Outcome, Policy};
}

/// The operator's dead-letter tool, for tests against a broker.
pub mod dead_letters {
    pub use crate::dead_letters::{
        discard, discard_each, list, resubmit, Options, Selection, REDRIVE_PROPERTY,
    };
    /// What became of one dead letter.
    pub mod verdict {
        pub use crate::dead_letters::verdict::Verdict;
    }
}

/// The functions' routes.
pub mod functions {
    pub use crate::functions::{metrics, ready};
    /// `POST /ClaimApproved`.
    pub mod claim_approved {
        pub use crate::functions::claim_approved::{ClaimHandler, FUNCTION_NAME};
    }
    /// The custom-handler protocol's invocation envelope.
    pub mod envelope {
        pub use crate::functions::envelope::{BodyEncoding, Invocation};
    }
    /// The body limits.
    pub mod limits {
        pub use crate::functions::limits::read_body;
    }
}

/// The HTTP Idempotency-Key API.
pub mod payments_api {
    pub use crate::payments_api::{CallerAuth, PaymentsApi};
}

/// Reconciliation.
pub mod reconcile {
    pub use crate::reconcile::{Options, Reconciler, RunCounts, Summary, MAX_PER_RUN};
}

/// The broker port the dead-letter tool uses (the simulator's broker stands behind it),
/// and its REST client.
pub mod servicebus {
    pub use crate::servicebus::{
        header_json, unquote, Broker, BrokerMessageId, BusError, BusErrorKind, DeadLetter, Lock,
        LockToken, Locked, Outgoing, Property,
    };
    /// The REST client.
    pub mod rest {
        pub use crate::servicebus::rest::{Auth, RestBroker};
    }
}

/// What one process's parts share, built once.
pub mod services {
    pub use crate::services::{Services, Work};
}

/// The composition root.
pub mod startup {
    pub use crate::startup::{open_store, serve, AppState, Application, Composition};
}

/// The store port and its records: what a conformance suite, a decorator or another store
/// needs. The three adapters are crates of their own (`claims_payments_sqlite`,
/// `claims_payments_postgres`, `claims_payments_cosmos`), named directly.
pub mod store {
    pub use crate::store::{
        AttemptId, ClaimResult, DynStore, Finalize, InboxKey, InboxOutcome, InboxRecord,
        InboxStatus, InsertResult, Listed, PaymentRecord, PaymentStatus, Store, StoreCall,
        StoreDecorator, StoreError, StoreResult, Version, Versioned,
    };
}

/// Logs, counters and traces.
pub mod telemetry {
    pub use crate::telemetry::{counters, quiet_library_backtraces};
    /// Sampling.
    pub mod sampling {
        pub use crate::telemetry::sampling::keeps_share;
    }
    /// The exporters' settings.
    pub mod export {
        pub use crate::telemetry::export::SETTINGS;
    }
}
