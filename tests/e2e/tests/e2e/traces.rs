//! One order, one trace: the real binaries export OTLP to a receiver in the
//! test, which checks the trace as a backend would show it.
//!
//! The structure (docs/observability.md, "Traces"):
//!
//! ```text
//! order-service   POST /orders                 server    (child of the caller's span)
//!   order-service create_order                 internal
//!     ...
//!       outbox-relay      pedido.eventos publish    producer  (child of the stored context)
//!         inventory-service pedido.eventos process  consumer  outcome=applied effect=reserved
//!           outbox-relay      estoque.eventos publish  producer
//!             order-service     estoque.eventos process  consumer  outcome=applied
//! ```

use std::time::Duration;

use e2e::pipeline::{DLT, TOPIC, binary};
use e2e::{Pipeline, PipelineOptions};
use test_support::database::TestDatabase;
use test_support::eventually::eventually;
use test_support::kafka::TopicReader;
use test_support::otlp::{OtlpReceiver, ReceivedSpan, tree};
use test_support::process::{Service, free_port};
use test_support::tls::{TestCa, TlsProxy};
use uuid::Uuid;

fn new_trace_id() -> String {
    Uuid::new_v4().simple().to_string()
}

/// Produces to `pedido.eventos` as a foreign producer would.
async fn produce(broker: &str, key: &str, value: &[u8], headers: &[(&str, Option<&[u8]>)]) {
    test_support::kafka::produce(broker, TOPIC, key, value, headers).await;
}

