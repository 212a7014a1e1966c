//! How a time is written wherever entrega writes one: events, API bodies,
//! the console and the tools; and how a duration becomes an SQL interval.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `at` as RFC 3339. Formatting fails only for a year outside 0..=9999,
/// which no clock here produces; such a time is written as `time` writes
/// it rather than lost.
pub fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_else(|_| at.to_string())
}

/// `duration` as the `time::Duration` the queries bind for an `interval`
/// parameter; one too long for it (none configured here is) saturates
/// rather than fails.
pub fn interval(duration: std::time::Duration) -> time::Duration {
    time::Duration::try_from(duration).unwrap_or(time::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_too_long_for_an_interval_saturates() {
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(interval(day), time::Duration::days(1));
        assert_eq!(interval(std::time::Duration::MAX), time::Duration::MAX);
    }

    #[test]
    fn a_time_is_written_as_rfc_3339() {
        let at = OffsetDateTime::from_unix_timestamp(1_764_928_800).unwrap();
        assert_eq!(rfc3339(at), "2025-12-05T10:00:00Z");
    }
}
