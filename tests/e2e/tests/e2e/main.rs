//! The end-to-end and fault scenarios, one test each, run one at a time
//! (.config/nextest.toml): each starts its own broker, databases and
//! services. Set TEST_LOG=1 and RUST_LOG=info to see the services' logs.

// A failed unwrap in a scenario is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod brokers;
mod cancellations;
mod chaos;
mod console;
mod consumers;
mod databases;
mod happy_path;
mod least_privilege;
mod ops_config;
mod poison;
mod relays;
mod secure;
mod traces;
