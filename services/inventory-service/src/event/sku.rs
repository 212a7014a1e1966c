//! `Sku`: a stock-keeping unit code, `[A-Z0-9-]{1,64}`. One type for the
//! HTTP API's path and the events' items, so both accept the same codes.

use std::fmt;

/// A valid sku; built only through [`Sku::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sku(String);

/// The rule, for error messages and the OpenAPI document.
pub const SKU_PATTERN: &str = "^[A-Z0-9-]{1,64}$";

impl Sku {
    pub fn parse(text: &str) -> Option<Self> {
        let valid = (1..=64).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-');
        valid.then(|| Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn codes_follow_the_pattern() {
        for good in ["A", "ABC-1", "0-9", &"Z".repeat(64)] {
            assert!(Sku::parse(good).is_some(), "{good:?}");
        }
        for bad in ["", "abc", "AB C", "AB_C", "ÁB", &"Z".repeat(65)] {
            assert!(Sku::parse(bad).is_none(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn parse_agrees_with_the_pattern(text in "\\PC{0,70}") {
            let matches = (1..=64).contains(&text.len())
                && text.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '-');
            prop_assert_eq!(Sku::parse(&text).is_some(), matches);
        }
    }
}
