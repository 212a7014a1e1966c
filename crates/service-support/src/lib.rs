//! What entrega's services share, and only that: configuration value types,
//! logging and tracing, the Prometheus recorder, the shutdown signal, Kafka
//! client settings, a producer that is rebuilt when it fails, and the one
//! retry helper. Nothing here serves HTTP: what the services' APIs share is
//! the `http-api` crate's, so that the relay and the outbox link no web
//! framework. Each service keeps its own domain, HTTP API and wiring.

pub mod amqp; // RabbitMQ: the URL, a connection, the exchanges
pub mod config; // DatabaseUrl, durations, log format
pub mod consumers; // the two consumers' names and their topics' and groups' defaults
pub mod kafka; // librdkafka settings from the environment
pub mod metrics; // the process-wide Prometheus recorder
pub mod producer; // a shared Kafka producer rebuilt with a fresh producer id when it fails
pub mod retry; // the one retry and backoff helper
pub mod secret; // passwords and tokens from a variable or a file, never printed
pub mod serving; // the listener and the root cancellation token
pub mod shutdown; // SIGTERM / SIGINT
pub mod sku; // Sku: the one stock-keeping unit code every service accepts
pub mod telemetry; // the tracing subscriber
pub mod timestamps; // a time written as RFC 3339
pub mod tls_probe; // whether a listener speaks TLS (a plaintext client at a TLS port)
pub mod topics; // what the broker says of a topic: partitions, settings
