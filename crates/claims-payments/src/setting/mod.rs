//! The vocabulary of settings, below everything that reads one: their names, defined
//! once, and the one error a settings parser returns, with the number parsers they share.
//! Each module parses its own group (the stores, the bank); the `config` module composes
//! them into the process's settings.

mod error;
pub mod names;

pub use error::ConfigError;
pub(crate) use error::{millis, parse_u64};
