//! One active relay at a time: a PostgreSQL session advisory lock, plus a
//! lease so that a leader that stalls cannot keep the lock, or publish, for
//! ever.
//!
//! The leader holds the lock on a dedicated connection and does all its
//! outbox reads and writes on that connection. A leader killed outright
//! loses its socket; PostgreSQL releases the lock at once and a standby
//! takes over within one `--failover-interval`.
//!
//! A leader can also stall with its session open: frozen (SIGSTOP, a VM
//! paused), blocked on a row lock, or cut off from the database while its
//! TCP connection looks alive (no keepalive notices a frozen process: its
//! kernel still answers). The lease covers all three. Every statement the
//! leader runs renews it; PostgreSQL's own `pg_stat_activity.state_change`
//! (the start or end of the session's latest statement) is the heartbeat,
//! so renewing costs nothing. A standby that finds the lock held by a
//! session whose state has not changed for `--lease` terminates that session
//! (`pg_terminate_backend`), which releases the lock, and takes it.
//!
//! The fence is the other half: a deposed leader that wakes must not send
//! the rows it read before it stalled, or they land after the later rows of
//! the same aggregates the new leader has published. The leader keeps its
//! own view of the lease, measured on its monotonic clock from the moment it
//! *sent* its latest successful statement (never later than the moment the
//! server recorded). It hands a record to librdkafka only while at least
//! `--delivery-timeout` plus [`SEND_MARGIN`] of that lease is left, and
//! `message.timeout.ms` is `--delivery-timeout`: librdkafka drops, without
//! sending, a queued record whose timeout has passed, and times out an
//! in-flight request with it. So nothing leaves the old leader later than
//! `SEND_MARGIN` before a standby may depose it. docs/relay.md says why this
//! and not Kafka transactions.
//!
//! Why one leader rather than splitting work by aggregate hash: per-aggregate
//! order then needs nothing else (one reader, rows in insert order), and one
//! relay publishes far faster than orders are written (docs/benchmarks.md).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

/// The default lock key: "entrega" in ASCII.
pub const DEFAULT_LOCK_KEY: i64 = outbox::RELAY_LOCK_KEY;

/// The lease left unused between the deadline of the leader's last record
/// and the earliest moment a standby may depose it: it absorbs librdkafka's
/// timeout scan (once a second), a request on the wire and clock-rate
/// differences between the hosts.
pub const SEND_MARGIN: Duration = Duration::from_secs(2);

/// Below this much of the send window left, the lease is renewed before
/// sending: enough to hand a full batch to librdkafka.
const MIN_SEND_WINDOW: Duration = Duration::from_millis(500);

/// How long a standby waits for a deposed session to end.
const TERMINATE_WAIT_MS: i64 = 2_000;

#[derive(Debug, thiserror::Error)]
pub enum LeadershipError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The database did not answer before the lease ran out: a standby may
    /// already lead, so this relay must not go on as the leader.
    #[error("the database did not answer within the lease ({0:?})")]
    Unresponsive(Duration),
}

/// The leader's connection, holding the lock, and its view of the lease.
#[derive(Debug)]
pub struct Leader {
    conn: PgConnection,
    lease: Duration,
    /// When the latest successful statement was sent.
    renewed_at: Instant,
}

/// The lease settings a relay runs with.
#[derive(Debug, Clone)]
pub struct Election {
    pub database: PgConnectOptions,
    pub lock_key: i64,
    pub lease: Duration,
}

impl Election {
    /// Takes the lock if it is free, or if its holder's lease has run out
    /// (then the holder's session is terminated first). `None` if another
    /// relay leads. Bounded by the lease: a database that does not answer is
    /// an error, not a wait.
    pub async fn try_lead(&self) -> Result<Option<Leader>, LeadershipError> {
        let started = Instant::now();
        within(self.lease, self.try_lead_unbounded(started)).await?
    }

    async fn try_lead_unbounded(
        &self,
        started: Instant,
    ) -> Result<Option<Leader>, LeadershipError> {
        let mut conn = PgConnection::connect_with(&self.database).await?;
        if try_lock(&mut conn, self.lock_key).await? {
            return Ok(Some(self.leader(conn, started)));
        }
        let deposed = self.depose_stale_leader(&mut conn).await?;
        if deposed && try_lock(&mut conn, self.lock_key).await? {
            return Ok(Some(self.leader(conn, started)));
        }
        conn.close().await?;
        Ok(None)
    }

