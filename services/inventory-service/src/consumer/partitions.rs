//! Which partitions this consumer owns right now, and the rebalance
//! callbacks that keep that true.
//!
//! On revoke, each revoked partition is deactivated and the callback waits
//! (bounded) for the record being processed to finish: its transaction
//! commits and its offset is stored before librdkafka commits offsets and
//! hands the partition over. Records of a revoked partition still queued are
//! dropped, never processed. Whatever slips through a timeout is harmless:
//! the dedupe row makes a second processing a no-op.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;

/// One owned partition.
#[derive(Debug)]
pub struct PartitionState {
    pub partition: i32,
    active: AtomicBool,
    busy: Mutex<bool>,
    idle: Condvar,
    /// Records handed to the worker and not yet done.
    pub queued: AtomicUsize,
    /// Fetching paused because the worker is behind.
    pub paused: AtomicBool,
}

impl PartitionState {
    fn new(partition: i32) -> Self {
        Self {
            partition,
            active: AtomicBool::new(true),
            busy: Mutex::new(false),
            idle: Condvar::new(),
            queued: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
        }
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::SeqCst)
    }

    /// Marks a record as being processed; false if the partition is gone.
    pub fn begin(&self) -> bool {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.active.load(Ordering::SeqCst) {
            return false;
        }
        *busy = true;
        true
    }

    pub fn end(&self) {
        *self.busy.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.idle.notify_all();
    }

    /// Stops the partition and waits up to `grace` for the record in
    /// progress; true if it finished in time.
    fn deactivate_and_wait(&self, grace: Duration) -> bool {
        let busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        self.active.store(false, Ordering::SeqCst);
        let (busy, _) = self
            .idle
            .wait_timeout_while(busy, grace, |busy| *busy)
            .unwrap_or_else(PoisonError::into_inner);
        !*busy
    }
}

/// The partitions owned now.
#[derive(Debug, Default)]
pub struct Registry {
    partitions: Mutex<HashMap<i32, Arc<PartitionState>>>,
}

impl Registry {
    pub fn get(&self, partition: i32) -> Option<Arc<PartitionState>> {
        self.lock().get(&partition).cloned()
    }

    pub fn owned(&self) -> Vec<i32> {
        let mut owned: Vec<i32> = self.lock().keys().copied().collect();
        owned.sort_unstable();
        owned
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Arc<PartitionState>>> {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The consumer's context: rebalance and commit callbacks.
#[derive(Debug)]
pub struct RebalanceContext {
    pub registry: Arc<Registry>,
    pub topic: String,
    /// How long a revoke waits for the record in progress.
    pub revoke_grace: Duration,
}

impl ClientContext for RebalanceContext {}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            for element in revoked.elements_for_topic(&self.topic) {
                let state = self.registry.lock().remove(&element.partition());
                if let Some(state) = state {
                    if !state.deactivate_and_wait(self.revoke_grace) {
                        tracing::warn!(
                            partition = state.partition,
                            "revoked while a record was still in progress"
                        );
                    }
                    metrics::gauge!("consumer_lag", "partition" => state.partition.to_string())
                        .set(0.0);
                }
            }
            tracing::info!(partitions = ?self.registry.owned(), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                {
                    let mut partitions = self.registry.lock();
                    for element in assigned.elements_for_topic(&self.topic) {
                        let partition = element.partition();
                        partitions.insert(partition, Arc::new(PartitionState::new(partition)));
                    }
                }
                tracing::info!(partitions = ?self.registry.owned(), "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(error) => tracing::error!(%error, "rebalance failed"),
        }
        metrics::gauge!("consumer_assigned_partitions").set(self.registry.owned().len() as f64);
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        // NoOffset: an automatic commit found nothing new to commit.
        if let Err(error) = result
            && error.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::NoOffset)
        {
            tracing::warn!(%error, ?offsets, "offset commit failed; the records will be delivered again");
        }
    }
}
