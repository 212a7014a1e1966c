//! Configuration from the environment and the command line: options shared
//! by every command, the service's own, and the tools' subcommands.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idempotent_consumer::tools::DltCommand;
use service_support::config::{
    DatabaseUrl, LogFormat, parse_database_url, parse_positive_duration,
};
use service_support::consumers;

/// The inventory service: consumes pedido.eventos and reserves stock. With a
/// subcommand, a tool for the dead-letter topic or the processed table.
#[derive(Debug, Clone, Parser)]
#[command(name = "inventory-service", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Args)]
pub struct Common {
    /// PostgreSQL URL of the inventory database.
    #[arg(long, env = "INVENTORY_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/inventory",
          value_parser = parse_database_url, global = true)]
    pub database_url: DatabaseUrl,

    /// Kafka bootstrap servers. Other KAFKA_* variables pass through to
    /// librdkafka (KAFKA_SECURITY_PROTOCOL sets security.protocol).
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092",
        global = true
    )]
    pub bootstrap_servers: String,

    /// The topic consumed.
    #[arg(
        long,
        env = "INVENTORY_TOPIC",
        default_value = consumers::INVENTORY.topic,
        global = true
    )]
    pub topic: String,

    /// The dead-letter topic: at least as many partitions as the topic.
    #[arg(
        long,
        env = "INVENTORY_DLT_TOPIC",
        default_value = consumers::INVENTORY.dlt_topic,
        global = true
    )]
    pub dlt_topic: String,

    /// The consumer group.
    #[arg(
        long,
        env = "INVENTORY_GROUP",
        default_value = consumers::INVENTORY.group,
        global = true
    )]
    pub group: String,

    /// Log format.
    #[arg(long, env = "INVENTORY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// Options of the service itself (no subcommand, or `serve`).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the admin and inspection API (port 0 picks a free port).
    #[arg(long, env = "INVENTORY_HTTP_ADDR", default_value = "127.0.0.1:8081")]
    pub http_addr: SocketAddr,

    /// Largest number of database connections.
    #[arg(long, env = "INVENTORY_DB_POOL_SIZE", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(2..=1000))]
    pub db_pool_size: u32,

    /// Time limit for one HTTP request.
    #[arg(long, env = "INVENTORY_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,

    /// Time limit for one SQL statement; hitting it is a transient failure.
    #[arg(long, env = "INVENTORY_STATEMENT_TIMEOUT", default_value = "5s", value_parser = parse_positive_duration)]
    pub statement_timeout: Duration,

    /// Records of one partition applied in one transaction at most, when
    /// that many are already waiting (each keeps its own dedupe row; 1 means
    /// a transaction per record).
    #[arg(long, env = "INVENTORY_BATCH_SIZE", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch_size: u32,

    /// Retries after a transient failure, before the DLT.
    #[arg(long, env = "INVENTORY_RETRIES", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    pub retries: u32,

    /// Wait between retries.
    #[arg(long, env = "INVENTORY_RETRY_BACKOFF", default_value = "1s", value_parser = parse_positive_duration)]
    pub retry_backoff: Duration,

    /// Records the DLQ circuit looks back over.
    #[arg(long, env = "INVENTORY_CIRCUIT_WINDOW", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub circuit_window: u32,

    /// Share of dead-lettered records in the window that opens the circuit
    /// (strictly more than this).
    #[arg(long, env = "INVENTORY_CIRCUIT_MAX_DLT_SHARE", default_value_t = 0.5, value_parser = parse_share)]
    pub circuit_max_dlt_share: f64,

    /// Records seen before the circuit may open at all.
    #[arg(long, env = "INVENTORY_CIRCUIT_MIN_RECORDS", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub circuit_min_records: u32,

    /// Kafka session timeout: how long until a dead member's partitions move.
    #[arg(long, env = "INVENTORY_SESSION_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub session_timeout: Duration,

    /// How long a revoke waits for the record in progress to finish.
    #[arg(long, env = "INVENTORY_REVOKE_GRACE", default_value = "10s", value_parser = parse_positive_duration)]
    pub revoke_grace: Duration,

    /// Run the processed-table retention this often (off by default).
    #[arg(long, env = "INVENTORY_RETENTION_EVERY", value_parser = parse_positive_duration)]
    pub retention_every: Option<Duration>,

    #[command(flatten)]
    pub retention: RetentionArgs,

    /// Do not apply the inventory database migrations at start-up.
    #[arg(long, env = "INVENTORY_NO_MIGRATE")]
    pub no_migrate: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the service (the default).
    Serve,
    /// Inspect and redrive the dead-letter topic.
    #[command(subcommand)]
    Dlt(DltCommand),
    /// Delete mensagem_processada rows older than the retention, in batches.
    Retention,
}

#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// Keep mensagem_processada rows this long. Must cover the topic's
    /// retention plus the redrive window, or a redelivered message would no
    /// longer be recognised as a duplicate.
    #[arg(long, env = "INVENTORY_RETENTION", default_value = "14d", value_parser = parse_positive_duration, global = true)]
    pub retention: Duration,
    /// How long after its first delivery a message may still be redriven.
    #[arg(long, env = "INVENTORY_REDRIVE_WINDOW", default_value = "7d", value_parser = parse_positive_duration, global = true)]
    pub redrive_window: Duration,
    /// Accept a retention shorter than topic retention plus redrive window.
    #[arg(long, env = "INVENTORY_RETENTION_FORCE", global = true)]
    pub force_retention: bool,
}

fn parse_share(value: &str) -> Result<f64, String> {
    let share: f64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a number"))?;
    if (0.0..1.0).contains(&share) {
        Ok(share)
    } else {
        Err("must be at least 0 and less than 1".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotent_consumer::DltReason;

    #[test]
    fn defaults_work_against_the_local_services() {
        let cli = Cli::try_parse_from(["inventory-service"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.http_addr.to_string(), "127.0.0.1:8081");
        assert_eq!(cli.serve.retries, 3);
        assert_eq!(cli.serve.retry_backoff, Duration::from_secs(1));
        assert_eq!(
            cli.serve.retention.retention,
            Duration::from_secs(14 * 86_400)
        );
        assert_eq!(cli.common.group, "estoque");
    }

    #[test]
    fn subcommands_parse_with_their_filters() {
        let cli = Cli::try_parse_from([
            "inventory-service",
            "dlt",
            "redrive",
            "--reason",
            "retries-exhausted",
            "--dry-run",
            "--rate",
            "5",
        ])
        .unwrap();
        let Some(Command::Dlt(DltCommand::Redrive(args))) = cli.command else {
            panic!("not a redrive");
        };
        assert_eq!(args.filter.reason, Some(DltReason::RetriesExhausted));
        assert!(args.dry_run);
        assert!(Cli::try_parse_from(["inventory-service", "dlt", "list", "--since", "2h"]).is_ok());
        assert!(
            Cli::try_parse_from(["inventory-service", "dlt", "list", "--reason", "bad"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["inventory-service", "dlt", "list", "--offset", "3"]).is_err()
        );
    }

    #[test]
    fn invalid_service_values_are_refused() {
        for args in [
            vec!["inventory-service", "--circuit-max-dlt-share", "1.5"],
            vec!["inventory-service", "--retry-backoff", "0s"],
            vec!["inventory-service", "--db-pool-size", "1"],
        ] {
            assert!(Cli::try_parse_from(&args).is_err(), "{args:?} was accepted");
        }
    }
}
