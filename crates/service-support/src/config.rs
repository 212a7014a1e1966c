//! Configuration value types that every service parses the same way.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    Text,
    Json,
}

/// A PostgreSQL URL, validated when parsed; Debug and Display hide the password.
#[derive(Clone)]
pub struct DatabaseUrl {
    pub options: PgConnectOptions,
    redacted: String,
    /// Kept for clients other than sqlx (the relay's replication
    /// connection): `PgConnectOptions` does not give it back.
    password: Option<String>,
}

impl DatabaseUrl {
    /// The password the URL carries, percent-decoded.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
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

/// A clap value parser for PostgreSQL URLs.
pub fn parse_database_url(value: &str) -> Result<DatabaseUrl, String> {
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
    let password = shown.password().map(percent_decode).transpose()?;
    if shown.password().is_some() {
        // Fails only for URLs that cannot carry a password; this one does.
        let _ = shown.set_password(Some("***"));
    }
    Ok(DatabaseUrl {
        options,
        redacted: shown.to_string(),
        password,
    })
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("the password has an invalid %-escape")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the password is not UTF-8 once %-decoded".to_owned())
}

/// A clap value parser for durations such as `10s`, `500ms`, `24h`; zero is refused.
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
    fn passwords_never_print() {
        let url = parse_database_url("postgres://app:s3cret@db:5432/orders").unwrap();
        assert_eq!(format!("{url:?}"), "postgres://app:***@db:5432/orders");
        assert_eq!(url.password(), Some("s3cret"));
        let escaped = parse_database_url("postgres://app:a%40b%2F@db/orders").unwrap();
        assert_eq!(escaped.password(), Some("a@b/"));
        assert!(parse_database_url("postgres://app:a%4@db/orders").is_err());
        assert_eq!(url.to_string(), "postgres://app:***@db:5432/orders");
        let url = parse_database_url("postgres://postgres@127.0.0.1:5432/orders").unwrap();
        assert_eq!(url.to_string(), "postgres://postgres@127.0.0.1:5432/orders");
    }

    #[test]
    fn only_postgresql_urls_are_accepted() {
        assert!(parse_database_url("postgresql://u@h/d").is_ok());
        for bad in ["mysql://u@h/d", "not a url", "127.0.0.1:5432"] {
            assert!(parse_database_url(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_are_human_and_positive() {
        assert_eq!(
            parse_positive_duration("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_positive_duration("24h"),
            Ok(Duration::from_secs(86_400))
        );
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_positive_duration("soon").is_err());
    }
}
