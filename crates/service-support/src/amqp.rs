//! RabbitMQ over AMQP 0-9-1 (lapin): the URL, a connection, and the topic
//! exchanges the relay publishes to. A Kafka topic and its exchange share a
//! name (`pedido.eventos`), so one `--topics` list serves either broker.

use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::secret::{Secret, SecretError, read_secret_file};

/// The local broker the scripts and the demo use.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// How long a connection or a declaration may take before it counts as an
/// unreachable broker: a silent peer would otherwise hold start-up.
const TIMEOUT: Duration = Duration::from_secs(10);

/// An `amqp://` or `amqps://` URL. It may carry a password, so it prints
/// with the password hidden.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    url: Secret,
    redacted: String,
}

impl AmqpUrl {
    /// The URL with the password held in `file` (named by `variable`), when
    /// one is given; a URL with a password of its own is refused with one.
    pub fn with_password_file(
        self,
        variable: &'static str,
        file: Option<&std::path::Path>,
    ) -> Result<Self, SecretError> {
        let Some(path) = file else {
            return Ok(self);
        };
        let mut url = url::Url::parse(self.url.expose()).map_err(|_| SecretError::Both {
            value_variable: "the AMQP URL",
            file_variable: variable,
        })?;
        if url.password().is_some() {
            return Err(SecretError::Both {
                value_variable: "the AMQP URL's password",
                file_variable: variable,
            });
        }
        let secret = read_secret_file(variable, path)?;
        // `set_password` percent-encodes; lapin decodes.
        let _ = url.set_password(Some(secret.expose()));
        Ok(Self {
            url: Secret::new(url.to_string()),
            redacted: redact(&url),
        })
    }

    /// The URL itself, password included, for the one call that connects.
    fn expose(&self) -> &str {
        self.url.expose()
    }
}

impl std::fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl std::fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

fn redact(url: &url::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// Parses an AMQP URL; the error never quotes it.
pub fn parse_amqp_url(value: &str) -> Result<AmqpUrl, String> {
    const EXPECTED: &str = "expected amqp://user:password@host:port/vhost (or amqps://)";
    let url = url::Url::parse(value).map_err(|error| format!("not a URL ({error}); {EXPECTED}"))?;
    if !matches!(url.scheme(), "amqp" | "amqps") {
        return Err(format!("scheme {:?} is not AMQP; {EXPECTED}", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("no host; {EXPECTED}"));
    }
    // lapin's own parser, so that what passes here also connects.
    value
        .parse::<lapin::uri::AMQPUri>()
        .map_err(|error| format!("not an AMQP URI ({error}); {EXPECTED}"))?;
    Ok(AmqpUrl {
        url: Secret::new(value),
        redacted: redact(&url),
    })
}

impl std::str::FromStr for AmqpUrl {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        parse_amqp_url(value)
    }
}

/// A clap value parser for AMQP URLs whose errors never quote the value.
#[cfg(feature = "cli")]
#[derive(Debug, Clone, Copy)]
pub struct AmqpUrlParser;

#[cfg(feature = "cli")]
impl clap::builder::TypedValueParser for AmqpUrlParser {
    type Value = AmqpUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<AmqpUrl, clap::Error> {
        crate::config::parse_secret_url(cmd, arg, value, "the AMQP URL", parse_amqp_url)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    #[error("cannot connect to RabbitMQ at {url}")]
    Connect {
        url: String,
        #[source]
        source: lapin::Error,
    },
    #[error("RabbitMQ at {url} did not answer within {TIMEOUT:?}")]
    Timeout { url: String },
    #[error("the channel failed")]
    Channel(#[source] lapin::Error),
    #[error("{0}")]
    Closed(&'static str),
    #[error("exchange {0:?} does not exist (declare it, or start the relay with --create-topics)")]
    MissingExchange(String),
    #[error("cannot declare exchange {name:?}")]
    Declare {
        name: String,
        #[source]
        source: lapin::Error,
    },
}

impl AmqpError {
    /// Whether waiting may help: the broker is down or starting.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Connect { source, .. } => !is_access_refused(source),
            Self::Timeout { .. } | Self::Channel(_) | Self::Closed(_) => true,
            Self::MissingExchange(_) | Self::Declare { .. } => false,
        }
    }
}

/// A message's headers as name and bytes ([`header_bytes`]); none when it
/// has no header table.
pub fn headers(properties: &lapin::BasicProperties) -> Vec<(String, Option<Vec<u8>>)> {
    properties
        .headers()
        .as_ref()
        .map(|table| {
            table
                .inner()
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), header_bytes(value)))
                .collect()
        })
        .unwrap_or_default()
}

