//! What entrega's services share, and only that: configuration value types,
//! logging, the Prometheus recorder, the shutdown signal, Kafka client
//! settings and a producer that is rebuilt when it fails. Each service keeps
//! its own domain, HTTP API and wiring.

pub mod config; // DatabaseUrl, durations, log format
pub mod consumers; // the two consumers' names and their topics' and groups' defaults
pub mod http; // problem+json, the JSON extractor, common layers, OpenAPI pages
pub mod kafka; // librdkafka settings from the environment
pub mod metrics; // the process-wide Prometheus recorder
pub mod producer; // a shared Kafka producer rebuilt with a fresh producer id when it fails
pub mod shutdown; // SIGTERM / SIGINT
pub mod telemetry; // the tracing subscriber
