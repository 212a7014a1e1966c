//! The consumer of `pedido.eventos`: one task per owned partition (key order
//! kept, partitions in parallel), offsets stored only once a record is done.
//!
//! The main loop polls the consumer (which also serves rebalances and keeps
//! the member in the group, so slow work never violates
//! `max.poll.interval.ms`) and hands each record to its partition's worker.
//! A worker that falls behind gets its partition paused until it catches up,
//! so one slow partition neither blocks the others nor grows memory.
//! `enable.auto.offset.store=false`: a worker stores the record's offset after the
//! record's transaction committed (or its DLT record was acknowledged), and
//! librdkafka commits stored offsets every few seconds, on revoke and on
//! close.

mod lag; // consumer lag per partition, from watermarks and commits
mod partitions; // owned partitions and the rebalance callbacks

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::dlt::SourceRecord;
use crate::processor::Processor;
pub use partitions::{PartitionState, RebalanceContext, Registry};

/// A partition's worker gets paused above this many queued records, resumed
/// below the low mark. Generous on purpose: each resume costs a fetch round
/// trip, and pausing at 500 held the consumer to a third of its speed
/// (docs/benchmarks.md). 5 000 records of a few hundred bytes is a few MB.
const QUEUE_HIGH: usize = 5_000;
const QUEUE_LOW: usize = 1_000;

type KafkaConsumer = StreamConsumer<RebalanceContext>;

/// The consumer's settings.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub topic: String,
    pub group: String,
    pub revoke_grace: Duration,
    pub lag_interval: Duration,
    /// Records of one partition applied in one transaction at most.
    pub max_batch: usize,
}

/// The consumer's librdkafka settings; `KAFKA_*` variables may override them.
pub fn consumer_settings(group: &str, session_timeout: Duration) -> Vec<(&'static str, String)> {
    vec![
        ("group.id", group.to_owned()),
        ("client.id", crate::event::CONSUMER_NAME.to_owned()),
        ("enable.auto.commit", "true".to_owned()),
        ("enable.auto.offset.store", "false".to_owned()),
        ("auto.commit.interval.ms", "1000".to_owned()),
        ("auto.offset.reset", "earliest".to_owned()),
        (
            "session.timeout.ms",
            session_timeout.as_millis().to_string(),
        ),
    ]
}

struct Job {
    record: SourceRecord,
    state: Arc<PartitionState>,
}

fn one_partition(topic: &str, partition: i32) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, partition);
    list
}

/// Runs until `shutdown`: then stops fetching, lets each worker finish the
/// record in progress, commits the stored offsets and leaves the group.
pub async fn run(
    settings: ConsumerSettings,
    config: ClientConfig,
    processor: Arc<Processor>,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let registry = Arc::new(Registry::default());
    let context = RebalanceContext {
        registry: Arc::clone(&registry),
        topic: settings.topic.clone(),
        revoke_grace: settings.revoke_grace,
    };
    let consumer: Arc<KafkaConsumer> = Arc::new(config.create_with_context(context)?);
    consumer.subscribe(&[&settings.topic])?;
    tracing::info!(topic = %settings.topic, group = %settings.group, "consumer started");
    let lag = tokio::spawn(lag::sample(
        Arc::clone(&consumer),
        settings.lag_interval,
        shutdown.clone(),
    ));

    let mut workers: HashMap<i32, (mpsc::UnboundedSender<Job>, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    let mut circuit_handled = false;
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => break,
            message = consumer.recv() => message,
        };
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%error, "consumer error");
                continue;
            }
        };
        if processor.circuit.is_open() {
            // Stop consuming, stay in the group: records stay where they are.
            if !circuit_handled {
                circuit_handled = true;
                if let Ok(assignment) = consumer.assignment() {
                    let _ = consumer.pause(&assignment);
                }
            }
            continue;
        }
        let partition = message.partition();
        let Some(state) = registry.get(partition) else {
            continue; // not ours any more; its new owner reads it again
        };
        let record = SourceRecord::from_message(&message);
        drop(message);
        let (sender, _) = workers.entry(partition).or_insert_with(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let worker = tokio::spawn(work(
                receiver,
                Arc::clone(&processor),
                Arc::clone(&consumer),
                settings.topic.clone(),
                settings.max_batch,
                shutdown.clone(),
            ));
            (sender, worker)
        });
        let queued = state.queued.fetch_add(1, Ordering::SeqCst) + 1;
        if queued > QUEUE_HIGH && !state.paused.swap(true, Ordering::SeqCst) {
            let _ = consumer.pause(&one_partition(&settings.topic, partition));
        }
        if sender.send(Job { record, state }).is_err() {
            tracing::error!(partition, "partition worker stopped");
        }
    }

    tracing::info!("consumer stopping: finishing records in progress");
    for (_, (sender, worker)) in workers.drain() {
        drop(sender);
        let _ = worker.await;
    }
    let _ = lag.await;
    // Commit what the workers stored, then leave the group (the consumer's
    // close, on drop, sends LeaveGroup: partitions move at once).
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
        Err(error) => tracing::warn!(%error, "final offset commit failed"),
    }
    consumer.unsubscribe();
    tracing::info!("consumer stopped");
    Ok(())
}

/// One partition's records, in order, up to `max_batch` of those already
/// queued at a time (one transaction for a run of valid records).
async fn work(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    processor: Arc<Processor>,
    consumer: Arc<KafkaConsumer>,
    topic: String,
    max_batch: usize,
    shutdown: CancellationToken,
) {
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match jobs.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        if shutdown.is_cancelled() {
            return; // queued records are abandoned: they are not stored
        }
        let state = Arc::clone(&first.state);
        let mut batch = vec![first.record];
        // Only records already waiting, and only of the same assignment.
        while batch.len() < max_batch {
            match jobs.try_recv() {
                Ok(job) if Arc::ptr_eq(&job.state, &state) => batch.push(job.record),
                Ok(job) => {
                    carried = Some(job);
                    break;
                }
                Err(_) => break,
            }
        }
        let taken = batch.len();
        tracing::debug!(partition = state.partition, records = taken, "batch");
        if state.begin() {
            let stop =
                || shutdown.is_cancelled() || !state.is_active() || processor.circuit.is_open();
            let outcomes = processor.handle_batch(&batch, &stop).await;
            let done = outcomes
                .iter()
                .take_while(|handled| handled.is_done())
                .count();
            // rd_kafka_offset_store stores `offset + 1` itself (the next
            // record to read): pass the last done record's own offset.
            if let Some(last) = done.checked_sub(1).map(|i| &batch[i])
                && let Err(error) = consumer.store_offset(&topic, last.partition, last.offset)
            {
                // The partition was revoked meanwhile: its new owner will see
                // the records again, and the dedupe rows absorb them.
                tracing::debug!(%error, "offset not stored");
            }
            state.end();
        }
        let queued = state
            .queued
            .fetch_sub(taken, Ordering::SeqCst)
            .saturating_sub(taken);
        if queued < QUEUE_LOW && state.paused.swap(false, Ordering::SeqCst) && state.is_active() {
            let _ = consumer.resume(&one_partition(&topic, state.partition));
        }
    }
}
