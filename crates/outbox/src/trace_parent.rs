use std::fmt;

/// A W3C Trace Context `traceparent` header value, kept as the 55 characters
/// `version-traceid-parentid-flags` so it can be handed on to Kafka.
///
/// Per the specification, an invalid header is ignored rather than refused:
/// tracing must never make a request fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent(String);

const LEN: usize = 55;

fn is_lower_hex(part: &str) -> bool {
    part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TraceParent {
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let head = value.get(..LEN)?;
        let mut parts = head.split('-');
        let (version, trace_id, parent_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let well_formed = [(version, 2), (trace_id, 32), (parent_id, 16), (flags, 2)]
            .iter()
            .all(|(part, len)| part.len() == *len && is_lower_hex(part));
        if !well_formed || parts.next().is_some() || version == "ff" {
            return None;
        }
        // Version 00 is exactly 55 characters; later versions may append
        // fields after a '-', which this service does not carry.
        let rest = &value[LEN..];
        if (version == "00" && !rest.is_empty()) || (!rest.is_empty() && !rest.starts_with('-')) {
            return None;
        }
        if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
            return None;
        }
        Some(Self(head.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn accepts_the_specification_example() {
        assert_eq!(
            TraceParent::parse(VALID).map(|t| t.0),
            Some(VALID.to_owned())
        );
    }

    #[test]
    fn keeps_the_known_fields_of_a_future_version() {
        let future =
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert_eq!(
            TraceParent::parse(future).map(|t| t.0),
            Some(future[..LEN].to_owned())
        );
    }

    #[test]
    fn ignores_malformed_values() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?} was accepted");
        }
    }
}
