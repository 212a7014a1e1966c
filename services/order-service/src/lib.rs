//! The order service: an HTTP API that places orders, and the consumer that
//! brings their outcome back.
//!
//! `POST /orders` writes the order, its items and one `PedidoCriado` outbox
//! row in one PostgreSQL statement (one transaction), so an order exists if and only if its
//! event will be published. The relay (or Debezium) publishes outbox rows to
//! Kafka; this service never produces to Kafka itself. The inventory's
//! outcome comes back on `estoque.eventos`, consumed idempotently
//! ([`status::consumer`], on the `idempotent-consumer` library): the order
//! moves from PENDING to CONFIRMED or REJECTED.
//!
//! Layout: `domain` holds validated values, `orders`, `events` and
//! `idempotency` their persistence, `status` the transitions and the
//! consumer, `http` the API, `startup` the wiring.

pub mod config; // environment and command-line configuration
pub mod domain; // values that can only exist when valid
pub mod events; // the order's events as outbox rows
pub mod http; // routes, errors, metrics, OpenAPI
pub mod idempotency; // Idempotency-Key claims and replays
pub mod orders; // orders, items and status history in PostgreSQL
pub mod placing; // the one statement that places an order
pub mod startup; // Application::build and run_until_stopped
pub mod status; // status transitions; the pedido.status consumer

pub use config::Config;
pub use startup::{Application, RunError, StartupError};
