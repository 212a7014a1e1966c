use std::time::{Duration, Instant};

use test_support::eventually::eventually;
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};

fn be_i32(bytes: &[u8]) -> i32 {
    i32::from_be_bytes(bytes.try_into().unwrap())
}

fn be_i64(bytes: &[u8]) -> i64 {
    i64::from_be_bytes(bytes.try_into().unwrap())
}

fn header_bytes(record: &test_support::kafka::Record, name: &str) -> Vec<u8> {
    record
        .headers
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no header {name}"))
}

#[tokio::test]
async fn each_deterministic_failure_goes_to_the_dlt_at_once_and_the_partition_moves_on() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&[], &[]).await;
    let order = Uuid::now_v7();
    let valid = Outgoing::order(order, &[("ABC-1", 1)]);
    let mut poison = Vec::new();
    let mut invalid_json = valid.clone();
    invalid_json.value = Some("{not json".to_owned());
    poison.push(("invalid-json", invalid_json));
    let mut missing_id = valid.clone();
    missing_id.headers.retain(|(k, _)| *k != "id");
    poison.push(("missing-header", missing_id));
    let mut invalid_id = valid.clone();
    invalid_id.headers[0].1 = Some("not-a-uuid".to_owned());
    poison.push(("invalid-header", invalid_id));
    let mut unknown_type = Outgoing::order(order, &[("ABC-1", 1)]);
    unknown_type.headers[1].1 = Some("PedidoDevolvido".to_owned());
    poison.push(("unknown-event-type", unknown_type));
    let mut schema = Outgoing::order(order, &[("ABC-1", 0)]);
    schema.key = Some(order.to_string());
    poison.push(("schema-violation", schema));

    let started = Instant::now();
    let mut sources = Vec::new();
    for (_, record) in &poison {
        sources.push(test.produce(&record.clone().on_partition(2)).await);
    }
    test.produce(&valid.clone().on_partition(2)).await;

    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    let dead = test.dlt_records(poison.len()).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "no retries for deterministic failures"
    );
    assert_eq!(dead.len(), poison.len());
    for ((reason, sent), ((partition, offset), record)) in
        poison.iter().zip(sources.iter().zip(&dead))
    {
        assert_eq!(record.partition, 2, "{reason}: same partition");
        assert_eq!(record.header("dlt-reason").as_deref(), Some(*reason));
        assert_eq!(record.header("dlt-attempts").as_deref(), Some("1"));
        assert_eq!(
            record.header("kafka_dlt-original-topic"),
            Some(test.topic.clone())
        );
        assert_eq!(
            be_i32(&header_bytes(record, "kafka_dlt-original-partition")),
            *partition
        );
        assert_eq!(
            be_i64(&header_bytes(record, "kafka_dlt-original-offset")),
            *offset
        );
        assert_eq!(
            record.header("kafka_dlt-original-consumer-group"),
            Some(test.group.clone())
        );
        assert!(
            record
                .header("kafka_dlt-exception-message")
                .is_some_and(|m| !m.is_empty())
        );
        assert!(record.header("kafka_dlt-exception-fqcn").is_some());
        assert_eq!(
            record.value_text(),
            sent.value.clone().unwrap_or_default(),
            "{reason}: value bytes kept"
        );
        assert_eq!(record.key_text(), sent.key.clone().unwrap_or_default());
        assert_eq!(
            record.header("id").as_deref(),
            sent.message_id(),
            "{reason}: original headers kept"
        );
    }
    assert_eq!(test.stock("ABC-1").await, (9, 1));
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_transient_failure_is_retried_three_times_a_second_apart_then_dead_lettered() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&["--statement-timeout", "200ms"], &[]).await;
    let lock = test.lock_stock("ABC-1").await;
    let order = Uuid::now_v7();
    let stuck = Outgoing::order(order, &[("ABC-1", 1)]).on_partition(1);
    let next_order = Uuid::now_v7();

    let started = Instant::now();
    test.produce(&stuck).await;
    test.produce(&Outgoing::order(next_order, &[("OTHER-1", 1)]).on_partition(1))
        .await;
    let dead = test.dlt_records(1).await;
    let elapsed = started.elapsed();

    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("retries-exhausted")
    );
    assert_eq!(dead[0].header("dlt-attempts").as_deref(), Some("4"));
    assert_eq!(dead[0].header("id").as_deref(), stuck.message_id());
    assert!(
        elapsed >= Duration::from_secs(3),
        "4 attempts 1 s apart took only {elapsed:?}"
    );
    assert!(service.metric("consumer_retries_total").await >= 3.0);
    // Key order: the next record of the partition waited, then went on.
    assert_eq!(test.wait_for_reservation(next_order).await.0, "REJECTED");
    assert_eq!(test.reservation(order).await, None);
    drop(lock);
    assert_eq!(
        test.count("select count(*) from mensagem_processada").await,
        1
    );
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_transient_failure_that_heals_within_the_retries_is_processed_once() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&["--statement-timeout", "200ms"], &[]).await;
    let lock = test.lock_stock("ABC-1").await;
    let order = Uuid::now_v7();

    test.produce(&Outgoing::order(order, &[("ABC-1", 4)])).await;
    eventually("a retry happened", Duration::from_secs(30), || async {
        (service.metric("consumer_retries_total").await >= 1.0).then_some(())
    })
    .await;
    lock.rollback().await.unwrap();

    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    assert_eq!(test.stock("ABC-1").await, (6, 4));
    assert_eq!(service.metric("consumer_dlt_total").await, 0.0);
    service.service.terminate(Duration::from_secs(30)).await;
}

