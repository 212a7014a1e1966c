//! W3C Trace Context across process boundaries: HTTP requests, outbox
//! rows, Kafka headers.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";
const TRACEPARENT_LEN: usize = 55;
/// What the specification asks every vendor to carry at least; longer
/// values are dropped, so that a stored context stays small.
const TRACESTATE_MAX: usize = 512;

/// Set once the OpenTelemetry layer is installed ([`super::init`]): until
/// then spans have no OpenTelemetry context and nothing here is worth doing.
static RECORDING: AtomicBool = AtomicBool::new(false);

pub(super) fn start_recording() {
    RECORDING.store(true, Ordering::Relaxed);
}

/// Whether spans are recorded for export.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// A valid W3C `traceparent` (the 55 characters `version-traceid-parentid-flags`)
/// with its `tracestate`, if any.
///
/// Per the specification an invalid `traceparent` is ignored, never
/// refused: tracing must not make a request or a record fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

fn is_lower_hex(part: &str) -> bool {
    part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn parse_traceparent(value: &str) -> Option<String> {
    let value = value.trim();
    let head = value.get(..TRACEPARENT_LEN)?;
    let mut parts = head.split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let well_formed = [(version, 2), (trace_id, 32), (parent_id, 16), (flags, 2)]
        .iter()
        .all(|(part, len)| part.len() == *len && is_lower_hex(part));
    if !well_formed || parts.next().is_some() || version == "ff" {
        return None;
    }
    // Version 00 is exactly 55 characters; later versions may append
    // fields after a '-', which are not carried on.
    let rest = &value[TRACEPARENT_LEN..];
    if (version == "00" && !rest.is_empty()) || (!rest.is_empty() && !rest.starts_with('-')) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
        return None;
    }
    // Carried on as version 00, the only one this code knows how to write.
    Some(format!("00{}", &head[2..]))
}

/// A `tracestate` worth carrying: printable ASCII, bounded; otherwise dropped
/// (the `traceparent` stays).
fn parse_tracestate(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()
        && value.len() <= TRACESTATE_MAX
        && value.bytes().all(|b| (0x20..0x7f).contains(&b)))
    .then(|| value.to_owned())
}

impl TraceContext {
    /// The context carried by these header values, if `traceparent` is valid.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        Some(Self {
            traceparent: parse_traceparent(traceparent)?,
            tracestate: tracestate.and_then(parse_tracestate),
        })
    }

    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The 32 hex digits of the trace id.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The form of Debezium's context column (`tracing.span.context.field`):
    /// Java `Properties` text, one `key=value` line per header.
    pub fn to_properties(&self) -> String {
        let mut text = format!("{TRACEPARENT}={}\n", self.traceparent);
        if let Some(state) = &self.tracestate {
            // Properties.load reads `=` in a value as is; only a backslash
            // needs escaping.
            text.push_str(&format!("{TRACESTATE}={}\n", state.replace('\\', "\\\\")));
        }
        text
    }

    /// Reads Debezium's context column. Comment lines and unknown keys are
    /// skipped; without a valid `traceparent` there is no context.
    pub fn from_properties(text: &str) -> Option<Self> {
        let (mut traceparent, mut tracestate) = (None, None);
        for line in text.lines() {
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let Some((key, value)) = split_property(line) else {
                continue;
            };
            match key.as_str() {
                TRACEPARENT => traceparent = Some(value),
                TRACESTATE => tracestate = Some(value),
                _ => {}
            }
        }
        Self::parse(&traceparent?, tracestate.as_deref())
    }

    fn to_otel(&self) -> opentelemetry::Context {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert(TRACEPARENT.to_owned(), self.traceparent.clone());
        if let Some(state) = &self.tracestate {
            carrier.insert(TRACESTATE.to_owned(), state.clone());
        }
        TraceContextPropagator::new().extract(&carrier)
    }

    fn of_otel(context: &opentelemetry::Context) -> Option<Self> {
        if !context.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = HashMap::with_capacity(2);
        TraceContextPropagator::new().inject_context(context, &mut carrier);
        Self::parse(
            carrier.get(TRACEPARENT)?,
            carrier.get(TRACESTATE).map(String::as_str),
        )
    }
}

