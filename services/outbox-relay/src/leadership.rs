//! One active relay at a time, by a PostgreSQL session advisory lock.
//!
//! The leader holds the lock on a dedicated connection and does all its
//! outbox reads and writes on that same connection. If the connection dies,
//! the lock is gone and so is every statement the leader could still issue:
//! a deposed leader cannot mark rows. Standbys try the lock every
//! `--failover-interval`; a leader killed outright loses its socket, so
//! PostgreSQL releases the lock at once and failover takes one interval.
//!
//! Why one leader rather than splitting work by aggregate hash: per-aggregate
//! order then needs nothing else (one reader, rows in insert order), and one
//! relay publishes far faster than orders are written (docs/benchmarks.md).

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

/// The default lock key: "entrega" in ASCII.
pub const DEFAULT_LOCK_KEY: i64 = 0x0065_6e74_7265_6761;

/// The leader's connection, holding the lock.
#[derive(Debug)]
pub struct Leader {
    pub conn: PgConnection,
}

/// Takes the lock if it is free; `None` if another relay leads.
pub async fn try_lead(options: &PgConnectOptions, key: i64) -> Result<Option<Leader>, sqlx::Error> {
    let mut conn = PgConnection::connect_with(options).await?;
    let acquired: bool = sqlx::query_scalar("select pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut conn)
        .await?;
    if acquired {
        Ok(Some(Leader { conn }))
    } else {
        conn.close().await?;
        Ok(None)
    }
}

impl Leader {
    /// Releases the lock by closing the session.
    pub async fn step_down(self) {
        if let Err(error) = self.conn.close().await {
            tracing::debug!(%error, "closing the leader connection");
        }
    }
}
