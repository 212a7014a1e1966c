//! The redrive audit (`dlt_redrive`, migrations/consumer): who redrove
//! which dead letter, when, and where its copy went. A row is written once
//! the broker acknowledged the copy and before the redrive group's offset
//! moves past the record, so every redrive that counts has one.

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use time::OffsetDateTime;
use uuid::Uuid;

/// The longest operator name taken, in characters as given (the table
/// takes 200).
pub const MAX_OPERATOR_LEN: usize = 200;

/// Where redrives are recorded, and in whose name.
#[derive(Debug, Clone)]
pub struct Audit {
    pool: PgPool,
    operator: String,
    via: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("the operator's name is empty or only whitespace")]
    Empty,
    #[error("the operator's name is longer than {MAX_OPERATOR_LEN} characters")]
    TooLong,
    #[error("the operator's name holds a control character")]
    Control,
}

/// Checks an operator's name: at most [`MAX_OPERATOR_LEN`] characters, no
/// control character (the name is printed, logged and stored: PostgreSQL
/// refuses NUL), and one character that is not whitespace. The name is kept
/// without the whitespace around it. [`operator_pattern`] states the same
/// rule for an API's schema.
pub fn valid_operator(name: &str) -> Result<&str, OperatorError> {
    if name.chars().count() > MAX_OPERATOR_LEN {
        return Err(OperatorError::TooLong);
    }
    if name.chars().any(char::is_control) {
        return Err(OperatorError::Control);
    }
    match name.trim() {
        "" => Err(OperatorError::Empty),
        name => Ok(name),
    }
}

/// The control characters (Unicode Cc: `char::is_control`).
const CONTROL: &[(char, char)] = &[('\u{0}', '\u{1f}'), ('\u{7f}', '\u{9f}')];
/// The control characters and whitespace (Unicode White_Space:
/// `char::is_whitespace`).
const CONTROL_OR_WHITESPACE: &[(char, char)] = &[
    ('\u{0}', '\u{20}'),
    ('\u{7f}', '\u{a0}'),
    ('\u{1680}', '\u{1680}'),
    ('\u{2000}', '\u{200a}'),
    ('\u{2028}', '\u{2029}'),
    ('\u{202f}', '\u{202f}'),
    ('\u{205f}', '\u{205f}'),
    ('\u{3000}', '\u{3000}'),
];

/// [`valid_operator`]'s rule as a JSON Schema `pattern`: no control
/// character, and one that is neither control nor whitespace. With
/// `maxLength` [`MAX_OPERATOR_LEN`], a name matches exactly when
/// `valid_operator` takes it. The classes name code points (`\uXXXX`), which
/// ECMA 262 and Python read alike; `\s` would not do: each language's
/// whitespace differs from Rust's.
pub fn operator_pattern() -> String {
    let class = |ranges: &[(char, char)]| -> String {
        ranges
            .iter()
            .map(|&(first, last)| {
                if first == last {
                    format!("\\u{:04x}", u32::from(first))
                } else {
                    format!("\\u{:04x}-\\u{:04x}", u32::from(first), u32::from(last))
                }
            })
            .collect()
    };
    let (control, blank) = (class(CONTROL), class(CONTROL_OR_WHITESPACE));
    format!("^[^{control}]*[^{blank}][^{control}]*$")
}

/// The operator a command-line redrive runs as when none is named: the
/// login name.
pub fn login_name() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|variable| {
            std::env::var(variable)
                .ok()
                .filter(|v| !v.trim().is_empty())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// One redrive as the audit records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Redriven {
    pub dlt_topic: String,
    pub dlt_partition: i32,
    pub dlt_offset: i64,
    pub message_id: Option<Uuid>,
    pub reason: Option<String>,
    pub to_topic: String,
    pub to_partition: i32,
    pub to_offset: i64,
}

/// A row of the audit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditEntry {
    #[serde(flatten)]
    pub redriven: Redriven,
    pub operator: String,
    pub via: String,
    #[serde(with = "time::serde::rfc3339")]
    pub redriven_at: OffsetDateTime,
}

