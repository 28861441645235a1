//! Money: an ISO 4217 currency and a positive decimal amount, under one strict grammar.
//!
//! Money is `rust_decimal::Decimal` end to end. A JSON number is taken from its raw
//! text (`serde_json::value::RawValue`), never through `f64`.

use std::fmt;

use iso_currency::Currency as IsoCurrency;
use rust_decimal::Decimal;
use serde_json::value::RawValue;

use super::{canonical, json_error, json_type, InvalidMessage};

/// An ISO 4217 currency with a defined number of minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency(IsoCurrency);

impl Currency {
    pub fn parse(s: &str) -> Result<Self, InvalidMessage> {
        let currency = IsoCurrency::from_code(s).ok_or_else(|| {
            InvalidMessage::new(
                "currency",
                "is not an ISO 4217 code (three capital letters, e.g. EUR)",
            )
        })?;
        if currency.exponent().is_none() {
            return Err(InvalidMessage::new(
                "currency",
                "has no minor unit (a fund or metal code), so it cannot be paid out",
            ));
        }
        Ok(Currency(currency))
    }

    pub fn code(&self) -> &'static str {
        self.0.code()
    }

    /// Fraction digits the currency allows, capped at the contract's two.
    fn max_fraction_digits(&self) -> u32 {
        u32::from(self.0.exponent().unwrap_or(0)).min(Money::MAX_FRACTION_DIGITS)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A positive amount in a currency, with at most two fraction digits (fewer if the
/// currency has fewer minor units). Trailing zeros are not precision: `12.50` and
/// `12.5` are the same amount and hash the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Money {
    amount: Decimal,
    currency: Currency,
}

impl Money {
    pub const MAX_FRACTION_DIGITS: u32 = 2;
    /// One trillion minus a cent: larger is a producer bug, not a claim.
    pub const MAX_AMOUNT: Decimal = Decimal::from_parts(276_447_231, 23_283, 0, false, 2);

    pub fn new(amount: Decimal, currency: Currency) -> Result<Self, InvalidMessage> {
        let amount = amount.normalize();
        if amount <= Decimal::ZERO {
            return Err(InvalidMessage::new("amount", "must be positive"));
        }
        if amount > Self::MAX_AMOUNT {
            return Err(InvalidMessage::new(
                "amount",
                format!("exceeds the maximum {}", Self::MAX_AMOUNT),
            ));
        }
        let allowed = currency.max_fraction_digits();
        if amount.scale() > allowed {
            return Err(InvalidMessage::new(
                "amount",
                format!(
                    "has {} fraction digits; {} allows at most {allowed}",
                    amount.scale(),
                    currency.code()
                ),
            ));
        }
        Ok(Money { amount, currency })
    }

    pub fn amount(&self) -> Decimal {
        self.amount
    }

    pub fn currency(&self) -> Currency {
        self.currency
    }

    /// Reads an amount and a currency back from the store, where [`Money::amount_string`]
    /// and [`Currency::code`] wrote them: the message's strict grammar and limits, and
    /// the canonical form, so that writing the value again gives the same bytes.
    pub fn from_stored(amount: &str, currency: &str) -> Result<Self, InvalidMessage> {
        if !is_plain_decimal(amount) {
            return Err(InvalidMessage::new(
                "amount",
                "is not a plain decimal number",
            ));
        }
        let value = Decimal::from_str_exact(amount)
            .map_err(|_| InvalidMessage::new("amount", "is out of range"))?;
        let money = Money::new(value, Currency::parse(currency)?)?;
        canonical("amount", amount, &money.amount_string())?;
        Ok(money)
    }

    /// The amount as the string every document and the bank body carry, with the
    /// currency's fraction digits (`12.50`, `1000` for JPY).
    pub fn amount_string(&self) -> String {
        let mut rounded = self.amount;
        rounded.rescale(self.currency.max_fraction_digits());
        rounded.to_string()
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount_string(), self.currency)
    }
}

/// Parses an amount from the raw JSON text: a string (`"12.50"`) or a number (`12.5`),
/// without ever going through `f64`. One strict grammar for both: an optional `-` (so
/// a negative amount is refused as such), digits, and optionally `.` and more digits.
/// No exponent, sign `+`, separators, spaces or a bare `.`: money from another system
/// that does not match is refused, never guessed at.
pub(super) fn parse_amount(raw: &RawValue) -> Result<Decimal, InvalidMessage> {
    let text = raw.get().trim();
    let literal = if text.starts_with('"') {
        serde_json::from_str::<String>(text).map_err(|e| {
            InvalidMessage::new(
                "amount",
                format!("is not a valid JSON string: {}", json_error(&e)),
            )
        })?
    } else if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        text.to_owned()
    } else {
        let got = serde_json::from_str(text)
            .map(|v| json_type(&v))
            .unwrap_or("not JSON");
        return Err(InvalidMessage::new(
            "amount",
            format!("must be a decimal number or a string holding one, got {got}"),
        ));
    };
    if !is_plain_decimal(&literal) {
        return Err(InvalidMessage::new(
            "amount",
            "is not a plain decimal number (digits, optionally '.' and digits)",
        ));
    }
    Decimal::from_str_exact(&literal).map_err(|_| InvalidMessage::new("amount", "is out of range"))
}

/// An amount another party (the bank) wrote, under the same strict grammar as a
/// message's: `None` for anything else. Its scale is kept for display; decimals
/// compare by value, so `75.0` equals `75.00`.
pub fn parse_decimal_amount(text: &str) -> Option<Decimal> {
    if !is_plain_decimal(text) {
        return None;
    }
    Decimal::from_str_exact(text).ok()
}

/// `-?[0-9]+(\.[0-9]+)?`
fn is_plain_decimal(s: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let unsigned = s.strip_prefix('-').unwrap_or(s);
    match unsigned.split_once('.') {
        Some((whole, fraction)) => digits(whole) && digits(fraction),
        None => digits(unsigned),
    }
}
