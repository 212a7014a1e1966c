use std::fmt;

/// A stock-keeping unit code: 1 to 64 of `A-Z`, `0-9` and `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sku(String);

impl Sku {
    pub const MAX_LEN: usize = 64;

    pub fn parse(value: String) -> Result<Self, String> {
        let valid_chars = value
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-');
        if value.is_empty() || value.len() > Self::MAX_LEN || !valid_chars {
            return Err(format!(
                "must match [A-Z0-9-]{{1,{}}} (upper-case letters, digits and '-')",
                Self::MAX_LEN
            ));
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_codes_of_the_allowed_alphabet() {
        for good in ["ABC-1", "0", "-", &"Z".repeat(64)] {
            assert!(Sku::parse(good.to_owned()).is_ok(), "{good:?} was refused");
        }
    }

    #[test]
    fn refuses_empty_lower_case_spaces_unicode_and_too_long() {
        for bad in ["", "abc-1", "AB C", "ÄBC", "ABC_1", &"Z".repeat(65)] {
            assert!(Sku::parse(bad.to_owned()).is_err(), "{bad:?} was accepted");
        }
    }

    proptest! {
        #[test]
        fn accepts_exactly_the_documented_pattern(value in "\\PC{0,70}") {
            let matches = (1..=64).contains(&value.len())
                && value.bytes().all(|b| matches!(b, b'A'..=b'Z' | b'0'..=b'9' | b'-'));
            prop_assert_eq!(Sku::parse(value).is_ok(), matches);
        }

        #[test]
        fn accepts_every_code_of_the_alphabet(value in "[A-Z0-9-]{1,64}") {
            prop_assert!(Sku::parse(value).is_ok());
        }
    }
}
