//! The relay's reads and writes on the outbox table.
//!
//! No cursor: every read takes the oldest rows still to publish, whatever
//! the last read saw. A row whose transaction committed late, with a lower
//! `seq` than rows already published, is simply found by the next read.
//!
//! Per-aggregate order is decided here: a read takes a row only when no
//! earlier row of its aggregate is still unpublished (sent, parked, waiting
//! out a broker fault). So a batch holds at most one row per aggregate, and
//! a row is never sent while an earlier one of its aggregate may still fail.

use std::sync::LazyLock;
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

/// Fails unless the outbox table has every column the relay reads or writes.
pub async fn check_table(pool: &PgPool, log: DeliveryLog) -> Result<(), sqlx::Error> {
    sqlx::query(
        "select id, aggregatetype, aggregateid, type, payload, created_at, seq, traceparent,
                tracingspancontext, attempts, last_error, parked_at, published_at, next_attempt_at, deferrals
         from outbox limit 0",
    )
    .execute(pool)
    .await?;
    if log == DeliveryLog::Off {
        return Ok(());
    }
    // The log is written in the statement that marks a batch: a relay that
    // could not write it would fail every mark after the broker's ack.
    let writable: bool = sqlx::query_scalar(
        "select coalesce(has_table_privilege(to_regclass('outbox_delivery'), 'INSERT'), false)",
    )
    .fetch_one(pool)
    .await?;
    if writable {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(
            "outbox_delivery is missing or not writable by this role: start the service that owns the outbox (it migrates), grant INSERT, or run with --delivery-log false".to_owned(),
        ))
    }
}

/// The oldest rows that may be sent now, in insert order: not parked, the
/// earliest unpublished row of their aggregate, and either never deferred or
/// done waiting out a broker fault. Rows that were deferred take at most a
/// tenth of a read, so that however many of them are due, the rows behind
/// them are read too (no head-of-line blocking by a broken topic or
/// partition).
pub async fn fetch_pending(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    sqlx::query_as(&FETCH_PENDING)
        .bind(limit)
        .bind((limit / 10).max(1))
        .fetch_all(conn)
        .await
}

/// The read of [`fetch_pending`], built once: it runs on every poll.
///
/// The eligibility test is written out twice, not as a CTE: a CTE used twice
/// is materialised, which would read every pending row on every read. "The
/// earliest of its aggregate" is a scalar subquery, so it runs as one index
/// probe per row the scan meets: as an anti-join, a plan made before the
/// table was first analysed (a bulk backlog) could be quadratic (seen in P2:
/// one read of 50 000 rows ran for minutes).
static FETCH_PENDING: LazyLock<String> = LazyLock::new(|| {
    let eligible = |extra: &str, limit: &str| {
        format!(
            "(select o.id, o.aggregatetype, o.aggregateid, o.type, o.payload::text as payload,
                     o.traceparent, o.tracingspancontext, o.seq, o.attempts
              from outbox o
              where o.published_at is null and o.parked_at is null and {extra}
                and o.seq = (
                    select min(e.seq) from outbox e
                    where e.aggregatetype = o.aggregatetype and e.aggregateid = o.aggregateid
                      and e.published_at is null)
              order by o.seq
              limit {limit})"
        )
    };
    format!(
        "select * from ({} union all {}) as batch order by seq",
        eligible("o.deferrals = 0", "$1"),
        eligible("o.deferrals > 0 and o.next_attempt_at <= now()", "$2"),
    )
});

/// Whether published rows' deliveries are appended to `outbox_delivery`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryLog {
    On,
    Off,
}

/// Where the broker put a published row, from its delivery report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: Uuid,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl Delivery {
    pub fn of(row: &OutboxRow, partition: i32, offset: i64) -> Self {
        Self {
            id: row.id,
            topic: format!("{}{}", row.aggregatetype, crate::record::TOPIC_SUFFIX),
            partition,
            offset,
        }
    }
}

/// Records a batch as published, in one statement that also appends each
/// row's delivery to `outbox_delivery` (what `entrega journey` reads once
/// the row is gone). Returns the ids it found: in CDC mode a row can be
/// published before its commit is visible to this statement (the caller
/// retries those).
pub async fn mark_published(
    conn: &mut PgConnection,
    deliveries: &[Delivery],
    after: AfterPublish,
    log: DeliveryLog,
) -> Result<Vec<Uuid>, sqlx::Error> {
    if deliveries.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = deliveries.iter().map(|d| d.id).collect();
    let topics: Vec<&str> = deliveries.iter().map(|d| d.topic.as_str()).collect();
    let partitions: Vec<i32> = deliveries.iter().map(|d| d.partition).collect();
    let offsets: Vec<i64> = deliveries.iter().map(|d| d.offset).collect();
    let query = match (after, log) {
        (AfterPublish::Delete, DeliveryLog::On) => sqlx::query_scalar(&MARK_DELETE),
        (AfterPublish::Retain, DeliveryLog::On) => sqlx::query_scalar(&MARK_RETAIN),
        (AfterPublish::Delete, DeliveryLog::Off) => {
            return sqlx::query_scalar("delete from outbox where id = any($1) returning id")
                .bind(&ids)
                .fetch_all(conn)
                .await;
        }
        (AfterPublish::Retain, DeliveryLog::Off) => {
            return sqlx::query_scalar(
                "update outbox set published_at = coalesce(published_at, now())
                 where id = any($1) returning id",
            )
            .bind(&ids)
            .fetch_all(conn)
            .await;
        }
    };
    query
        .bind(&ids)
        .bind(&topics)
        .bind(&partitions)
        .bind(&offsets)
        .fetch_all(conn)
        .await
}

