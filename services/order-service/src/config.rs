//! Configuration from the environment and the command line.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idempotent_consumer::ConsumerOptions;
use idempotent_consumer::tools::DltCommand;
pub use service_support::config::{DatabaseUrl, LogFormat};
use service_support::config::{parse_database_url, parse_positive_duration};
use service_support::consumers;

/// The order service: places orders and writes their outbox rows; consumes
/// the inventory's outcomes into each order's status. With a subcommand, a
/// tool for the status consumer's dead-letter topic.
#[derive(Debug, Clone, Parser)]
#[command(name = "order-service", version, about)]
pub struct Config {
    /// PostgreSQL URL of the orders database.
    #[arg(
        long,
        env = "ORDER_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/orders",
        value_parser = parse_database_url,
        hide_default_value = false
    )]
    pub database_url: DatabaseUrl,

    /// Address the HTTP API listens on (port 0 picks a free port).
    #[arg(long, env = "ORDER_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,

    /// Largest number of database connections.
    #[arg(long, env = "ORDER_DB_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub db_pool_size: u32,

    /// Time limit for one request, database work included (e.g. 10s, 500ms).
    #[arg(long, env = "ORDER_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,

    /// Time limit for one SQL statement: a lock held elsewhere fails the
    /// statement (a transient failure for the consumer) instead of hanging.
    #[arg(long, env = "ORDER_STATEMENT_TIMEOUT", default_value = "5s", value_parser = parse_positive_duration)]
    pub statement_timeout: Duration,

    /// How long an Idempotency-Key is remembered (e.g. 24h).
    #[arg(long, env = "ORDER_IDEMPOTENCY_KEY_TTL", default_value = "24h", value_parser = parse_positive_duration)]
    pub idempotency_key_ttl: Duration,

    /// Do not apply the database migrations at start-up.
    #[arg(long, env = "ORDER_NO_MIGRATE")]
    pub no_migrate: bool,

    #[command(flatten)]
    pub status: StatusConsumerArgs,

    /// Log format.
    #[arg(long, env = "ORDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Delete each outbox row in the transaction that inserts it: the table
    /// stays empty and only the WAL carries the row. Only with a relay that
    /// reads the WAL (outbox-relay --mode cdc --outbox-cleanup
    /// delete-in-transaction, or Debezium); a polling relay would see nothing.
    #[arg(long, env = "ORDER_OUTBOX_DELETE_IN_TRANSACTION")]
    pub outbox_delete_in_transaction: bool,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve the API and consume the outcomes (the default).
    Serve,
    /// Inspect and redrive the status consumer's dead-letter topic
    /// (--status-dlt-topic): the same tools as every consumer of the
    /// idempotent-consumer library.
    #[command(subcommand)]
    Dlt(DltCommand),
}

/// The `pedido.status` consumer: the inventory's outcomes move orders out
/// of PENDING.
#[derive(Debug, Clone, Args)]
pub struct StatusConsumerArgs {
    /// Serve the API without consuming the inventory's outcomes: orders stay
    /// PENDING. For tests of the API alone and for benchmarks.
    #[arg(long, env = "ORDER_NO_STATUS_CONSUMER")]
    pub no_status_consumer: bool,

    /// Kafka bootstrap servers. Other KAFKA_* variables pass through to
    /// librdkafka (KAFKA_SECURITY_PROTOCOL sets security.protocol).
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092",
        global = true
    )]
    pub bootstrap_servers: String,

    /// The inventory's outcomes.
    #[arg(long, env = "ORDER_STATUS_TOPIC", default_value = consumers::ORDER_STATUS.topic)]
    pub status_topic: String,

    /// Dead letters of the status consumer: at least as many partitions as
    /// the topic.
    #[arg(
        long,
        env = "ORDER_STATUS_DLT_TOPIC",
        default_value = consumers::ORDER_STATUS.dlt_topic,
        global = true
    )]
    pub status_dlt_topic: String,

    /// The consumer group.
    #[arg(
        long,
        env = "ORDER_STATUS_GROUP",
        default_value = consumers::ORDER_STATUS.group,
        global = true
    )]
    pub status_group: String,

    /// Records of one partition applied in one transaction at most.
    #[arg(long, env = "ORDER_STATUS_BATCH_SIZE", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub status_batch_size: u32,

    /// Retries after a transient failure, before the DLT.
    #[arg(long, env = "ORDER_STATUS_RETRIES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub status_retries: u32,

    /// Wait between retries.
    #[arg(long, env = "ORDER_STATUS_RETRY_BACKOFF", default_value = "1s", value_parser = parse_positive_duration)]
    pub status_retry_backoff: Duration,

    /// Kafka session timeout: how long until a dead member's partitions move.
    #[arg(long, env = "ORDER_STATUS_SESSION_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub status_session_timeout: Duration,
}

impl StatusConsumerArgs {
    pub fn options(&self) -> ConsumerOptions {
        ConsumerOptions {
            bootstrap_servers: self.bootstrap_servers.clone(),
            topic: self.status_topic.clone(),
            dlt_topic: self.status_dlt_topic.clone(),
            group: self.status_group.clone(),
            batch_size: self.status_batch_size as usize,
            retries: self.status_retries,
            retry_backoff: self.status_retry_backoff,
            session_timeout: self.status_session_timeout,
            // As long as the request timeout's default: a batch is short.
            revoke_grace: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_against_the_local_services() {
        let config = Config::try_parse_from(["order-service"]).unwrap();
        assert_eq!(config.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(config.request_timeout, Duration::from_secs(10));
        assert!(!config.no_migrate);
    }

    #[test]
    fn invalid_values_are_refused_with_a_reason() {
        for args in [
            vec!["order-service", "--database-url", "mysql://x"],
            vec!["order-service", "--http-addr", "localhost"],
            vec!["order-service", "--db-pool-size", "0"],
            vec!["order-service", "--request-timeout", "0s"],
            vec!["order-service", "--request-timeout", "soon"],
        ] {
            assert!(
                Config::try_parse_from(&args).is_err(),
                "{args:?} was accepted"
            );
        }
    }
}
