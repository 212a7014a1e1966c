//! The relay's reads and writes on the outbox table.
//!
//! No cursor: every read takes the oldest rows still to publish, whatever
//! the last read saw. A row whose transaction committed late, with a lower
//! `seq` than rows already published, is simply found by the next read.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::record::OutboxRow;

/// What happens to a row once the broker acknowledged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPublish {
    /// Delete it: reads stay as cheap as the backlog is small (default).
    Delete,
    /// Keep it with `published_at` set, for inspection; purged later.
    Retain,
}

/// The oldest rows still to publish, in insert order.
pub async fn fetch_pending(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    sqlx::query_as(
        "select id, aggregatetype, aggregateid, type, payload::text as payload, traceparent, seq, attempts
         from outbox
         where published_at is null and parked_at is null
         order by seq
         limit $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Records a batch as published, in one statement.
pub async fn mark_published(
    conn: &mut PgConnection,
    ids: &[Uuid],
    after: AfterPublish,
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let statement = match after {
        AfterPublish::Delete => "delete from outbox where id = any($1)",
        AfterPublish::Retain => "update outbox set published_at = now() where id = any($1)",
    };
    Ok(sqlx::query(statement)
        .bind(ids)
        .execute(conn)
        .await?
        .rows_affected())
}

/// Counts one failed attempt caused by each row itself, records its error,
/// and parks the rows that reached `max_attempts`. Returns the parked ids.
pub async fn record_poison(
    conn: &mut PgConnection,
    failures: &[(Uuid, String)],
    max_attempts: i32,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let (ids, errors): (Vec<Uuid>, Vec<&str>) =
        failures.iter().map(|(id, e)| (*id, e.as_str())).unzip();
    sqlx::query_scalar(
        "update outbox o
         set attempts = o.attempts + 1,
             last_error = f.error,
             parked_at = case when o.attempts + 1 >= $3 then now() end
         from unnest($1::uuid[], $2::text[]) as f (id, error)
         where o.id = f.id
         returning case when o.parked_at is not null then o.id end",
    )
    .bind(&ids)
    .bind(&errors)
    .bind(max_attempts)
    .fetch_all(conn)
    .await
    .map(|parked: Vec<Option<Uuid>>| parked.into_iter().flatten().collect())
}

/// Records the error of rows that failed for reasons outside themselves
/// (broker unavailable): no attempt is counted.
pub async fn record_transient(
    conn: &mut PgConnection,
    failures: &[(Uuid, String)],
) -> Result<(), sqlx::Error> {
    let (ids, errors): (Vec<Uuid>, Vec<&str>) =
        failures.iter().map(|(id, e)| (*id, e.as_str())).unzip();
    sqlx::query(
        "update outbox o set last_error = f.error
         from unnest($1::uuid[], $2::text[]) as f (id, error)
         where o.id = f.id",
    )
    .bind(&ids)
    .bind(&errors)
    .execute(conn)
    .await?;
    Ok(())
}

/// What the metrics report about the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_pending_age: Duration,
    pub parked: i64,
}

pub async fn backlog(pool: &PgPool) -> Result<Backlog, sqlx::Error> {
    // Both counts use the partial indexes; the parked count is usually 0.
    let (pending, oldest_age_seconds, parked): (i64, Option<f64>, i64) = sqlx::query_as(
        "select (select count(*) from outbox where published_at is null and parked_at is null),
                (select extract(epoch from now() - min(created_at))::float8
                   from outbox where published_at is null and parked_at is null),
                (select count(*) from outbox where parked_at is not null)",
    )
    .fetch_one(pool)
    .await?;
    Ok(Backlog {
        pending,
        oldest_pending_age: Duration::from_secs_f64(oldest_age_seconds.unwrap_or(0.0).max(0.0)),
        parked,
    })
}

/// Deletes retained rows published before `older_than`, `batch` at a time,
/// so that no single statement holds many locks or much WAL.
pub async fn purge_published(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let older_than = time::Duration::try_from(older_than).unwrap_or(time::Duration::MAX);
    let mut total = 0;
    loop {
        let deleted = sqlx::query(
            "delete from outbox where id in (
                 select id from outbox
                 where published_at < now() - $1
                 limit $2)",
        )
        .bind(older_than)
        .bind(batch)
        .execute(pool)
        .await?
        .rows_affected();
        total += deleted;
        if deleted < u64::try_from(batch).unwrap_or(0) {
            return Ok(total);
        }
    }
}