/// Places an order, with the caller's trace context when given; its id.
async fn place_order(http: &str, context: &[(&str, String)]) -> String {
    let request = context.iter().fold(
        reqwest::Client::new().post(format!("{http}/orders")),
        |request, (name, value)| request.header(*name, value),
    );
    let reply: serde_json::Value = request
        .json(&serde_json::json!({"customerId": "c-trace", "items": [{"sku": "ABC-1", "quantity": 1}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    reply["id"].as_str().unwrap().to_owned()
}

/// The one span of `trace` that `matches`, once it has arrived.
async fn span_of(
    receiver: &OtlpReceiver,
    trace_id: &str,
    what: &str,
    matches: impl Fn(&ReceivedSpan) -> bool,
) -> ReceivedSpan {
    eventually(what, Duration::from_secs(60), || async {
        let found: Vec<ReceivedSpan> = receiver
            .trace(trace_id)
            .into_iter()
            .filter(|span| matches(span))
            .collect();
        (found.len() == 1).then(|| found[0].clone())
    })
    .await
}

fn is(service: &str, name: &str) -> impl Fn(&ReceivedSpan) -> bool {
    move |span| span.service == service && span.name == name
}

/// Whether `ancestor` is `span`'s parent or further up, within `trace`.
fn descends_from(trace: &[ReceivedSpan], span: &ReceivedSpan, ancestor: &ReceivedSpan) -> bool {
    let mut parent = span.parent_span_id.as_str();
    while let Some(next) = trace.iter().find(|s| s.span_id == parent) {
        if next.span_id == ancestor.span_id {
            return true;
        }
        parent = next.parent_span_id.as_str();
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn one_order_is_one_trace_from_the_request_through_both_consumers() {
    let receiver = OtlpReceiver::start().await;
    let pipeline = Pipeline::start(PipelineOptions {
        environment: receiver.environment(),
        ..PipelineOptions::default()
    })
    .await;
    let broker = pipeline.broker.address().to_owned();

    // The caller's trace: the order must continue it.
    let trace_id = new_trace_id();
    let caller_span = "00f067aa0ba902b7";
    let order_id = place_order(
        &pipeline.order_service.http,
        &[
            ("traceparent", format!("00-{trace_id}-{caller_span}-01")),
            ("tracestate", "congo=t61rcWkgMzE".to_owned()),
        ],
    )
    .await;

    let server = span_of(
        &receiver,
        &trace_id,
        "the order service's server span",
        is("order-service", "POST /orders"),
    )
    .await;
    let published = span_of(
        &receiver,
        &trace_id,
        "the relay's producer span",
        is("outbox-relay", "pedido.eventos publish"),
    )
    .await;
    let consumed = span_of(
        &receiver,
        &trace_id,
        "the inventory's process span",
        is("inventory-service", "pedido.eventos process"),
    )
    .await;
    let announced = span_of(
        &receiver,
        &trace_id,
        "the inventory relay's producer span",
        is("outbox-relay", "estoque.eventos publish"),
    )
    .await;
    let confirmed = span_of(
        &receiver,
        &trace_id,
        "the order service's process span",
        is("order-service", "estoque.eventos process"),
    )
    .await;
    let trace = receiver.trace(&trace_id);

    assert_eq!(server.kind, "server");
    assert_eq!(
        server.parent_span_id, caller_span,
        "the request continues the caller's trace"
    );
    assert_eq!(server.attribute("http.route"), Some("/orders"));
    assert_eq!(server.attribute("http.response.status_code"), Some("201"));
    // The relay's span is a child of the context stored on the outbox row:
    // a span inside the request.
    assert_eq!(published.kind, "producer");
    assert!(
        descends_from(&trace, &published, &server),
        "publish under the request:\n{}",
        tree(&trace)
    );
    assert_eq!(published.attribute("messaging.system"), Some("kafka"));
    assert_eq!(
        published.attribute("messaging.destination.name"),
        Some(TOPIC)
    );
    assert_eq!(
        published.attribute("messaging.kafka.message.key"),
        Some(order_id.as_str())
    );
    assert!(
        published.attribute("messaging.kafka.offset").is_some(),
        "offset after the ack"
    );
    assert!(
        published
            .attribute("messaging.destination.partition.id")
            .is_some()
    );
    // Each consumer continues from the record's headers: the producer span.
    assert_eq!(consumed.kind, "consumer");
    assert_eq!(consumed.parent_span_id, published.span_id);
    assert_eq!(consumed.attribute("entrega.outcome"), Some("applied"));
    assert_eq!(consumed.attribute("entrega.effect"), Some("reserved"));
    assert_eq!(
        consumed.attribute("id"),
        published.attribute("messaging.message.id")
    );
    assert_eq!(
        announced.parent_span_id, consumed.span_id,
        "the outcome event continues the consumer's span"
    );
    assert_eq!(confirmed.parent_span_id, announced.span_id);
    assert_eq!(confirmed.attribute("entrega.outcome"), Some("applied"));

    // The record on the topic carries the producer span's context, and the
    // caller's tracestate travels with it.
    let record = TopicReader::new(&broker, TOPIC)
        .read_at_least(1, Duration::from_secs(30))
        .await
        .into_iter()
        .find(|record| record.key_text() == order_id)
        .unwrap();
    assert_eq!(
        record.header("traceparent"),
        Some(format!("00-{trace_id}-{}-01", published.span_id))
    );
    assert_eq!(
        record.header("tracestate").as_deref(),
        Some("congo=t61rcWkgMzE")
    );

    // A duplicate delivery of the same record: a second process span in the
    // same trace, marked as such.
    let headers: Vec<(&str, Option<&[u8]>)> = record
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_deref()))
        .collect();
    produce(
        &broker,
        &order_id,
        record.value.as_deref().unwrap(),
        &headers,
    )
    .await;
    let duplicate = span_of(
        &receiver,
        &trace_id,
        "the duplicate's process span",
        |span| {
            span.name == "pedido.eventos process"
                && span.attribute("entrega.outcome") == Some("duplicate")
        },
    )
    .await;
    assert_eq!(duplicate.parent_span_id, published.span_id);
    assert!(!duplicate.error);

    // A record that cannot be processed: dead-lettered, in its producer's
    // trace, and the dead letter keeps the trace headers.
    let bad_trace = new_trace_id();
    let bad_parent = format!("00-{bad_trace}-b7ad6b7169203331-01");
    let bad_id = Uuid::now_v7().to_string();
    produce(
        &broker,
        "o-trace-bad",
        b"{not json",
        &[
            ("id", Some(bad_id.as_bytes())),
            ("eventType", Some(b"PedidoCriado")),
            ("traceparent", Some(bad_parent.as_bytes())),
        ],
    )
    .await;
    let dead = span_of(
        &receiver,
        &bad_trace,
        "the dead letter's process span",
        is("inventory-service", "pedido.eventos process"),
    )
    .await;
    assert_eq!(dead.parent_span_id, "b7ad6b7169203331");
    assert_eq!(dead.attribute("entrega.outcome"), Some("dead-lettered"));
    assert_eq!(dead.attribute("entrega.dlt.reason"), Some("invalid-json"));
    assert!(dead.error, "a dead letter is an error span");
    let letter = TopicReader::new(&broker, DLT)
        .read_at_least(1, Duration::from_secs(30))
        .await
        .into_iter()
        .find(|record| record.header("id").as_deref() == Some(bad_id.as_str()))
        .unwrap();
    assert_eq!(letter.header("traceparent"), Some(bad_parent));

    // Redriven (and dead-lettered again: its JSON is still broken), it
    // continues the same trace from the same parent.
    pipeline.redrive("invalid-json").await;
    eventually(
        "the redriven record's process span",
        Duration::from_secs(60),
        || async {
            let spans: Vec<ReceivedSpan> = receiver
                .trace(&bad_trace)
                .into_iter()
                .filter(|span| span.name == "pedido.eventos process")
                .collect();
            (spans.len() == 2).then_some(spans)
        },
    )
    .await
    .iter()
    .for_each(|span| {
        assert_eq!(span.parent_span_id, "b7ad6b7169203331");
        assert_eq!(span.attribute("entrega.outcome"), Some("dead-lettered"));
    });

    // Without a caller's context, a request starts a trace of its own, and
    // its event carries it.
    let untraced = place_order(&pipeline.order_service.http, &[]).await;
    let stored: Option<String> =
        sqlx::query_scalar("select tracingspancontext from outbox where aggregateid = $1")
            .bind(&untraced)
            .fetch_one(&pipeline.orders)
            .await
            .unwrap();
    let stored = stored.expect("a context on the row of a request without traceparent");
    let own_trace = &stored["traceparent=00-".len().."traceparent=00-".len() + 32];
    let root = span_of(
        &receiver,
        own_trace,
        "the new trace's server span",
        is("order-service", "POST /orders"),
    )
    .await;
    assert_eq!(root.parent_span_id, "", "a root span");

    println!(
        "trace {trace_id} of order {order_id}:\n{}",
        tree(&receiver.trace(&trace_id))
    );
    println!(
        "dead letter and its redrive, trace {bad_trace}:\n{}",
        tree(&receiver.trace(&bad_trace))
    );
    pipeline.stop().await;
}

/// A collector behind TLS with a private CA: the exporter verifies the
/// collector's certificate against OTEL_EXPORTER_OTLP_CERTIFICATE (the
/// receiver behind the tests' TLS proxy), and the spans arrive.
#[tokio::test(flavor = "multi_thread")]
async fn spans_reach_a_collector_over_https_with_a_private_ca() {
    let receiver = OtlpReceiver::start().await;
    let ca = TestCa::new();
    let proxy = TlsProxy::bind().await;
    let endpoint = format!("https://localhost:{}", proxy.address.port());
    let _proxy = proxy.start(receiver.address(), &ca.server);
    let server = std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned());
    let database = TestDatabase::create(&server, "e2e_otlp_tls").await;
    let http = format!("127.0.0.1:{}", free_port());
    let service = Service::start(
        "order-service",
        &binary("order-service"),
        &[
            "--database-url",
            &database.url(),
            "--http-addr",
            &http,
            "--no-status-consumer",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            (
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                ca.ca.display().to_string(),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ],
    );
    let base = format!("http://{http}");
    eventually(
        "the order service answers",
        Duration::from_secs(60),
        || async {
            reqwest::get(format!("{base}/healthz"))
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
    let trace_id = new_trace_id();
    place_order(
        &base,
        &[("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))],
    )
    .await;
    span_of(
        &receiver,
        &trace_id,
        "the server span, exported over https",
        is("order-service", "POST /orders"),
    )
    .await;
    service.terminate(Duration::from_secs(30)).await;
}
