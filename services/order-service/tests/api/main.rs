//! Integration tests of the order service against a real PostgreSQL, a fresh
//! database per test (and, for the status consumer, real broker topics per
//! test). Set TEST_LOG=1 to see the service's logs.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod atomicity;
mod bad_input;
mod cancel;
mod create_order;
mod helpers;
mod idempotency;
mod migrations;
mod operations;
mod secrets;
mod status;
