//! Configuration from the environment and the command line: options shared
//! by every command, the service's own, and the tools' subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use consumer_tools::DltCommand;
use service_support::config::{DatabaseUrl, DatabaseUrlParser, LogFormat, parse_positive_duration};
use service_support::consumers;
use service_support::secret::{Secret, SecretError, value_or_file};

/// The inventory service: consumes pedido.eventos and reserves stock. With a
/// subcommand, a tool for the dead-letter topic or the processed table.
#[derive(Debug, Clone, Parser)]
#[command(name = "inventory-service", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub consumer: ConsumerArgs,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Args)]
pub struct Common {
    /// PostgreSQL URL of the inventory database.
    #[arg(long, env = "INVENTORY_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/inventory",
          value_parser = DatabaseUrlParser, hide_env_values = true, global = true)]
    pub database_url: DatabaseUrl,

    /// A file holding the database password (a container secret), for a
    /// URL without one.
    #[arg(
        long,
        env = "INVENTORY_DATABASE_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub database_password_file: Option<PathBuf>,

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

    /// Do not apply the inventory database migrations at start-up.
    #[arg(long, env = "INVENTORY_NO_MIGRATE")]
    pub no_migrate: bool,

    /// The bearer token that admin writes (PUT /stock/{sku}) need. With
    /// neither this nor INVENTORY_ADMIN_TOKEN_FILE they are all refused.
    /// Prefer the file: a command line is public.
    #[arg(long, env = "INVENTORY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,

    /// A file holding the admin token (a container secret).
    #[arg(long, env = "INVENTORY_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
}

impl Common {
    /// Reads the database password file, if one is named.
    pub fn resolve_secrets(&mut self) -> Result<(), SecretError> {
        self.database_url = self.database_url.clone().with_password_file(
            "INVENTORY_DATABASE_PASSWORD_FILE",
            self.database_password_file.as_deref(),
        )?;
        Ok(())
    }
}

impl ServeArgs {
    /// The admin token, from the variable or the file.
    pub fn admin_token(&self) -> Result<Option<Secret>, SecretError> {
        let file = self.admin_token_file.as_deref();
        value_or_file(
            self.admin_token.as_ref(),
            "INVENTORY_ADMIN_TOKEN",
            file,
            "INVENTORY_ADMIN_TOKEN_FILE",
        )
    }
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
    /// Apply the inventory database's migrations and exit: run as the
    /// database's owner, then serve with INVENTORY_NO_MIGRATE as a role
    /// that owns nothing (docs/security.md, "Least privilege").
    Migrate {
        /// Apply the migrations only: no grants to the roles of
        /// migrations/roles.sql (the deployment grants its own way).
        #[arg(long)]
        no_grants: bool,
    },
}

consumer_tools::consumer_args!(
    ConsumerArgs,
    env = "INVENTORY",
    flag = "",
    defaults = consumers::INVENTORY
);

#[cfg(test)]
mod tests {
    use super::*;
    use idempotent_consumer::DltReason;

    #[test]
    fn defaults_work_against_the_local_services() {
        let cli = Cli::try_parse_from(["inventory-service"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.http_addr.to_string(), "127.0.0.1:8081");
        assert_eq!(cli.consumer.retries, 3);
        assert_eq!(cli.consumer.retry_backoff, Duration::from_secs(1));
        assert_eq!(cli.consumer.retention, Duration::from_secs(14 * 86_400));
        assert_eq!(cli.consumer.group, "estoque");
        assert_eq!(cli.consumer.topic, "pedido.eventos");
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
