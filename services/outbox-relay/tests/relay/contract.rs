//! The built-in relay produces exactly the records Debezium would: the
//! fixture in debezium/contract/ states them, with how each part was derived.

use std::time::Duration;

use serde::Deserialize;
use test_support::broker::PrivateBroker;
use test_support::kafka::{TopicReader, create_topic, java_partition};

use crate::helpers::RelayTest;

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

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../debezium/contract/pedido-criado.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_fixture_partitions_follow_the_java_partitioner() {
    let fixture = fixture();
    for case in &fixture.cases {
        assert_eq!(
            java_partition(case.record.key.as_bytes(), fixture.partitions),
            case.record.partition,
            "{}",
            case.name
        );
    }
}

#[tokio::test]
async fn the_relay_publishes_exactly_the_record_debezium_emits() {
    let fixture = fixture();
    // The fixture routes to pedido.eventos: a broker of the test's own keeps
    // these records out of the shared one.
    let broker = PrivateBroker::start().await;
    create_topic(&broker.address, "pedido.eventos", fixture.partitions).await;
    let test = RelayTest::with_broker(&broker.address).await;
    for case in &fixture.cases {
        sqlx::query(
            "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent)
             values ($1, $2, $3, $4, $5::jsonb, $6)",
        )
        .bind(case.row.id)
        .bind(&case.row.aggregatetype)
        .bind(&case.row.aggregateid)
        .bind(&case.row.event_type)
        .bind(&case.row.payload)
        .bind(&case.row.traceparent)
        .execute(&test.pool)
        .await
        .unwrap();
    }
    let reader = TopicReader::new(&test.bootstrap, "pedido.eventos");
    let relay = test.start_relay(&["--topics", "pedido.eventos"]);
    test.wait_until_drained(Duration::from_secs(60)).await;
    let records = reader.read_all(Duration::from_secs(60)).await;

    for case in &fixture.cases {
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
    relay.service.terminate(Duration::from_secs(30)).await;
}
