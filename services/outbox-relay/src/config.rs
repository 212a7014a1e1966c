//! Configuration from the environment and the command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use service_support::amqp::{AmqpUrl, AmqpUrlParser};
use service_support::config::{DatabaseUrl, DatabaseUrlParser, LogFormat, parse_positive_duration};
use service_support::secret::SecretError;

use crate::leadership::{DEFAULT_LOCK_KEY, SEND_MARGIN};

/// The outbox relay: publishes committed outbox rows to Kafka.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-relay", version, about)]
pub struct Config {
    /// PostgreSQL URL of the database whose outbox this relay publishes:
    /// orders (pedido.eventos), or inventory with --topics estoque.eventos.
    #[arg(long, env = "ORDER_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/orders",
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub database_url: DatabaseUrl,

    /// A file holding the database password (a container secret), for a
    /// URL without one.
    #[arg(long, env = "ORDER_DATABASE_PASSWORD_FILE", value_name = "PATH")]
    pub database_password_file: Option<PathBuf>,

    /// Kafka bootstrap servers. Other KAFKA_* variables pass through to
    /// librdkafka (KAFKA_SECURITY_PROTOCOL sets security.protocol).
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// The broker the relay publishes to: Kafka topics, or RabbitMQ topic
    /// exchanges of the same names (docs/relay.md, "RabbitMQ").
    #[arg(long, env = "RELAY_TRANSPORT", value_enum, default_value_t = Transport::Kafka)]
    pub transport: Transport,

