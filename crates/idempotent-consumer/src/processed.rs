//! The dedupe table, `mensagem_processada`, and all that touches it: its
//! schema (this library's migration set), the claim that decides which
//! delivery of a message wins, the withdrawal of a refused message's claim,
//! retention, and what the console reads of it.
//!
//! A row may go once its message can no longer arrive: after the topic's
//! retention plus the redrive window. Deleting it earlier would let a late
//! redelivery or a redrive apply the message twice, so a shorter retention
//! is refused unless forced.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::ClientConfig;
use service_support::retry;
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::topics::{self, TopicError};

/// Rows deleted per statement: short transactions, little lock and WAL
/// pressure.
const PURGE_BATCH: i64 = 5_000;

/// This library's tables (`migrations/consumer`: the dedupe table and the
/// redrive audit), for a service to apply after its own set; tolerant of
/// the other sets' versions in the database's one history table. On a
/// database whose own set made `mensagem_processada` already (inventory
/// 0001, orders 0005) it changes nothing.
pub fn migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("../../migrations/consumer");
    migrator.set_ignore_missing(true);
    migrator
}

/// Claims `ids` for `consumer` inside the transaction of the effect: the
/// ids inserted now, i.e. the messages seen for the first time. Insert
/// first, no SELECT before it: the primary key decides between concurrent
/// deliveries, and a duplicate inserts nothing.
pub(crate) async fn claim(
    tx: &mut PgConnection,
    consumer: &str,
    ids: &[Uuid],
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let claimed = sqlx::query_scalar!(
        "insert into mensagem_processada (consumidor, mensagem_id)
         select $1, id from unnest($2::uuid[]) as id
         on conflict do nothing
         returning mensagem_id",
        consumer,
        ids,
    )
    .fetch_all(tx)
    .await?;
    Ok(claimed.into_iter().collect())
}

/// Withdraws the claims of messages the handler refused, in the same
/// transaction: no claim stays behind, so a redrive applies them.
pub(crate) async fn withdraw(
    tx: &mut PgConnection,
    consumer: &str,
    ids: &[Uuid],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "delete from mensagem_processada where consumidor = $1 and mensagem_id = any($2)",
        consumer,
        ids,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// When `consumer` processed each of `ids` that it did process: the
/// evidence the console shows for a message.
pub async fn processed_at(
    pool: &PgPool,
    consumer: &str,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, time::OffsetDateTime)>, sqlx::Error> {
    let rows = sqlx::query!(
        "select mensagem_id, processada_em from mensagem_processada
         where consumidor = $1 and mensagem_id = any($2)",
        consumer,
        ids,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.mensagem_id, row.processada_em))
        .collect())
}

/// How long a consumer keeps its rows, and what that must cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Rows older than this go.
    pub keep: Duration,
    /// How long after its first delivery a message may still be redriven.
    pub redrive_window: Duration,
    /// Accept a `keep` shorter than the topic's retention plus the window.
    pub force: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(
        "retention {retention} is shorter than the topic's retention ({topic_retention}) plus the redrive window \
         ({redrive_window}): a message redelivered or redriven after that would be applied twice; \
         use a longer --retention, or --force-retention if you accept that"
    )]
    TooShort {
        retention: String,
        topic_retention: String,
        redrive_window: String,
    },
    #[error(
        "the topic keeps records forever (retention.ms=-1), so no retention of processed rows is safe; \
         use --force-retention if you accept that"
    )]
    TopicKeepsForever,
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error("deleting processed rows failed")]
    Database(#[from] sqlx::Error),
}

impl Retention {
    /// Refuses a retention that is not safe for `topic`, unless forced.
    pub async fn check(&self, kafka: &ClientConfig, topic: &str) -> Result<(), RetentionError> {
        if self.force {
            return Ok(());
        }
        self.judge(topics::retention(kafka, topic).await?)
    }

    /// The window rule, against the topic's retention (`None`: forever).
    fn judge(&self, topic_retention: Option<Duration>) -> Result<(), RetentionError> {
        if self.force {
            return Ok(());
        }
        let Some(topic_retention) = topic_retention else {
            return Err(RetentionError::TopicKeepsForever);
        };
        if self.keep < topic_retention + self.redrive_window {
            return Err(RetentionError::TooShort {
                retention: hours(self.keep),
                topic_retention: hours(topic_retention),
                redrive_window: hours(self.redrive_window),
            });
        }
        Ok(())
    }
}

fn hours(duration: Duration) -> String {
    format!("{} h", duration.as_secs() / 3_600)
}

/// Deletes `consumer`'s rows older than `keep`, a batch at a time; returns
/// how many went. Another consumer's rows in the same table follow the
/// window of its own topic, so they are left alone.
pub async fn purge(pool: &PgPool, consumer: &str, keep: Duration) -> Result<u64, RetentionError> {
    let keep = service_support::timestamps::interval(keep);
    let mut total = 0;
    loop {
        let deleted = sqlx::query!(
            "delete from mensagem_processada where ctid = any(array(
                 select ctid from mensagem_processada
                 where consumidor = $1 and processada_em < now() - $2::interval
                 limit $3))",
            consumer,
            keep as time::Duration,
            PURGE_BATCH,
        )
        .execute(pool)
        .await?
        .rows_affected();
        total += deleted;
        metrics::counter!("retention_deleted_total").increment(deleted);
        if deleted < PURGE_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// Purges every `every` until `shutdown`; a failed purge is logged and
/// tried again at the next tick.
pub(crate) async fn purge_every(
    pool: PgPool,
    consumer: &'static str,
    every: Duration,
    keep: Duration,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    while retry::tick(&mut interval, &shutdown).await {
        match purge(&pool, consumer, keep).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, consumer, "processed-table retention"),
            Err(error) => {
                tracing::warn!(error.message = %error, consumer, "processed-table retention failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3_600);

    fn retention(keep_hours: u64, force: bool) -> Retention {
        Retention {
            keep: HOUR * u32::try_from(keep_hours).unwrap(),
            redrive_window: 7 * 24 * HOUR,
            force,
        }
    }

    #[test]
    fn a_retention_must_cover_the_topic_retention_plus_the_redrive_window() {
        let week = Some(7 * 24 * HOUR);
        assert!(retention(14 * 24, false).judge(week).is_ok());
        let error = retention(14 * 24 - 1, false).judge(week).unwrap_err();
        assert!(
            error.to_string().contains("335 h is shorter than the topic's retention (168 h) plus the redrive window (168 h)"),
            "{error}"
        );
        assert!(retention(1, true).judge(week).is_ok());
    }

    #[test]
    fn a_topic_that_keeps_records_forever_allows_no_retention_unless_forced() {
        assert!(matches!(
            retention(100_000, false).judge(None),
            Err(RetentionError::TopicKeepsForever)
        ));
        assert!(retention(1, true).judge(None).is_ok());
    }
}
