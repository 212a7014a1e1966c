//! The end-to-end harness: a whole pipeline per scenario (its own broker,
//! its own orders and inventory databases, the three real service binaries
//! as processes), a load of orders through the HTTP API, faults, and the
//! invariants checked at the end. Nothing is mocked.
//!
//! Each scenario prints one line and records it under `target/e2e/`;
//! `scripts/test` prints the summary line over all of them.

// A failed step of a scenario is a failed test, with its message.
#![allow(clippy::unwrap_used)]

pub mod console; // the operations console (entrega) and the scenes its tests look at
pub mod containers; // PostgreSQL and the broker in containers (testcontainers)
pub mod invariants; // what must hold at the end of every scenario
pub mod load; // placing orders through the order service's API
pub mod pipeline; // brokers, databases and service processes
pub mod report; // the per-scenario line and its record
pub mod roles; // least privilege: an owner that migrates, a role per part

pub use invariants::Outcome;
pub use pipeline::{Pipeline, PipelineOptions};
