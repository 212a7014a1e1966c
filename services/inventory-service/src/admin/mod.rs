//! The command-line tools: DLT inspection and redrive, processed-table
//! retention. They talk to the same broker and database as the service.

mod dlt_read; // reading the DLT up to its current end
mod list; // dlt list and dlt show
mod redrive; // dlt redrive

pub use list::{list, show};
pub use redrive::redrive;
