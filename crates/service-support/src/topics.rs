//! What every Kafka client here asks the broker about a topic: whether it
//! exists and with how many partitions, and its settings (retention,
//! `min.insync.replicas`). One error type for all of it: the consumer's
//! start-up checks, the relay's, the tools' and the console's.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::{Client, ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::tls_probe;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// Worth retrying: the broker may not be up yet.
    #[error("cannot read topic metadata from the broker")]
    Unreachable(#[source] rdkafka::error::KafkaError),
    /// Not worth retrying: the settings themselves are wrong.
    #[error("invalid Kafka client settings (check the KAFKA_* variables)")]
    Client(#[source] rdkafka::error::KafkaError),
    #[error("topic {0} does not exist")]
    Missing(String),
    #[error(
        "the dead-letter topic {dlt} has {dlt_partitions} partitions, fewer than the {source_partitions} of {source_topic}: \
         a dead letter keeps its partition number, so the DLT needs at least as many; refusing to run"
    )]
    DltTooSmall {
        dlt: String,
        dlt_partitions: usize,
        source_topic: String,
        source_partitions: usize,
    },
    #[error(
        "topic {topic} has {actual} partitions, {expected} are configured; \
         keys would not land where the consumers and Debezium expect"
    )]
    WrongPartitions {
        topic: String,
        actual: usize,
        expected: usize,
    },
    #[error("cannot create topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("cannot read the configuration of topic {0}")]
    Config(String),
    /// Not worth retrying: the broker answered, and refused this client.
    #[error(
        "the broker refused this client: {reason} (check KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_* and KAFKA_SSL_*)"
    )]
    Refused { reason: String },
}

impl TopicError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, TopicError::Unreachable(_))
    }
}

/// A client context that remembers librdkafka's last connection failure,
/// so that a start-up check that times out can say why. A TLS handshake
/// that fails (an unknown CA, an expired or misnamed certificate), a SASL
/// refusal, or a plaintext client at a TLS listener will not heal by
/// retrying: librdkafka reconnects forever, and says what happened only in
/// its log (synchronously, from its broker threads) and in error events (a
/// consumer's, when polled).
#[derive(Debug)]
pub struct Diagnosed {
    /// The latest refusal seen; a client is made per check, so it is never
    /// stale.
    refusal: Mutex<Option<String>>,
    /// A connection closed during the first request (ApiVersion): a
    /// plaintext client at a TLS listener, or nothing behind a proxy.
    closed_at_first_request: AtomicBool,
    /// `bootstrap.servers`, when the client speaks plaintext (no TLS): where
    /// to ask whether the listener speaks TLS.
    plaintext_bootstrap: Option<String>,
}

/// How long the TLS probe waits for each bootstrap address.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl Diagnosed {
    /// For a client made from `config`.
    pub fn new(config: &ClientConfig) -> Self {
        let protocol = config
            .get("security.protocol")
            .unwrap_or("plaintext")
            .to_ascii_lowercase();
        let plaintext = matches!(protocol.as_str(), "plaintext" | "sasl_plaintext");
        Self {
            refusal: Mutex::new(None),
            closed_at_first_request: AtomicBool::new(false),
            plaintext_bootstrap: plaintext
                .then(|| config.get("bootstrap.servers").map(str::to_owned))
                .flatten(),
        }
    }

    fn remember(&self, reason: &str) {
        if reason.contains("APIVERSION_QUERY") || reason.contains("requesting ApiVersion") {
            self.closed_at_first_request.store(true, Ordering::Relaxed);
        }
        // librdkafka follows a refusal with shorter lines of the same
        // failure ("error:0A000086:SSL routines::…"): the first says most.
        if is_refusal(reason)
            && let Ok(mut refusal) = self.refusal.lock()
            && refusal.is_none()
        {
            *refusal = Some(reason.to_owned());
        }
    }

    /// `error`, a request that failed, as a refusal when librdkafka saw
    /// one, or when a plaintext client's connections were closed at the
    /// first request by a listener that answers TLS; otherwise the broker is
    /// taken to be unreachable (yet). Blocking (the probe): off the runtime.
    pub fn classify(&self, error: KafkaError) -> TopicError {
        if let Some(reason) = self.refusal.lock().ok().and_then(|refusal| refusal.clone()) {
            return TopicError::Refused { reason };
        }
        if let Some(servers) = &self.plaintext_bootstrap
            && self.closed_at_first_request.load(Ordering::Relaxed)
            && let Some(listener) = tls_probe::first_tls_listener(servers, PROBE_TIMEOUT)
        {
            return TopicError::Refused {
                reason: format!(
                    "{listener} speaks TLS and this client does not (security.protocol is plaintext): \
                     it closes the connection at the client's first request; \
                     set KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL"
                ),
            };
        }
        TopicError::Unreachable(error)
    }
}

impl ClientContext for Diagnosed {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        use RDKafkaLogLevel::*;
        // librdkafka says some refusals at info ("Disconnected while
        // requesting ApiVersion: might be caused by incorrect
        // security.protocol…").
        self.remember(message);
        match level {
            Emerg | Alert | Critical | Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}");
            }
            Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
            Notice | Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}"),
            Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}");
        self.remember(reason);
    }
}

