//! The relay against the real PostgreSQL and broker, run as its own process
//! (so it can be killed), a fresh database and topic per test.
//! Set TEST_LOG=1 to see the relay's logs.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod cdc;
mod contract;
mod crashes;
mod environment;
mod failover;
mod failures;
mod helpers;
mod ordering;
mod publishing;
mod queries;
mod rabbitmq;
