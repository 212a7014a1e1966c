use std::time::{Duration, Instant};

use broker_proof::{
    Outgoing, commit_stored, create_topic, idempotent_producer, manual_commit_consumer, receive,
    send_all, unique_name, watermarks,
};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

const RECORDS: usize = 20_000;

/// A consumer that starts far behind must catch up, not stall: one storage
/// engine was seen re-fetching the same large batch until its session timed
/// out. The rate is printed for the record; speed is judged by benchmarks,
/// the test only fails if catch-up does not finish.
#[tokio::test]
async fn consumer_catches_up_on_twenty_thousand_records_of_one_partition() {
    let topic = unique_name("proof-catch-up");
    create_topic(&topic, 1).await;
    let producer = idempotent_producer();
    // A realistic event: an order with a few items, about 200 bytes.
    let value = r#"{"pedidoId":"0190f5d2-7c1e-7000-8000-000000000000","clienteId":"c-42","itens":[{"sku":"ABC-1","quantidade":2},{"sku":"XYZ-9","quantidade":1}],"criadoEm":"2026-12-02T15:00:00Z"}"#;
    let outgoing: Vec<Outgoing> = (0..RECORDS)
        .map(|n| Outgoing::keyed(format!("order-{n}"), value).to_partition(0))
        .collect();
    send_all(&producer, &topic, &outgoing).await;

    let consumer = manual_commit_consumer(&unique_name("proof-group"));
    assert_eq!(watermarks(&consumer, &topic, 0), (0, RECORDS as i64));
    // Assigned, not subscribed: the clock starts at the first fetch, not
    // after a group join, and every record read counts.
    let mut partition = TopicPartitionList::new();
    partition
        .add_partition_offset(&topic, 0, Offset::Beginning)
        .expect("a valid partition");
    let started = Instant::now();
    consumer.assign(&partition).expect("assigning");
    let received = receive(&consumer, RECORDS, Duration::from_secs(120)).await;
    commit_stored(&consumer);
    let elapsed = started.elapsed();

    let offsets = received.iter().map(|r| r.offset);
    assert!(
        offsets.eq(0..RECORDS as i64),
        "offsets are not 0..{RECORDS} in order"
    );
    println!(
        "catch-up: {RECORDS} records of one partition from offset 0, committed, in {:.2} s = {:.0} records/s",
        elapsed.as_secs_f64(),
        RECORDS as f64 / elapsed.as_secs_f64(),
    );
}
