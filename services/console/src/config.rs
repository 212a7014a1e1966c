//! The console's configuration: environment and flags, the same for the
//! CLI and the page.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};
use consumer_tools::DltFilter;
use service_support::config::{DatabaseUrl, DatabaseUrlParser, LogFormat};
use service_support::consumers;
use service_support::secret::{Secret, SecretError, value_or_file};
use url::Url;
use uuid::Uuid;

/// entrega's operations console: where a message or an order has been, what
/// the dead-letter topics hold (and their redrive), the pipeline's health.
/// Inspection reads in read-only sessions; only a redrive writes.
#[derive(Debug, Parser)]
#[command(name = "entrega", version)]
pub struct Cli {
    #[command(flatten)]
    pub sources: SourceArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The orders database (orders, outbox, status consumer).
    #[arg(long, env = "ORDER_DATABASE_URL", global = true,
          default_value = "postgres://postgres@127.0.0.1:5432/orders",
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub orders_database_url: DatabaseUrl,

    /// The inventory database (reservations, its outbox, the reserving consumer).
    #[arg(long, env = "INVENTORY_DATABASE_URL", global = true,
          default_value = "postgres://postgres@127.0.0.1:5432/inventory",
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub inventory_database_url: DatabaseUrl,

    /// Where a redrive records itself in the orders database
    /// (`dlt_redrive`); a role that may insert there. Default: the
    /// inspection URL.
    #[arg(long, env = "CONSOLE_ORDERS_REDRIVE_DATABASE_URL", global = true,
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub orders_redrive_database_url: Option<DatabaseUrl>,

    /// The same for the inventory database.
    #[arg(long, env = "CONSOLE_INVENTORY_REDRIVE_DATABASE_URL", global = true,
          value_parser = DatabaseUrlParser, hide_env_values = true)]
    pub inventory_redrive_database_url: Option<DatabaseUrl>,

    /// Files holding the passwords of the four URLs above (container
    /// secrets), for URLs without one.
    #[arg(
        long,
        env = "ORDER_DATABASE_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub orders_database_password_file: Option<std::path::PathBuf>,
    #[arg(
        long,
        env = "INVENTORY_DATABASE_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub inventory_database_password_file: Option<std::path::PathBuf>,
    #[arg(
        long,
        env = "CONSOLE_ORDERS_REDRIVE_DATABASE_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub orders_redrive_database_password_file: Option<std::path::PathBuf>,
    #[arg(
        long,
        env = "CONSOLE_INVENTORY_REDRIVE_DATABASE_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub inventory_redrive_database_password_file: Option<std::path::PathBuf>,

    /// The Kafka bootstrap servers; other `KAFKA_*` variables pass through
    /// to librdkafka, as for the services.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        global = true,
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap_servers: String,

    /// The services whose /metrics the health page reads, as name=URL,
    /// comma-separated.
    #[arg(long, env = "CONSOLE_SERVICES", global = true, value_delimiter = ',',
          value_parser = parse_service,
          default_value = "order-service=http://127.0.0.1:8080,inventory-service=http://127.0.0.1:8081,outbox-relay=http://127.0.0.1:8082")]
    pub services: Vec<ServiceUrl>,

    /// The most records a journey reads from one partition looking for a
    /// message's copies.
    #[arg(long, env = "CONSOLE_SCAN_LIMIT", global = true, default_value_t = 50_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub scan_limit: u32,

    /// The topic the inventory service consumes, as it names it.
    #[arg(long, env = "INVENTORY_TOPIC", global = true,
          default_value = consumers::INVENTORY.topic)]
    pub inventory_topic: String,

    /// The inventory service's dead-letter topic, as it names it.
    #[arg(long, env = "INVENTORY_DLT_TOPIC", global = true,
          default_value = consumers::INVENTORY.dlt_topic)]
    pub inventory_dlt_topic: String,

    /// The inventory service's consumer group, as it names it: its lag, and
    /// its redrive group (this + `.redrive`, as `inventory-service dlt
    /// redrive` uses).
    #[arg(long, env = "INVENTORY_GROUP", global = true,
          default_value = consumers::INVENTORY.group)]
    pub inventory_group: String,

    /// The topic the order service's status consumer reads, as it names it.
    #[arg(long, env = "ORDER_STATUS_TOPIC", global = true,
          default_value = consumers::ORDER_STATUS.topic)]
    pub order_status_topic: String,

    /// The status consumer's dead-letter topic, as the order service names it.
    #[arg(long, env = "ORDER_STATUS_DLT_TOPIC", global = true,
          default_value = consumers::ORDER_STATUS.dlt_topic)]
    pub order_status_dlt_topic: String,

    /// The status consumer's group, as the order service names it (its
    /// redrive group: this + `.redrive`, as `order-service dlt redrive`
    /// uses).
    #[arg(long, env = "ORDER_STATUS_GROUP", global = true,
          default_value = consumers::ORDER_STATUS.group)]
    pub order_status_group: String,

    /// The relays' election lock (`outbox-relay --lock-key`), to find the
    /// leader.
    #[arg(long, env = "RELAY_LOCK_KEY", global = true, default_value_t = outbox::RELAY_LOCK_KEY)]
    pub relay_lock_key: i64,

    /// Log format.
    #[arg(long, env = "CONSOLE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

