use std::fmt;

use uuid::Uuid;

/// An order's identifier: a UUIDv7, so new orders sort after old ones and
/// append to the primary-key index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OrderId(Uuid);

impl OrderId {
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl Default for OrderId {
    fn default() -> Self {
        Self::new()
    }
}

impl From<Uuid> for OrderId {
    fn from(value: Uuid) -> Self {
        Self(value)
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_version_7_and_increase() {
        let first = OrderId::new();
        let second = OrderId::new();
        assert_eq!(first.as_uuid().get_version_num(), 7);
        assert!(second.as_uuid() > first.as_uuid());
    }
}