    /// RabbitMQ URL, for --transport rabbitmq (amqps:// for TLS).
    #[arg(long, env = "AMQP_URL", default_value = service_support::amqp::DEFAULT_URL,
          value_parser = AmqpUrlParser, hide_env_values = true)]
    pub amqp_url: AmqpUrl,

    /// A file holding the RabbitMQ password, for a URL without one.
    #[arg(long, env = "AMQP_PASSWORD_FILE", value_name = "PATH")]
    pub amqp_password_file: Option<PathBuf>,

    /// Address of /metrics, /healthz and /readyz (port 0 picks a free port).
    #[arg(long, env = "RELAY_HTTP_ADDR", default_value = "127.0.0.1:8082")]
    pub http_addr: SocketAddr,

    /// How the relay finds new rows.
    #[arg(long, env = "RELAY_MODE", value_enum, default_value_t = Mode::Poll)]
    pub mode: Mode,

    /// Rows read and published per batch: larger batches drain a backlog
    /// faster (one read, one delete and one wait for acknowledgements per
    /// batch); a crash re-publishes at most two batches (while a backlog
    /// drains, one batch is sent while the one before awaits its
    /// acknowledgements).
    #[arg(long, env = "RELAY_BATCH_SIZE", default_value_t = 2000,
          value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub batch_size: i64,

    /// Longest sleep between reads when the outbox is empty (reads follow
    /// each other at once while there are rows, and start 1 ms apart).
    #[arg(long, env = "RELAY_POLL_INTERVAL", default_value = "50ms", value_parser = parse_positive_duration)]
    pub poll_interval: Duration,

    /// How often a standby relay tries to take over.
    #[arg(long, env = "RELAY_FAILOVER_INTERVAL", default_value = "500ms", value_parser = parse_positive_duration)]
    pub failover_interval: Duration,

    /// Failed attempts caused by a row itself before the row is parked.
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 5,
          value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: i32,

    /// What becomes of outbox rows once published: the relay deletes them,
    /// or keeps them (--retain-published), or the writer deleted them in
    /// its own transaction (CDC mode only: the WAL still has the insert).
    #[arg(long, env = "RELAY_OUTBOX_CLEANUP", value_enum, default_value_t = Cleanup::RelayDeletes)]
    pub outbox_cleanup: Cleanup,

    /// With --outbox-cleanup retain: how long published rows are kept (e.g. 7d).
    #[arg(long, env = "RELAY_RETAIN_PUBLISHED", value_parser = parse_positive_duration)]
    pub retain_published: Option<Duration>,

    /// Append each published row's delivery (topic, partition, offset) to
    /// `outbox_delivery`, in the statement that deletes or marks the batch:
    /// what `entrega journey` reads once the row is gone.
    #[arg(long, env = "RELAY_DELIVERY_LOG", default_value_t = true, action = clap::ArgAction::Set)]
    pub delivery_log: bool,

    /// How long the delivery log (`outbox_delivery`: where each published
    /// row went, for `entrega journey`) keeps an entry.
    #[arg(long, env = "RELAY_DELIVERY_LOG_RETENTION", default_value = "7d",
          value_parser = parse_positive_duration)]
    pub delivery_log_retention: Duration,

    /// CDC mode: the logical replication slot (pgoutput) the relay streams;
    /// created when missing. One per database and relay group.
    #[arg(long, env = "RELAY_CDC_SLOT", default_value = "entrega_outbox", value_parser = parse_identifier)]
    pub cdc_slot: String,

    /// CDC mode: the publication of the outbox's inserts; created when missing.
    #[arg(long, env = "RELAY_CDC_PUBLICATION", default_value = "entrega_outbox", value_parser = parse_identifier)]
    pub cdc_publication: String,

    /// CDC mode: how soon a confirmed position reaches the server (lets it
    /// recycle WAL; a crash re-sends at most this much more).
    #[arg(long, env = "RELAY_CDC_STATUS_INTERVAL", default_value = "1s", value_parser = parse_positive_duration)]
    pub cdc_status_interval: Duration,

    /// Longest wait between retries while the broker or database is down.
    #[arg(long, env = "RELAY_MAX_BACKOFF", default_value = "5s", value_parser = parse_positive_duration)]
    pub max_backoff: Duration,

    /// How long librdkafka keeps trying to deliver one record
    /// (`message.timeout.ms`). At most `--lease` minus 3 s: the leader only
    /// sends while the records can be delivered, or dropped, within its lease.
    #[arg(long, env = "RELAY_DELIVERY_TIMEOUT", default_value = "5s", value_parser = parse_positive_duration)]
    pub delivery_timeout: Duration,

    /// How long a leader may stall (frozen, blocked, cut off from the
    /// database) before a standby deposes it: the bound on failover after
    /// anything but a crash (docs/relay.md, "Leadership").
    #[arg(long, env = "RELAY_LEASE", default_value = "10s", value_parser = parse_positive_duration)]
    pub lease: Duration,

    /// Topics (or RabbitMQ exchanges) the relay publishes to, checked at
    /// start-up (comma-separated).
    #[arg(
        long,
        env = "RELAY_TOPICS",
        value_delimiter = ',',
        default_value = service_support::consumers::INVENTORY.topic
    )]
    pub topics: Vec<String>,

    /// Partitions each topic must have.
    #[arg(long, env = "RELAY_TOPIC_PARTITIONS", default_value_t = 6,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub topic_partitions: u16,

    /// Replication factor for topics created with --create-topics
    /// (1 on a laptop, 3 in production).
    #[arg(long, env = "RELAY_TOPIC_REPLICATION_FACTOR", default_value_t = 1,
          value_parser = clap::value_parser!(i32).range(1..=32))]
    pub topic_replication_factor: i32,

    /// Create missing topics (durable topic exchanges on RabbitMQ) at
    /// start-up instead of refusing to run.
    #[arg(long, env = "RELAY_CREATE_TOPICS")]
    pub create_topics: bool,

    /// PostgreSQL advisory lock key that elects the single active relay.
    #[arg(long, env = "RELAY_LOCK_KEY", default_value_t = DEFAULT_LOCK_KEY)]
    pub lock_key: i64,

    /// Log format.
    #[arg(long, env = "RELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The broker the relay publishes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    Kafka,
    #[value(name = "rabbitmq")]
    RabbitMq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Read pending rows with SQL (the default).
    Poll,
    /// Stream inserted rows from the write-ahead log (a logical replication
    /// slot with pgoutput; needs wal_level=logical and the REPLICATION role).
    Cdc,
}

/// What becomes of a published outbox row (docs/relay.md, "Outbox cleanup").
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Cleanup {
    /// The relay deletes it once the broker acknowledged it.
    RelayDeletes,
    /// The relay sets `published_at`; rows older than --retain-published go.
    Retain,
    /// The writer deletes it in the transaction that inserted it: the table
    /// stays empty. CDC mode only.
    DeleteInTransaction,
}

/// Slot and publication names: PostgreSQL's rule for slot names (lower-case
/// letters, digits, underscore; at most 63), which keeps them safe to quote.
fn parse_identifier(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(value.to_owned())
    } else {
        Err("use 1 to 63 lower-case letters, digits and underscores".to_owned())
    }
}

