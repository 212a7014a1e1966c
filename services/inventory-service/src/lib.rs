//! The inventory service: consumes `pedido.eventos` idempotently and
//! reserves stock in the same transaction as the message's dedupe row.
//!
//! For each record: parse it (headers, event type, JSON, schema; anything
//! wrong goes straight to the DLT), then in one transaction insert
//! `(consumidor, mensagem_id)` into `mensagem_processada` (a conflict means
//! duplicate: commit, no effect) and reserve the order's stock, all or
//! nothing. Transient database failures are retried (3 × 1 s by default),
//! then dead-lettered. The offset is stored only after the commit or the DLT
//! acknowledgement: at-least-once delivery, exactly-once effect.

pub mod admin; // dlt list, show and redrive
pub mod circuit; // the DLQ circuit
pub mod config; // environment, flags and subcommands
pub mod consumer; // partitions, workers, offsets, rebalances
pub mod dlt; // dead-letter records and their headers
pub mod event; // parsing and validating PedidoCriado; failure classes
pub mod http; // stock and reservation API, health, metrics
pub mod inventory; // stock, reservations, dedupe rows in PostgreSQL
pub mod processor; // one record: dedupe + reserve, retries, DLT
pub mod retention; // processed-table retention
pub mod startup; // Application::build and run_until_stopped
pub mod topics; // start-up topic checks

pub use startup::{Application, StartupError};
