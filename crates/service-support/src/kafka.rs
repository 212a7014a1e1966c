//! librdkafka client settings: the bootstrap servers, the service's own
//! settings, and `KAFKA_*` environment variables passed through, so that
//! SASL/TLS and tuning need no code (`KAFKA_SECURITY_PROTOCOL=SASL_SSL` sets
//! `security.protocol`).
//!
//! The pass-through is predictable and cannot weaken a guarantee:
//! - Kubernetes service variables (`KAFKA_PORT=tcp://…`,
//!   `KAFKA_SERVICE_HOST`, `KAFKA_PORT_9092_TCP_ADDR`…, injected for any
//!   Service named `kafka`) are not client properties and are ignored;
//! - every other variable must name a librdkafka property with a valid
//!   value, or the service does not start, naming the variable;
//! - the properties the delivery guarantees depend on ([`PROTECTED`]) are the
//!   services' own: a variable that would set one stops the service;
//! - a secret ([`SECRETS`]: `sasl.password`…) may come from a file instead,
//!   `KAFKA_SASL_PASSWORD_FILE=/run/secrets/kafka`, and its value is never
//!   quoted in an error;
//! - so are the properties a service derives from one of its own options
//!   ([`Owned`]: the relay's `message.timeout.ms` is `--delivery-timeout`,
//!   which its lease and send fence rest on): the error names the option.

use std::ffi::OsString;
use std::path::Path;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use crate::secret::{SecretError, read_secret_file};

/// The longest librdkafka reason quoted in an error, in characters.
const MAX_REASON_CHARS: usize = 300;

/// Variables that are entrega's own settings, not librdkafka properties.
const OWN_VARIABLES: &[&str] = &["KAFKA_BOOTSTRAP_SERVERS"];

/// librdkafka properties that exactly-once effects rest on: idempotent,
/// fully acknowledged sends in key order; offsets stored only after the
/// work is done; a new group starting from the beginning; the group and
/// brokers the services are configured with. Aliases included.
pub const PROTECTED: &[&str] = &[
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "transactional.id",
    "partitioner",
    "queuing.strategy",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "isolation.level",
    "group.id",
    "bootstrap.servers",
    "metadata.broker.list",
];

/// librdkafka properties that hold a secret: each may be read from the file
/// a `KAFKA_<PROPERTY>_FILE` variable names, and none is ever quoted.
pub const SECRETS: &[&str] = &[
    "sasl.password",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
];

#[derive(Debug, thiserror::Error)]
pub enum PassthroughError {
    #[error(
        "{variable} would set the librdkafka property {property}, which the delivery guarantees depend on: it cannot be overridden (unset {variable})"
    )]
    Protected { variable: String, property: String },
    #[error(
        "{variable} would set the librdkafka property {property}, which {option} sets: {reason} (unset {variable}; use {option})"
    )]
    Owned {
        variable: String,
        property: String,
        option: &'static str,
        reason: &'static str,
    },
    #[error("a KAFKA_* environment variable's name or value is not UTF-8")]
    NotUtf8,
    #[error("{variable} would set the librdkafka property {property}: {reason}")]
    Invalid {
        variable: String,
        property: String,
        reason: String,
    },
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("set {variable} or {variable}_FILE, not both")]
    SecretTwice { variable: String },
}

/// librdkafka's aliases (its CONFIGURATION.md, "Alias for"): two names of
/// one property. A variable naming either overrides a setting made under
/// the other; left side by side, which one librdkafka applied last would
/// depend on a map's order.
const ALIASES: &[(&str, &str)] = &[
    ("bootstrap.servers", "metadata.broker.list"),
    ("max.in.flight", "max.in.flight.requests.per.connection"),
    ("sasl.mechanism", "sasl.mechanisms"),
    ("max.partition.fetch.bytes", "fetch.message.max.bytes"),
    ("linger.ms", "queue.buffering.max.ms"),
    ("retries", "message.send.max.retries"),
    ("compression.type", "compression.codec"),
    ("acks", "request.required.acks"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("enable.auto.commit", "auto.commit.enable"),
];

/// The other name of `property`, if it has one.
fn alias_of(property: &str) -> Option<&'static str> {
    ALIASES.iter().find_map(|&(a, b)| {
        if a == property {
            Some(b)
        } else if b == property {
            Some(a)
        } else {
            None
        }
    })
}

