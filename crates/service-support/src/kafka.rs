//! librdkafka client settings: the bootstrap servers, the service's own
//! settings, and any `KAFKA_*` environment variable passed through, so that
//! SASL/TLS and tuning need no code (`KAFKA_SECURITY_PROTOCOL=SASL_SSL` sets
//! `security.protocol`).

use rdkafka::ClientConfig;

/// Variables that are entrega's own settings, not librdkafka properties.
const NOT_PASSED_THROUGH: &[&str] = &["KAFKA_BOOTSTRAP_SERVERS"];

/// librdkafka properties from `KAFKA_*` variables: `KAFKA_SASL_MECHANISMS`
/// becomes `sasl.mechanisms`.
pub fn passthrough_from(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut properties: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(name, _)| !NOT_PASSED_THROUGH.contains(&name.as_str()))
        .filter_map(|(name, value)| {
            let property = name.strip_prefix("KAFKA_")?;
            (!property.is_empty()).then(|| (property.to_ascii_lowercase().replace('_', "."), value))
        })
        .collect();
    properties.sort();
    properties
}

/// A client configuration: bootstrap servers, then the caller's settings,
/// then the environment's `KAFKA_*` overrides (the operator has the last word).
pub fn client_config(bootstrap_servers: &str, settings: &[(&str, &str)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap_servers);
    for (key, value) in settings {
        config.set(*key, *value);
    }
    for (key, value) in passthrough_from(std::env::vars()) {
        config.set(key, value);
    }
    config
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn kafka_variables_become_librdkafka_properties() {
        let properties = passthrough_from(vars(&[
            ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("KAFKA_SASL_MECHANISMS", "PLAIN"),
            ("KAFKA_BOOTSTRAP_SERVERS", "b:9092"),
            ("KAFKA_", "x"),
            ("PATH", "/bin"),
        ]));
        assert_eq!(
            properties,
            vars(&[
                ("sasl.mechanisms", "PLAIN"),
                ("security.protocol", "SASL_SSL")
            ])
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
}
