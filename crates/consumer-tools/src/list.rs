//! `dlt list` and `dlt show`: what the DLT holds.

use std::collections::HashMap;

use rdkafka::ClientConfig;

use crate::cli::DltFilter;
use crate::dlt_read::{self, DltRead, From, ReadError, matches};

/// `dlt list`: the records that pass `filter`, and what expired.
pub async fn list(
    config: ClientConfig,
    dlt: String,
    filter: DltFilter,
) -> Result<DltRead, ReadError> {
    let from = From {
        offsets: HashMap::new(),
        only: filter.partition,
    };
    let mut read = dlt_read::read_off_runtime(config, dlt, from).await?;
    read.records.retain(|record| matches(&filter, record));
    Ok(read)
}

/// `dlt show`: the record at `partition`/`offset` if it is there (the read
/// reports it as expired if retention deleted it).
pub async fn show(
    config: ClientConfig,
    dlt: String,
    partition: i32,
    offset: i64,
) -> Result<DltRead, ReadError> {
    let from = From {
        offsets: HashMap::from([(partition, offset)]),
        only: Some(partition),
    };
    let mut read = dlt_read::read_off_runtime(config, dlt, from).await?;
    read.records.retain(|r| r.offset == offset);
    Ok(read)
}