    fn leader(&self, conn: PgConnection, renewed_at: Instant) -> Leader {
        Leader {
            conn,
            lease: self.lease,
            renewed_at,
        }
    }

    /// Terminates the lock holder's session if it has been still for longer
    /// than the lease. Needs the same role as the leader (or
    /// `pg_read_all_stats` and `pg_signal_backend`): without it the holder's
    /// `state_change` reads as NULL and nobody is deposed (logged).
    async fn depose_stale_leader(&self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        let lease = service_support::timestamps::interval(self.lease);
        // A bigint advisory key shows in pg_locks as classid (high 32 bits),
        // objid (low 32 bits), objsubid 1.
        let holder = sqlx::query!(
            r#"select a.pid as "pid!",
                    extract(epoch from now() - a.state_change)::float8 as still_for,
                    case when a.state_change < now() - $3::interval
                         then pg_terminate_backend(a.pid, $4) end as terminated
             from pg_locks l
             join pg_stat_activity a on a.pid = l.pid
             where l.locktype = 'advisory' and l.granted and l.objsubid = 1
               and l.database = (select oid from pg_database where datname = current_database())
               and l.classid::bigint = $1 and l.objid::bigint = $2"#,
            self.lock_key >> 32 & 0xffff_ffff,
            self.lock_key & 0xffff_ffff,
            lease as time::Duration,
            TERMINATE_WAIT_MS,
        )
        .fetch_optional(&mut *conn)
        .await?
        .map(|row| (row.pid, row.still_for, row.terminated));
        match holder {
            Some((pid, Some(still_for), Some(terminated))) => {
                tracing::warn!(
                    leader.pid = pid,
                    still_for_seconds = still_for,
                    terminated,
                    "the leader's session was still for longer than the lease; deposed it"
                );
                metrics::counter!("relay_leaders_deposed_total").increment(1);
                Ok(true)
            }
            Some((pid, None, _)) => {
                // Once per process: a standby asks every failover interval.
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        leader.pid = pid,
                        "cannot see the leader's session activity: a stalled leader cannot be deposed (run every relay as the same role, or grant pg_read_all_stats and pg_signal_backend)"
                    );
                }
                Ok(false)
            }
            // The leader is alive and well.
            Some((_, Some(_), None)) => Ok(false),
            // The lock was released since it was tried: try again.
            None => Ok(true),
        }
    }
}

