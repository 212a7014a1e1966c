//! Records no well-behaved producer sends: whatever the bytes, each ends in
//! an outcome, the service stays up and the partition moves on.

use std::time::Duration;

use test_support::raw::{self, RawRecord};
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};

/// The documented bound of `kafka_dlt-exception-message`, in bytes.
const MAX_EXCEPTION_MESSAGE: usize = 1024;

#[tokio::test]
async fn a_header_name_that_is_not_utf8_is_dead_lettered_and_the_next_record_is_applied() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let mut service = test.start(&[], &[]).await;
    // A valid PedidoCriado in every other respect.
    let hostile_order = Uuid::now_v7();
    let hostile = Outgoing::order(hostile_order, &[("ABC-1", 1)]);
    let id = hostile.message_id().unwrap().to_owned();
    let (key, value) = (hostile_order.to_string(), hostile.value.clone().unwrap());
    let (bootstrap, topic) = (test.bootstrap.clone(), test.topic.clone());
    let id_header = id.clone();
    let (partition, offset) = tokio::task::spawn_blocking(move || {
        raw::produce(
            &bootstrap,
            &topic,
            &RawRecord {
                partition: 2,
                key: key.as_bytes(),
                value: value.as_bytes(),
                headers: vec![
                    (b"id", Some(id_header.as_bytes())),
                    (b"eventType", Some(b"PedidoCriado")),
                    (&[0xff], Some(b"not a name")),
                ],
            },
        )
    })
    .await
    .unwrap();
    let next = Uuid::now_v7();
    test.produce(&Outgoing::order(next, &[("ABC-1", 1)]).on_partition(2))
        .await;

    assert_eq!(test.wait_for_reservation(next).await.0, "RESERVED");
    let dead = test.dlt_records(1).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].partition, partition);
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("invalid-header")
    );
    assert_eq!(dead[0].header("id"), Some(id));
    assert_eq!(
        dead[0]
            .headers
            .iter()
            .find(|(name, _)| name == "kafka_dlt-original-offset")
            .and_then(|(_, value)| value.clone()),
        Some(offset.to_be_bytes().to_vec())
    );
    assert_eq!(test.reservation(hostile_order).await, None);
    assert!(service.service.is_running(), "the service crashed");
    assert_eq!(test.stock("ABC-1").await, (9, 1));
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn dead_letters_near_the_size_limit_reach_the_dlt_and_the_partition_moves_on() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&[], &[]).await;
    // ~900 KB: a sku that is not one, which the parser quotes in its error.
    let mut huge_sku = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
    huge_sku.value = Some(
        huge_sku
            .value
            .unwrap()
            .replace("ABC-1", &"X".repeat(900_000)),
    );
    // A 600 KB eventType, quoted in the error too.
    let mut huge_type = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
    huge_type.headers[1].1 = Some("T".repeat(600_000));
    // Invalid JSON just under the broker's 1 000 000 bytes: its dead letter,
    // with the DLT headers added, is over the limit.
    let mut at_the_limit = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
    at_the_limit.value = Some("{".repeat(999_500));
    let next = Uuid::now_v7();
    let records = [
        huge_sku.on_partition(4),
        huge_type.on_partition(4),
        at_the_limit.on_partition(4),
        Outgoing::order(next, &[("ABC-1", 1)]).on_partition(4),
    ];
    for record in &records {
        test.produce(record).await;
    }

    assert_eq!(test.wait_for_reservation(next).await.0, "RESERVED");
    let dead = test.dlt_records(3).await;
    let reasons: Vec<Option<String>> = dead.iter().map(|r| r.header("dlt-reason")).collect();
    assert_eq!(
        reasons,
        [
            Some("schema-violation".to_owned()),
            Some("unknown-event-type".to_owned()),
            Some("invalid-json".to_owned())
        ]
    );
    for (record, sent) in dead.iter().zip(&records) {
        assert_eq!(record.header("id").as_deref(), sent.message_id());
        let message = record.header("kafka_dlt-exception-message").unwrap();
        assert!(
            !message.is_empty() && message.len() <= MAX_EXCEPTION_MESSAGE,
            "an exception message of {} bytes",
            message.len()
        );
    }
    assert_eq!(dead[0].value_text(), records[0].value.clone().unwrap());
    assert_eq!(
        dead[1].header("eventType").map(|t| t.len()),
        Some(600_000),
        "the record's own headers are kept"
    );
    // Too large for the DLT whole: the value is left out, and says so.
    assert_eq!(dead[2].value, None);
    assert_eq!(
        dead[2].header("dlt-value-truncated").as_deref(),
        Some("999500")
    );
    assert_eq!(service.metric("consumer_dlt_total").await, 3.0);
    service.service.terminate(Duration::from_secs(30)).await;

    // A skeleton is not the message: redrive leaves it, says so, and keeps
    // its place so that it stays unredriven.
    let skeleton = format!("partition 4 offset {}: a skeleton", dead[2].offset);
    let redrive = test.tool_output(&["dlt", "redrive", "--rate", "100"]).await;
    assert_eq!(redrive.code, Some(0), "{redrive:?}");
    assert_eq!(redrive.stdout.matches("redrove").count(), 2, "{redrive:?}");
    assert!(redrive.stderr.contains(&skeleton), "{redrive:?}");
    let again = test.tool_output(&["dlt", "redrive", "--dry-run"]).await;
    assert!(again.stderr.contains(&skeleton), "{again:?}");
}
