//! The command line of a consumer built on the idempotent-consumer library,
//! the same in every service but for the names: `consumer_args!` declares
//! its options under a service's variable prefix and flag prefix, and turns
//! them into the engine's [`ConsumerOptions`](idempotent_consumer::ConsumerOptions)
//! and [`Circuit`](idempotent_consumer::Circuit).
//!
//! A macro because clap takes a variable's and a flag's name as constants,
//! and each service has its own prefix: `consumer_args!(ConsumerArgs,
//! env = "INVENTORY", flag = "", defaults = consumers::INVENTORY)` gives
//! `--topic` / `INVENTORY_TOPIC`, `--retries` / `INVENTORY_RETRIES`, and so
//! on; `flag = "status-"` gives `--status-topic`. The retention options keep
//! their flags unprefixed (`<service> retention --retention 14d`).

/// Declares `$name`, a consumer's options; see the module's documentation.
#[macro_export]
macro_rules! consumer_args {
    ($name:ident, env = $env:literal, flag = $flag:literal, defaults = $defaults:expr) => {
        #[derive(Debug, Clone, clap::Args)]
        pub struct $name {
            /// Kafka bootstrap servers. Other KAFKA_* variables pass through to
            /// librdkafka (KAFKA_SECURITY_PROTOCOL sets security.protocol).
            #[arg(long, env = "KAFKA_BOOTSTRAP_SERVERS", default_value = "127.0.0.1:9092", global = true)]
            pub bootstrap_servers: String,

            /// The broker consumed: Kafka, or RabbitMQ (a quorum queue bound
            /// to the exchange named like the topic; docs/rabbitmq.md).
            #[arg(long = concat!($flag, "transport"), env = concat!($env, "_TRANSPORT"),
                  value_enum, default_value_t = $crate::args::Transport::Kafka, global = true)]
            pub transport: $crate::args::Transport,

            /// RabbitMQ URL, for the rabbitmq transport (amqps:// for TLS).
            #[arg(long, env = "AMQP_URL", default_value = $crate::args::DEFAULT_AMQP_URL,
                  value_parser = $crate::args::AmqpUrlParser, hide_env_values = true, global = true)]
            pub amqp_url: $crate::args::AmqpUrl,

            /// The RabbitMQ queue consumed: a quorum queue with a single
            /// active consumer, declared at start-up with its dead-letter
            /// exchange and queue (`<queue>.dlx`, `<queue>.dlq`).
            #[arg(long = concat!($flag, "queue"), env = concat!($env, "_QUEUE"),
                  default_value = $defaults.name, global = true)]
            pub queue: String,

            /// RabbitMQ: messages delivered and not yet acknowledged, at most.
            #[arg(long = concat!($flag, "prefetch"), env = concat!($env, "_PREFETCH"), default_value_t = 100,
                  value_parser = clap::value_parser!(u16).range(1..))]
            pub prefetch: u16,

            /// RabbitMQ: deliveries of one message before the broker
            /// dead-letters it (a backstop: a message that fails is
            /// dead-lettered by the consumer on its first delivery).
            #[arg(long = concat!($flag, "delivery-limit"), env = concat!($env, "_DELIVERY_LIMIT"),
                  default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
            pub delivery_limit: u32,

            /// The topic consumed.
            #[arg(long = concat!($flag, "topic"), env = concat!($env, "_TOPIC"),
                  default_value = $defaults.topic, global = true)]
            pub topic: String,

            /// The dead-letter topic: at least as many partitions as the topic.
            #[arg(long = concat!($flag, "dlt-topic"), env = concat!($env, "_DLT_TOPIC"),
                  default_value = $defaults.dlt_topic, global = true)]
            pub dlt_topic: String,

            /// The consumer group.
            #[arg(long = concat!($flag, "group"), env = concat!($env, "_GROUP"),
                  default_value = $defaults.group, global = true)]
            pub group: String,

            /// Records of one partition applied in one transaction at most, when
            /// that many are already waiting (each keeps its own dedupe row; 1
            /// means a transaction per record).
            #[arg(long = concat!($flag, "batch-size"), env = concat!($env, "_BATCH_SIZE"), default_value_t = 50,
                  value_parser = clap::value_parser!(u32).range(1..=1000))]
            pub batch_size: u32,

            /// Retries after a transient failure, before the DLT.
            #[arg(long = concat!($flag, "retries"), env = concat!($env, "_RETRIES"), default_value_t = 3,
                  value_parser = clap::value_parser!(u32).range(0..=100))]
            pub retries: u32,

            /// Wait between retries.
            #[arg(long = concat!($flag, "retry-backoff"), env = concat!($env, "_RETRY_BACKOFF"),
                  default_value = "1s", value_parser = $crate::parse_positive_duration)]
            pub retry_backoff: std::time::Duration,

            /// Records the DLQ circuit looks back over.
            #[arg(long = concat!($flag, "circuit-window"), env = concat!($env, "_CIRCUIT_WINDOW"),
                  default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
            pub circuit_window: u32,

            /// Share of dead-lettered records in the window that opens the circuit
            /// (strictly more than this).
            #[arg(long = concat!($flag, "circuit-max-dlt-share"), env = concat!($env, "_CIRCUIT_MAX_DLT_SHARE"),
                  default_value_t = 0.5, value_parser = $crate::args::parse_share)]
            pub circuit_max_dlt_share: f64,

            /// Records seen before the circuit may open at all.
            #[arg(long = concat!($flag, "circuit-min-records"), env = concat!($env, "_CIRCUIT_MIN_RECORDS"),
                  default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
            pub circuit_min_records: u32,

            /// Kafka session timeout: how long until a dead member's partitions move.
            #[arg(long = concat!($flag, "session-timeout"), env = concat!($env, "_SESSION_TIMEOUT"),
                  default_value = "10s", value_parser = $crate::parse_positive_duration)]
            pub session_timeout: std::time::Duration,

            /// How long a revoke waits for the record in progress to finish.
            #[arg(long = concat!($flag, "revoke-grace"), env = concat!($env, "_REVOKE_GRACE"),
                  default_value = "10s", value_parser = $crate::parse_positive_duration)]
            pub revoke_grace: std::time::Duration,

            /// Keep mensagem_processada rows this long. Must cover the topic's
            /// retention plus the redrive window, or a redelivered message would no
            /// longer be recognised as a duplicate.
            #[arg(long, env = concat!($env, "_RETENTION"), default_value = "14d",
                  value_parser = $crate::parse_positive_duration, global = true)]
            pub retention: std::time::Duration,

            /// How long after its first delivery a message may still be redriven.
            #[arg(long, env = concat!($env, "_REDRIVE_WINDOW"), default_value = "7d",
                  value_parser = $crate::parse_positive_duration, global = true)]
            pub redrive_window: std::time::Duration,

            /// Accept a retention shorter than topic retention plus redrive window.
            #[arg(long, env = concat!($env, "_RETENTION_FORCE"), global = true)]
            pub force_retention: bool,

            /// Delete expired mensagem_processada rows this often while serving
            /// (off by default).
            #[arg(long, env = concat!($env, "_RETENTION_EVERY"),
                  value_parser = $crate::parse_positive_duration)]
            pub retention_every: Option<std::time::Duration>,
        }

        impl $name {
            /// What the engine is told.
            pub fn options(&self) -> $crate::ConsumerOptions {
                $crate::ConsumerOptions {
                    bootstrap_servers: self.bootstrap_servers.clone(),
                    topic: self.topic.clone(),
                    dlt_topic: self.dlt_topic.clone(),
                    group: self.group.clone(),
                    batch_size: self.batch_size as usize,
                    retries: self.retries,
                    retry_backoff: self.retry_backoff,
                    session_timeout: self.session_timeout,
                    revoke_grace: self.revoke_grace,
                    retention: $crate::Retention {
                        keep: self.retention,
                        redrive_window: self.redrive_window,
                        force: self.force_retention,
                    },
                    retention_every: self.retention_every,
                    rabbitmq: (self.transport == $crate::args::Transport::RabbitMq).then(|| {
                        $crate::args::RabbitMqOptions {
                            url: self.amqp_url.clone(),
                            queue: self.queue.clone(),
                            prefetch: self.prefetch,
                            delivery_limit: self.delivery_limit,
                        }
                    }),
                }
            }

            /// The DLQ circuit these options describe.
            pub fn circuit(&self) -> $crate::Circuit {
                $crate::Circuit::new(
                    self.circuit_window as usize,
                    self.circuit_max_dlt_share,
                    self.circuit_min_records as usize,
                )
            }
        }
    };
}

#[doc(hidden)]
pub use idempotent_consumer::RabbitMqOptions;
#[doc(hidden)]
pub use service_support::amqp::{AmqpUrl, AmqpUrlParser, DEFAULT_URL as DEFAULT_AMQP_URL};

/// The broker a consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Kafka,
    #[value(name = "rabbitmq")]
    RabbitMq,
}

/// A share in `[0, 1)`.
pub fn parse_share(value: &str) -> Result<f64, String> {
    let share: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if (0.0..1.0).contains(&share) {
        Ok(share)
    } else {
        Err("must be at least 0 and less than 1".to_owned())
    }
}