impl ConsumerContext for Diagnosed {}

/// What librdkafka says when a broker turned the client away, as opposed
/// to not answering: a refused TLS handshake, a refused SASL exchange, or
/// its own diagnosis of a client speaking the wrong protocol ("…incorrect
/// security.protocol configuration (connecting to a SSL listener?)").
fn is_refusal(reason: &str) -> bool {
    [
        "SSL handshake failed",
        "SASL authentication error",
        "SASL handshake failed",
        "security.protocol",
    ]
    .iter()
    .any(|refusal| reason.contains(refusal))
}

/// `error`, from a request `consumer` made, as a refusal or as the broker
/// unreachable: first delivers what the consumer queued for its context
/// (librdkafka's log lines and error events reach a `BaseConsumer`'s
/// context only when it is polled; half a second: they are already queued).
pub fn explain(consumer: &BaseConsumer<Diagnosed>, error: KafkaError) -> TopicError {
    pump_errors(consumer);
    consumer.context().classify(error)
}

fn pump_errors(consumer: &BaseConsumer<Diagnosed>) {
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < deadline {
        if let Some(Err(error)) = consumer.poll(Duration::from_millis(50)) {
            consumer.context().remember(&error.to_string());
        }
    }
}

/// Why a request failed with `error`: a metadata request by a client made
/// for the purpose, whose context hears what librdkafka says (an admin
/// client's does not: its log lines go to a queue nobody polls). Blocking,
/// for up to the request timeout: call off the runtime.
pub fn diagnose(config: &ClientConfig, error: KafkaError) -> TopicError {
    let Ok(probe) =
        config.create_with_context::<_, BaseConsumer<Diagnosed>>(Diagnosed::new(config))
    else {
        return TopicError::Unreachable(error);
    };
    match probe.fetch_metadata(None, TIMEOUT) {
        Ok(_) => TopicError::Unreachable(error),
        Err(_) => explain(&probe, error),
    }
}

/// [`diagnose`] off the runtime, for an admin client's failed request.
pub async fn diagnose_blocking(config: &ClientConfig, error: KafkaError) -> TopicError {
    let config = config.clone();
    let unexplained = TopicError::Unreachable(error.clone());
    tokio::task::spawn_blocking(move || diagnose(&config, error))
        .await
        .unwrap_or(unexplained)
}

/// What the broker says of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Described {
    pub partitions: usize,
    /// The fewest replicas any of its partitions has.
    pub replication_factor: usize,
}

/// The number of partitions and replicas of `topic`; `Missing` when the
/// broker does not know it (blocking: call off the runtime, or accept a
/// short block at start-up).
pub fn describe<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
) -> Result<Described, TopicError> {
    let metadata = client
        .fetch_metadata(Some(topic), TIMEOUT)
        .map_err(TopicError::Unreachable)?;
    match metadata.topics().iter().find(|t| t.name() == topic) {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(Described {
            partitions: t.partitions().len(),
            replication_factor: t
                .partitions()
                .iter()
                .map(|p| p.replicas().len())
                .min()
                .unwrap_or(0),
        }),
        _ => Err(TopicError::Missing(topic.to_owned())),
    }
}

/// The number of partitions of `topic`.
pub fn partition_count<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<usize, TopicError> {
    describe(consumer.client(), topic).map(|described| described.partitions)
}

/// The value of the topic setting `name`, as the broker reports it
/// (`None`: not reported).
pub async fn config_value<C: ClientContext + 'static>(
    admin: &AdminClient<C>,
    topic: &str,
    name: &str,
) -> Result<Option<String>, TopicError> {
    let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let results = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(TopicError::Unreachable)?;
    let resource = results
        .into_iter()
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| TopicError::Config(topic.to_owned()))?;
    Ok(resource.get(name).and_then(|entry| entry.value.clone()))
}

/// Kafka's default `log.retention.hours` (168).
const KAFKA_DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3_600);

/// The topic's `retention.ms`; `None` when retention is unlimited (-1). A
/// broker that does not report it is taken to use Kafka's default, 7 days.
pub async fn retention(config: &ClientConfig, topic: &str) -> Result<Option<Duration>, TopicError> {
    let admin: AdminClient<DefaultClientContext> = config.create().map_err(TopicError::Client)?;
    let value = match config_value(&admin, topic, "retention.ms").await {
        Err(TopicError::Unreachable(error)) => return Err(diagnose_blocking(config, error).await),
        other => other?,
    };
    let Some(value) = value else {
        tracing::warn!(
            topic,
            "the broker does not report retention.ms; assuming Kafka's default of 7 days"
        );
        return Ok(Some(KAFKA_DEFAULT_RETENTION));
    };
    let millis: i64 = value
        .parse()
        .map_err(|_| TopicError::Config(topic.to_owned()))?;
    Ok(u64::try_from(millis).ok().map(Duration::from_millis))
}
