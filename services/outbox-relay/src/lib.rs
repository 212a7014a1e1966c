//! The outbox relay: publishes committed outbox rows to Kafka in exactly the
//! record format Debezium's Outbox Event Router produces, crash-safe and in
//! per-aggregate order.
//!
//! One relay leads at a time (a PostgreSQL advisory lock); it reads the
//! oldest pending rows, sends them with an idempotent `acks=all` producer,
//! waits for every delivery report and only then deletes (or marks) the rows.
//! A crash between the two re-publishes the batch: duplicates, never loss,
//! which the consumer's dedupe on the `id` header absorbs.

pub mod cdc; // --mode cdc: the outbox read from the WAL
pub mod config; // environment and command-line configuration
pub mod http; // /metrics, /healthz, /readyz
pub mod leadership; // the advisory lock that elects one relay
pub mod metrics; // metric names and descriptions
pub mod publisher; // sending a batch and classifying failures
pub mod record; // outbox row -> Debezium-compatible Kafka record
pub mod relay; // the read-publish-record loop
pub mod startup; // Application::build and run_until_stopped
pub mod store; // reads and writes on the outbox table
pub mod topics; // the start-up topic check

pub use config::Config;
pub use startup::{Application, StartupError};