async fn try_lock(conn: &mut PgConnection, key: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(r#"select pg_try_advisory_lock($1) as "locked!""#, key)
        .fetch_one(conn)
        .await
}

/// The lease a statement sent at `sent_at` renews, if any: only one sent
/// with at least [`SEND_MARGIN`] of the lease left. A standby deposes a
/// session whose server-side activity is older than the lease; a statement
/// sent in the lease's last moments may reach the server after a standby
/// judged the session stale, and even succeed before the termination
/// lands: it proves nothing, and renewing from it would let this relay send
/// beside the new leader. Such a statement still runs (a batch the broker
/// acknowledged is still recorded); the lease just runs out.
fn renewal(renewed_at: Instant, lease: Duration, sent_at: Instant) -> Option<Instant> {
    let left = (renewed_at + lease).saturating_duration_since(sent_at);
    (left >= SEND_MARGIN).then_some(sent_at)
}

/// [`Leader::send_deadline`] for a lease renewed at `renewed_at`: never
/// before the renewal, so a lease too short for the timeout sends nothing.
fn send_deadline_after(
    renewed_at: Instant,
    lease: Duration,
    delivery_timeout: Duration,
) -> Instant {
    (renewed_at + lease)
        .checked_sub(delivery_timeout + SEND_MARGIN)
        .unwrap_or(renewed_at)
        .max(renewed_at)
}

/// Runs `future` for at most `limit`.
async fn within<T>(limit: Duration, future: impl Future<Output = T>) -> Result<T, LeadershipError> {
    tokio::time::timeout(limit, future)
        .await
        .map_err(|_| LeadershipError::Unresponsive(limit))
}

impl Leader {
    /// Runs one statement on the leader's connection. It must end while the
    /// lease lasts: past that, a standby may lead, and this relay must step
    /// down rather than wait. Success renews the lease from the moment the
    /// statement was sent (see [`renewal`]), so `statement` must reach the
    /// server (not return early with nothing to do).
    pub async fn run<T>(
        &mut self,
        statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T, sqlx::Error>,
    ) -> Result<T, LeadershipError> {
        let sent_at = Instant::now();
        let left = self.lease_left(sent_at);
        if left.is_zero() {
            return Err(LeadershipError::Unresponsive(self.lease));
        }
        let result = within(left, statement(&mut self.conn)).await??;
        if let Some(renewed_at) = renewal(self.renewed_at, self.lease, sent_at) {
            self.renewed_at = renewed_at;
        }
        Ok(result)
    }

    /// The latest moment a record may be handed to the producer so that it
    /// is sent, or dropped, `SEND_MARGIN` before a standby may take over.
    pub fn send_deadline(&self, delivery_timeout: Duration) -> Instant {
        send_deadline_after(self.renewed_at, self.lease, delivery_timeout)
    }

    /// The send deadline for records about to be sent. When a statement
    /// (a read waiting on a lock, a slow plan, a loaded server) used up most
    /// of the window, the lease is renewed first with a trivial statement:
    /// its success proves this session was not deposed since (deposing ends
    /// the session), so what was read is still this leader's to send.
    /// Without it, a read that is always slow would have every row withheld
    /// and read again, for ever.
    pub async fn send_deadline_renewed(
        &mut self,
        delivery_timeout: Duration,
    ) -> Result<Instant, LeadershipError> {
        let send_by = self.send_deadline(delivery_timeout);
        if send_by.saturating_duration_since(Instant::now()) >= MIN_SEND_WINDOW {
            return Ok(send_by);
        }
        metrics::counter!("relay_lease_renewals_total", "after" => "slow_statement").increment(1);
        tracing::warn!(
            "a statement outlasted most of the lease's send window; renewing the lease before sending (docs/relay.md, \"Slow statements\")"
        );
        self.renew().await?;
        Ok(self.send_deadline(delivery_timeout))
    }

    /// Renews the lease with a statement that does nothing else.
    pub async fn renew(&mut self) -> Result<(), LeadershipError> {
        self.run(async |conn| {
            sqlx::query!("select 1 as one")
                .fetch_one(conn)
                .await
                .map(drop)
        })
        .await
    }

    /// How long the leader may go without a statement before it must
    /// renew: a third of the lease, so that an idle leader is never deposed.
    pub fn renew_within(&self) -> Duration {
        self.lease / 3
    }

    /// When an idle leader must renew ([`Leader::renew_within`] after the
    /// latest renewal).
    pub fn renew_at(&self) -> Instant {
        self.renewed_at + self.renew_within()
    }

    fn lease_left(&self, now: Instant) -> Duration {
        (self.renewed_at + self.lease).saturating_duration_since(now)
    }

    /// Releases the lock by closing the session.
    pub async fn step_down(self) {
        match within(SEND_MARGIN, self.conn.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, "closing the leader connection"),
            Err(error) => tracing::debug!(%error, "closing the leader connection"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_renews_the_lease_only_with_the_send_margin_left() {
        let lease = Duration::from_secs(10);
        let renewed_at = Instant::now();
        let at = |seconds: f64| renewed_at + Duration::from_secs_f64(seconds);
        // Early in the lease, and exactly at the margin: renewed from the send.
        assert_eq!(renewal(renewed_at, lease, at(1.0)), Some(at(1.0)));
        assert_eq!(renewal(renewed_at, lease, at(8.0)), Some(at(8.0)));
        // Inside the margin, at the end and past it: not renewed.
        assert_eq!(renewal(renewed_at, lease, at(8.001)), None);
        assert_eq!(renewal(renewed_at, lease, at(10.0)), None);
        assert_eq!(renewal(renewed_at, lease, at(12.0)), None);
    }

    #[test]
    fn nothing_is_sent_within_the_delivery_timeout_and_margin_of_the_lease_end() {
        let lease = Duration::from_secs(10);
        let renewed_at = Instant::now();
        let deadline = send_deadline_after(renewed_at, lease, Duration::from_secs(5));
        assert_eq!(deadline, renewed_at + Duration::from_secs(3));
        // A delivery timeout that leaves no room: the deadline is the renewal.
        let none_left = send_deadline_after(renewed_at, lease, Duration::from_secs(9));
        assert_eq!(none_left, renewed_at);
    }
}