/// Properties a service sets from one of its own options: a `KAFKA_*`
/// variable may not set them (under any of their librdkafka names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owned {
    /// Every librdkafka name of the properties (aliases included).
    pub properties: &'static [&'static str],
    /// The option that sets them, as the error names it.
    pub option: &'static str,
    /// Why they may not be set otherwise.
    pub reason: &'static str,
}

/// The environment's `KAFKA_*` variables, sorted out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Passthrough {
    /// librdkafka properties, `(property, value)`, sorted.
    pub properties: Vec<(String, String)>,
    /// Variables ignored as Kubernetes service variables.
    pub ignored: Vec<String>,
}

/// A Kubernetes service-link variable: `<SVC>_SERVICE_HOST`,
/// `<SVC>_SERVICE_PORT[_<NAME>]`, `<SVC>_PORT`, or
/// `<SVC>_PORT_<N>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]`. No librdkafka property
/// has such a shape.
fn is_kubernetes_service_variable(name: &str) -> bool {
    if name.ends_with("_SERVICE_HOST")
        || name.ends_with("_SERVICE_PORT")
        || name.contains("_SERVICE_PORT_")
        || name.ends_with("_PORT")
    {
        return true;
    }
    let parts: Vec<&str> = name.split('_').collect();
    parts.windows(3).any(|w| {
        w[0] == "PORT"
            && !w[1].is_empty()
            && w[1].bytes().all(|b| b.is_ascii_digit())
            && matches!(w[2], "TCP" | "UDP" | "SCTP")
    })
}

/// Sorts `KAFKA_*` variables into librdkafka properties (`KAFKA_SASL_MECHANISMS`
/// becomes `sasl.mechanisms`) and ignored Kubernetes variables; refuses a
/// protected property, an unknown one or an invalid value.
pub fn passthrough_from(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    owned: &[Owned],
) -> Result<Passthrough, PassthroughError> {
    let mut passthrough = Passthrough::default();
    for (variable, value) in vars {
        // Read as bytes: `std::env::vars` panics on any variable, ours or
        // not, that is not UTF-8.
        if !variable.as_encoded_bytes().starts_with(b"KAFKA_") {
            continue;
        }
        let (Ok(variable), Ok(value)) = (variable.into_string(), value.into_string()) else {
            return Err(PassthroughError::NotUtf8);
        };
        let Some(suffix) = variable.strip_prefix("KAFKA_") else {
            continue;
        };
        if suffix.is_empty() || OWN_VARIABLES.contains(&variable.as_str()) {
            continue;
        }
        if is_kubernetes_service_variable(&variable) {
            passthrough.ignored.push(variable);
            continue;
        }
        let mut property = suffix.to_ascii_lowercase().replace('_', ".");
        let mut value = value;
        let from_file = property
            .strip_suffix(".file")
            .filter(|base| SECRETS.contains(base))
            .map(str::to_owned);
        if let Some(base) = from_file {
            value = read_secret_file(&variable, Path::new(&value))?
                .expose()
                .to_owned();
            property = base;
        }
        let secret = SECRETS.contains(&property.as_str());
        let names = [Some(property.as_str()), alias_of(&property)];
        if names.iter().flatten().any(|name| PROTECTED.contains(name)) {
            return Err(PassthroughError::Protected { variable, property });
        }
        if let Some(own) = owned.iter().find(|own| {
            names
                .iter()
                .flatten()
                .any(|name| own.properties.contains(name))
        }) {
            return Err(PassthroughError::Owned {
                variable,
                property,
                option: own.option,
                reason: own.reason,
            });
        }
        // librdkafka itself says whether it knows the property and takes the
        // value; no client is made.
        if let Err(error) = ClientConfig::new()
            .set(&property, &value)
            .create_native_config()
        {
            let reason = match error {
                _ if secret => "librdkafka refused the value (not shown: a secret)".to_owned(),
                KafkaError::ClientConfig(_, description, _, _) => description,
                other => other.to_string(),
            };
            // librdkafka quotes the value: a start-up error stays readable
            // whatever was set.
            let reason = match reason.char_indices().nth(MAX_REASON_CHARS) {
                Some((end, _)) => format!("{}…", &reason[..end]),
                None => reason,
            };
            return Err(PassthroughError::Invalid {
                variable,
                property,
                reason,
            });
        }
        if secret
            && passthrough
                .properties
                .iter()
                .any(|(set, _)| *set == property)
        {
            let variable = format!("KAFKA_{}", property.to_ascii_uppercase().replace('.', "_"));
            return Err(PassthroughError::SecretTwice { variable });
        }
        passthrough.properties.push((property, value));
    }
    passthrough.properties.sort();
    passthrough.ignored.sort();
    Ok(passthrough)
}

