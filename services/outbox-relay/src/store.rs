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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use service_support::timestamps::interval;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::publisher::Position;
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
    // Checked at compile time against the migrations, and here against the
    // database the relay was pointed at (which may be older, or not ours).
    sqlx::query!(
        "select id, aggregatetype, aggregateid, type, payload, created_at, seq, traceparent,
                tracingspancontext, attempts, last_error, parked_at, published_at, next_attempt_at, deferrals
         from outbox limit 0",
    )
    .fetch_optional(pool)
    .await?;
    if log == DeliveryLog::Off {
        return Ok(());
    }
    // The log is written in the statement that marks a batch: a relay that
    // could not write it would fail every mark after the broker's ack.
    let writable = sqlx::query_scalar!(
        r#"select coalesce(has_table_privilege(to_regclass('outbox_delivery'), 'INSERT'), false) as "writable!""#,
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
///
/// `in_flight` are rows sent and not yet recorded (the batch before this
/// one, while a backlog drains): they are skipped, and as they are still
/// unpublished, the later rows of their aggregates are not taken either.
pub async fn fetch_pending(
    conn: &mut PgConnection,
    limit: i64,
    in_flight: &[Uuid],
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    // Each half walks an index that holds only the rows it may take, so a
    // read costs what it returns, not what waits: rows never deferred in
    // insert order (`outbox_ready_idx`), deferred rows whose wait is over in
    // the order they came due (`outbox_due_idx`). Deferred rows that are not
    // due yet (a broken topic's backlog) are in neither walk. Rows behind an
    // earlier unpublished row of their aggregate are still met by the first
    // walk, one index probe each.
    //
    // The eligibility test is written out twice, not as a CTE: a CTE used
    // twice is materialised, which would read every pending row on every
    // read. "The earliest of its aggregate" is a scalar subquery, so it runs
    // as one index probe per row the scan meets: as an anti-join, a plan
    // made before the table was first analysed (a bulk backlog) could be
    // quadratic (seen in P2: one read of 50 000 rows ran for minutes).
    //
    // The in-flight ids are an uncorrelated `not in` subquery so that the
    // array is hashed once per statement (a hashed SubPlan), not searched
    // for each row the scan meets, as `<> all($3)` would be.
    sqlx::query_as!(
        OutboxRow,
        r#"select id as "id!", aggregatetype as "aggregatetype!", aggregateid as "aggregateid!",
                  type as "event_type!", payload as "payload!", traceparent, tracingspancontext,
                  seq as "seq!", attempts as "attempts!"
           from ((select o.id, o.aggregatetype, o.aggregateid, o.type, o.payload::text as payload,
                         o.traceparent, o.tracingspancontext, o.seq, o.attempts
                  from outbox o
                  where o.published_at is null and o.parked_at is null and o.deferrals = 0
                    and o.id not in (select unnest($3::uuid[]))
                    and o.seq = (
                        select min(e.seq) from outbox e
                        where e.aggregatetype = o.aggregatetype and e.aggregateid = o.aggregateid
                          and e.published_at is null)
                  order by o.seq
                  limit $1)
                 union all
                 (select o.id, o.aggregatetype, o.aggregateid, o.type, o.payload::text as payload,
                         o.traceparent, o.tracingspancontext, o.seq, o.attempts
                  from outbox o
                  where o.published_at is null and o.parked_at is null
                    and o.deferrals > 0 and o.next_attempt_at <= now()
                    and o.id not in (select unnest($3::uuid[]))
                    and o.seq = (
                        select min(e.seq) from outbox e
                        where e.aggregatetype = o.aggregatetype and e.aggregateid = o.aggregateid
                          and e.published_at is null)
                  order by o.next_attempt_at
                  limit $2)) as batch
           order by seq"#,
        limit,
        (limit / 10).max(1),
        in_flight,
    )
    .fetch_all(conn)
    .await
}

/// CDC mode's rows stepped aside: rows the stream could not deliver, the
/// later rows of their aggregates held behind them, and the rows the table
/// held when the slot was made. They are marked `deferrals > 0` and left to
/// [`fetch_stepped_aside`]; the stream holds back every record of an
/// aggregate that has one, or a parked row ([`blocked_aggregates`]), so an
/// aggregate's rows go out in order, as in poll mode.
///
/// The oldest stepped-aside rows that may be sent now: due, not parked, and
/// the earliest of their aggregate's stepped-aside or parked rows. Rows of
/// the aggregate that are neither were the stream's: published, or about
/// to be cleaned up.
pub async fn fetch_stepped_aside(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<OutboxRow>, sqlx::Error> {
    sqlx::query_as!(
        OutboxRow,
        r#"select o.id, o.aggregatetype, o.aggregateid, o.type as event_type,
                  o.payload::text as "payload!", o.traceparent, o.tracingspancontext, o.seq,
                  o.attempts
           from outbox o
           where o.published_at is null and o.parked_at is null and o.deferrals > 0
             and o.next_attempt_at <= now()
             and o.seq = (
                 select min(e.seq) from outbox e
                 where e.aggregatetype = o.aggregatetype and e.aggregateid = o.aggregateid
                   and e.published_at is null and (e.deferrals > 0 or e.parked_at is not null))
           order by o.next_attempt_at, o.seq
           limit $1"#,
        limit,
    )
    .fetch_all(conn)
    .await
}

/// What CDC mode's table path has to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SteppedAside {
    /// When the next stepped-aside row is due; `None` if there is none.
    pub due_in: Option<Duration>,
    /// Whether parked rows hold back their aggregates (until un-parked).
    pub parked: bool,
}

/// Whether rows are stepped aside or parked, and when the next one that may
/// be sent (the earliest of its aggregate, not parked) is due.
pub async fn stepped_aside(conn: &mut PgConnection) -> Result<SteppedAside, sqlx::Error> {
    // No `greatest(…, 0)` around it: greatest ignores a NULL and would make
    // "none" read as "due now".
    let found = sqlx::query!(
        r#"select (select extract(epoch from min(o.next_attempt_at) - now())::float8
                 from outbox o
                 where o.published_at is null and o.parked_at is null and o.deferrals > 0
                   and o.seq = (
                       select min(e.seq) from outbox e
                       where e.aggregatetype = o.aggregatetype and e.aggregateid = o.aggregateid
                         and e.published_at is null
                         and (e.deferrals > 0 or e.parked_at is not null))) as due_in,
                exists (select 1 from outbox where parked_at is not null and published_at is null)
                    as "parked!""#,
    )
    .fetch_one(conn)
    .await?;
    Ok(SteppedAside {
        due_in: found
            .due_in
            .map(|seconds| Duration::from_secs_f64(seconds.max(0.0))),
        parked: found.parked,
    })
}

