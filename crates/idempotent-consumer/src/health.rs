//! What readiness says about the consumer: every reason it is not doing its
//! job right now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::circuit::Circuit;
use super::database::Database;

/// A worker that died keeps readiness failing this long after its restart.
const WORKER_DEATH_SHOWS_FOR: Duration = Duration::from_secs(60);

/// The consumer's health, shared with the HTTP API.
#[derive(Debug, Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    circuit: Circuit,
    database: Arc<Database>,
    /// Partitions whose dead letter is failing to publish, and since when.
    dlt_failing: Mutex<HashMap<i32, Instant>>,
    last_worker_death: Mutex<Option<Instant>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Health {
    pub fn new(circuit: Circuit, database: Arc<Database>) -> Self {
        Self {
            inner: Arc::new(Inner {
                circuit,
                database,
                dlt_failing: Mutex::new(HashMap::new()),
                last_worker_death: Mutex::new(None),
            }),
        }
    }

    pub fn circuit(&self) -> &Circuit {
        &self.inner.circuit
    }

    pub fn database(&self) -> &Arc<Database> {
        &self.inner.database
    }

    /// A dead letter of `partition` could not be published.
    pub fn dlt_failing(&self, partition: i32) {
        lock(&self.inner.dlt_failing)
            .entry(partition)
            .or_insert_with(Instant::now);
    }

    /// `partition` no longer waits for a dead letter: it was published, or
    /// the partition gave it up (revoke, shutdown, circuit).
    pub fn dlt_settled(&self, partition: i32) {
        lock(&self.inner.dlt_failing).remove(&partition);
    }

    pub fn worker_died(&self) {
        *lock(&self.inner.last_worker_death) = Some(Instant::now());
    }

    /// Why the consumer is not ready; empty when it is.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.inner.circuit.is_open() {
            problems.push(
                "the DLQ circuit is open: too many recent records went to the DLT; consumption \
                 stopped until a restart"
                    .to_owned(),
            );
        }
        if let Some(since) = self.inner.database.down_since() {
            problems.push(format!(
                "the database has been unreachable for {} s: consumption paused",
                since.elapsed().as_secs()
            ));
        }
        let mut failing: Vec<(i32, Instant)> = lock(&self.inner.dlt_failing)
            .iter()
            .map(|(partition, since)| (*partition, *since))
            .collect();
        failing.sort_unstable();
        for (partition, since) in failing {
            problems.push(format!(
                "a dead letter of partition {partition} has failed to publish for {} s: the partition waits",
                since.elapsed().as_secs()
            ));
        }
        if let Some(at) = *lock(&self.inner.last_worker_death)
            && at.elapsed() < WORKER_DEATH_SHOWS_FOR
        {
            problems.push(format!(
                "a partition worker died {} s ago and was restarted from its last stored offset",
                at.elapsed().as_secs()
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        // Never connects: the test does not touch the database.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://127.0.0.1:1/none")
            .unwrap();
        Health::new(Circuit::new(10, 0.5, 5), Database::new(pool))
    }

    #[tokio::test]
    async fn a_failing_partition_stays_unready_until_it_settles_whatever_the_others_do() {
        let health = health();
        health.dlt_failing(1);
        health.dlt_failing(2);
        health.dlt_settled(2);
        assert_eq!(health.problems().len(), 1);
        assert!(health.problems()[0].contains("partition 1"));
        health.dlt_settled(1);
        assert!(health.problems().is_empty());
    }
}
