//! The replication slot and publication, through SQL on an ordinary
//! connection: set-up at start, the health the slot-lag guard reports, and
//! the last confirmation after a stream ends.

use sqlx::PgPool;

use super::progress::Lsn;
use crate::store;

/// The set-up problems an operator must fix; each message says how.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error(
        "wal_level is '{0}' on this server; CDC mode needs 'logical': ALTER SYSTEM SET wal_level = logical and restart PostgreSQL, or run --mode poll"
    )]
    WalLevel(String),
    #[error(
        "role {0} may not stream a replication slot: ALTER ROLE {0} WITH REPLICATION (or run --mode poll)"
    )]
    NotReplication(String),
    #[error(
        "publication {publication} exists but does not publish inserts into this database's outbox table: ALTER PUBLICATION {publication} ADD TABLE outbox, SET (publish = 'insert'), or choose another --cdc-publication"
    )]
    WrongPublication { publication: String },
    #[error(
        "publication {publication} carries other tables too ({tables}): the relay publishes only the outbox. ALTER PUBLICATION {publication} DROP TABLE …, or choose another --cdc-publication (the relay creates its own: FOR TABLE outbox WITH (publish = 'insert'))"
    )]
    PublicationTooWide { publication: String, tables: String },
    #[error(
        "replication slot {slot} exists but {problem}: choose another --cdc-slot, or drop it (SELECT pg_drop_replication_slot('{slot}'))"
    )]
    WrongSlot { slot: String, problem: String },
    /// PostgreSQL removed WAL the slot still needed (`max_slot_wal_keep_size`
    /// exceeded): the slot can never stream again, and rows written while
    /// the relay was behind are not in the WAL any more.
    #[error(
        "replication slot {slot} was invalidated (wal_status = lost): the relay fell further behind than max_slot_wal_keep_size allows and PostgreSQL removed WAL it still needed. \
         The relay stops rather than carry on by itself (docs/relay.md, \"When the slot is lost\"). To rebuild: \
         (1) SELECT pg_drop_replication_slot('{slot}'); \
         (2) start the relay again: it creates a new slot and first publishes every row still pending in the outbox table, as --mode poll would (duplicates, which consumers absorb). \
         With --outbox-cleanup delete-in-transaction the rows written while the relay was behind are in neither the table nor the WAL: re-emit those events from the service's own tables"
    )]
    Lost { slot: String },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Checks the server, then creates the publication and the slot if they are
/// missing. Idempotent, and safe when two relays start at once.
pub async fn prepare(pool: &PgPool, slot: &str, publication: &str) -> Result<(), SlotError> {
    let wal_level = sqlx::query_scalar!(r#"select current_setting('wal_level') as "wal_level!""#)
        .fetch_one(pool)
        .await?;
    if wal_level != "logical" {
        return Err(SlotError::WalLevel(wal_level));
    }
    let role = sqlx::query!(
        r#"select rolname::text as "name!", rolreplication or rolsuper as "may_replicate!"
           from pg_roles where rolname = current_user"#,
    )
    .fetch_one(pool)
    .await?;
    if !role.may_replicate {
        return Err(SlotError::NotReplication(role.name));
    }
    prepare_publication(pool, publication).await?;
    prepare_slot(pool, slot).await
}

async fn prepare_publication(pool: &PgPool, publication: &str) -> Result<(), SlotError> {
    let exists = sqlx::query_scalar!(
        r#"select exists (select 1 from pg_publication where pubname = $1) as "exists!""#,
        publication,
    )
    .fetch_one(pool)
    .await?;
    if !exists {
        // Dynamic: an identifier cannot be a bind parameter. The name is
        // checked at start-up (config.rs): letters, digits, _.
        let created = sqlx::query(&format!(
            "create publication {publication} for table outbox with (publish = 'insert')"
        ))
        .execute(pool)
        .await;
        match created {
            Ok(_) => tracing::info!(publication, "created the publication"),
            // Another relay created it in between.
            Err(error) if sqlstate(&error).as_deref() == Some("42710") => {}
            Err(error) => return Err(error.into()),
        }
    }
    let publishes_outbox = sqlx::query_scalar!(
        r#"select exists (
             select 1 from pg_publication p
             join pg_publication_tables t on t.pubname = p.pubname
             where p.pubname = $1 and p.pubinsert
               and t.schemaname = current_schema() and t.tablename = 'outbox') as "publishes!""#,
        publication,
    )
    .fetch_one(pool)
    .await?;
    if !publishes_outbox {
        return Err(SlotError::WrongPublication {
            publication: publication.to_owned(),
        });
    }
    // Another table's inserts would come down the stream beside the
    // outbox's, for the relay to skip: WAL decoded and sent for nothing.
    let others = sqlx::query_scalar!(
        r#"select format('%I.%I', schemaname, tablename) as "table!" from pg_publication_tables
           where pubname = $1 and not (schemaname = current_schema() and tablename = 'outbox')
           order by 1 limit 6"#,
        publication,
    )
    .fetch_all(pool)
    .await?;
    if !others.is_empty() {
        let mut tables = others[..others.len().min(5)].join(", ");
        if others.len() > 5 {
            tables.push_str(", …");
        }
        return Err(SlotError::PublicationTooWide {
            publication: publication.to_owned(),
            tables,
        });
    }
    Ok(())
}