/// Which of `aggregates` (type, id) have a stepped-aside or parked row.
pub async fn blocked_aggregates(
    conn: &mut PgConnection,
    aggregates: &HashSet<(&str, &str)>,
) -> Result<HashSet<(String, String)>, sqlx::Error> {
    let (types, ids): (Vec<&str>, Vec<&str>) = aggregates.iter().copied().unzip();
    let blocked = sqlx::query!(
        "select distinct o.aggregatetype, o.aggregateid
         from unnest($1::text[], $2::text[]) as b (aggregatetype, aggregateid)
         join outbox o on o.aggregatetype = b.aggregatetype and o.aggregateid = b.aggregateid
         where o.published_at is null and (o.deferrals > 0 or o.parked_at is not null)",
        &types as &[&str],
        &ids as &[&str],
    )
    .fetch_all(conn)
    .await?;
    Ok(blocked
        .into_iter()
        .map(|row| (row.aggregatetype, row.aggregateid))
        .collect())
}

/// A stream row to step aside: one the broker did not take (with its
/// error: it waits out a backoff), or one held behind an earlier row of its
/// aggregate (due at once, sent when it is the earliest).
#[derive(Debug)]
pub struct Aside<'a> {
    pub row: &'a OutboxRow,
    pub error: Option<&'a str>,
}

