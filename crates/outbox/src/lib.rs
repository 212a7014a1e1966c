//! The transactional outbox, as the services that publish events write it.
//!
//! A service writes [`OutboxMessage`]s with [`insert`] inside the
//! transaction that makes the change they announce; a relay (the built-in
//! one or Debezium's Outbox Event Router) publishes them: `aggregatetype`
//! routes to the topic `<aggregatetype>.eventos`, `aggregateid` becomes the
//! record key, `type` the `eventType` header, `id` the `id` header and
//! `payload` the record value, unchanged.
//!
//! The table belongs to the database of the service that writes it: the
//! service applies [`migrator`] after its own set at start-up. The relay
//! never creates it (on a fresh orders database it would run before the
//! orders set, which creates the table its own way).

pub mod read; // what an inspector reads: a message's key, a key's rows and deliveries

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

pub use service_support::telemetry::TraceContext;

/// The outbox table's migrations (`migrations/outbox`), tolerant of the
/// service's own versions in the same history table.
pub fn migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("../../migrations/outbox");
    migrator.set_ignore_missing(true);
    migrator
}

/// A service's own migrations, then the outbox table's: each set tolerant
/// of the other's versions in the database's one history table.
pub fn with_outbox(mut own: Migrator) -> [Migrator; 2] {
    own.set_ignore_missing(true);
    [own, migrator()]
}

/// Applies `migrators` in order.
pub async fn migrate(pool: &PgPool, migrators: &[Migrator]) -> Result<(), MigrateError> {
    for migrator in migrators {
        migrator.run(pool).await?;
    }
    Ok(())
}

/// Grants the parts of entrega their privileges on a migrated database, as
/// its owner: the tables every service database has
/// (migrations/grants/common.sql, to `service_role` and the relay's,
/// console's and redrive's roles), then `own`, the service's file. One
/// transaction; the roles must exist (migrations/roles.sql).
pub async fn grant(pool: &PgPool, service_role: &str, own: &str) -> Result<(), sqlx::Error> {
    let common = include_str!("../../../migrations/grants/common.sql");
    // A multi-statement simple query is one implicit transaction.
    let grants = format!("{}\n{own}", common.replace("{service}", service_role));
    sqlx::raw_sql(&grants).execute(pool).await?;
    Ok(())
}

/// A migration of this build that the database has not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub version: i64,
    pub description: String,
}

impl std::fmt::Display for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04} {}", self.version, self.description)
    }
}

/// Why a service that does not migrate refuses its database.
#[derive(Debug, thiserror::Error)]
pub enum NotCurrent {
    #[error(
        "the database lacks migrations this build needs ({}); {variable} is set, so this \
         service does not migrate: run `{command}` as the database's owner first",
        pending.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Behind {
        pending: Vec<Pending>,
        command: &'static str,
        variable: &'static str,
    },
    #[error(
        "cannot read which migrations the database has (the service's role needs select on _sqlx_migrations)"
    )]
    History(#[source] sqlx::Error),
}

/// Refuses a database that lacks any of `migrators`' migrations, naming
/// them, the command that applies them and the variable that skipped it.
pub async fn require_current(
    pool: &PgPool,
    migrators: &[Migrator],
    command: &'static str,
    variable: &'static str,
) -> Result<(), NotCurrent> {
    let pending = pending(pool, migrators)
        .await
        .map_err(NotCurrent::History)?;
    if pending.is_empty() {
        Ok(())
    } else {
        Err(NotCurrent::Behind {
            pending,
            command,
            variable,
        })
    }
}

/// The migrations of `migrators` that the database has not applied (or
/// whose application failed), in order: for a service that does not
/// migrate, to refuse a schema older than its queries.
pub async fn pending(pool: &PgPool, migrators: &[Migrator]) -> Result<Vec<Pending>, sqlx::Error> {
    // sqlx's history table, not ours: absent until the first migration, and
    // not in the schema the query macros are checked against.
    let applied: Vec<i64> =
        match sqlx::query_scalar("select version from _sqlx_migrations where success")
            .fetch_all(pool)
            .await
        {
            Ok(applied) => applied,
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42P01") => {
                Vec::new()
            }
            Err(error) => return Err(error),
        };
    Ok(migrators
        .iter()
        .flat_map(|migrator| migrator.iter())
        .filter(|migration| migration.migration_type.is_up_migration())
        .filter(|migration| !applied.contains(&migration.version))
        .map(|migration| Pending {
            version: migration.version,
            description: migration.description.to_string(),
        })
        .collect())
}

/// One outbox row to write.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// The message id: consumers deduplicate on it.
    pub id: Uuid,
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub event_type: &'static str,
    pub payload: serde_json::Value,
    /// The trace the message continues: stored as `traceparent` and as
    /// Debezium's `tracingspancontext` (migrations/outbox/1001).
    pub trace: Option<TraceContext>,
}

impl OutboxMessage {
    /// A new message with a fresh time-ordered id.
    pub fn new(
        aggregate_type: &'static str,
        aggregate_id: impl Into<String>,
        event_type: &'static str,
        payload: serde_json::Value,
        trace: Option<TraceContext>,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            aggregate_type,
            aggregate_id: aggregate_id.into(),
            event_type,
            payload,
            trace,
        }
    }
}

/// Who removes the rows a writer inserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cleanup {
    /// The relay, once published (or Debezium's retention): the rows stay
    /// until then. Works with every relay mode.
    #[default]
    Relay,
    /// The writer, in the transaction that inserted them: the table stays
    /// empty and only the WAL carries the rows. Only for a relay reading
    /// the WAL (`outbox-relay --mode cdc --outbox-cleanup
    /// delete-in-transaction`, or Debezium): a polling relay sees nothing.
    InTransaction,
}