/// A header value as the bytes a record header holds: text and byte arrays
/// as they are, void as null, anything else (numbers, and the tables and
/// arrays of `x-death`) rendered as text, so that whatever a producer or
/// the broker put there can be read and shown.
pub fn header_bytes(value: &AMQPValue) -> Option<Vec<u8>> {
    match value {
        AMQPValue::Void => None,
        AMQPValue::LongString(text) => Some(text.as_bytes().to_vec()),
        AMQPValue::ByteArray(bytes) => Some(bytes.as_slice().to_vec()),
        other => Some(render(other).into_bytes()),
    }
}

/// A value as text: `x-death` reads `[{count=3, exchange=…, reason=delivery_limit, …}]`.
pub fn render(value: &AMQPValue) -> String {
    match value {
        AMQPValue::Void => String::new(),
        AMQPValue::Boolean(value) => value.to_string(),
        AMQPValue::ShortShortInt(value) => value.to_string(),
        AMQPValue::ShortShortUInt(value) => value.to_string(),
        AMQPValue::ShortInt(value) => value.to_string(),
        AMQPValue::ShortUInt(value) => value.to_string(),
        AMQPValue::LongInt(value) => value.to_string(),
        AMQPValue::LongUInt(value) => value.to_string(),
        AMQPValue::LongLongInt(value) => value.to_string(),
        AMQPValue::Float(value) => value.to_string(),
        AMQPValue::Double(value) => value.to_string(),
        AMQPValue::Timestamp(value) => value.to_string(),
        AMQPValue::ShortString(text) => text.as_str().to_owned(),
        AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()).into_owned(),
        AMQPValue::ByteArray(bytes) => String::from_utf8_lossy(bytes.as_slice()).into_owned(),
        AMQPValue::FieldArray(values) => {
            let items: Vec<String> = values.as_slice().iter().map(render).collect();
            format!("[{}]", items.join(", "))
        }
        AMQPValue::FieldTable(table) => {
            let items: Vec<String> = table
                .inner()
                .iter()
                .map(|(name, value)| format!("{}={}", name.as_str(), render(value)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// The reply code the broker closed with, if it closed with one.
pub fn reply(error: &lapin::Error) -> Option<&AMQPErrorKind> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(error) => Some(error.kind()),
        _ => None,
    }
}

fn is_access_refused(error: &lapin::Error) -> bool {
    matches!(
        reply(error),
        Some(AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED))
    ) || matches!(error.kind(), lapin::ErrorKind::AuthProviderError(_))
}

/// Connects, naming the connection `name` in RabbitMQ's management view.
pub async fn connect(url: &AmqpUrl, name: &str) -> Result<Connection, AmqpError> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    match tokio::time::timeout(TIMEOUT, Connection::connect(url.expose(), properties)).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(source)) => Err(AmqpError::Connect {
            url: url.to_string(),
            source,
        }),
        Err(_) => Err(AmqpError::Timeout {
            url: url.to_string(),
        }),
    }
}

/// A connection named `name` and a channel on it in confirm mode: every
/// message published on it is acknowledged by the broker (or not).
pub async fn confirm_channel(
    url: &AmqpUrl,
    name: &str,
) -> Result<(Connection, Channel), AmqpError> {
    let connection = connect(url, name).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::Channel)?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(AmqpError::Channel)?;
    Ok((connection, channel))
}

/// Checks that every exchange exists; with `create`, declares the missing
/// ones as durable topic exchanges first (declaring one that exists with the
/// same type is a no-op, so this is safe to run on every start).
pub async fn ensure_exchanges(
    connection: &Connection,
    names: &[String],
    create: bool,
) -> Result<(), AmqpError> {
    for name in names {
        // A refused declaration closes its channel: one channel per name.
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::Channel)?;
        let options = ExchangeDeclareOptions {
            passive: !create,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = channel
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(()) => {
                let _ = channel.close(200, "declared".into()).await;
            }
            Err(error)
                if !create
                    && matches!(
                        reply(&error),
                        Some(AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
                    ) =>
            {
                return Err(AmqpError::MissingExchange(name.clone()));
            }
            Err(source) => {
                return Err(AmqpError::Declare {
                    name: name.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_prints_without_its_password() {
        let url = parse_amqp_url("amqp://app:s3cret@127.0.0.1:5672/%2f").expect("valid");
        assert_eq!(url.to_string(), "amqp://app:***@127.0.0.1:5672/%2f");
        assert!(!format!("{url:?}").contains("s3cret"));
    }

    #[test]
    fn a_url_that_is_not_amqp_is_refused_without_being_quoted() {
        for bad in [
            "postgres://app:s3cret@host/db",
            "amqp://",
            "not a url s3cret",
        ] {
            let error = parse_amqp_url(bad).expect_err(bad);
            assert!(!error.contains("s3cret"), "{error}");
        }
    }
}