struct ExistingSlot {
    plugin: Option<String>,
    database: Option<String>,
    ours: bool,
    wal_status: Option<String>,
}

async fn prepare_slot(pool: &PgPool, slot: &str) -> Result<(), SlotError> {
    let wrong = |problem: String| SlotError::WrongSlot {
        slot: slot.to_owned(),
        problem,
    };
    for _ in 0..2 {
        let found = sqlx::query_as!(
            ExistingSlot,
            r#"select plugin::text, database::text, database = current_database() as "ours!",
                      wal_status
               from pg_replication_slots where slot_name = $1"#,
            slot,
        )
        .fetch_optional(pool)
        .await?;
        match found.map(|s| (s.plugin, s.database, s.ours, s.wal_status)) {
            None => match create_slot(pool, slot).await {
                Ok(handed_over) => {
                    tracing::info!(
                        slot,
                        rows_in_the_table = handed_over,
                        "created the replication slot; the rows the table held are published first, each aggregate's in order"
                    );
                    return Ok(());
                }
                Err(error) if sqlstate(&error).as_deref() == Some("42710") => continue,
                Err(error) => return Err(error.into()),
            },
            Some((plugin, _, _, _)) if plugin.as_deref() != Some("pgoutput") => {
                return Err(wrong(format!(
                    "is not a pgoutput logical slot (plugin {})",
                    plugin.as_deref().unwrap_or("none: a physical slot")
                )));
            }
            Some((_, database, false, _)) => {
                return Err(wrong(format!(
                    "belongs to database {}",
                    database.as_deref().unwrap_or("?")
                )));
            }
            Some((_, _, _, wal_status)) if wal_status.as_deref() == Some("lost") => {
                return Err(SlotError::Lost {
                    slot: slot.to_owned(),
                });
            }
            Some(_) => return Ok(()),
        }
    }
    Err(wrong(
        "was created and dropped while the relay started".to_owned(),
    ))
}

/// Creates `slot` so that no row is missed or sent twice at the seam: the
/// rows the table holds before the slot exists are not in its stream, so
/// they are stepped aside (store.rs) for the table path to publish. In one
/// transaction, a temporary slot fixes where the stream will start and every
/// pending row is stepped aside; then the slot is copied to its permanent
/// name. A crash before the copy leaves no slot (a temporary one ends with
/// its session) and the next start does it all again; after it, the rows
/// are marked. Rows committed between the two steps are in both: the stream
/// holds them back behind their marked selves (a duplicate at most).
/// Returns the rows stepped aside.
async fn create_slot(pool: &PgPool, slot: &str) -> Result<u64, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let temporary = format!("entrega_new_{}", uuid::Uuid::new_v4().simple());
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query!(
        "select slot_name::text from pg_create_logical_replication_slot($1, 'pgoutput', true)",
        temporary,
    )
    .fetch_one(&mut *tx)
    .await?;
    let handed_over = store::step_aside_pending(&mut tx).await?;
    tx.commit().await?;
    let copied = sqlx::query!(
        "select slot_name::text from pg_copy_logical_replication_slot($1, $2, false)",
        temporary,
        slot,
    )
    .fetch_one(&mut *conn)
    .await;
    // The pooled session lives on: drop the temporary slot now.
    let dropped = sqlx::query!("select pg_drop_replication_slot($1)", temporary)
        .fetch_one(&mut *conn)
        .await;
    copied?;
    dropped?;
    Ok(handed_over)
}

