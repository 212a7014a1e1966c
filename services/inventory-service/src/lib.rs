//! The inventory service: consumes `pedido.eventos` idempotently and
//! reserves stock in the same transaction as the message's dedupe row.
//!
//! A record flows: [`idempotent_consumer`] (poll loop → partition worker → pipeline:
//! parse, then one transaction that inserts `(consumidor, mensagem_id)`
//! first and hands the claimed messages to the handler) → [`reserving`]
//! (the handler) → [`inventory`] (the reservation, all or nothing, and its
//! [`announce`]ment: an outbox row for `estoque.eventos` in the same
//! transaction, published by a relay on the inventory database).
//! Anything unprocessable goes to the DLT with its reason; message-scoped
//! transient failures are retried (3 × 1 s by default) first; a database
//! that cannot be reached is waited for. The offset is stored only after the
//! commit or the DLT acknowledgement: at-least-once delivery, exactly-once
//! effect.

pub mod announce; // the outcomes on estoque.eventos, as outbox rows
pub mod config; // environment, flags and subcommands
pub mod event; // PedidoCriado, its parser and domain types (Sku)
pub mod http; // stock and reservation API, health, metrics
pub mod inventory; // stock and reservations in PostgreSQL
pub mod reserving; // the consumer's handler: reserve stock per order
pub mod startup; // Application::build and run_until_stopped

pub use startup::{Application, StartupError};
