/// How many units of one sku an order asks for: 1 to 10 000.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity(i32);

impl Quantity {
    pub const MAX: i32 = 10_000;

    pub fn parse(value: i64) -> Result<Self, String> {
        match i32::try_from(value) {
            Ok(quantity) if (1..=Self::MAX).contains(&quantity) => Ok(Self(quantity)),
            _ => Err(format!("must be between 1 and {}", Self::MAX)),
        }
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(Quantity::parse(1).map(Quantity::get), Ok(1));
        assert_eq!(Quantity::parse(10_000).map(Quantity::get), Ok(10_000));
        assert!(Quantity::parse(0).is_err());
        assert!(Quantity::parse(10_001).is_err());
    }

    proptest! {
        #[test]
        fn accepts_exactly_one_to_ten_thousand(value in any::<i64>()) {
            prop_assert_eq!(Quantity::parse(value).is_ok(), (1..=10_000).contains(&value));
        }
    }
}
