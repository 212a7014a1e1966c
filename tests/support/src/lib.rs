//! Helpers for tests that talk to the real PostgreSQL and Kafka-protocol
//! broker: a fresh database per test, private brokers that a test may stop
//! and restart, collecting records with their headers, Kafka's key
//! partitioner, child processes, and one retry helper for eventually-true
//! assertions. Nothing here mocks anything.

// A failed expectation in a helper is a failed test, with its message.
#![allow(clippy::unwrap_used)]

pub mod amqp; // RabbitMQ: a queue bound to an exchange, its messages read
pub mod broker; // private tansu brokers for fault tests
pub mod database; // a fresh database per test, dropped afterwards
pub mod dedupe; // aged rows of the consumer's dedupe table
pub mod eventually; // the one retry-until-deadline helper
pub mod kafka; // topics, record collection, the Java partitioner
pub mod metrics; // reading a service's /metrics text
pub mod otlp; // an OTLP/HTTP trace receiver
pub mod outbox; // outbox rows compared column by column
pub mod postgres; // private PostgreSQL clusters for restart tests
pub mod process; // service binaries as child processes, signals, their logs
pub mod proxy; // a TCP proxy a test can blackhole: a network partition
pub mod raw; // records rdkafka cannot express: header names that are not UTF-8
pub mod terminal; // a record's bytes that would drive a terminal, and the check
pub mod tls; // a CA per run and a TLS-terminating proxy

/// The admin token the tests start the inventory service with
/// (`INVENTORY_ADMIN_TOKEN`), and present as a bearer token to set stock.
pub const ADMIN_TOKEN: &str = "entrega-test-admin-token";
