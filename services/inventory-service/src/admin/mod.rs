//! The command-line tools: DLT inspection and redrive. They return what
//! they found or did; [`present`] prints it.

mod dlt_read; // reading the DLT from its low watermark up to its current end
mod list; // dlt list and dlt show
pub mod present; // the tools' output: the only place that prints
mod redrive; // dlt redrive

pub use dlt_read::{DltRead, Expired, ReadError, dead_lettered_at};
pub use list::{list, show};
pub use redrive::{RedriveError, RedriveStep, RedriveSummary, redrive};