/// A client configuration: bootstrap servers, then the caller's settings,
/// then the environment's `KAFKA_*` properties (the operator tunes what is
/// not protected).
pub fn client_config(
    bootstrap_servers: &str,
    settings: &[(&str, &str)],
) -> Result<ClientConfig, PassthroughError> {
    client_config_owning(bootstrap_servers, settings, &[])
}

/// [`client_config`], refusing the [`Owned`] properties as overrides too.
pub fn client_config_owning(
    bootstrap_servers: &str,
    settings: &[(&str, &str)],
    owned: &[Owned],
) -> Result<ClientConfig, PassthroughError> {
    let passthrough = passthrough_from(std::env::vars_os(), owned)?;
    if !passthrough.ignored.is_empty() {
        tracing::debug!(ignored = ?passthrough.ignored, "KAFKA_* Kubernetes service variables are not client properties");
    }
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap_servers);
    for (key, value) in settings {
        config.set(*key, *value);
    }
    override_with(&mut config, passthrough.properties);
    Ok(config)
}

/// Sets `properties` over `config`: each replaces a setting made under its
/// alias, so the variable wins whichever name either used.
fn override_with(config: &mut ClientConfig, properties: Vec<(String, String)>) {
    for (key, value) in properties {
        if let Some(alias) = alias_of(&key) {
            config.remove(alias);
        }
        config.set(key, value);
    }
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn is_valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Kafka's Java client hash of a key (`Utils.murmur2`), which the default
/// partitioner, Kafka Connect and so Debezium use.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = data.len();
    let mut h: u32 = SEED ^ u32::try_from(length).unwrap_or(u32::MAX);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client (and Debezium) picks for `key`.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn strings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_value_that_is_not_utf8_is_refused_and_other_variables_are_not_read() {
        use std::os::unix::ffi::OsStringExt;
        let junk = OsString::from_vec(vec![0xff, 0xfe]);
        let refused =
            passthrough_from([(OsString::from("KAFKA_CLIENT_ID"), junk.clone())], &[]).unwrap_err();
        assert!(matches!(refused, PassthroughError::NotUtf8));
        let ignored = passthrough_from(
            [
                (OsString::from("LANG"), junk.clone()),
                (junk, OsString::from("x")),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(ignored, Passthrough::default());
    }

    #[test]
    fn an_empty_or_huge_value_is_librdkafkas_to_judge() {
        let empty = passthrough_from(vars(&[("KAFKA_LINGER_MS", "")]), &[]).unwrap_err();
        assert!(matches!(empty, PassthroughError::Invalid { .. }), "{empty}");
        let huge = "x".repeat(1_000_000);
        let refused = passthrough_from(vars(&[("KAFKA_LINGER_MS", &huge)]), &[]).unwrap_err();
        assert!(matches!(refused, PassthroughError::Invalid { .. }));
        assert!(
            refused.to_string().len() < 1_000,
            "the error quotes the whole value"
        );
    }

    #[test]
    fn kafka_variables_become_librdkafka_properties() {
        let passthrough = passthrough_from(
            vars(&[
                ("KAFKA_FETCH_WAIT_MAX_MS", "20"),
                ("KAFKA_SASL_MECHANISMS", "PLAIN"),
                ("KAFKA_BOOTSTRAP_SERVERS", "b:9092"),
                ("KAFKA_", "x"),
                ("PATH", "/bin"),
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(
            passthrough.properties,
            strings(&[("fetch.wait.max.ms", "20"), ("sasl.mechanisms", "PLAIN")])
        );
    }

    #[test]
    fn kubernetes_service_variables_are_ignored() {
        let injected = [
            ("KAFKA_PORT", "tcp://10.0.0.7:9092"),
            ("KAFKA_SERVICE_HOST", "10.0.0.7"),
            ("KAFKA_SERVICE_PORT", "9092"),
            ("KAFKA_SERVICE_PORT_BROKER", "9092"),
            ("KAFKA_PORT_9092_TCP", "tcp://10.0.0.7:9092"),
            ("KAFKA_PORT_9092_TCP_PROTO", "tcp"),
            ("KAFKA_PORT_9092_TCP_PORT", "9092"),
            ("KAFKA_PORT_9092_TCP_ADDR", "10.0.0.7"),
            ("KAFKA_UI_SERVICE_HOST", "10.0.0.8"),
            ("KAFKA_UI_PORT_8080_TCP_ADDR", "10.0.0.8"),
        ];
        let passthrough = passthrough_from(vars(&injected), &[]).unwrap();
        assert!(passthrough.properties.is_empty(), "{passthrough:?}");
        assert_eq!(passthrough.ignored.len(), injected.len());
    }

    #[test]
    fn a_protected_property_is_refused_naming_the_variable() {
        for (variable, property) in [
            ("KAFKA_ENABLE_AUTO_OFFSET_STORE", "enable.auto.offset.store"),
            ("KAFKA_ACKS", "acks"),
            ("KAFKA_REQUEST_REQUIRED_ACKS", "request.required.acks"),
            ("KAFKA_ENABLE_IDEMPOTENCE", "enable.idempotence"),
            ("KAFKA_ISOLATION_LEVEL", "isolation.level"),
        ] {
            let refused = passthrough_from(vars(&[(variable, "1")]), &[]).unwrap_err();
            assert!(
                matches!(&refused, PassthroughError::Protected { variable: v, property: p }
                    if v == variable && p == property),
                "{refused:?}"
            );
            assert!(refused.to_string().contains(&format!("unset {variable}")));
        }
    }

    #[test]
    fn a_secret_comes_from_its_file_and_is_never_quoted() {
        let path = std::env::temp_dir().join(format!("kafka-secret-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "sc4am-pass\n").unwrap();
        let file = path.to_str().unwrap();
        let passthrough = passthrough_from(
            vars(&[
                ("KAFKA_SASL_PASSWORD_FILE", file),
                ("KAFKA_SASL_USERNAME", "entrega"),
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(
            passthrough.properties,
            strings(&[
                ("sasl.password", "sc4am-pass"),
                ("sasl.username", "entrega")
            ])
        );
        let twice = passthrough_from(
            vars(&[
                ("KAFKA_SASL_PASSWORD_FILE", file),
                ("KAFKA_SASL_PASSWORD", "other"),
            ]),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            twice,
            "set KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE, not both"
        );
        let missing =
            passthrough_from(vars(&[("KAFKA_SASL_PASSWORD_FILE", "/nonexistent/k")]), &[])
                .unwrap_err()
                .to_string();
        assert_eq!(
            missing,
            "KAFKA_SASL_PASSWORD_FILE: cannot read /nonexistent/k"
        );
        // A property whose own name ends in .file is a property, not a secret's file.
        // (This build of librdkafka has no libcurl, so it refuses the
        // property itself; either way it was not read as a file.)
        match passthrough_from(
            vars(&[(
                "KAFKA_SASL_OAUTHBEARER_ASSERTION_FILE",
                "/etc/assertion.jwt",
            )]),
            &[],
        ) {
            Ok(assertion) => assert_eq!(
                assertion.properties,
                strings(&[("sasl.oauthbearer.assertion.file", "/etc/assertion.jwt")])
            ),
            Err(PassthroughError::Invalid { property, .. }) => {
                assert_eq!(property, "sasl.oauthbearer.assertion.file");
            }
            Err(other) => panic!("{other}"),
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_unknown_property_or_a_bad_value_is_refused_naming_the_variable() {
        let unknown = passthrough_from(vars(&[("KAFKA_NO_SUCH_THING", "1")]), &[]).unwrap_err();
        assert!(
            matches!(&unknown, PassthroughError::Invalid { variable, property, .. }
                if variable == "KAFKA_NO_SUCH_THING" && property == "no.such.thing"),
            "{unknown}"
        );
        let bad = passthrough_from(vars(&[("KAFKA_LINGER_MS", "soon")]), &[]).unwrap_err();
        assert!(
            bad.to_string()
                .starts_with("KAFKA_LINGER_MS would set the librdkafka property linger.ms"),
            "{bad}"
        );
    }

    #[test]
    fn topic_names_follow_kafkas_rule() {
        for good in ["pedido.eventos", "a", "A-b_c.9", &"x".repeat(249)] {
            assert!(is_valid_topic_name(good), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "pedido eventos",
            "pedido/eventos",
            "pédido",
            &"x".repeat(250),
        ] {
            assert!(!is_valid_topic_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_owned_property_is_refused_under_each_of_its_names_naming_the_option() {
        let owned = [Owned {
            properties: &["message.timeout.ms", "delivery.timeout.ms"],
            option: "--delivery-timeout",
            reason: "the send fence rests on it",
        }];
        for (variable, property) in [
            ("KAFKA_MESSAGE_TIMEOUT_MS", "message.timeout.ms"),
            ("KAFKA_DELIVERY_TIMEOUT_MS", "delivery.timeout.ms"),
        ] {
            let refused = passthrough_from(vars(&[(variable, "60000")]), &owned).unwrap_err();
            assert_eq!(
                refused.to_string(),
                format!(
                    "{variable} would set the librdkafka property {property}, which --delivery-timeout sets: the send fence rests on it (unset {variable}; use --delivery-timeout)"
                )
            );
        }
        let elsewhere = passthrough_from(vars(&[("KAFKA_MESSAGE_TIMEOUT_MS", "60000")]), &[]);
        assert!(
            elsewhere.is_ok(),
            "only the owner refuses it: {elsewhere:?}"
        );
    }

    #[test]
    fn a_variable_naming_an_alias_overrides_the_setting_made_under_the_other_name() {
        let passthrough =
            passthrough_from(vars(&[("KAFKA_QUEUE_BUFFERING_MAX_MS", "40")]), &[]).unwrap();
        assert_eq!(
            passthrough.properties,
            strings(&[("queue.buffering.max.ms", "40")])
        );
        let mut config = ClientConfig::new();
        config.set("linger.ms", "5");
        override_with(&mut config, passthrough.properties);
        let native = config.create_native_config().unwrap();
        assert_eq!(native.get("linger.ms").unwrap(), "40");
    }

    #[test]
    fn a_protected_property_is_refused_under_its_alias_too() {
        let refused =
            passthrough_from(vars(&[("KAFKA_AUTO_COMMIT_ENABLE", "true")]), &[]).unwrap_err();
        assert!(
            matches!(&refused, PassthroughError::Protected { property, .. } if property == "auto.commit.enable"),
            "{refused}"
        );
    }
}
