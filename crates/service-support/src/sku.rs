//! `Sku`: a stock-keeping unit code, `[A-Z0-9-]{1,64}`. One type for every
//! place a code enters: the order API's items, the inventory's events and
//! its stock API, so all of them accept the same codes.

use std::fmt;

/// A valid code; built only through [`Sku::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sku(String);

/// The rule, for error messages and the OpenAPI documents.
pub const SKU_PATTERN: &str = "^[A-Z0-9-]{1,64}$";

/// Why a text is not a code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must match [A-Z0-9-]{{1,{max}}} (upper-case letters, digits and '-')", max = Sku::MAX_LEN)]
pub struct InvalidSku;

impl Sku {
    pub const MAX_LEN: usize = 64;

    pub fn parse(text: &str) -> Result<Self, InvalidSku> {
        let valid = (1..=Self::MAX_LEN).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-');
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(InvalidSku)
        }
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
        for good in ["A", "ABC-1", "0", "-", "0-9", &"Z".repeat(64)] {
            assert!(Sku::parse(good).is_ok(), "{good:?} was refused");
        }
        for bad in [
            "",
            "abc",
            "abc-1",
            "AB C",
            "AB_C",
            "ÁB",
            "ÄBC",
            &"Z".repeat(65),
        ] {
            assert_eq!(Sku::parse(bad), Err(InvalidSku), "{bad:?} was accepted");
        }
        assert_eq!(
            InvalidSku.to_string(),
            "must match [A-Z0-9-]{1,64} (upper-case letters, digits and '-')"
        );
    }

    proptest! {
        #[test]
        fn parse_agrees_with_the_pattern(text in "\\PC{0,70}") {
            let matches = (1..=64).contains(&text.len())
                && text.bytes().all(|b| matches!(b, b'A'..=b'Z' | b'0'..=b'9' | b'-'));
            prop_assert_eq!(Sku::parse(&text).is_ok(), matches);
        }

        #[test]
        fn accepts_every_code_of_the_alphabet(text in "[A-Z0-9-]{1,64}") {
            prop_assert!(Sku::parse(&text).is_ok());
        }
    }
}
