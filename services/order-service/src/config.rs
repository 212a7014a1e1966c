//! Configuration from the environment and the command line.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use sqlx::postgres::PgConnectOptions;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A PostgreSQL URL, validated at start-up; its Debug output hides the password.
#[derive(Clone)]
pub struct DatabaseUrl {
    pub options: PgConnectOptions,
    redacted: String,
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

fn parse_database_url(value: &str) -> Result<DatabaseUrl, String> {
    const EXPECTED: &str = "expected postgres://user@host:port/database";
    let mut shown =
        url::Url::parse(value).map_err(|error| format!("not a URL ({error}); {EXPECTED}"))?;
    if !matches!(shown.scheme(), "postgres" | "postgresql") {
        return Err(format!(
            "scheme {:?} is not PostgreSQL; {EXPECTED}",
            shown.scheme()
        ));
    }
    let options: PgConnectOptions = value
        .parse()
        .map_err(|error| format!("not a PostgreSQL URL ({error}); {EXPECTED}"))?;
    if shown.password().is_some() {
        // Only fails for URLs that cannot have a password, which this one has.
        let _ = shown.set_password(Some("***"));
    }
    Ok(DatabaseUrl {
        options,
        redacted: shown.to_string(),
    })
}

/// Durations such as `10s`, `500ms`, `24h`; zero is refused.
pub fn parse_positive_duration(value: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(value)
        .map_err(|error| format!("{error} (examples: 10s, 500ms, 24h)"))?;
    if duration.is_zero() {
        return Err("must be greater than zero".to_owned());
    }
    Ok(duration)
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
    fn passwords_never_print() {
        let url = parse_database_url("postgres://app:s3cret@db:5432/orders").unwrap();
        assert_eq!(format!("{url:?}"), "postgres://app:***@db:5432/orders");
        let url = parse_database_url("postgres://postgres@127.0.0.1:5432/orders").unwrap();
        assert_eq!(url.to_string(), "postgres://postgres@127.0.0.1:5432/orders");
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
