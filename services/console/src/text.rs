//! How the console writes times and errors, wherever it shows them.

pub use service_support::timestamps::rfc3339;

pub use service_support::telemetry::cause_chain as chain;
