//! Why a record could not be applied, and what follows from it.
//!
//! Three classes (docs/inventory-service.md):
//! - **invalid**: nothing about the record will ever change; straight to
//!   the DLT with the reason ([`InvalidMessage`]);
//! - **message-scoped transient**: the record's own transaction failed (a
//!   lock timeout on a hot row, serialization failure, deadlock, statement
//!   timeout); retried, then the DLT as `retries-exhausted`;
//! - **database unavailable**: not the record's fault at all; the consumer
//!   waits for the database, however long, and dead-letters nothing for it.

use std::fmt::Write;

/// Why a record went to the dead-letter topic (header `dlt-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DltReason {
    InvalidJson,
    MissingHeader,
    InvalidHeader,
    UnknownEventType,
    SchemaViolation,
    /// Valid, but about an aggregate the consuming service does not know.
    UnknownAggregate,
    RetriesExhausted,
}

impl DltReason {
    pub const ALL: [DltReason; 7] = [
        Self::InvalidJson,
        Self::MissingHeader,
        Self::InvalidHeader,
        Self::UnknownEventType,
        Self::SchemaViolation,
        Self::UnknownAggregate,
        Self::RetriesExhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidJson => "invalid-json",
            Self::MissingHeader => "missing-header",
            Self::InvalidHeader => "invalid-header",
            Self::UnknownEventType => "unknown-event-type",
            Self::SchemaViolation => "schema-violation",
            Self::UnknownAggregate => "unknown-aggregate",
            Self::RetriesExhausted => "retries-exhausted",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == value)
    }
}

/// A record that no retry can make processable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", reason.as_str())]
pub struct InvalidMessage {
    pub reason: DltReason,
    pub detail: String,
}

impl InvalidMessage {
    pub fn new(reason: DltReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// Why and how a record failed, as its dead letter records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: DltReason,
    pub message: String,
    /// The error type, for `kafka_dlt-exception-fqcn`: a type that exists.
    pub error_type: &'static str,
    pub attempts: u32,
}

impl Failure {
    pub fn invalid(invalid: &InvalidMessage) -> Self {
        Self {
            reason: invalid.reason,
            message: invalid.detail.clone(),
            error_type: std::any::type_name::<InvalidMessage>(),
            attempts: 1,
        }
    }

    pub fn retries_exhausted(error: &sqlx::Error, attempts: u32) -> Self {
        Self {
            reason: DltReason::RetriesExhausted,
            message: error.to_string(),
            error_type: std::any::type_name::<sqlx::Error>(),
            attempts,
        }
    }
}

/// What a database error says about whom to blame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFailure {
    /// The database cannot be reached or cannot take writes now: wait for it.
    Unavailable,
    /// The record's own transaction failed: retry it, then dead-letter it.
    MessageScoped,
}

impl DatabaseFailure {
    pub fn of(error: &sqlx::Error) -> Self {
        use sqlx::Error;
        match error {
            Error::PoolTimedOut
            | Error::PoolClosed
            | Error::Io(_)
            | Error::Tls(_)
            | Error::Protocol(_)
            | Error::WorkerCrashed
            | Error::Configuration(_) => Self::Unavailable,
            Error::Database(database) => match database.code().as_deref() {
                Some(code) if is_unavailable_sqlstate(code) => Self::Unavailable,
                _ => Self::MessageScoped,
            },
            _ => Self::MessageScoped,
        }
    }
}

/// SQLSTATEs that mean "the server, not this transaction": connection
/// exceptions (class 08), insufficient resources such as too many
/// connections (53), operator intervention such as an admin shutdown or a
/// server still starting (57P01–57P05; not 57014, a statement timeout, which
/// belongs to the transaction), a read-only server after a failover (25006),
/// authentication (28) and a database that does not exist (3D000).
fn is_unavailable_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("28")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "57P04" | "57P05" | "25006" | "3D000"
        )
}

/// Sender text quoted in an error, escaped and cut to `MAX_QUOTED` characters:
/// a record may carry anything, and its dead letter must stay small.
pub fn quote(text: &str) -> String {
    const MAX_QUOTED: usize = 64;
    let mut quoted = String::new();
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(MAX_QUOTED).collect();
    let _ = write!(quoted, "{head:?}");
    let rest = chars.as_str().len();
    if rest > 0 {
        let _ = write!(quoted, " (and {rest} more bytes)");
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_their_names() {
        for reason in DltReason::ALL {
            assert_eq!(DltReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(DltReason::parse("other"), None);
    }

    #[test]
    fn the_server_going_away_is_unavailability_and_a_stuck_transaction_is_not() {
        for code in [
            "08006", "08001", "57P01", "57P03", "25006", "53300", "3D000", "28P01",
        ] {
            assert!(is_unavailable_sqlstate(code), "{code}");
        }
        // serialization failure, deadlock, lock not available, statement
        // timeout, check violation, numeric overflow
        for code in ["40001", "40P01", "55P03", "57014", "23514", "22003"] {
            assert!(!is_unavailable_sqlstate(code), "{code}");
        }
        assert_eq!(
            DatabaseFailure::of(&sqlx::Error::PoolTimedOut),
            DatabaseFailure::Unavailable
        );
        assert_eq!(
            DatabaseFailure::of(&sqlx::Error::Io(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused
            ))),
            DatabaseFailure::Unavailable
        );
        assert_eq!(
            DatabaseFailure::of(&sqlx::Error::RowNotFound),
            DatabaseFailure::MessageScoped
        );
    }

    #[test]
    fn quoted_sender_text_is_escaped_and_bounded() {
        assert_eq!(quote("PedidoCriado"), "\"PedidoCriado\"");
        assert_eq!(quote("a\"b\n"), "\"a\\\"b\\n\"");
        let long = "X".repeat(600_000);
        let quoted = quote(&long);
        assert!(quoted.len() < 120, "{quoted}");
        assert!(quoted.ends_with("(and 599936 more bytes)"), "{quoted}");
    }
}