/// Steps `rows` aside, in their order: written into the table (in
/// delete-in-transaction cleanup the writer deleted them; in the other modes
/// the insert finds the row and marks it), marked `deferrals > 0`. The
/// stream skips the inserts this writes (they carry the mark).
pub async fn step_aside(
    conn: &mut PgConnection,
    rows: &[Aside<'_>],
    max_wait: Duration,
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(rows.len());
    let mut types = Vec::with_capacity(rows.len());
    let mut aggregate_ids = Vec::with_capacity(rows.len());
    let mut event_types = Vec::with_capacity(rows.len());
    let mut payloads = Vec::with_capacity(rows.len());
    let mut traceparents = Vec::with_capacity(rows.len());
    let mut contexts = Vec::with_capacity(rows.len());
    let mut errors = Vec::with_capacity(rows.len());
    for Aside { row, error } in rows {
        ids.push(row.id);
        types.push(row.aggregatetype.as_str());
        aggregate_ids.push(row.aggregateid.as_str());
        event_types.push(row.event_type.as_str());
        payloads.push(row.payload.as_str());
        traceparents.push(row.traceparent.as_deref());
        contexts.push(row.tracingspancontext.as_deref());
        errors.push(*error);
    }
    let max_wait = interval(max_wait);
    // `with ordinality` and the ordered select keep `seq` in stream order
    // for the rows this inserts.
    sqlx::query!(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                             tracingspancontext, last_error, deferrals, next_attempt_at)
         select id, aggregatetype, aggregateid, type, payload::jsonb, traceparent,
                tracingspancontext, error, 1,
                case when error is null then now()
                     else now() + least($9::interval, interval '100 milliseconds') end
         from unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                     $7::text[], $8::text[])
              with ordinality as r (id, aggregatetype, aggregateid, type, payload, traceparent,
                                    tracingspancontext, error, n)
         order by n
         on conflict (id) do update
         set last_error = coalesce(excluded.last_error, outbox.last_error),
             deferrals = outbox.deferrals + 1,
             next_attempt_at = case when excluded.last_error is null then now()
                 else now() + least($9::interval,
                     interval '100 milliseconds' * power(2, least(outbox.deferrals, 20))) end",
        &ids,
        &types as &[&str],
        &aggregate_ids as &[&str],
        &event_types as &[&str],
        &payloads as &[&str],
        &traceparents as &[Option<&str>],
        &contexts as &[Option<&str>],
        &errors as &[Option<&str>],
        max_wait as time::Duration,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Steps aside every row the table holds that nothing stepped aside yet:
/// the rows written before a new slot existed, which its stream will never
/// carry. Returns how many.
pub async fn step_aside_pending(conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
    sqlx::query!(
        "update outbox set deferrals = 1, next_attempt_at = now()
         where published_at is null and parked_at is null and deferrals = 0",
    )
    .execute(conn)
    .await
    .map(|done| done.rows_affected())
}

/// Whether published rows' deliveries are appended to `outbox_delivery`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryLog {
    On,
    Off,
}

/// The delivery log as a relay writes it. The log is optional: one that
/// cannot be written (a revoked grant, a dropped table, a full tablespace)
/// never stops the relay, which would otherwise fail every mark after the
/// broker's acknowledgement and publish the same batch again for ever. The
/// batch is marked without it, the failure counted and logged, and the log
/// tried again a minute later.
#[derive(Debug)]
pub struct DeliveryLogWriter {
    wanted: DeliveryLog,
    paused_until: Option<Instant>,
}

/// How long the log is left alone after it could not be written.
const LOG_PAUSE: Duration = Duration::from_secs(60);

impl DeliveryLogWriter {
    pub fn new(wanted: DeliveryLog) -> Self {
        Self {
            wanted,
            paused_until: None,
        }
    }

