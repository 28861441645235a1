//! The one error of every setting parser, and the number parsers they share.

use std::time::Duration;

/// A setting that cannot be used, named as the operator wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {setting}: {problem}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub problem: String,
}

impl ConfigError {
    pub fn new(setting: &'static str, problem: impl Into<String>) -> Self {
        ConfigError {
            setting,
            problem: problem.into(),
        }
    }
}

/// A whole number, or an error naming `setting`.
pub fn parse_u64(setting: &'static str, value: &str) -> Result<u64, ConfigError> {
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| ConfigError::new(setting, format!("{value:?} is not a whole number")))
}

/// A whole number within `range`, or an error naming `setting` and the range, then
/// `why` (its unit, or what a value outside it would break).
pub fn whole_number_within(
    setting: &'static str,
    value: &str,
    range: std::ops::RangeInclusive<u64>,
    why: &str,
) -> Result<u64, ConfigError> {
    let n = parse_u64(setting, value)?;
    if !range.contains(&n) {
        return Err(ConfigError::new(
            setting,
            format!("{n} is outside {}..={}{why}", range.start(), range.end()),
        ));
    }
    Ok(n)
}

pub fn millis(
    setting: &'static str,
    value: &str,
    min: u64,
    max: u64,
) -> Result<Duration, ConfigError> {
    let ms = parse_u64(setting, value)?;
    if !(min..=max).contains(&ms) {
        return Err(ConfigError::new(
            setting,
            format!("{ms} ms is outside {min}..={max} ms"),
        ));
    }
    Ok(Duration::from_millis(ms))
}
