//! A Kafka producer that is replaced by a fresh one when it fails, while
//! it is shared.
//!
//! After failed deliveries librdkafka bumps an idempotent producer's epoch
//! (KIP-360) and carries on; not every Kafka-protocol broker handles that
//! bump (tansu 0.6 refuses every later produce), and a fatal error ends an
//! idempotent producer for good. A fresh producer (a new producer id) works
//! on every broker. Nothing is lost by replacing one: a record whose
//! delivery failed is its sender's to send again.
//!
//! Callers reach the producer only through calls that do not wait on the
//! broker (enqueue, the fatal-error check), so this value holds the only
//! reference to it: a replaced producer is dropped here, on a blocking
//! thread. Dropping one purges and flushes, which blocks for up to half a
//! second: never on the async runtime's threads.

use std::sync::{PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::ToBytes;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

/// Which producer a record was handed to. A failure rebuilds the producer
/// only if it is still the one that failed: callers failing together
/// (every partition's dead letter during an outage) rebuild it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(u64);

/// A producer and the configuration to build its successors from.
pub struct RebuildableProducer {
    config: ClientConfig,
    current: RwLock<Current>,
}

struct Current {
    producer: FutureProducer,
    generation: Generation,
}

impl std::fmt::Debug for RebuildableProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RebuildableProducer")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl RebuildableProducer {
    pub fn new(config: ClientConfig) -> KafkaResult<Self> {
        let producer = config.create()?;
        Ok(Self {
            config,
            current: RwLock::new(Current {
                producer,
                generation: Generation(0),
            }),
        })
    }

    /// The producer is only replaced under the write lock, and a panic
    /// cannot leave `Current` half-written: a poisoned lock is still sound.
    fn current(&self) -> RwLockReadGuard<'_, Current> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn generation(&self) -> Generation {
        self.current().generation
    }

    /// Hands `record` to the current producer without waiting (a full
    /// queue is an error, as in [`FutureProducer::send_result`]). The
    /// delivery future holds no reference to the producer; the generation
    /// is the one to pass to [`Self::rebuild`] if the delivery fails.
    // rdkafka's own signature: the record comes back for another try.
    #[allow(clippy::result_large_err)]
    pub fn send_result<'a, K, P>(
        &self,
        record: FutureRecord<'a, K, P>,
    ) -> Result<(DeliveryFuture, Generation), (KafkaError, FutureRecord<'a, K, P>)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let current = self.current();
        current
            .producer
            .send_result(record)
            .map(|delivery| (delivery, current.generation))
    }

    /// The current producer's fatal error, if it has one.
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.current().producer.client().fatal_error()
    }

    /// Waits up to `timeout` for queued records to be delivered. Blocks:
    /// call it where blocking is allowed (shutdown).
    pub fn flush(&self, timeout: Duration) -> KafkaResult<()> {
        self.current().producer.flush(timeout)
    }

    /// Replaces the producer with a fresh one, unless `failed` was replaced
    /// already. True if this call replaced it. The old producer's queued
    /// and in-flight records fail (purged): their senders send them again.
    /// Must be called within a Tokio runtime (the old producer is dropped
    /// on its blocking pool).
    pub fn rebuild(&self, failed: Generation) -> bool {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.generation != failed {
            return false;
        }
        match self.config.create::<FutureProducer>() {
            Ok(producer) => {
                let old = std::mem::replace(&mut current.producer, producer);
                current.generation = Generation(failed.0 + 1);
                drop(current);
                tokio::task::spawn_blocking(move || drop(old));
                true
            }
            Err(error) => {
                tracing::error!(%error, "rebuilding the producer failed; keeping the old one");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable_broker() -> ClientConfig {
        let mut config = ClientConfig::new();
        // Nothing listens on port 1: the producers are built, never used.
        config.set("bootstrap.servers", "127.0.0.1:1");
        config
    }

    #[tokio::test]
    async fn a_producer_is_rebuilt_once_however_many_senders_saw_it_fail() {
        let producer = RebuildableProducer::new(unreachable_broker()).unwrap();
        let failed = producer.generation();
        assert!(producer.rebuild(failed), "the first failure rebuilds");
        let rebuilt = producer.generation();
        assert_ne!(rebuilt, failed);
        assert!(
            !producer.rebuild(failed),
            "a second sender's failure on the old producer rebuilt the new one"
        );
        assert_eq!(producer.generation(), rebuilt);
        assert!(
            producer.rebuild(rebuilt),
            "a failure of the new one rebuilds it"
        );
    }
}
