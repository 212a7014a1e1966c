//! Configuration from the environment and the command line.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use service_support::config::{
    DatabaseUrl, LogFormat, parse_database_url, parse_positive_duration,
};

use crate::leadership::{DEFAULT_LOCK_KEY, SEND_MARGIN};

/// The outbox relay: publishes committed outbox rows to Kafka.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-relay", version, about)]
pub struct Config {
    /// PostgreSQL URL of the database whose outbox this relay publishes:
    /// orders (pedido.eventos), or inventory with --topics estoque.eventos.
    #[arg(long, env = "ORDER_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/orders",
          value_parser = parse_database_url)]
    pub database_url: DatabaseUrl,

    /// Kafka bootstrap servers. Other KAFKA_* variables pass through to
    /// librdkafka (KAFKA_SECURITY_PROTOCOL sets security.protocol).
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// Address of /metrics, /healthz and /readyz (port 0 picks a free port).
    #[arg(long, env = "RELAY_HTTP_ADDR", default_value = "127.0.0.1:8082")]
    pub http_addr: SocketAddr,

    /// How the relay finds new rows.
    #[arg(long, env = "RELAY_MODE", value_enum, default_value_t = Mode::Poll)]
    pub mode: Mode,

    /// Rows read and published per batch: larger batches drain a backlog
    /// faster (one read, one delete and one wait for acknowledgements per
    /// batch); a crash re-publishes at most one batch.
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

    /// Keep published rows this long (e.g. 7d) instead of deleting them.
    #[arg(long, env = "RELAY_RETAIN_PUBLISHED", value_parser = parse_positive_duration)]
    pub retain_published: Option<Duration>,

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

    /// Topics the relay publishes to, checked at start-up (comma-separated).
    #[arg(
        long,
        env = "RELAY_TOPICS",
        value_delimiter = ',',
        default_value = "pedido.eventos"
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

    /// Create missing topics at start-up instead of refusing to run.
    #[arg(long, env = "RELAY_CREATE_TOPICS")]
    pub create_topics: bool,

    /// PostgreSQL advisory lock key that elects the single active relay.
    #[arg(long, env = "RELAY_LOCK_KEY", default_value_t = DEFAULT_LOCK_KEY)]
    pub lock_key: i64,

    /// Log format.
    #[arg(long, env = "RELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Read pending rows with SQL (the default).
    Poll,
}

impl Config {
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
    }
}
