//! The inventory service against the real PostgreSQL and broker, run as its
//! own process (so it can be killed); records are produced straight to the
//! topic. A fresh database, topic pair and group per test.
//! Set TEST_LOG=1 to see the service's logs.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod api;
mod blame;
mod cancelling;
mod consuming;
mod dead_letters;
mod environment;
mod helpers;
mod hostile;
mod in_process;
mod outages;
mod rebalancing;
mod tools;
mod worker_death;
