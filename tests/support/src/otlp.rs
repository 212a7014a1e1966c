//! A small OTLP/HTTP trace receiver: what the services export when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` points at it. It decodes every
//! `POST /v1/traces` (protobuf) and keeps the spans, so a test can look at
//! one trace across processes as a backend (Jaeger, Tempo) would.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One span as the receiver got it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// `service.name` of the exporting process.
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// `server`, `producer`, `consumer`, `internal`, `client`.
    pub kind: &'static str,
    pub attributes: BTreeMap<String, String>,
    /// (trace id, span id) of each link.
    pub links: Vec<(String, String)>,
    pub error: bool,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Debug, Default)]
struct Received {
    /// Keep the spans; a load run only counts them.
    keep: bool,
    spans: Vec<ReceivedSpan>,
    count: usize,
    requests: u64,
}

type Shared = Arc<Mutex<Received>>;

/// A receiver on 127.0.0.1, stopped when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    received: Shared,
    task: JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::BoolValue(value)) => value.to_string(),
        Some(any_value::Value::IntValue(value)) => value.to_string(),
        Some(any_value::Value::DoubleValue(value)) => value.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(list: &[KeyValue]) -> BTreeMap<String, String> {
    list.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn kind(kind: i32) -> &'static str {
    match SpanKind::try_from(kind) {
        Ok(SpanKind::Server) => "server",
        Ok(SpanKind::Client) => "client",
        Ok(SpanKind::Producer) => "producer",
        Ok(SpanKind::Consumer) => "consumer",
        Ok(SpanKind::Internal) => "internal",
        _ => "unspecified",
    }
}

fn spans_of(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: kind(span.kind),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                        .collect(),
                    error: span
                        .status
                        .is_some_and(|status| status.code == SpanStatus::Error as i32),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                });
            }
        }
    }
    spans
}

async fn export(
    State(received): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes() == b"application/x-protobuf");
    let decoded = protobuf
        .then(|| ExportTraceServiceRequest::decode(body.as_ref()).ok())
        .flatten();
    let Some(request) = decoded else {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain")],
            b"expected an ExportTraceServiceRequest in protobuf".to_vec(),
        );
    };
    let spans = spans_of(request);
    {
        let mut received = received.lock().unwrap_or_else(PoisonError::into_inner);
        received.requests += 1;
        received.count += spans.len();
        if received.keep {
            received.spans.extend(spans);
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl OtlpReceiver {
    /// A receiver that keeps every span.
    pub async fn start() -> Self {
        Self::serve(true).await
    }

    /// A receiver that decodes and counts spans but keeps none: for load.
    pub async fn start_counting() -> Self {
        Self::serve(false).await
    }

    async fn serve(keep: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let received: Shared = Arc::new(Mutex::new(Received {
            keep,
            ..Received::default()
        }));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(Arc::clone(&received));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            endpoint: format!("http://{address}"),
            received,
            task,
        }
    }

    /// The environment that points a service's exporter here, exporting
    /// every 100 ms so that a test does not wait for the default 5 s.
    /// Where it listens (plain HTTP): for a TLS proxy in front of it.
    pub fn address(&self) -> std::net::SocketAddr {
        self.endpoint.trim_start_matches("http://").parse().unwrap()
    }

    pub fn environment(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spans
            .clone()
    }

    /// The spans of one trace, in start order.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        let mut spans: Vec<ReceivedSpan> = self
            .spans()
            .into_iter()
            .filter(|span| span.trace_id == trace_id)
            .collect();
        spans.sort_by_key(|span| span.start_unix_nano);
        spans
    }

    /// Spans received so far, and the export requests that carried them.
    pub fn counts(&self) -> (usize, u64) {
        let received = self.received.lock().unwrap_or_else(PoisonError::into_inner);
        (received.count, received.requests)
    }
}

/// `spans` as an indented tree: service, span name, kind, and the
/// attributes a reader of an order's trace looks for. Spans whose parent is
/// not among them (a caller's span, or one not exported) are roots.
pub fn tree(spans: &[ReceivedSpan]) -> String {
    const SHOWN: [&str; 6] = [
        "http.route",
        "messaging.destination.partition.id",
        "messaging.kafka.offset",
        "entrega.outcome",
        "entrega.effect",
        "entrega.dlt.reason",
    ];
    fn walk(spans: &[ReceivedSpan], parent: &str, depth: usize, out: &mut String) {
        for span in spans.iter().filter(|span| span.parent_span_id == parent) {
            let details: Vec<String> = SHOWN
                .iter()
                .filter_map(|key| span.attribute(key).map(|value| format!("{key}={value}")))
                .collect();
            let _ = writeln!(
                out,
                "{:indent$}{} {} [{}] span={} {}",
                "",
                span.service,
                span.name,
                span.kind,
                span.span_id,
                details.join(" "),
                indent = depth * 2
            );
            walk(spans, &span.span_id, depth + 1, out);
        }
    }
    let mut out = String::new();
    let roots: Vec<&str> = spans
        .iter()
        .filter(|span| {
            !spans
                .iter()
                .any(|other| other.span_id == span.parent_span_id)
        })
        .map(|span| span.parent_span_id.as_str())
        .collect();
    let mut seen = Vec::new();
    for root in roots {
        if !seen.contains(&root) {
            seen.push(root);
            if !root.is_empty() {
                let _ = writeln!(out, "(parent {root}, not exported here)");
            }
            walk(spans, root, usize::from(!root.is_empty()), &mut out);
        }
    }
    out
}