impl Config {
    /// Reads the database password file, if one is named.
    pub fn resolve_secrets(&mut self) -> Result<(), SecretError> {
        self.database_url = self.database_url.clone().with_password_file(
            "ORDER_DATABASE_PASSWORD_FILE",
            self.database_password_file.as_deref(),
        )?;
        self.amqp_url = self
            .amqp_url
            .clone()
            .with_password_file("AMQP_PASSWORD_FILE", self.amqp_password_file.as_deref())?;
        Ok(())
    }

    /// Checks what clap cannot: the topic names.
    pub fn validate(&self) -> Result<(), String> {
        for topic in &self.topics {
            if !service_support::kafka::is_valid_topic_name(topic) {
                return Err(format!(
                    "--topics: {topic:?} is not a valid Kafka topic name"
                ));
            }
        }
        if self.topics.is_empty() {
            return Err("--topics: at least one topic is needed".to_owned());
        }
        match (self.outbox_cleanup, self.retain_published) {
            (Cleanup::Retain, None) => {
                return Err("--outbox-cleanup retain needs --retain-published (e.g. 7d)".to_owned());
            }
            (Cleanup::RelayDeletes | Cleanup::DeleteInTransaction, Some(_)) => {
                return Err(
                    "--retain-published applies only with --outbox-cleanup retain".to_owned(),
                );
            }
            (Cleanup::DeleteInTransaction, _) if self.mode == Mode::Poll => {
                return Err("--outbox-cleanup delete-in-transaction needs --mode cdc: with it the table stays empty, so polling finds nothing".to_owned());
            }
            _ => {}
        }
        if self.delivery_timeout < Duration::from_secs(1) {
            return Err(format!(
                "--delivery-timeout {:?} is too short: librdkafka needs at least 1s to deliver a record",
                self.delivery_timeout
            ));
        }
        let shortest_lease = self.delivery_timeout + SEND_MARGIN + Duration::from_secs(1);
        if self.lease < shortest_lease {
            return Err(format!(
                "--lease {:?} is too short for --delivery-timeout {:?}: it must be at least {:?} (the delivery timeout, {:?} of margin and 1 s to send in)",
                self.lease, self.delivery_timeout, shortest_lease, SEND_MARGIN,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_against_the_local_services() {
        let config = Config::try_parse_from(["outbox-relay"]).unwrap();
        assert_eq!(config.http_addr.to_string(), "127.0.0.1:8082");
        assert_eq!(config.batch_size, 2000);
        assert_eq!(config.topics, ["pedido.eventos"]);
        assert_eq!(config.retain_published, None);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn invalid_values_are_refused() {
        for args in [
            vec!["outbox-relay", "--batch-size", "0"],
            vec!["outbox-relay", "--poll-interval", "0ms"],
            vec!["outbox-relay", "--max-attempts", "0"],
            vec!["outbox-relay", "--database-url", "redis://x"],
            vec!["outbox-relay", "--cdc-publication", "p; drop table outbox"],
        ] {
            assert!(
                Config::try_parse_from(&args).is_err(),
                "{args:?} was accepted"
            );
        }
        let config = Config::try_parse_from(["outbox-relay", "--topics", "bad topic"]).unwrap();
        assert!(config.validate().is_err());
        let config = Config::try_parse_from(["outbox-relay", "--delivery-timeout", "8s"]).unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.contains("--lease 10s is too short"), "{error}");
        let config =
            Config::try_parse_from(["outbox-relay", "--delivery-timeout", "8s", "--lease", "11s"])
                .unwrap();
        assert!(config.validate().is_ok());
        for (args, expected) in [
            (
                vec!["--outbox-cleanup", "retain"],
                "needs --retain-published",
            ),
            (vec!["--retain-published", "7d"], "applies only with"),
            (
                vec!["--outbox-cleanup", "delete-in-transaction"],
                "needs --mode cdc",
            ),
        ] {
            let config = Config::try_parse_from(["outbox-relay"].into_iter().chain(args)).unwrap();
            let error = config.validate().unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
        for args in [
            [
                "--outbox-cleanup",
                "retain",
                "--retain-published",
                "7d",
                "--mode",
                "poll",
            ],
            [
                "--outbox-cleanup",
                "delete-in-transaction",
                "--mode",
                "cdc",
                "--cdc-slot",
                "s_1",
            ],
        ] {
            let config = Config::try_parse_from(["outbox-relay"].into_iter().chain(args)).unwrap();
            assert!(config.validate().is_ok(), "{args:?}");
        }
        for name in ["", "Upper", "has-dash", &"x".repeat(64)] {
            assert!(
                Config::try_parse_from(["outbox-relay", "--cdc-slot", name]).is_err(),
                "{name:?}"
            );
        }
    }
}