impl SourceArgs {
    /// Reads the database password files that are named.
    pub fn resolve_secrets(&mut self) -> Result<(), SecretError> {
        self.orders_database_url = self.orders_database_url.clone().with_password_file(
            "ORDER_DATABASE_PASSWORD_FILE",
            self.orders_database_password_file.as_deref(),
        )?;
        self.inventory_database_url = self.inventory_database_url.clone().with_password_file(
            "INVENTORY_DATABASE_PASSWORD_FILE",
            self.inventory_database_password_file.as_deref(),
        )?;
        for (url, variable, file) in [
            (
                &mut self.orders_redrive_database_url,
                "CONSOLE_ORDERS_REDRIVE_DATABASE_PASSWORD_FILE",
                &self.orders_redrive_database_password_file,
            ),
            (
                &mut self.inventory_redrive_database_url,
                "CONSOLE_INVENTORY_REDRIVE_DATABASE_PASSWORD_FILE",
                &self.inventory_redrive_database_password_file,
            ),
        ] {
            if let Some(given) = url.take() {
                *url = Some(given.with_password_file(variable, file.as_deref())?);
            }
        }
        Ok(())
    }
}

/// A service the health page asks for its metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    pub name: String,
    pub url: Url,
}

fn parse_service(value: &str) -> Result<ServiceUrl, String> {
    let (name, url) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?}: expected name=http://host:port"))?;
    let url = Url::parse(url).map_err(|error| format!("{value:?}: {error}"))?;
    if !matches!(url.scheme(), "http" | "https") || name.trim().is_empty() {
        return Err(format!("{value:?}: expected name=http://host:port"));
    }
    Ok(ServiceUrl {
        name: name.trim().to_owned(),
        url,
    })
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Everywhere a message (by its id) or an order (by its id) has been,
    /// in time order, with the evidence.
    Journey {
        /// A message id (outbox id, Kafka header `id`) or an order id.
        id: Uuid,
        /// Print the journey as JSON (as GET /api/journey/{id} returns it).
        #[arg(long)]
        json: bool,
    },
    /// The dead-letter topics: list, show, redrive.
    #[command(subcommand)]
    Dlt(DltCommand),
    /// The pipeline's health: lag, outbox backlog, DLT depth, circuits,
    /// relay leaders.
    Health {
        #[arg(long)]
        json: bool,
    },
    /// Serve the console's page and its JSON API.
    Serve(ServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum DltCommand {
    /// List dead letters (all DLTs unless --topic).
    List {
        /// Only this DLT (pedido.eventos.dlt or estoque.eventos.dlt).
        #[arg(long)]
        topic: Option<String>,
        #[command(flatten)]
        filter: DltFilter,
        #[arg(long)]
        json: bool,
    },
    /// One dead letter, headers decoded and value pretty-printed.
    Show {
        topic: String,
        partition: i32,
        offset: i64,
        #[arg(long)]
        json: bool,
    },
    /// Redrive one dead letter to its original topic, keeping its id; with
    /// --dry-run, say what would happen now and publish nothing.
    Redrive {
        topic: String,
        partition: i32,
        offset: i64,
        #[arg(long)]
        dry_run: bool,
        /// Who redrives, for the audit. Default: the login name.
        #[arg(long, env = "DLT_OPERATOR")]
        operator: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where the page is served: a loopback address (the console has no
    /// login; reach it from elsewhere through an authenticating proxy or an
    /// SSH tunnel).
    #[arg(long, env = "CONSOLE_HTTP_ADDR", default_value = "127.0.0.1:8090",
          value_parser = parse_loopback)]
    pub http_addr: SocketAddr,

    /// The bearer token a redrive needs (the API's Authorization header,
    /// the page's token field). With neither this nor
    /// CONSOLE_ADMIN_TOKEN_FILE every redrive is refused. Prefer the file: a
    /// command line is public.
    #[arg(long, env = "CONSOLE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,

    /// A file holding the admin token (a container secret).
    #[arg(long, env = "CONSOLE_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<std::path::PathBuf>,
}

impl ServeArgs {
    /// The admin token, from the variable or the file.
    pub fn admin_token(&self) -> Result<Option<Secret>, SecretError> {
        let file = self.admin_token_file.as_deref();
        value_or_file(
            self.admin_token.as_ref(),
            "CONSOLE_ADMIN_TOKEN",
            file,
            "CONSOLE_ADMIN_TOKEN_FILE",
        )
    }
}

fn parse_loopback(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|error| format!("{value:?}: {error}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{value}: the console serves loopback only (127.0.0.1 or [::1]); it has no login"
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_work_against_the_local_services() {
        let cli = Cli::try_parse_from(["entrega", "health"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.sources.services.len(), 3);
        assert_eq!(cli.sources.services[2].name, "outbox-relay");
        assert_eq!(cli.sources.bootstrap_servers, "127.0.0.1:9092");
    }

    #[test]
    fn the_consumers_are_named_as_their_services_name_them() {
        let cli = Cli::try_parse_from(["entrega", "health"]).unwrap_or_else(|e| panic!("{e}"));
        let names = |topic: &str, dlt: &str, group: &str| {
            (topic.to_owned(), dlt.to_owned(), group.to_owned())
        };
        let s = &cli.sources;
        assert_eq!(
            names(
                &s.inventory_topic,
                &s.inventory_dlt_topic,
                &s.inventory_group
            ),
            names("pedido.eventos", "pedido.eventos.dlt", "estoque")
        );
        assert_eq!(
            names(
                &s.order_status_topic,
                &s.order_status_dlt_topic,
                &s.order_status_group
            ),
            names("estoque.eventos", "estoque.eventos.dlt", "pedido")
        );
        let cli = Cli::try_parse_from([
            "entrega",
            "--inventory-group",
            "estoque-blue",
            "--order-status-group",
            "pedido-blue",
            "health",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                cli.sources.inventory_group.as_str(),
                cli.sources.order_status_group.as_str()
            ),
            ("estoque-blue", "pedido-blue")
        );
    }

    #[test]
    fn a_service_needs_a_name_and_an_http_url() {
        assert!(parse_service("relay=http://127.0.0.1:8082").is_ok());
        assert!(parse_service("http://127.0.0.1:8082").is_err());
        assert!(parse_service("relay=ftp://x").is_err());
        assert!(parse_service("=http://x").is_err());
    }

    #[test]
    fn the_page_is_served_on_loopback_only() {
        assert!(parse_loopback("127.0.0.1:8090").is_ok());
        assert!(parse_loopback("[::1]:8090").is_ok());
        assert!(parse_loopback("0.0.0.0:8090").is_err());
        assert!(parse_loopback("10.0.0.5:8090").is_err());
    }

    #[test]
    fn a_journey_takes_a_uuid() {
        assert!(Cli::try_parse_from(["entrega", "journey", "not-a-uuid"]).is_err());
    }
}