static MARK_DELETE: LazyLock<String> =
    LazyLock::new(|| mark("delete from outbox o where o.id = any($1)"));
static MARK_RETAIN: LazyLock<String> = LazyLock::new(|| {
    // A row published again (a session that ended before its mark) is
    // found, and its second delivery logged.
    mark("update outbox o set published_at = coalesce(o.published_at, now()) where o.id = any($1)")
});

/// `change` (a delete or an update of the published rows) and the append
/// of their deliveries: a data-modifying CTE, so one round trip.
fn mark(change: &str) -> String {
    format!(
        "with published as (
             {change}
             returning o.id, o.aggregatetype, o.aggregateid, o.type, o.created_at),
         logged as (
             insert into outbox_delivery
                 (id, aggregatetype, aggregateid, type, written_at, topic, partition, \"offset\")
             select p.id, p.aggregatetype, p.aggregateid, p.type, p.created_at,
                    d.topic, d.partition, d.offset
             from published p
             join unnest($1::uuid[], $2::text[], $3::int[], $4::bigint[])
                 as d (id, topic, partition, \"offset\") using (id))
         select id from published"
    )
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

/// CDC mode's parking: a row that failed because of itself is written back
/// (it may have been deleted in its own transaction) with `parked_at` set,
/// for an operator to see; the stream skips rows that carry `parked_at`,
/// so this insert does not come round again.
pub async fn park_from_wal(
    conn: &mut PgConnection,
    row: &OutboxRow,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                             tracingspancontext, attempts, last_error, parked_at)
         values ($1, $2, $3, $4, $5::jsonb, $6, $7, 1, $8, now())
         on conflict (id) do update
         set attempts = outbox.attempts + 1, last_error = excluded.last_error, parked_at = now()",
    )
    .bind(row.id)
    .bind(&row.aggregatetype)
    .bind(&row.aggregateid)
    .bind(&row.event_type)
    .bind(&row.payload)
    .bind(&row.traceparent)
    .bind(&row.tracingspancontext)
    .bind(error)
    .execute(conn)
    .await
    .map(drop)
}

/// Records the error of rows that failed for reasons outside themselves
/// (broker, topic, network): no attempt is counted; each row steps aside for
/// a wait that doubles with each deferral, from 100 ms up to `max_wait`.
pub async fn record_transient(
    conn: &mut PgConnection,
    failures: &[(Uuid, String)],
    max_wait: Duration,
) -> Result<(), sqlx::Error> {
    let (ids, errors): (Vec<Uuid>, Vec<&str>) =
        failures.iter().map(|(id, e)| (*id, e.as_str())).unzip();
    let max_wait = time::Duration::try_from(max_wait).unwrap_or(time::Duration::MAX);
    sqlx::query(
        "update outbox o
         set last_error = f.error,
             deferrals = o.deferrals + 1,
             next_attempt_at = now()
                 + least($3::interval, interval '100 milliseconds' * power(2, least(o.deferrals, 20)))
         from unnest($1::uuid[], $2::text[]) as f (id, error)
         where o.id = f.id",
    )
    .bind(&ids)
    .bind(&errors)
    .bind(max_wait)
    .execute(conn)
    .await?;
    Ok(())
}

pub use outbox::{Backlog, backlog};

/// Deletes deliveries recorded before `older_than`, `batch` at a time.
pub async fn purge_deliveries(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    purge(
        pool,
        "delete from outbox_delivery where ctid = any(array(
             select ctid from outbox_delivery where published_at < now() - $1 limit $2))",
        older_than,
        batch,
    )
    .await
}

/// Deletes retained rows published before `older_than`, `batch` at a time,
/// so that no single statement holds many locks or much WAL.
pub async fn purge_published(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    purge(
        pool,
        "delete from outbox where id in (
             select id from outbox
             where published_at < now() - $1
             limit $2)",
        older_than,
        batch,
    )
    .await
}

async fn purge(
    pool: &PgPool,
    statement: &str,
    older_than: Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let older_than = time::Duration::try_from(older_than).unwrap_or(time::Duration::MAX);
    let mut total = 0;
    loop {
        let deleted = sqlx::query(statement)
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
