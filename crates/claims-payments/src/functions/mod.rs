//! One module per function of the app, as `function-app/<Name>/function.json` declares
//! them: what the host sends to each route, and what it gets back.
//!
//! - [`claim_approved`]: `POST /ClaimApproved`, the Service Bus trigger;
//! - [`payments`]: `POST /api/payments` and `GET /api/payments/{claimId}`, the HTTP
//!   functions `Payments` and `PaymentsGet` (forwarded unchanged by the host);
//! - [`reconcile`]: `POST /Reconcile`, the timer trigger;
//! - [`purge`]: `POST /Purge`, the retention timer trigger.

pub mod claim_approved;
pub mod payments;
pub mod purge;
pub mod reconcile;