    fn now(&mut self) -> DeliveryLog {
        match self.paused_until {
            Some(until) if Instant::now() < until => DeliveryLog::Off,
            _ => self.wanted,
        }
    }
}

/// [`mark_published`], appending to the delivery log when it can (see
/// [`DeliveryLogWriter`]).
pub async fn record_published(
    conn: &mut PgConnection,
    deliveries: &[Delivery],
    after: AfterPublish,
    log: &mut DeliveryLogWriter,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let mode = log.now();
    match mark_published(conn, deliveries, after, mode).await {
        // An error the server returned: the statement failed, the session
        // is fine. If the log was the cause, the mark alone succeeds.
        Err(error) if mode == DeliveryLog::On && error.as_database_error().is_some() => {
            let marked = mark_published(conn, deliveries, after, DeliveryLog::Off).await?;
            metrics::counter!("relay_delivery_log_failures_total").increment(1);
            tracing::error!(error.message = %error, rows = marked.len(),
                "cannot append to the delivery log (outbox_delivery); marked the batch without it and will try the log again in a minute (docs/relay.md, \"Delivery log\")");
            log.paused_until = Some(Instant::now() + LOG_PAUSE);
            Ok(marked)
        }
        other => other,
    }
}

/// Where the broker put a published row, from its delivery report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: Uuid,
    pub topic: String,
    /// Kafka's partition and offset; none for a RabbitMQ confirm.
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

impl Delivery {
    pub fn of(row: &OutboxRow, position: Option<Position>) -> Self {
        Self {
            id: row.id,
            topic: format!("{}{}", row.aggregatetype, crate::record::TOPIC_SUFFIX),
            partition: position.map(|p| p.partition),
            offset: position.map(|p| p.offset),
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
    let partitions: Vec<Option<i32>> = deliveries.iter().map(|d| d.partition).collect();
    let offsets: Vec<Option<i64>> = deliveries.iter().map(|d| d.offset).collect();
    // The delivery log is appended in the statement that marks the rows: a
    // data-modifying CTE, so one round trip. A row published again (a
    // session that ended before its mark) is found, and its second delivery
    // logged.
    match (after, log) {
        (AfterPublish::Delete, DeliveryLog::On) => {
            sqlx::query_scalar!(
                r#"with published as (
                       delete from outbox o where o.id = any($1)
                       returning o.id, o.aggregatetype, o.aggregateid, o.type, o.created_at),
                   logged as (
                       insert into outbox_delivery
                           (id, aggregatetype, aggregateid, type, written_at, topic, partition, "offset")
                       select p.id, p.aggregatetype, p.aggregateid, p.type, p.created_at,
                              d.topic, d.partition, d.offset
                       from published p
                       join unnest($1::uuid[], $2::text[], $3::int[], $4::bigint[])
                           as d (id, topic, partition, "offset") using (id))
                   select id as "id!" from published"#,
                &ids,
                &topics as &[&str],
                // Nullable elements: `as _` lets the macro take them.
                &partitions as _,
                &offsets as _,
            )
            .fetch_all(conn)
            .await
        }
        (AfterPublish::Retain, DeliveryLog::On) => {
            sqlx::query_scalar!(
                r#"with published as (
                       update outbox o set published_at = coalesce(o.published_at, now())
                       where o.id = any($1)
                       returning o.id, o.aggregatetype, o.aggregateid, o.type, o.created_at),
                   logged as (
                       insert into outbox_delivery
                           (id, aggregatetype, aggregateid, type, written_at, topic, partition, "offset")
                       select p.id, p.aggregatetype, p.aggregateid, p.type, p.created_at,
                              d.topic, d.partition, d.offset
                       from published p
                       join unnest($1::uuid[], $2::text[], $3::int[], $4::bigint[])
                           as d (id, topic, partition, "offset") using (id))
                   select id as "id!" from published"#,
                &ids,
                &topics as &[&str],
                // Nullable elements: `as _` lets the macro take them.
                &partitions as _,
                &offsets as _,
            )
            .fetch_all(conn)
            .await
        }
        (AfterPublish::Delete, DeliveryLog::Off) => {
            sqlx::query_scalar!("delete from outbox where id = any($1) returning id", &ids)
                .fetch_all(conn)
                .await
        }
        (AfterPublish::Retain, DeliveryLog::Off) => {
            sqlx::query_scalar!(
                "update outbox set published_at = coalesce(published_at, now())
                 where id = any($1) returning id",
                &ids,
            )
            .fetch_all(conn)
            .await
        }
    }
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
    sqlx::query_scalar!(
        "update outbox o
         set attempts = o.attempts + 1,
             last_error = f.error,
             parked_at = case when o.attempts + 1 >= $3 then now() end
         from unnest($1::uuid[], $2::text[]) as f (id, error)
         where o.id = f.id
         returning case when o.parked_at is not null then o.id end",
        &ids,
        &errors as &[&str],
        max_attempts,
    )
    .fetch_all(conn)
    .await
    .map(|parked: Vec<Option<Uuid>>| parked.into_iter().flatten().collect())
}

