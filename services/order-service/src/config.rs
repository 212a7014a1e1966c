//! Configuration from the environment and the command line.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
pub use service_support::config::{DatabaseUrl, LogFormat};
use service_support::config::{parse_database_url, parse_positive_duration};

/// The order service: places orders and writes their outbox rows.
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

    /// How long an Idempotency-Key is remembered (e.g. 24h).
    #[arg(long, env = "ORDER_IDEMPOTENCY_KEY_TTL", default_value = "24h", value_parser = parse_positive_duration)]
    pub idempotency_key_ttl: Duration,

    /// Do not apply the database migrations at start-up.
    #[arg(long, env = "ORDER_NO_MIGRATE")]
    pub no_migrate: bool,

    /// Log format.
    #[arg(long, env = "ORDER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
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
