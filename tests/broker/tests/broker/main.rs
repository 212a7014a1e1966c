//! Broker proof: one test binary, a module per property entrega relies on.

mod catch_up;
mod consumer_groups;
mod produce_consume;
mod resume;
mod topics;
