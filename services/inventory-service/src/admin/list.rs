use std::collections::HashMap;

use rdkafka::ClientConfig;
use time::format_description::well_known::Rfc3339;

use super::dlt_read::{self, ReadError, dead_lettered_at, matches};
use crate::config::DltFilter;
use crate::dlt::{DltInfo, decode_header};

/// Prints a line; false once stdout is gone (`dlt list | head`), so the
/// listing stops quietly instead of panicking on a broken pipe.
fn out(line: std::fmt::Arguments<'_>) -> bool {
    use std::io::Write;
    writeln!(std::io::stdout().lock(), "{line}").is_ok()
}

fn text(bytes: Option<&[u8]>) -> String {
    bytes.map_or_else(
        || "(null)".to_owned(),
        |b| String::from_utf8_lossy(b).into_owned(),
    )
}

/// `dlt list`: one line per matching record; returns how many.
pub async fn list(
    config: ClientConfig,
    dlt: String,
    filter: DltFilter,
) -> Result<usize, ReadError> {
    let records =
        tokio::task::spawn_blocking(move || dlt_read::read(&config, &dlt, &HashMap::new()))
            .await
            .map_err(|_| ReadError::Stalled(std::time::Duration::ZERO))??;
    if !out(format_args!(
        "{:>9} {:>8}  {:<38} {:<38} {:<20} {:>8}  DEAD-LETTERED AT",
        "PARTITION", "OFFSET", "KEY", "ID", "REASON", "ATTEMPTS"
    )) {
        return Ok(0);
    }
    let mut shown = 0;
    for record in records.iter().filter(|r| matches(&filter, r)) {
        let info = DltInfo::of(record);
        let at = dead_lettered_at(record)
            .and_then(|at| at.format(&Rfc3339).ok())
            .unwrap_or_else(|| "-".to_owned());
        let printed = out(format_args!(
            "{:>9} {:>8}  {:<38} {:<38} {:<20} {:>8}  {}",
            record.partition,
            record.offset,
            text(record.key.as_deref()),
            info.message_id.as_deref().unwrap_or("-"),
            info.reason.as_deref().unwrap_or("-"),
            info.attempts
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
            at,
        ));
        if !printed {
            return Ok(shown);
        }
        shown += 1;
    }
    eprintln!("{shown} record(s)");
    Ok(shown)
}

/// `dlt show`: one record, every header decoded.
pub async fn show(
    config: ClientConfig,
    dlt: String,
    partition: i32,
    offset: i64,
) -> Result<bool, ReadError> {
    let start = HashMap::from([(partition, offset)]);
    let records = tokio::task::spawn_blocking(move || dlt_read::read(&config, &dlt, &start))
        .await
        .map_err(|_| ReadError::Stalled(std::time::Duration::ZERO))??;
    let Some(record) = records
        .iter()
        .find(|r| r.partition == partition && r.offset == offset)
    else {
        eprintln!("no DLT record at partition {partition}, offset {offset}");
        return Ok(false);
    };
    println!("partition: {}", record.partition);
    println!("offset:    {}", record.offset);
    println!(
        "time:      {}",
        dead_lettered_at(record)
            .and_then(|at| at.format(&Rfc3339).ok())
            .unwrap_or_else(|| "-".to_owned())
    );
    println!("key:       {}", text(record.key.as_deref()));
    println!("value:     {}", text(record.value.as_deref()));
    println!("headers:");
    for (name, value) in &record.headers {
        println!("  {name}: {}", decode_header(name, value.as_deref()));
    }
    Ok(true)
}
