//! The vocabulary of settings, below everything that reads one: their names, defined
//! once, the one error a settings parser returns, with the number parsers they share, and
//! [`entra`]: which Microsoft Entra identity a part uses and its credential, built once
//! per process. Each part parses its own group (the store adapters, the bank); the
//! product's `configuration` module composes them into the process's settings.
//!
//! A crate of its own so that the store adapters, each a crate, and the product read
//! settings and choose identities by the same rules without depending on one another.
//! The credential itself (the Azure identity SDK and its HTTP client) is the `credential`
//! feature: a part that never logs in with Entra (the SQLite store) goes without it.

pub mod entra;
mod error;
pub mod names;

pub use error::ConfigError;
pub use error::{millis, parse_u64, whole_number_within};

/// A setting's value through `lookup`, trimmed; a blank one counts as unset, since app
/// settings are often blanked rather than removed.
pub fn non_blank(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A settings lookup over fixed name-value pairs, so the parsers' tests (here and in the
/// crates that read settings) state the environment they read as a table.
pub fn lookup_in(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}
