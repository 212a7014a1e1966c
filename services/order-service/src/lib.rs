//! The order service: an HTTP API that places orders.
//!
//! `POST /orders` writes the order, its items and one `PedidoCriado` outbox
//! row in one PostgreSQL transaction, so an order exists if and only if its
//! event will be published. The relay (or Debezium) publishes outbox rows to
//! Kafka; this service never talks to Kafka.
//!
//! Layout: `domain` holds validated values, `orders`, `outbox` and
//! `idempotency` their persistence, `http` the API, `startup` the wiring.

pub mod config; // environment and command-line configuration
pub mod domain; // values that can only exist when valid
pub mod http; // routes, errors, metrics, OpenAPI
pub mod idempotency; // Idempotency-Key claims and replays
pub mod orders; // orders and items in PostgreSQL
pub mod outbox; // the PedidoCriado outbox row
pub mod startup; // Application::build and run_until_stopped

pub use config::Config;
pub use startup::{Application, StartupError};
