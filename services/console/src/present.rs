//! The CLI's output: results on stdout (so they can be piped), notes on
//! stderr. Never `println!`: it panics when stdout is closed (`| head`).

use std::io::Write;

use consumer_tools::present::for_terminal;

use idempotent_consumer::Record;

use crate::dead_letters::{Listing, RedriveResult};
use crate::health::Health;
use crate::journey::{Journey, Matched};
use crate::text::rfc3339;

/// Writes `text`; a closed stdout ends the output quietly. Escaped as the
/// DLT tools escape theirs: a record's bytes must not drive the operator's
/// terminal (ANSI and OSC sequences).
fn out(text: &str) {
    let _ = std::io::stdout()
        .lock()
        .write_all(for_terminal(text.as_bytes()).as_bytes());
}

fn note(text: &str) {
    let _ = writeln!(
        std::io::stderr().lock(),
        "{}",
        for_terminal(text.as_bytes())
    );
}

pub fn json<T: serde::Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => out(&format!("{text}\n")),
        Err(error) => note(&format!("cannot print as JSON: {error}")),
    }
}

pub fn journey_text(journey: &Journey) -> String {
    let mut text = String::new();
    let what = match journey.matched {
        Some(Matched::Order) => "order",
        Some(Matched::Message) => "message",
        None => "id",
    };
    text.push_str(&format!("journey of {what} {}", journey.id));
    if journey.matched == Some(Matched::Message)
        && let Some(order) = &journey.order_id
    {
        text.push_str(&format!(" (order {order})"));
    }
    if let Some(order) = &journey.order {
        text.push_str(&format!(
            ": order {}{}",
            order.status,
            order
                .status_reason
                .as_deref()
                .map(|reason| format!(" ({reason})"))
                .unwrap_or_default()
        ));
    }
    text.push('\n');
    for step in &journey.steps {
        let at = step.at.map_or_else(|| "-".to_owned(), rfc3339);
        let message = match (&step.message_id, &step.event_type) {
            (Some(id), Some(event)) => format!("{id} {event}"),
            (Some(id), None) => id.to_string(),
            (None, Some(event)) => event.clone(),
            (None, None) => String::new(),
        };
        text.push_str(&format!(
            "{at:<32} {:<34} {:<24} {message}\n",
            step.place, step.what
        ));
        if !step.evidence.is_empty() {
            let evidence: Vec<String> = step
                .evidence
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            text.push_str(&format!("{:<32} {}\n", "", evidence.join("  ")));
        }
    }
    for line in &journey.notes {
        text.push_str(&format!("note: {line}\n"));
    }
    text
}

pub fn journey(journey: &Journey) {
    out(&journey_text(journey));
}

pub fn listing(listing: &Listing) {
    for line in &listing.notes {
        note(line);
    }
    out(&format!(
        "{:<20} {:>9} {:>8}  {:<36} {:<36} {:<18} {:>8}  DEAD-LETTERED AT\n",
        "TOPIC", "PARTITION", "OFFSET", "KEY", "ID", "REASON", "ATTEMPTS"
    ));
    for letter in &listing.letters {
        out(&format!(
            "{:<20} {:>9} {:>8}  {:<36} {:<36} {:<18} {:>8}  {}\n",
            letter.topic,
            letter.partition,
            letter.offset,
            letter.key.as_deref().unwrap_or("(null)"),
            letter.message_id.as_deref().unwrap_or("-"),
            letter.reason.as_deref().unwrap_or("-"),
            letter
                .attempts
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
            letter.at.map_or_else(|| "-".to_owned(), rfc3339),
        ));
    }
    note(&format!("{} dead letter(s)", listing.letters.len()));
}

/// A dead letter as `dlt show` prints it, the one terminal rendering.
pub fn dead_letter(record: &Record) {
    let mut text = consumer_tools::present::dead_letter(record).join("\n");
    text.push('\n');
    out(&text);
}

pub fn redrive(result: &RedriveResult) {
    let mut text = format!(
        "{} {}[{}]@{} (id {}) as {}\n",
        if result.dry_run {
            "dry run: redrive of"
        } else {
            "redrive of"
        },
        result.letter.topic,
        result.letter.partition,
        result.letter.offset,
        result.letter.message_id.as_deref().unwrap_or("-"),
        result.operator,
    );
    for line in &result.prediction.verdict {
        text.push_str(&format!("  - {line}\n"));
    }
    match (&result.redriven_to, result.dry_run) {
        (Some(to), _) => text.push_str(&format!("redriven to {to}\n")),
        (None, true) => text.push_str("nothing published (dry run)\n"),
        (None, false) => text.push_str("nothing published: redriven already, or not redrivable\n"),
    }
    out(&text);
}

pub fn health(health: &Health) {
    let mut text = format!("pipeline health at {}\n", rfc3339(health.read_at));
    for topic in &health.topics {
        text.push_str(&format!(
            "{} (group {}): lag {}  DLT {}: {} record(s), {} unredriven, newest {}\n",
            topic.topic,
            topic.group,
            topic.lag,
            topic.dlt.topic,
            topic.dlt.depth,
            topic.dlt.unredriven,
            topic.dlt.newest.map_or_else(|| "-".to_owned(), rfc3339),
        ));
        for p in &topic.partitions {
            text.push_str(&format!(
                "  partition {}: end {} committed {} lag {}\n",
                p.partition,
                p.end,
                p.committed
                    .map_or_else(|| "-".to_owned(), |c| c.to_string()),
                p.lag
            ));
        }
        if let Some(error) = &topic.error {
            text.push_str(&format!("  error: {error}\n"));
        }
    }
    for outbox in &health.outboxes {
        text.push_str(&format!(
            "{} outbox -> {}: pending {} (oldest {} s), parked {}, held {}, leader {}\n",
            outbox.database.name(),
            outbox.topic,
            show(outbox.pending),
            outbox
                .oldest_pending_seconds
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}")),
            show(outbox.parked),
            show(outbox.held),
            outbox.leader.as_ref().map_or_else(
                || "none".to_owned(),
                |l| format!(
                    "pid {} ({}, {})",
                    l.pid,
                    l.mode,
                    l.application_name.as_deref().unwrap_or("-")
                )
            ),
        ));
    }
    for service in &health.services {
        text.push_str(&format!(
            "{} {}: {}{}{}{}\n",
            service.name,
            service.url,
            if service.up { "up" } else { "DOWN" },
            flag(", circuit open", service.circuit_open),
            flag(", leader", service.leader),
            match service.database_available {
                Some(false) => ", database unavailable",
                _ => "",
            },
        ));
    }
    if health.alerts.is_empty() {
        text.push_str("no alert would fire\n");
    }
    for alert in &health.alerts {
        text.push_str(&format!("ALERT {alert}\n"));
    }
    out(&text);
}

fn show(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn flag(text: &str, value: Option<bool>) -> &str {
    if value == Some(true) { text } else { "" }
}