/// Ends the walsender that holds `slot`, if one does, and returns its pid.
/// Only for a leader holding the lock: the holder lost the lead.
pub async fn end_stream(
    conn: &mut sqlx::PgConnection,
    slot: &str,
) -> Result<Option<i32>, sqlx::Error> {
    // pg_terminate_backend in the select list, never in the where clause:
    // the planner may evaluate a where clause's conditions in any order, and
    // so end every slot's walsender on the server, other relays' included
    // (seen: a neighbour's slot creation cut off).
    let ended = sqlx::query!(
        r#"select active_pid as "pid!", pg_terminate_backend(active_pid, 2000) as "terminated!"
           from pg_replication_slots
           where slot_name = $1 and active_pid is not null"#,
        slot,
    )
    .fetch_optional(conn)
    .await?;
    Ok(ended.and_then(|row| row.terminated.then_some(row.pid)))
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    Some(error.as_database_error()?.code()?.into_owned())
}

/// What the slot-lag guard watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotHealth {
    /// WAL the server keeps for the slot (from its restart position).
    pub retained_bytes: i64,
    /// WAL written since the last position the relay confirmed.
    pub lag_bytes: i64,
    /// WAL that may still be written before the slot is invalidated;
    /// `None` without `max_slot_wal_keep_size`.
    pub safe_bytes: Option<i64>,
    pub lost: bool,
    pub confirmed: Option<Lsn>,
}

/// The slot's state now; `None` if it does not exist.
pub async fn health(pool: &PgPool, slot: &str) -> Result<Option<SlotHealth>, sqlx::Error> {
    let row = sqlx::query_as!(
        SlotRow,
        "select (pg_current_wal_lsn() - restart_lsn)::bigint as retained,
                (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint as lag,
                safe_wal_size, wal_status, confirmed_flush_lsn::text as confirmed
         from pg_replication_slots where slot_name = $1",
        slot,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| SlotHealth {
        retained_bytes: row.retained.unwrap_or(0),
        lag_bytes: row.lag.unwrap_or(0),
        safe_bytes: row.safe_wal_size,
        lost: row.wal_status.as_deref() == Some("lost"),
        confirmed: row.confirmed.and_then(|lsn| lsn.parse().ok()),
    }))
}

struct SlotRow {
    retained: Option<i64>,
    lag: Option<i64>,
    safe_wal_size: Option<i64>,
    wal_status: Option<String>,
    confirmed: Option<String>,
}

/// Confirms `position` for a slot no session streams: what a stream that
/// ended could not send itself (the replication crate stops without a last
/// status update). Retried briefly while the ended session still holds the
/// slot; if a standby took it first, the position is simply re-sent later
/// (duplicates, never loss).
pub async fn confirm_released(pool: &PgPool, slot: &str, position: Lsn) {
    for _ in 0..20 {
        let advanced = sqlx::query!(
            // The function's record is (slot_name, end_lsn): one column
            // taken, so it runs once per row.
            "select (pg_replication_slot_advance(slot_name, $2::text::pg_lsn)).end_lsn::text
             from pg_replication_slots
             where slot_name = $1 and confirmed_flush_lsn < $2::text::pg_lsn",
            slot,
            position.to_string(),
        )
        .fetch_optional(pool)
        .await;
        match advanced {
            Ok(_) => return,
            // Still active (55006): its walsender is exiting.
            Err(error) if sqlstate(&error).as_deref() == Some("55006") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(error) => {
                tracing::warn!(error.message = %error, %position, "could not confirm the last position; it will be re-sent");
                return;
            }
        }
    }
}
