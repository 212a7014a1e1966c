//! The operations console against a real pipeline: the journey of a normal
//! order, a duplicate delivery, a dead-lettered and redriven record, a
//! parked outbox row and a cancelled order, as `entrega journey` reports
//! them; and the page in headless Chromium (tests/browser/console.mjs).

use std::time::Duration;

use e2e::console::{
    created_message, dead_lettered_order, entrega, journey, place_order, quick_statement_timeout,
    serve, wait_for_status,
};
use e2e::pipeline::{DLT, TOPIC};
use e2e::{Pipeline, PipelineOptions};
use serde_json::Value;
use test_support::eventually::eventually;
use test_support::kafka::TopicReader;
use uuid::Uuid;

/// Relays that delete published rows, as by default: the journey must find
/// them through the delivery log. A consumer whose statements time out fast.
async fn pipeline() -> Pipeline {
    let mut pipeline = Pipeline::start(PipelineOptions {
        consumers: 0,
        // After the inventory service, which creates its outbox.
        inventory_relays: 0,
        retain_published: false,
        stock: Vec::new(),
        ..PipelineOptions::default()
    })
    .await;
    pipeline
        .start_consumer_with(&quick_statement_timeout())
        .await;
    pipeline.start_inventory_relay().await;
    pipeline.set_stock("CNS-1", 100).await;
    pipeline.set_stock("CNS-2", 100).await;
    pipeline
}

fn steps(journey: &Value) -> Vec<&Value> {
    journey["steps"].as_array().unwrap().iter().collect()
}

