//! The tools' output, and the only place in the library that prints: records
//! and results to stdout (so they can be piped), notes and summaries to
//! stderr. A closed stdout (`dlt list | head`) ends the listing quietly.
//! Every line goes through [`for_terminal`]: a record's bytes cannot drive
//! the operator's terminal.

use std::io::Write;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use service_support::timestamps::rfc3339;

use crate::dlt_read::{DltRead, Expired, dead_lettered_at};
use crate::redrive::{RedriveStep, RedriveSummary};
use idempotent_consumer::{DltInfo, Record, decode_header, escape_invalid_utf8};

/// Bytes as a terminal may show them: text as text, every byte that is not
/// UTF-8 as `\xNN`, and every control character but newline and tab as
/// `\u{..}`. A record's key, value and headers are anybody's bytes: raw,
/// an escape sequence in them (ANSI colours, OSC window titles and
/// hyperlinks, a carriage return over the line before) would act on the
/// operator's terminal. Every tool that prints what a broker holds (these
/// tools, the console) writes through it.
pub fn for_terminal(bytes: &[u8]) -> String {
    escape_invalid_utf8(bytes)
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Prints a line; false once stdout is gone.
fn out(line: std::fmt::Arguments<'_>) -> bool {
    writeln!(
        std::io::stdout().lock(),
        "{}",
        for_terminal(line.to_string().as_bytes())
    )
    .is_ok()
}

fn note(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(
        std::io::stderr().lock(),
        "{}",
        for_terminal(line.to_string().as_bytes())
    );
}

fn text(bytes: Option<&[u8]>) -> String {
    bytes.map_or_else(|| "(null)".to_owned(), for_terminal)
}

fn at(record: &Record) -> String {
    dead_lettered_at(record).map_or_else(|| "-".to_owned(), rfc3339)
}

/// Retention deleted records a tool wanted: say so, per partition.
pub fn expired(expired: &[Expired]) {
    for gone in expired {
        note(format_args!(
            "partition {}: {} record(s) before offset {} expired (deleted by retention before this read)",
            gone.partition,
            gone.count(),
            gone.low_watermark
        ));
    }
}

/// `dlt list`: one line per record.
pub fn listing(read: &DltRead) {
    expired(&read.expired);
    if !out(format_args!(
        "{:>9} {:>8}  {:<38} {:<38} {:<20} {:>8}  DEAD-LETTERED AT",
        "PARTITION", "OFFSET", "KEY", "ID", "REASON", "ATTEMPTS"
    )) {
        return;
    }
    for record in &read.records {
        let info = DltInfo::of(record);
        if !out(format_args!(
            "{:>9} {:>8}  {:<38} {:<38} {:<20} {:>8}  {}",
            record.partition,
            record.offset,
            text(record.key.as_deref()),
            info.message_id.as_deref().unwrap_or("-"),
            info.reason.as_deref().unwrap_or("-"),
            info.attempts
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
            at(record),
        )) {
            return;
        }
    }
    note(format_args!("{} record(s)", read.records.len()));
}

/// `dlt show`: one record, every header decoded; false if it is not there.
pub fn shown(read: &DltRead, partition: i32, offset: i64) -> bool {
    expired(&read.expired);
    let Some(record) = read.records.first() else {
        note(format_args!(
            "no DLT record at partition {partition}, offset {offset}"
        ));
        return false;
    };
    for line in dead_letter(record) {
        if !out(format_args!("{line}")) {
            break;
        }
    }
    true
}

/// A dead letter for a terminal, every header decoded: the one rendering
/// of `dlt show` and `entrega dlt show` (the console's page has its own,
/// escaped by its templates). The lines are printed through
/// [`for_terminal`]; what is returned is not yet escaped.
pub fn dead_letter(record: &Record) -> Vec<String> {
    let mut lines = vec![
        format!("topic:     {}", record.topic),
        format!("partition: {}", record.partition),
        format!("offset:    {}", record.offset),
        format!("time:      {}", at(record)),
        format!("key:       {}", text(record.key.as_deref())),
        format!("value:     {}", text(record.value.as_deref())),
        "headers:".to_owned(),
    ];
    for header in &record.headers {
        let name = header.name_text();
        lines.push(format!(
            "  {name}: {}",
            decode_header(&name, header.value.as_deref())
        ));
    }
    lines
}

/// The progress of a redrive: one line per record on stdout (what a dry
/// run is for), and a counter on stderr when it is a terminal.
pub fn redrive_progress(dry_run: bool) -> impl FnMut(RedriveStep<'_>) + Send {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {pos} redriven, {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    move |step: RedriveStep<'_>| {
        bar.suspend(|| {
            out(format_args!(
                "{} {}/{}/{} (id {}, {}) to {}[{}]",
                if dry_run { "would redrive" } else { "redrove" },
                step.record.topic,
                step.record.partition,
                step.record.offset,
                step.info.message_id.as_deref().unwrap_or("-"),
                step.info.reason.as_deref().unwrap_or("-"),
                step.to_topic,
                step.to_partition,
            ))
        });
        bar.inc(1);
    }
}

/// What a redrive did.
pub fn redrive_summary(summary: &RedriveSummary) {
    expired(&summary.expired);
    note(format_args!(
        "{} {} record(s); {} of {} unredriven record(s) left in the DLT by the filter",
        if summary.dry_run {
            "would redrive"
        } else {
            "redrove"
        },
        summary.redriven,
        summary.skipped,
        summary.unredriven
    ));
    for (partition, offset) in &summary.skeletons {
        note(format_args!(
            "partition {partition} offset {offset}: a skeleton (sent without its value: too large for the broker), not redriven; `dlt show` says where the whole record is"
        ));
    }
}

/// What `<service> retention` deleted.
pub fn purged(deleted: u64) {
    out(format_args!(
        "deleted {deleted} mensagem_processada row(s) older than the retention"
    ));
}

#[cfg(test)]
mod tests {
    use super::for_terminal;

    #[test]
    fn bytes_for_a_terminal_keep_text_and_escape_control_characters() {
        assert_eq!(
            for_terminal(b"id\x1b]0;pwn\x07 ok\r\n\tnext \xc2\x9b2J \xff"),
            "id\\u{1b}]0;pwn\\u{7} ok\\u{d}\n\tnext \\u{9b}2J \\xFF"
        );
        assert_eq!(for_terminal("ação".as_bytes()), "ação");
    }
}