/// The columns of outbox rows, one array each, in message order: what
/// [`insert`] binds, and what a writer binds when its own statement inserts
/// the rows as a data-modifying CTE, so that the change and its
/// announcement cost one round trip (the order service's `POST /orders`,
/// the inventory's reservations). Such a statement inserts exactly these
/// columns from `unnest(…) with ordinality … order by n`, as [`insert`]
/// does; each writer has a test that compares its rows with [`insert`]'s.
#[derive(Debug)]
pub struct Columns<'a> {
    pub ids: Vec<Uuid>,
    pub aggregate_types: Vec<&'static str>,
    pub aggregate_ids: Vec<&'a str>,
    pub types: Vec<&'static str>,
    /// `Json<&Value>` encodes as jsonb without a copy of the payload; the
    /// query macros only know `Vec<Value>` for jsonb[], so bind it `as _`.
    pub payloads: Vec<Json<&'a serde_json::Value>>,
    pub traceparents: Vec<Option<&'a str>>,
    /// Debezium's `tracingspancontext` (migrations/outbox/1001).
    pub span_contexts: Vec<Option<String>>,
}

impl<'a> Columns<'a> {
    pub fn of(messages: &'a [OutboxMessage]) -> Self {
        let mut columns = Self {
            ids: Vec::with_capacity(messages.len()),
            aggregate_types: Vec::with_capacity(messages.len()),
            aggregate_ids: Vec::with_capacity(messages.len()),
            types: Vec::with_capacity(messages.len()),
            payloads: Vec::with_capacity(messages.len()),
            traceparents: Vec::with_capacity(messages.len()),
            span_contexts: Vec::with_capacity(messages.len()),
        };
        for message in messages {
            columns.ids.push(message.id);
            columns.aggregate_types.push(message.aggregate_type);
            columns.aggregate_ids.push(message.aggregate_id.as_str());
            columns.types.push(message.event_type);
            columns.payloads.push(Json(&message.payload));
            columns
                .traceparents
                .push(message.trace.as_ref().map(TraceContext::traceparent));
            columns
                .span_contexts
                .push(message.trace.as_ref().map(TraceContext::to_properties));
        }
        columns
    }
}

/// Writes `messages` in the caller's transaction, in their order (their
/// `seq` follows it), with one statement whatever their number; with
/// [`Cleanup::InTransaction`], deletes them again in the same transaction.
#[tracing::instrument(skip_all, fields(rows = messages.len()), err)]
pub async fn insert(
    tx: &mut PgConnection,
    messages: &[OutboxMessage],
    cleanup: Cleanup,
) -> Result<(), sqlx::Error> {
    if messages.is_empty() {
        return Ok(());
    }
    let columns = Columns::of(messages);
    // `with ordinality` and the ordered select keep `seq` in message order.
    sqlx::query!(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                             tracingspancontext)
         select id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext
         from unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::text[],
                     $7::text[])
              with ordinality as m (id, aggregatetype, aggregateid, type, payload, traceparent,
                                    tracingspancontext, n)
         order by n",
        &columns.ids,
        &columns.aggregate_types as &[&str],
        &columns.aggregate_ids as &[&str],
        &columns.types as &[&str],
        &columns.payloads as _,
        &columns.traceparents as &[Option<&str>],
        &columns.span_contexts as &[Option<String>],
    )
    .execute(&mut *tx)
    .await?;
    if cleanup == Cleanup::InTransaction {
        delete_written(tx, &columns.ids).await?;
    }
    Ok(())
}

/// [`Cleanup::InTransaction`]'s half: deletes the rows `ids` that the
/// caller's transaction wrote, so that only the WAL carries them. A
/// separate statement, never a CTE beside the insert: a statement does not
/// see the rows its own CTEs insert.
pub async fn delete_written(tx: &mut PgConnection, ids: &[Uuid]) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from outbox where id = any($1)", ids)
        .execute(tx)
        .await?;
    Ok(())
}

/// The lock the built-in relays of one database elect their leader with
/// (a session advisory lock; `outbox-relay --lock-key`): "entrega" in ASCII.
pub const RELAY_LOCK_KEY: i64 = 0x0065_6e74_7265_6761;

/// The outbox table's backlog, as the relay's metrics and the console's
/// health page report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub pending: i64,
    pub oldest_pending_age: Duration,
    pub parked: i64,
    /// Unpublished rows behind a parked row of their aggregate.
    pub held: i64,
}

/// Reads the backlog; cheap while the backlog is small (partial indexes).
pub async fn backlog(pool: &PgPool) -> Result<Backlog, sqlx::Error> {
    // Both counts use the partial indexes; the parked count is usually 0.
    // The held count starts from the parked rows (usually none).
    let counts = sqlx::query!(
        r#"select (select count(*) from outbox where published_at is null and parked_at is null)
                      as "pending!",
                (select extract(epoch from now() - min(created_at))::float8
                   from outbox where published_at is null and parked_at is null)
                      as oldest_age_seconds,
                (select count(*) from outbox where parked_at is not null) as "parked!",
                (select count(distinct o.id)
                   from outbox p
                   join outbox o on o.aggregatetype = p.aggregatetype
                                and o.aggregateid = p.aggregateid
                                and o.seq > p.seq
                                and o.published_at is null and o.parked_at is null
                  where p.parked_at is not null and p.published_at is null) as "held!""#,
    )
    .fetch_one(pool)
    .await?;
    Ok(Backlog {
        pending: counts.pending,
        oldest_pending_age: Duration::from_secs_f64(
            counts.oldest_age_seconds.unwrap_or(0.0).max(0.0),
        ),
        parked: counts.parked,
        held: counts.held,
    })
}
