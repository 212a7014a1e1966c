//! The Kafka consumer assembled and run: the settings the delivery guarantee
//! rests on, the poll thread, the lag sampler and the database probe beside
//! it, and how it all ends.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

use crate::handler::Handler;
use crate::pipeline::Pipeline;
use crate::{lag, poller};

/// The consumer's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub topic: String,
    pub group: String,
    /// How long a revoke (or shutdown) waits for the attempt in flight.
    pub revoke_grace: Duration,
    pub lag_interval: Duration,
    /// Records of one partition applied in one transaction at most.
    pub max_batch: usize,
}

/// The librdkafka settings the delivery guarantee depends on: offsets are
/// stored by the workers only after a record is finished, and librdkafka
/// commits what was stored every second, on revoke and on close.
pub fn consumer_settings(
    group: &str,
    client_id: &str,
    session_timeout: Duration,
) -> Vec<(&'static str, String)> {
    vec![
        ("group.id", group.to_owned()),
        ("client.id", client_id.to_owned()),
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

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("cannot create the Kafka consumer")]
    Kafka(#[from] KafkaError),
    #[error("the poll thread could not start")]
    Thread(#[source] std::io::Error),
    #[error("the poll thread panicked")]
    PollThreadPanicked,
}

/// Consumes until `shutdown`: then lets each worker finish the attempt in
/// flight, commits the stored offsets and leaves the group.
pub async fn run<H: Handler>(
    settings: Settings,
    config: ClientConfig,
    pipeline: Pipeline<H>,
    shutdown: CancellationToken,
) -> Result<(), ConsumerError> {
    let pipeline = Arc::new(pipeline);
    let context = poller::Context::new(
        settings.topic.clone(),
        pipeline.policy.consuming.clone(),
        settings.revoke_grace,
        tokio::runtime::Handle::current(),
    );
    let consumer: Arc<poller::KafkaConsumer> = Arc::new(config.create_with_context(context)?);
    consumer.subscribe(&[&settings.topic])?;
    tracing::info!(topic = %settings.topic, group = %settings.group, "consumer started");
    let lag = tokio::spawn(lag::sample(
        Arc::clone(&consumer),
        settings.lag_interval,
        shutdown.clone(),
    ));
    let probe = tokio::spawn(Arc::clone(pipeline.policy.health.database()).probe(shutdown.clone()));

    let poller = poller::Poller {
        consumer,
        pipeline,
        max_batch: settings.max_batch,
        shutdown: shutdown.clone(),
    };
    let (done, finished) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("kafka-poll".to_owned())
        .spawn(move || {
            poller.run();
            // The lag sampler holds the consumer too: it ends first, so that
            // the last reference drops here. Closing the consumer blocks
            // (final commit, LeaveGroup, the revoke callback), which must not
            // happen on a runtime thread.
            let _ = runtime.block_on(lag);
            drop(poller);
            let _ = done.send(());
        })
        .map_err(ConsumerError::Thread)?;
    let result = finished
        .await
        .map_err(|_| ConsumerError::PollThreadPanicked);
    // The poll thread stopping for any reason stops the service.
    shutdown.cancel();
    let _ = probe.await;
    result
}
