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
use tracing::Instrument;

use crate::dlt::SourceRecord;
use crate::processor::Processor;
pub use partitions::{PartitionState, RebalanceContext, Registry};

/// A partition's worker gets paused above this many queued records, resumed
/// below the low mark.
const QUEUE_HIGH: usize = 500;
const QUEUE_LOW: usize = 100;

type KafkaConsumer = StreamConsumer<RebalanceContext>;

/// The consumer's settings.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub topic: String,
    pub group: String,
    pub revoke_grace: Duration,
    pub lag_interval: Duration,
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

/// One partition's records, in order.
async fn work(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    processor: Arc<Processor>,
    consumer: Arc<KafkaConsumer>,
    topic: String,
    shutdown: CancellationToken,
) {
    while let Some(Job { record, state }) = jobs.recv().await {
        if shutdown.is_cancelled() {
            break; // queued records are abandoned: they are not stored
        }
        if state.begin() {
            let stop =
                || shutdown.is_cancelled() || !state.is_active() || processor.circuit.is_open();
            let span = tracing::info_span!(
                "message",
                id = record.text_header("id").as_deref().unwrap_or("-"),
                topic = %record.topic,
                partition = record.partition,
                offset = record.offset,
            );
            let handled = processor.handle(&record, &stop).instrument(span).await;
            // rd_kafka_offset_store stores `offset + 1` itself (the next
            // record to read): pass the record's own offset.
            if handled.is_done()
                && let Err(error) = consumer.store_offset(&topic, record.partition, record.offset)
            {
                // The partition was revoked meanwhile: its new owner will see
                // the record again, and the dedupe row absorbs it.
                tracing::debug!(%error, "offset not stored");
            }
            state.end();
        }
        let queued = state
            .queued
            .fetch_sub(1, Ordering::SeqCst)
            .saturating_sub(1);
        if queued < QUEUE_LOW && state.paused.swap(false, Ordering::SeqCst) && state.is_active() {
            let _ = consumer.resume(&one_partition(&topic, state.partition));
        }
    }
}