/// One `Properties` line as key and value: the key ends at the first
/// unescaped `=`, `:` or whitespace; backslash escapes are undone.
fn split_property(line: &str) -> Option<(String, String)> {
    let mut key = String::new();
    let mut chars = line.chars();
    let mut escaped = false;
    let mut ended_by_separator = false;
    for c in chars.by_ref() {
        if escaped {
            key.push(unescape(c));
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if matches!(c, '=' | ':') {
            ended_by_separator = true;
            break;
        } else if matches!(c, ' ' | '\t') {
            break;
        } else {
            key.push(c);
        }
    }
    // After `key ` one `=` or `:` may still follow; after `key=`, a second
    // one belongs to the value.
    let mut rest = chars.as_str().trim_start_matches([' ', '\t']);
    if !ended_by_separator {
        rest = rest
            .strip_prefix(['=', ':'])
            .unwrap_or(rest)
            .trim_start_matches([' ', '\t']);
    }
    let mut value = String::with_capacity(rest.len());
    let mut escaped = false;
    for c in rest.chars() {
        if escaped {
            value.push(unescape(c));
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            value.push(c);
        }
    }
    (!key.is_empty()).then_some((key, value))
}

fn unescape(c: char) -> char {
    match c {
        't' => '\t',
        'n' => '\n',
        'r' => '\r',
        'f' => '\u{c}',
        other => other,
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent)
    }
}

/// Makes `span` a child of the context `parent` reads (a request's or a
/// record's). Call it before the span is first entered. With tracing off,
/// or a span that is not enabled, `parent` is not even called.
pub fn continue_trace(span: &tracing::Span, parent: impl FnOnce() -> Option<TraceContext>) {
    if !recording() || span.is_disabled() {
        return;
    }
    if let Some(parent) = parent() {
        // Fails only when no OpenTelemetry layer is installed.
        let _ = span.set_parent(parent.to_otel());
    }
}

/// `span`'s own context, when traces are recorded.
pub fn recorded(span: &tracing::Span) -> Option<TraceContext> {
    if !recording() {
        return None;
    }
    TraceContext::of_otel(&span.context())
}

/// The context to hand on from `span`: its own when traces are recorded,
/// otherwise `incoming`, passed on unchanged so that a caller's trace still
/// reaches the next service.
pub fn outgoing(span: &tracing::Span, incoming: Option<TraceContext>) -> Option<TraceContext> {
    recorded(span).or(incoming)
}

/// Links `span` to `other`'s trace: for work that serves several traces at
/// once (one transaction for a batch of records).
pub fn link(span: &tracing::Span, other: &tracing::Span) {
    if !recording() {
        return;
    }
    let context = other.context();
    let other = context.span().span_context().clone();
    if other.is_valid() {
        span.add_link(other);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn accepts_the_specification_example() {
        let context = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.traceparent(), VALID);
        assert_eq!(context.tracestate(), Some("congo=t61rcWkgMzE"));
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn carries_a_future_version_as_version_00() {
        let future =
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert_eq!(
            TraceContext::parse(future, None).map(|c| c.traceparent),
            Some(VALID.to_owned())
        );
    }

    #[test]
    fn ignores_malformed_values() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u{e9}",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?} was accepted");
        }
    }

    #[test]
    fn drops_a_tracestate_that_is_not_printable_ascii_but_keeps_the_parent() {
        let context = TraceContext::parse(VALID, Some("a=b\u{0}")).unwrap();
        assert_eq!(context.tracestate(), None);
        let too_long = "k=".to_owned() + &"v".repeat(TRACESTATE_MAX);
        assert_eq!(
            TraceContext::parse(VALID, Some(&too_long))
                .unwrap()
                .tracestate(),
            None
        );
    }

    #[test]
    fn passes_the_incoming_context_on_when_traces_are_not_recorded() {
        let incoming = TraceContext::parse(VALID, None);
        let span = tracing::info_span!("no layer");
        continue_trace(&span, || incoming.clone());
        assert_eq!(outgoing(&span, incoming.clone()), incoming);
    }

    #[test]
    fn reads_and_writes_debeziums_context_column() {
        let context = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE,rojo=00f0")).unwrap();
        let text = context.to_properties();
        assert_eq!(
            text,
            format!("traceparent={VALID}\ntracestate=congo=t61rcWkgMzE,rojo=00f0\n")
        );
        assert_eq!(TraceContext::from_properties(&text), Some(context));
        // As java.util.Properties.store writes it: a date comment, escaped
        // separators in the value.
        let stored = format!(
            "#Thu Dec 03 10:00:00 UTC 2026\r\ntracestate=congo\\=t61rcWkgMzE\r\ntraceparent : {VALID}\r\n"
        );
        let read = TraceContext::from_properties(&stored).unwrap();
        assert_eq!(read.traceparent(), VALID);
        assert_eq!(read.tracestate(), Some("congo=t61rcWkgMzE"));
        assert_eq!(TraceContext::from_properties("tracestate=a=b\n"), None);
        // As Java reads them: the first separator ends the key, a second one
        // is the value's.
        assert_eq!(
            split_property("key==v"),
            Some(("key".to_owned(), "=v".to_owned()))
        );
        assert_eq!(
            split_property("key  :  v w"),
            Some(("key".to_owned(), "v w".to_owned()))
        );
        assert_eq!(TraceContext::from_properties("traceparent=nonsense"), None);
    }

    #[test]
    fn round_trips_through_opentelemetry() {
        let context = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(TraceContext::of_otel(&context.to_otel()), Some(context));
    }
}
