//! Configuration value types that every service parses the same way.

use std::path::Path;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use crate::secret::{Secret, SecretError, read_secret_file};

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
    /// The URL's `sslrootcert`, for the same clients, for the same reason.
    ssl_root_cert: Option<std::path::PathBuf>,
}

impl DatabaseUrl {
    /// The password the URL carries, percent-decoded.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The CA file the URL names (`sslrootcert`), if any.
    pub fn ssl_root_cert(&self) -> Option<&Path> {
        self.ssl_root_cert.as_deref()
    }

    /// The URL with the password held in `file` (named by `variable`), when
    /// one is given: the URL may then be configuration, and only the file a
    /// secret. A URL that carries a password of its own is refused with a
    /// file, as which one wins would be a guess.
    pub fn with_password_file(
        self,
        variable: &'static str,
        file: Option<&Path>,
    ) -> Result<Self, SecretError> {
        let Some(path) = file else {
            return Ok(self);
        };
        if self.password.is_some() {
            return Err(SecretError::Both {
                value_variable: "the database URL's password",
                file_variable: variable,
            });
        }
        Ok(self.with_password(&read_secret_file(variable, path)?))
    }

    fn with_password(mut self, secret: &Secret) -> Self {
        self.options = self.options.password(secret.expose());
        self.password = Some(secret.expose().to_owned());
        if let Ok(mut shown) = url::Url::parse(&self.redacted) {
            if shown.set_password(Some("***")).is_ok() {
                self.redacted = shown.to_string();
            }
        }
        self
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
    let ssl_root_cert = shown
        .query_pairs()
        .find(|(key, _)| key == "sslrootcert" || key == "ssl-root-cert")
        .map(|(_, path)| std::path::PathBuf::from(path.into_owned()));
    if shown.password().is_some() {
        // Fails only for URLs that cannot carry a password; this one does.
        let _ = shown.set_password(Some("***"));
    }
    Ok(DatabaseUrl {
        options,
        redacted: shown.to_string(),
        password,
        ssl_root_cert,
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

/// A clap value parser for PostgreSQL URLs whose errors never quote the
/// value: clap's own message for a failed parser would print the URL, and
/// with it the password (`invalid value 'postgres://app:s3cret@…'`).
#[cfg(feature = "cli")]
#[derive(Debug, Clone, Copy)]
pub struct DatabaseUrlParser;

#[cfg(feature = "cli")]
impl clap::builder::TypedValueParser for DatabaseUrlParser {
    type Value = DatabaseUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<DatabaseUrl, clap::Error> {
        parse_secret_url(cmd, arg, value, "the database URL", parse_database_url)
    }
}

/// Parses a URL that may carry a password with `parse`; a refusal names the
/// option and its variable but never quotes the value.
#[cfg(feature = "cli")]
pub(crate) fn parse_secret_url<T>(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &std::ffi::OsStr,
    what: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, clap::Error> {
    let invalid = |reason: &str| {
        let name = arg.map_or_else(|| what.to_owned(), |arg| format!("'{arg}'"));
        let variable = arg
            .and_then(clap::Arg::get_env)
            .map(|variable| format!(" ({})", variable.to_string_lossy()))
            .unwrap_or_default();
        clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            format!(
                "invalid value for {name}{variable}: {reason} (the value is not shown: it may carry a password)\n"
            ),
        )
        .with_cmd(cmd)
    };
    let text = value.to_str().ok_or_else(|| invalid("not UTF-8"))?;
    parse(text).map_err(|reason| invalid(&reason))
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
    fn a_password_file_fills_the_url_and_stays_hidden() {
        let path = std::env::temp_dir().join(format!("db-password-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "fr0m-file\n").unwrap();
        let url = parse_database_url("postgres://app@db:5432/orders")
            .unwrap()
            .with_password_file("ORDER_DATABASE_PASSWORD_FILE", Some(&path))
            .unwrap();
        assert_eq!(url.password(), Some("fr0m-file"));
        assert_eq!(url.to_string(), "postgres://app:***@db:5432/orders");
        let both = parse_database_url("postgres://app:other@db/orders")
            .unwrap()
            .with_password_file("ORDER_DATABASE_PASSWORD_FILE", Some(&path))
            .unwrap_err()
            .to_string();
        assert!(both.contains("ORDER_DATABASE_PASSWORD_FILE"), "{both}");
        assert!(!both.contains("other"), "{both}");
        std::fs::remove_file(&path).unwrap();
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
