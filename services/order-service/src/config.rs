//! Configuration from the environment and the command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use consumer_tools::DltCommand;
pub use service_support::config::{DatabaseUrl, LogFormat};
use service_support::config::{DatabaseUrlParser, parse_positive_duration};
use service_support::consumers;
use service_support::secret::SecretError;

/// The order service: places orders and writes their outbox rows; consumes
/// the inventory's outcomes into each order's status. With a subcommand, a
/// tool for the status consumer's dead-letter topic or processed table.
#[derive(Debug, Clone, Parser)]
#[command(name = "order-service", version, about)]
pub struct Config {
    /// PostgreSQL URL of the orders database.
    #[arg(
        long,
        env = "ORDER_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/orders",
        value_parser = DatabaseUrlParser,
        hide_default_value = false,
        hide_env_values = true
    )]
    pub database_url: DatabaseUrl,

    /// A file holding the database password (a container secret), for a
    /// URL without one.
    #[arg(long, env = "ORDER_DATABASE_PASSWORD_FILE", value_name = "PATH")]
    pub database_password_file: Option<PathBuf>,

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

    /// Serve the API without consuming the inventory's outcomes: orders stay
    /// PENDING. For tests of the API alone and for benchmarks.
    #[arg(long, env = "ORDER_NO_STATUS_CONSUMER")]
    pub no_status_consumer: bool,

    /// The `pedido.status` consumer: the inventory's outcomes move orders
    /// out of PENDING.
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

impl Config {
    /// Reads the database password file, if one is named.
    pub fn resolve_secrets(&mut self) -> Result<(), SecretError> {
        self.database_url = self.database_url.clone().with_password_file(
            "ORDER_DATABASE_PASSWORD_FILE",
            self.database_password_file.as_deref(),
        )?;
        Ok(())
    }
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
    /// Delete the status consumer's mensagem_processada rows older than the
    /// retention, in batches.
    Retention,
    /// Apply the orders database's migrations and exit: run as the
    /// database's owner, then serve with ORDER_NO_MIGRATE as a role that
    /// owns nothing (docs/security.md, "Least privilege").
    Migrate {
        /// Apply the migrations only: no grants to the roles of
        /// migrations/roles.sql (the deployment grants its own way).
        #[arg(long)]
        no_grants: bool,
    },
}

consumer_tools::consumer_args!(
    StatusConsumerArgs,
    env = "ORDER_STATUS",
    flag = "status-",
    defaults = consumers::ORDER_STATUS
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_against_the_local_services() {
        let config = Config::try_parse_from(["order-service"]).unwrap();
        assert_eq!(config.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(config.request_timeout, Duration::from_secs(10));
        assert!(!config.no_migrate);
        let retention = config.status.options().retention;
        assert_eq!(retention.keep, Duration::from_secs(14 * 86_400));
        assert_eq!(retention.redrive_window, Duration::from_secs(7 * 86_400));
        assert!(!retention.force);
        assert_eq!(config.status.retention_every, None);
        assert_eq!(config.status.topic, "estoque.eventos");
    }

    #[test]
    fn retention_is_a_subcommand_with_the_inventorys_options() {
        let config = Config::try_parse_from([
            "order-service",
            "retention",
            "--retention",
            "1h",
            "--force-retention",
        ])
        .unwrap();
        assert!(matches!(config.command, Some(Command::Retention)));
        let retention = config.status.options().retention;
        assert_eq!(retention.keep, Duration::from_secs(3_600));
        assert!(retention.force);
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
