//! The vocabulary of settings, below everything that reads one: their names, defined
//! once, and the one error a settings parser returns, with the number parsers they share.
//! Each module parses its own group (the stores, the bank); the `configuration` module composes
//! them into the process's settings.

mod error;
pub mod names;

pub use error::ConfigError;
pub(crate) use error::{millis, parse_u64, whole_number_within};

/// A setting's value through `lookup`, trimmed; a blank one counts as unset, since app
/// settings are often blanked rather than removed.
pub(crate) fn non_blank(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    lookup(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A settings lookup over fixed name-value pairs, so the parsers' tests state the
/// environment they read as a table.
#[cfg(test)]
pub(crate) fn lookup_in(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}