/// CDC mode's parking: a row that failed because of itself is written back
/// (it may have been deleted in its own transaction) with `parked_at` set,
/// for an operator to see; the stream skips rows that carry `parked_at`,
/// so this insert does not come round again. It is marked stepped aside
/// too, due at once: un-parked (docs/relay.md), the table path sends it.
pub async fn park_from_wal(
    conn: &mut PgConnection,
    row: &OutboxRow,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                             tracingspancontext, attempts, last_error, parked_at,
                             deferrals, next_attempt_at)
         values ($1, $2, $3, $4, $5::text::jsonb, $6, $7, 1, $8, now(), 1, now())
         on conflict (id) do update
         set attempts = outbox.attempts + 1, last_error = excluded.last_error, parked_at = now(),
             deferrals = greatest(outbox.deferrals, 1), next_attempt_at = now()",
        row.id,
        row.aggregatetype,
        row.aggregateid,
        row.event_type,
        row.payload,
        row.traceparent,
        row.tracingspancontext,
        error,
    )
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
    let max_wait = interval(max_wait);
    sqlx::query!(
        "update outbox o
         set last_error = f.error,
             deferrals = o.deferrals + 1,
             next_attempt_at = now()
                 + least($3::interval, interval '100 milliseconds' * power(2, least(o.deferrals, 20)))
         from unnest($1::uuid[], $2::text[]) as f (id, error)
         where o.id = f.id",
        &ids,
        &errors as &[&str],
        max_wait as time::Duration,
    )
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
    let older_than = interval(older_than);
    in_batches(batch, || {
        sqlx::query!(
            "delete from outbox_delivery where ctid = any(array(
                 select ctid from outbox_delivery where published_at < now() - $1::interval limit $2))",
            older_than as time::Duration,
            batch,
        )
        .execute(pool)
    })
    .await
}

/// Deletes retained rows published before `older_than`, `batch` at a time,
/// so that no single statement holds many locks or much WAL.
pub async fn purge_published(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let older_than = interval(older_than);
    in_batches(batch, || {
        sqlx::query!(
            "delete from outbox where id in (
                 select id from outbox
                 where published_at < now() - $1::interval
                 limit $2)",
            older_than as time::Duration,
            batch,
        )
        .execute(pool)
    })
    .await
}

/// Runs `delete` until it deletes fewer than `batch` rows; returns the total.
async fn in_batches<F>(batch: i64, mut delete: impl FnMut() -> F) -> Result<u64, sqlx::Error>
where
    F: Future<Output = Result<sqlx::postgres::PgQueryResult, sqlx::Error>>,
{
    let mut total = 0;
    loop {
        let deleted = delete().await?.rows_affected();
        total += deleted;
        if deleted < u64::try_from(batch).unwrap_or(0) {
            return Ok(total);
        }
    }
}
