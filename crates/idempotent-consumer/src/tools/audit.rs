//! The redrive audit (`dlt_redrive`, migrations/consumer): who redrove
//! which dead letter, when, and where its copy went. A row is written once
//! the broker acknowledged the copy and before the redrive group's offset
//! moves past the record, so every redrive that counts has one.

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use time::OffsetDateTime;
use uuid::Uuid;

/// The longest operator name the table takes.
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
    #[error("the operator's name is empty")]
    Empty,
    #[error("the operator's name is longer than {MAX_OPERATOR_LEN} characters")]
    TooLong,
}

/// Checks an operator's name as the table will.
pub fn valid_operator(name: &str) -> Result<&str, OperatorError> {
    let name = name.trim();
    match name.chars().count() {
        0 => Err(OperatorError::Empty),
        n if n > MAX_OPERATOR_LEN => Err(OperatorError::TooLong),
        _ => Ok(name),
    }
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct AuditEntry {
    #[serde(flatten)]
    #[sqlx(flatten)]
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
        let writable: bool = sqlx::query_scalar(
            "select coalesce(has_table_privilege(to_regclass('dlt_redrive'), 'INSERT'), false)
                    and not current_setting('transaction_read_only')::bool",
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
        sqlx::query(
            "insert into dlt_redrive (dlt_topic, dlt_partition, dlt_offset, message_id, reason,
                                      to_topic, to_partition, to_offset, operator, via)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&redriven.dlt_topic)
        .bind(redriven.dlt_partition)
        .bind(redriven.dlt_offset)
        .bind(redriven.message_id)
        .bind(&redriven.reason)
        .bind(&redriven.to_topic)
        .bind(redriven.to_partition)
        .bind(redriven.to_offset)
        .bind(&self.operator)
        .bind(self.via)
        .execute(&self.pool)
        .await
        .map(drop)
    }
}

/// The audit's rows for these messages, oldest first.
pub async fn history(pool: &PgPool, message_ids: &[Uuid]) -> Result<Vec<AuditEntry>, sqlx::Error> {
    sqlx::query_as(
        "select dlt_topic, dlt_partition, dlt_offset, message_id, reason, to_topic,
                to_partition, to_offset, operator, via, redriven_at
         from dlt_redrive where message_id = any($1) order by position",
    )
    .bind(message_ids)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_is_named_within_the_tables_limit() {
        assert_eq!(valid_operator("  ana ").ok(), Some("ana"));
        assert!(matches!(valid_operator("   "), Err(OperatorError::Empty)));
        assert!(matches!(
            valid_operator(&"x".repeat(MAX_OPERATOR_LEN + 1)),
            Err(OperatorError::TooLong)
        ));
        assert!(valid_operator(&"é".repeat(MAX_OPERATOR_LEN)).is_ok());
    }
}