impl Audit {
    /// An audit in the database `database`, connected on first use (a dry
    /// run never connects). `via` says which tool: "cli" or "console".
    pub fn new(
        database: PgConnectOptions,
        operator: &str,
        via: &'static str,
    ) -> Result<Self, OperatorError> {
        let operator = valid_operator(operator)?.to_owned();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_lazy_with(database);
        Ok(Self {
            pool,
            operator,
            via,
        })
    }

    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// Whether the audit can be written: checked before anything is
    /// published, so no copy goes out that the audit cannot record (a
    /// read-only role, or a database whose service has not created the
    /// table yet).
    pub async fn check(&self) -> Result<(), sqlx::Error> {
        let writable = sqlx::query_scalar!(
            r#"select coalesce(has_table_privilege(to_regclass('dlt_redrive'), 'INSERT'), false)
                      and not current_setting('transaction_read_only')::bool as "writable!""#,
        )
        .fetch_one(&self.pool)
        .await?;
        if writable {
            Ok(())
        } else {
            Err(sqlx::Error::Protocol(
                "dlt_redrive is missing (start the consumer's service once: it migrates) or this \
                 role may not insert into it (or the session is read-only)"
                    .to_owned(),
            ))
        }
    }

    pub async fn record(&self, redriven: &Redriven) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "insert into dlt_redrive (dlt_topic, dlt_partition, dlt_offset, message_id, reason,
                                      to_topic, to_partition, to_offset, operator, via)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            redriven.dlt_topic,
            redriven.dlt_partition,
            redriven.dlt_offset,
            redriven.message_id,
            redriven.reason,
            redriven.to_topic,
            redriven.to_partition,
            redriven.to_offset,
            self.operator,
            self.via,
        )
        .execute(&self.pool)
        .await
        .map(drop)
    }
}

/// The audit's rows for these messages, oldest first.
pub async fn history(pool: &PgPool, message_ids: &[Uuid]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let rows = sqlx::query!(
        "select dlt_topic, dlt_partition, dlt_offset, message_id, reason, to_topic,
                to_partition, to_offset, operator, via, redriven_at
         from dlt_redrive where message_id = any($1) order by position",
        message_ids,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| AuditEntry {
            redriven: Redriven {
                dlt_topic: row.dlt_topic,
                dlt_partition: row.dlt_partition,
                dlt_offset: row.dlt_offset,
                message_id: row.message_id,
                reason: row.reason,
                to_topic: row.to_topic,
                to_partition: row.to_partition,
                to_offset: row.to_offset,
            },
            operator: row.operator,
            via: row.via,
            redriven_at: row.redriven_at,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_is_named_within_the_tables_limit() {
        assert_eq!(valid_operator("  ana ").ok(), Some("ana"));
        assert!(matches!(valid_operator(""), Err(OperatorError::Empty)));
        assert!(matches!(
            valid_operator(" \u{3000} "),
            Err(OperatorError::Empty)
        ));
        assert!(matches!(
            valid_operator(&"x".repeat(MAX_OPERATOR_LEN + 1)),
            Err(OperatorError::TooLong)
        ));
        assert!(matches!(
            valid_operator(&format!(" {}", "x".repeat(MAX_OPERATOR_LEN))),
            Err(OperatorError::TooLong)
        ));
        assert!(valid_operator(&"é".repeat(MAX_OPERATOR_LEN)).is_ok());
        for control in ["ana\u{0}", "ana\n", "\u{1b}]0;x\u{7}", "ana\u{85}"] {
            assert!(
                matches!(valid_operator(control), Err(OperatorError::Control)),
                "{control:?}"
            );
        }
    }

    fn within(ranges: &[(char, char)], c: char) -> bool {
        ranges
            .iter()
            .any(|&(first, last)| (first..=last).contains(&c))
    }

    /// The pattern's classes are `char::is_control` and
    /// `char::is_whitespace`, character for character.
    #[test]
    fn the_operator_pattern_names_the_characters_valid_operator_refuses() {
        for c in (0..=u32::from(char::MAX)).filter_map(char::from_u32) {
            assert_eq!(within(CONTROL, c), c.is_control(), "{c:?}");
            assert_eq!(
                within(CONTROL_OR_WHITESPACE, c),
                c.is_control() || c.is_whitespace(),
                "{c:?}"
            );
        }
        assert_eq!(
            operator_pattern(),
            "^[^\\u0000-\\u001f\\u007f-\\u009f]*\
             [^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028-\\u2029\\u202f\\u205f\\u3000]\
             [^\\u0000-\\u001f\\u007f-\\u009f]*$"
        );
    }
}
