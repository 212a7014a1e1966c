//! The console (`entrega`) as its own process against the real PostgreSQL
//! and a broker of the test's own (the console reads the pipeline's topics
//! by their default names), with fresh orders and inventory databases.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod consumers;
mod helpers;
mod terminal;