/// Sessions of the test database other than the asking one, terminated.
async fn terminate_other_sessions(test: &InventoryTest) -> i64 {
    sqlx::query_scalar(
        "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()) terminated",
    )
    .fetch_one(&test.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn after_every_pooled_connection_was_terminated_a_record_is_processed_not_dead_lettered() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 100).await;
    let service = test.start(&[], &[]).await;
    // One blocked transaction per partition fills the service's pool with
    // as many connections, idle once the lock goes.
    let lock = test.lock_stock("ABC-1").await;
    let mut warm_up = Vec::new();
    for partition in 0..6 {
        let order = Uuid::now_v7();
        test.produce(&Outgoing::order(order, &[("ABC-1", 1)]).on_partition(partition))
            .await;
        warm_up.push(order);
    }
    eventually("six transactions wait on the lock", Duration::from_secs(30), || async {
        let waiting = test
            .count("select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'")
            .await;
        (waiting >= 6).then_some(())
    })
    .await;
    lock.rollback().await.unwrap();
    for order in &warm_up {
        assert_eq!(test.wait_for_reservation(*order).await.0, "RESERVED");
    }

    let terminated = terminate_other_sessions(&test).await;
    assert!(terminated >= 6, "only {terminated} sessions to terminate");
    let order = Uuid::now_v7();
    test.produce(&Outgoing::order(order, &[("ABC-1", 1)]).on_partition(0))
        .await;

    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    assert_eq!(service.metric("consumer_dlt_total").await, 0.0);
    assert_eq!(test.stock("ABC-1").await, (93, 7));
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn the_dlq_circuit_stops_consumption_and_fails_readiness() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&[], &[]).await;
    assert_eq!(service.ready_status().await, Some(200));
    for _ in 0..25 {
        let mut broken = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
        broken.value = Some("not json".to_owned());
        test.produce(&broken.on_partition(0)).await;
    }

    eventually("readiness fails", Duration::from_secs(60), || async {
        (service.ready_status().await == Some(503)).then_some(())
    })
    .await;
    let late = Uuid::now_v7();
    test.produce(&Outgoing::order(late, &[("ABC-1", 1)]).on_partition(0))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(test.reservation(late).await, None, "consumption stopped");
    assert_eq!(service.metric("consumer_dlq_circuit_open").await, 1.0);
    let dead = service.metric("consumer_dlt_total").await;
    assert!(
        (20.0..=25.0).contains(&dead),
        "{dead} records dead-lettered before the circuit opened"
    );
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_dlt_with_fewer_partitions_than_its_source_is_refused() {
    let test = InventoryTest::with_dlt_partitions(3).await;

    let service = test.start_unready(&[], &[]);

    assert_ne!(service.service.wait(Duration::from_secs(30)).await, Some(0));
}

/// Once the circuit is open, no offset may be stored past a record that was
/// not finished: a restart must find the valid record the circuit stopped.
#[tokio::test]
async fn after_the_circuit_opens_a_restart_applies_the_valid_record_it_left_behind() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let one_at_a_time = ["--batch-size", "1"];
    let service = test.start(&one_at_a_time, &[]).await;
    let invalid = || {
        let mut broken = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
        broken.value = Some("not json".to_owned());
        broken.on_partition(0)
    };
    let valid = Uuid::now_v7();
    let mut records: Vec<Outgoing> = (0..20).map(|_| invalid()).collect();
    records.push(Outgoing::order(valid, &[("ABC-1", 1)]).on_partition(0));
    records.push(invalid());
    test.produce_all(&records).await;

    eventually("readiness fails", Duration::from_secs(60), || async {
        (service.ready_status().await == Some(503)).then_some(())
    })
    .await;
    assert_eq!(test.reservation(valid).await, None, "consumption stopped");
    assert_eq!(
        service.service.terminate(Duration::from_secs(30)).await,
        Some(0)
    );
    let restarted = test.start(&one_at_a_time, &[]).await;

    assert_eq!(test.wait_for_reservation(valid).await.0, "RESERVED");
    // The last invalid record is dead-lettered once, after the valid one.
    let dead = test.dlt_records(21).await;
    assert_eq!(dead.len(), 21);
    assert_eq!(dead[20].header("id").as_deref(), records[21].message_id());
    assert_eq!(test.stock("ABC-1").await, (9, 1));
    restarted.service.terminate(Duration::from_secs(30)).await;
}
