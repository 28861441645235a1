//! The bank: the engine's payout client ([`claims_payments_engine::bank`]: answers
//! classified, retries inside a send window, the clock check) on the HTTPS transport
//! built here ([`http`]), and the `BANK_*` settings ([`settings`]).

pub use claims_payments_engine::bank::*;

pub(crate) mod http;
pub(crate) mod settings;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::ambient::Ambient;

/// The bank over HTTPS, on the system's clock.
pub fn https_client(settings: &BankSettings) -> anyhow::Result<BankClient> {
    Ok(BankClient::with_transport(
        settings,
        Arc::new(http::HttpTransport::new(settings)?),
        Ambient::system(),
    ))
}
