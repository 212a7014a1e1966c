//! entrega's operations console: one binary (`entrega`) that answers the
//! first question of every incident, *where is this message now?*, shows
//! and redrives dead letters, and shows the pipeline's health, as a CLI and
//! as a page on 127.0.0.1. Both call the same functions:
//!
//! - [`journey`]: every place a message or an order has been, from the
//!   databases ([`sources`]) and the broker ([`kafka`]);
//! - [`dead_letters`]: list, show, and redrive with a dry run that says what
//!   would happen now, over the consumer library's DLT tools and its audit;
//! - [`health`]: lag, outbox backlog, DLT depth, circuits, relay leaders;
//! - [`present`] prints them; [`web`] serves them.

pub mod config; // environment and flags
pub mod dead_letters; // list, show, predict, redrive
pub mod health; // the pipeline's numbers
pub mod journey; // where a message or order has been
pub mod kafka; // reading partitions without a group
pub mod present; // the CLI's output
pub mod sources; // the databases, the broker, the pipeline's shape
pub mod text; // times and errors as the console writes them
pub mod web; // the page and the JSON API
