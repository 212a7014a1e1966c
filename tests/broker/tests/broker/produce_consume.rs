use std::time::Duration;

use broker_proof::{
    Outgoing, commit_stored, create_topic, idempotent_producer, manual_commit_consumer, receive,
    send_all, unique_name, watermarks,
};
use rdkafka::consumer::Consumer;

#[tokio::test]
async fn keyed_records_round_trip_with_their_headers_in_key_order() {
    let topic = unique_name("proof-keyed");
    create_topic(&topic, 6).await;
    let producer = idempotent_producer();
    // Three keys, four events each, interleaved as an outbox would emit them.
    let outgoing: Vec<Outgoing> = (0..4)
        .flat_map(|seq| {
            ["order-a", "order-b", "order-c"]
                .map(|key| Outgoing::keyed(key, format!("{{\"key\":\"{key}\",\"seq\":{seq}}}")))
        })
        .collect();

    let delivered = send_all(&producer, &topic, &outgoing).await;

    // A key always lands on one partition.
    for key in ["order-a", "order-b", "order-c"] {
        let partitions: std::collections::HashSet<i32> = outgoing
            .iter()
            .zip(&delivered)
            .filter(|(record, _)| record.key == key)
            .map(|(_, (partition, _))| *partition)
            .collect();
        assert_eq!(partitions.len(), 1, "{key} spread over {partitions:?}");
    }

    let consumer = manual_commit_consumer(&unique_name("proof-group"));
    consumer.subscribe(&[&topic]).expect("subscribing");
    let received = receive(&consumer, outgoing.len(), Duration::from_secs(60)).await;
    commit_stored(&consumer);

    for record in &outgoing {
        let got = received
            .iter()
            .find(|r| r.header("id") == Some(record.id.as_str()))
            .unwrap_or_else(|| panic!("record {} was not received", record.id));
        assert_eq!(got.key, record.key);
        assert_eq!(got.value, record.value);
        assert_eq!(got.header("eventType"), Some("PedidoCriado"));
    }
    // Per key, records arrive in the order they were sent.
    for key in ["order-a", "order-b", "order-c"] {
        let sent: Vec<&str> = outgoing
            .iter()
            .filter(|r| r.key == key)
            .map(|r| r.id.as_str())
            .collect();
        let got: Vec<&str> = received
            .iter()
            .filter(|r| r.key == key)
            .filter_map(|r| r.header("id"))
            .collect();
        assert_eq!(got, sent, "order of {key}");
    }
}

#[tokio::test]
async fn record_sent_to_a_chosen_partition_lands_there_and_moves_its_high_watermark() {
    let topic = unique_name("proof-partition");
    create_topic(&topic, 6).await;
    let producer = idempotent_producer();
    let outgoing = vec![
        Outgoing::keyed("k1", "\"first\"").to_partition(4),
        Outgoing::keyed("k2", "\"second\"").to_partition(4),
        Outgoing::keyed("k3", "\"third\"").to_partition(1),
    ];

    let delivered = send_all(&producer, &topic, &outgoing).await;

    assert_eq!(delivered, vec![(4, 0), (4, 1), (1, 0)]);
    let consumer = manual_commit_consumer(&unique_name("proof-group"));
    assert_eq!(watermarks(&consumer, &topic, 4), (0, 2));
    assert_eq!(watermarks(&consumer, &topic, 1), (0, 1));
    assert_eq!(watermarks(&consumer, &topic, 0), (0, 0));
}