/// `(what, place)` of every step, in the journey's order.
fn trail(journey: &Value) -> Vec<(String, String)> {
    steps(journey)
        .iter()
        .map(|s| {
            (
                s["what"].as_str().unwrap().to_owned(),
                s["place"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The position of the first step for which `wanted` holds; panics with
/// the whole trail when there is none.
fn position(journey: &Value, what: &str, wanted: impl Fn(&Value) -> bool) -> usize {
    steps(journey)
        .iter()
        .position(|step| step["what"] == what && wanted(step))
        .unwrap_or_else(|| panic!("no step {what:?} in {:#?}", trail(journey)))
}

fn count(journey: &Value, what: &str) -> usize {
    steps(journey).iter().filter(|s| s["what"] == what).count()
}

/// Where the order's records of `topic` are, read off the broker itself.
async fn places_of(pipeline: &Pipeline, topic: &str, key: Uuid) -> Vec<String> {
    TopicReader::new(pipeline.broker.address(), topic)
        .read_all(Duration::from_secs(30))
        .await
        .into_iter()
        .filter(|r| r.key_text() == key.to_string())
        .map(|r| format!("{}[{}]@{}", r.topic, r.partition, r.offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn journeys_of_an_order_a_duplicate_a_dead_letter_a_parked_row_and_a_cancellation() {
    let pipeline = pipeline().await;

    // A normal order, there and back.
    let order = place_order(&pipeline, "CNS-2", 1).await;
    wait_for_status(&pipeline, order, "CONFIRMED").await;
    let created = created_message(&pipeline, order).await;
    let normal = journey(&pipeline, &order.to_string()).await;
    assert_eq!(normal["matched"], "order");
    assert_eq!(normal["order"]["status"], "CONFIRMED");
    let out = places_of(&pipeline, TOPIC, order).await;
    let back = places_of(&pipeline, "estoque.eventos", order).await;
    assert_eq!((out.len(), back.len()), (1, 1), "one record each way");
    let is = |id: Uuid| move |step: &Value| step["messageId"] == id.to_string();
    let written = position(&normal, "written", is(created));
    let published = position(&normal, "published", |s| s["evidence"]["record"] == out[0]);
    let record = position(&normal, "record", |s| s["place"] == out[0]);
    let processed = position(&normal, "processed", |s| {
        s["place"] == "inventory.mensagem_processada" && s["messageId"] == created.to_string()
    });
    let reserved = position(&normal, "stock reserved", is(created));
    let returned = position(&normal, "record", |s| s["place"] == back[0]);
    let confirmed = position(&normal, "order CONFIRMED", |_| true);
    let back_processed = position(&normal, "processed", |s| {
        s["place"] == "orders.mensagem_processada"
    });
    // Each place's own clock: the broker stamps a record when it is sent,
    // before the relay records the delivery, and a consumer may apply it
    // before that; so "published" is only after "written".
    assert!(written < published, "{:#?}", trail(&normal));
    assert!(
        written < record
            && record < processed
            && processed < reserved
            && reserved < returned
            && returned < back_processed
            && back_processed < confirmed,
        "out of causal order: {:#?}",
        trail(&normal)
    );
    // The order's status change names the message that caused it.
    assert_eq!(
        steps(&normal)[confirmed]["messageId"],
        steps(&normal)[back_processed]["messageId"]
    );

    // A duplicate delivery: the same record again, in its partition.
    let original = TopicReader::new(pipeline.broker.address(), TOPIC)
        .read_all(Duration::from_secs(30))
        .await
        .into_iter()
        .find(|r| r.key_text() == order.to_string())
        .unwrap();
    let duplicates_before = pipeline.consumer_duplicates().await;
    let copy = original.clone();
    tokio::task::spawn_blocking({
        let broker = pipeline.broker.address().to_owned();
        move || {
            let headers: Vec<(&[u8], Option<&[u8]>)> = copy
                .headers
                .iter()
                .map(|(name, value)| (name.as_bytes(), value.as_deref()))
                .collect();
            test_support::raw::produce(
                &broker,
                TOPIC,
                &test_support::raw::RawRecord {
                    partition: copy.partition,
                    key: copy.key.as_deref().unwrap(),
                    value: copy.value.as_deref().unwrap(),
                    headers,
                },
            )
        }
    })
    .await
    .unwrap();
    eventually("the copy is absorbed", Duration::from_secs(30), || async {
        (pipeline.consumer_duplicates().await > duplicates_before).then_some(())
    })
    .await;
    let duplicate = journey(&pipeline, &created.to_string()).await;
    assert_eq!(duplicate["matched"], "message");
    assert_eq!(duplicate["orderId"], order.to_string());
    assert_eq!(count(&duplicate, "record"), 1, "{:#?}", trail(&duplicate));
    assert_eq!(count(&duplicate, "record (another copy)"), 1);
    assert_eq!(count(&duplicate, "processed"), 1, "one dedupe row");
    assert_eq!(count(&duplicate, "stock reserved"), 1, "one effect");
    assert!(
        steps(&duplicate)
            .iter()
            .all(|s| s["messageId"] == created.to_string()),
        "a message's journey holds only its own steps"
    );

    // Dead-lettered, then redriven once its cause is gone.
    let (stuck, stuck_message) = dead_lettered_order(&pipeline, "CNS-1").await;
    let dead = journey(&pipeline, &stuck_message.to_string()).await;
    let letter = &steps(&dead)[position(&dead, "dead-lettered", |s| {
        s["evidence"]["reason"] == "retries-exhausted"
    })];
    let dlt_place = letter["place"].as_str().unwrap().to_owned();
    assert!(dlt_place.starts_with(DLT), "{dlt_place}");
    assert_eq!(count(&dead, "processed"), 0);
    let (partition, offset) = dlt_place
        .trim_start_matches(DLT)
        .trim_start_matches('[')
        .split_once("]@")
        .unwrap();
    let run_redrive = |extra: &'static [&'static str]| {
        let pipeline = &pipeline;
        let (partition, offset) = (partition.to_owned(), offset.to_owned());
        async move {
            let mut args = vec![
                "dlt",
                "redrive",
                DLT,
                &partition,
                &offset,
                "--operator",
                "e2e",
            ];
            args.extend(extra);
            entrega(pipeline, &args).await
        }
    };
    let dry = run_redrive(&["--dry-run"]).await;
    assert!(dry.success, "{}", dry.stderr);
    assert!(
        dry.stdout.contains("after transient failures"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("nothing published (dry run)"),
        "{}",
        dry.stdout
    );
    assert_eq!(
        count(
            &journey(&pipeline, &stuck_message.to_string()).await,
            "redriven"
        ),
        0,
        "a dry run redrives nothing"
    );
    let redrive = run_redrive(&[]).await;
    assert!(redrive.success, "{}", redrive.stderr);
    let to = redrive
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix("redriven to "))
        .unwrap_or_else(|| panic!("{}", redrive.stdout))
        .to_owned();
    wait_for_status(&pipeline, stuck, "CONFIRMED").await;
    let again = run_redrive(&[]).await;
    assert!(
        again.stdout.contains("already redriven"),
        "{}",
        again.stdout
    );
    assert!(again.stdout.contains("a duplicate"), "{}", again.stdout);
    let printed = entrega(&pipeline, &["journey", &stuck_message.to_string()]).await;
    println!("{}", printed.stdout);
    let redriven = journey(&pipeline, &stuck_message.to_string()).await;
    let dead_lettered = position(&redriven, "dead-lettered", |_| true);
    let audited = position(&redriven, "redriven", |s| {
        s["evidence"]["operator"] == "e2e"
            && s["evidence"]["to"] == to
            && s["evidence"]["from"] == dlt_place
    });
    let copy = position(&redriven, "record (redriven copy)", |s| s["place"] == to);
    let applied = position(&redriven, "processed", |_| true);
    let effect = position(&redriven, "stock reserved", |_| true);
    assert!(
        dead_lettered < audited && dead_lettered < copy && copy < applied && applied < effect,
        "out of causal order: {:#?}",
        trail(&redriven)
    );
    assert_eq!(
        count(&redriven, "redriven"),
        1,
        "the second redrive published nothing"
    );

    // A parked outbox row: too large for the broker, five times.
    let parked_order = Uuid::now_v7();
    let parked_message = Uuid::now_v7();
    sqlx::query(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload)
         values ($1, 'pedido', $2, 'PedidoCriado', jsonb_build_object('padding', repeat('x', 2000000)))",
    )
    .bind(parked_message)
    .bind(parked_order.to_string())
    .execute(&pipeline.orders)
    .await
    .unwrap();
    eventually("the row is parked", Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, bool>("select parked_at is not null from outbox where id = $1")
            .bind(parked_message)
            .fetch_one(&pipeline.orders)
            .await
            .ok()
            .filter(|parked| *parked)
    })
    .await;
    let parked = journey(&pipeline, &parked_message.to_string()).await;
    let row = &steps(&parked)[position(&parked, "written", |s| s["evidence"]["state"] == "parked")];
    assert_eq!(row["evidence"]["attempts"], "5");
    assert!(
        row["evidence"]["last_error"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("too large"),
        "{row}"
    );
    position(&parked, "parked", |s| {
        s["evidence"]["unpark"]
            .as_str()
            .unwrap()
            .contains(&parked_message.to_string())
    });
    assert_eq!(count(&parked, "published"), 0);

    // A cancelled order: reserved, then released.
    let cancelled = place_order(&pipeline, "CNS-2", 3).await;
    wait_for_status(&pipeline, cancelled, "CONFIRMED").await;
    let reply = reqwest::Client::new()
        .post(format!(
            "{}/orders/{cancelled}/cancel",
            pipeline.order_service.http
        ))
        .send()
        .await
        .unwrap();
    assert!(reply.status().is_success(), "{}", reply.status());
    eventually("the stock is released", Duration::from_secs(60), || async {
        let status: Option<String> =
            sqlx::query_scalar("select status from reservations where order_id = $1")
                .bind(cancelled)
                .fetch_optional(&pipeline.inventory)
                .await
                .unwrap();
        (status.as_deref() == Some("RELEASED")).then_some(())
    })
    .await;
    let journey_cancelled = journey(&pipeline, &cancelled.to_string()).await;
    assert_eq!(journey_cancelled["order"]["status"], "CANCELLED");
    let cancel_written = position(&journey_cancelled, "written", |s| {
        s["eventType"] == "PedidoCancelado"
    });
    let cancel_processed_by = steps(&journey_cancelled)[cancel_written]["messageId"].clone();
    let cancel_record = position(&journey_cancelled, "record", |s| {
        s["messageId"] == cancel_processed_by
    });
    let released = position(&journey_cancelled, "reservation RELEASED", |s| {
        s["messageId"] == cancel_processed_by
    });
    let order_cancelled = position(&journey_cancelled, "order CANCELLED", |_| true);
    let liberado = position(&journey_cancelled, "record", |s| {
        s["eventType"] == "EstoqueLiberado"
    });
    assert!(
        order_cancelled < cancel_record && cancel_record < released && released < liberado,
        "out of causal order: {:#?}",
        trail(&journey_cancelled)
    );

    // An id nothing knows.
    let unknown = entrega(&pipeline, &["journey", &Uuid::now_v7().to_string()]).await;
    assert!(!unknown.success);
    assert!(
        unknown.stdout.contains("no order, outbox row"),
        "{}",
        unknown.stdout
    );
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_page_in_a_browser_and_every_services_docs_offline() {
    let pipeline = pipeline().await;
    let order = place_order(&pipeline, "CNS-2", 1).await;
    wait_for_status(&pipeline, order, "CONFIRMED").await;
    let (stuck, stuck_message) = dead_lettered_order(&pipeline, "CNS-1").await;
    let (console, url) = serve(&pipeline).await;

    let screenshots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e/screenshots");
    let browser_tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../browser");
    assert!(
        browser_tests.join("node_modules/playwright-core").exists(),
        "playwright-core is not installed: npm ci --prefix tests/browser (scripts/test does)"
    );
    let docs = format!(
        "order-service={},inventory-service={},console={url}",
        pipeline.order_service.http, pipeline.consumers[0].http
    );
    let output = tokio::process::Command::new("node")
        .arg(browser_tests.join("console.mjs"))
        .env("CONSOLE_URL", &url)
        .env("ADMIN_TOKEN", test_support::ADMIN_TOKEN)
        .env("MESSAGE_ID", stuck_message.to_string())
        .env("ORDER_ID", stuck.to_string())
        .env("DOCS_URLS", docs)
        .env("SCREENSHOTS", &screenshots)
        .output()
        .await
        .expect("running node (tests/browser/console.mjs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the browser test failed:\n{stdout}\n{}\nconsole log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        console.log()
    );
    assert!(stdout.contains("ok - no request left 127.0.0.1"));
    drop(console);
    pipeline.stop().await;
}
