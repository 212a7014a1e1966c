//! The built-in relay produces exactly the records Debezium would: the
//! fixtures in debezium/contract/ state them, with how each part was
//! derived: the order service's events and the inventory's, one relay (or
//! one connector) per database, the same router settings.

use std::time::Duration;

use serde::Deserialize;
use test_support::broker::PrivateBroker;
use test_support::kafka::{TopicReader, create_topic, java_partition};

use crate::helpers::{Mode, RelayTest};

#[derive(Debug, Deserialize)]
struct Fixture {
    partitions: i32,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    row: Row,
    record: Expected,
}

#[derive(Debug, Deserialize)]
struct Row {
    id: uuid::Uuid,
    aggregatetype: String,
    aggregateid: String,
    #[serde(rename = "type")]
    event_type: String,
    payload: String,
    traceparent: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Expected {
    topic: String,
    partition: i32,
    key: String,
    value: String,
    headers: Vec<(String, Option<String>)>,
}

const FIXTURES: [&str; 2] = ["pedido-criado.json", "estoque-eventos.json"];

fn fixture(name: &str) -> Fixture {
    let path = format!(
        "{}/../../debezium/contract/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every case of every fixture; all of them use the same partition count.
fn cases() -> (i32, Vec<Case>) {
    let fixtures: Vec<Fixture> = FIXTURES.iter().map(|name| fixture(name)).collect();
    let partitions = fixtures[0].partitions;
    assert!(fixtures.iter().all(|f| f.partitions == partitions));
    (
        partitions,
        fixtures.into_iter().flat_map(|f| f.cases).collect(),
    )
}

#[test]
fn the_fixture_partitions_follow_the_java_partitioner() {
    let (partitions, cases) = cases();
    for case in &cases {
        assert_eq!(
            java_partition(case.record.key.as_bytes(), partitions),
            case.record.partition,
            "{}",
            case.name
        );
    }
}

#[tokio::test]
async fn the_relay_publishes_exactly_the_record_debezium_emits() {
    publishes_exactly_what_debezium_emits(Mode::Poll).await;
}

#[tokio::test]
async fn the_relay_in_cdc_mode_publishes_exactly_the_record_debezium_emits() {
    publishes_exactly_what_debezium_emits(Mode::Cdc).await;
}

async fn publishes_exactly_what_debezium_emits(mode: Mode) {
    let (partitions, cases) = cases();
    // The fixtures route to pedido.eventos and estoque.eventos: a broker of
    // the test's own keeps these records out of the shared one.
    let broker = PrivateBroker::start().await;
    let mut topics: Vec<&str> = cases.iter().map(|c| c.record.topic.as_str()).collect();
    topics.sort_unstable();
    topics.dedup();
    for topic in &topics {
        create_topic(&broker.address, topic, partitions).await;
    }
    let test = RelayTest::in_mode(mode, &broker.address).await;
    let relay = test.start_relay(&["--topics", &topics.join(",")]);
    if mode == Mode::Cdc {
        // Rows written once the slot streams, and deleted in their own
        // transaction: only the WAL carries them to the relay.
        relay
            .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
            .await;
    }
    let mut tx = test.pool.begin().await.unwrap();
    for case in &cases {
        sqlx::query(
            // The context column as the services write it beside
            // `traceparent` (Debezium reads it only with OpenTelemetry on).
            "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                                 tracingspancontext)
             values ($1, $2, $3, $4, $5::jsonb, $6, 'traceparent=' || $6 || E'\n')",
        )
        .bind(case.row.id)
        .bind(&case.row.aggregatetype)
        .bind(&case.row.aggregateid)
        .bind(&case.row.event_type)
        .bind(&case.row.payload)
        .bind(&case.row.traceparent)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    let ids: Vec<uuid::Uuid> = cases.iter().map(|case| case.row.id).collect();
    test.commit_inserts(tx, &ids).await;
    test.wait_until_drained(Duration::from_secs(60)).await;
    let mut records = Vec::new();
    for topic in &topics {
        records.extend(
            TopicReader::new(&test.bootstrap, topic)
                .read_all(Duration::from_secs(60))
                .await,
        );
    }

    for case in &cases {
        let id = case.row.id.to_string();
        let record = records
            .iter()
            .rev()
            .find(|r| r.header("id").as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{}: no record with id {id}", case.name));
        let expected = &case.record;
        assert_eq!(record.topic, expected.topic, "{}", case.name);
        assert_eq!(record.partition, expected.partition, "{}", case.name);
        assert_eq!(
            record.key.as_deref(),
            Some(expected.key.as_bytes()),
            "{}",
            case.name
        );
        assert_eq!(record.value_text(), expected.value, "{}", case.name);
        let headers: Vec<(String, Option<String>)> = record
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_ref().map(|v| String::from_utf8(v.clone()).unwrap()),
                )
            })
            .collect();
        assert_eq!(headers, expected.headers, "{}", case.name);
    }
    println!(
        "contract test ({mode:?} mode): {} cases byte-identical to the Debezium fixtures",
        cases.len()
    );
    relay.service.terminate(Duration::from_secs(30)).await;
}
