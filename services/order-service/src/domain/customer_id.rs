use std::fmt;

/// The customer an order belongs to: 1 to 128 characters, not blank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomerId(String);

impl CustomerId {
    pub const MAX_CHARS: usize = 128;

    pub fn parse(value: String) -> Result<Self, String> {
        if value.trim().is_empty() {
            return Err("must not be empty".to_owned());
        }
        if value.chars().count() > Self::MAX_CHARS {
            return Err(format!("must be at most {} characters", Self::MAX_CHARS));
        }
        if value.chars().any(char::is_control) {
            return Err("must not contain control characters".to_owned());
        }
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CustomerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_typical_id_and_the_longest_one() {
        assert!(CustomerId::parse("c-42".into()).is_ok());
        assert!(CustomerId::parse("é".repeat(128)).is_ok());
    }

    #[test]
    fn refuses_empty_blank_too_long_and_control_characters() {
        for bad in [
            "".to_owned(),
            "   ".to_owned(),
            "x".repeat(129),
            "a\u{0}b".to_owned(),
        ] {
            assert!(
                CustomerId::parse(bad.clone()).is_err(),
                "{bad:?} was accepted"
            );
        }
    }
}
