use std::time::Duration;

use test_support::broker::PrivateBroker;
use test_support::eventually::eventually;
use test_support::kafka::TopicReader;
use test_support::terminal::{CONTROL, CONTROL_ESCAPED, assert_no_terminal_control};
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing, PARTITIONS, inventory_server};

#[tokio::test]
async fn dlt_list_and_show_describe_the_dead_letters() {
    let test = InventoryTest::new().await;
    let service = test.start(&[], &[]).await;
    let mut broken = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
    broken.value = Some("{oops".to_owned());
    let id = broken.message_id().unwrap().to_owned();
    test.produce(&broken.on_partition(3)).await;
    test.dlt_records(1).await;

    let (code, listed) = test
        .tool(&["dlt", "list", "--reason", "invalid-json"])
        .await;
    assert_eq!(code, Some(0));
    assert!(
        listed.contains(&id) && listed.contains("invalid-json"),
        "{listed}"
    );
    let (_, other_reason) = test
        .tool(&["dlt", "list", "--reason", "schema-violation"])
        .await;
    assert!(!other_reason.contains(&id), "{other_reason}");

    let (code, shown) = test
        .tool(&["dlt", "show", "--partition", "3", "--offset", "0"])
        .await;
    assert_eq!(code, Some(0));
    for expected in [
        "kafka_dlt-original-partition: 3".to_owned(),
        "kafka_dlt-original-offset: 0".to_owned(),
        format!("kafka_dlt-original-topic: {}", test.topic),
        "dlt-reason: invalid-json".to_owned(),
        "dlt-attempts: 1".to_owned(),
        "traceparent: (null)".to_owned(),
        "value:     {oops".to_owned(),
    ] {
        assert!(shown.contains(&expected), "no {expected:?} in:\n{shown}");
    }
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_redriven_record_whose_cause_was_fixed_is_processed_once_and_a_second_redrive_is_a_duplicate()
 {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test
        .start(&["--statement-timeout", "200ms", "--retries", "1"], &[])
        .await;
    // The cause: a lock that makes every attempt time out.
    let mut lock = test.pool.begin().await.unwrap();
    sqlx::query("select * from stock for update")
        .execute(&mut *lock)
        .await
        .unwrap();
    let order = Uuid::now_v7();
    test.produce(&Outgoing::order(order, &[("ABC-1", 3)])).await;
    let dead = test.dlt_records(1).await;
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("retries-exhausted")
    );
    lock.rollback().await.unwrap();

    let (code, dry) = test.tool(&["dlt", "redrive", "--dry-run"]).await;
    assert_eq!(code, Some(0), "{dry}");
    assert_eq!(
        test.reservation(order).await,
        None,
        "a dry run publishes nothing"
    );

    // With no audit it can write, a redrive publishes nothing.
    let hide = |from: &'static str, to: &'static str| {
        let pool = test.pool.clone();
        async move {
            sqlx::query(&format!("alter table {from} rename to {to}"))
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    hide("dlt_redrive", "dlt_redrive_hidden").await;
    let refused = test.tool_output(&["dlt", "redrive", "--rate", "100"]).await;
    hide("dlt_redrive_hidden", "dlt_redrive").await;
    assert_ne!(refused.code, Some(0));
    assert!(
        refused
            .stderr
            .contains("cannot be written: nothing was redriven"),
        "{}",
        refused.stderr
    );
    let source = TopicReader::new(&test.bootstrap, &test.topic)
        .read_all(Duration::from_secs(30))
        .await;
    assert_eq!(source.len(), 1, "only the original record: {source:?}");

    let (code, _) = test
        .tool(&["dlt", "redrive", "--rate", "100", "--operator", "ana"])
        .await;
    assert_eq!(code, Some(0));
    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    let audited: (String, String, i64) =
        sqlx::query_as("select operator, via, to_offset from dlt_redrive where message_id = $1")
            .bind(dead[0].header("id").unwrap().parse::<Uuid>().unwrap())
            .fetch_one(&test.pool)
            .await
            .unwrap();
    assert_eq!(audited, ("ana".to_owned(), "cli".to_owned(), 1));
    assert_eq!(test.stock("ABC-1").await, (7, 3));
    let (_, again) = test.tool(&["dlt", "redrive", "--dry-run"]).await;
    assert!(
        !again.contains("would redrive"),
        "the group offset marks it redriven: {again}"
    );

    // Redriving it on purpose once more: a duplicate, no effect.
    let partition = dead[0].partition.to_string();
    let offset = dead[0].offset.to_string();
    let (code, _) = test
        .tool(&[
            "dlt",
            "redrive",
            "--partition",
            &partition,
            "--offset",
            &offset,
            "--redrive-group",
            "estoque.redrive.again",
        ])
        .await;
    assert_eq!(code, Some(0));
    eventually(
        "the second redrive is absorbed",
        Duration::from_secs(60),
        || async { (service.metric("consumer_duplicates_total").await >= 1.0).then_some(()) },
    )
    .await;
    assert_eq!(test.stock("ABC-1").await, (7, 3));
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn retention_refuses_an_unsafe_window_and_deletes_old_rows_in_batches() {
    let test = InventoryTest::new().await;
    test_support::dedupe::aged_rows(&test.pool, "estoque.reserva", 12_000, 30).await;
    test_support::dedupe::aged_rows(&test.pool, "estoque.reserva", 1, 0).await;

    let (code, _) = test.tool(&["retention", "--retention", "1d"]).await;
    assert_ne!(
        code,
        Some(0),
        "one day is shorter than topic retention plus the redrive window"
    );
    assert_eq!(
        test.count("select count(*) from mensagem_processada").await,
        12_001
    );

    let (code, out) = test.tool(&["retention"]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("deleted 12000"), "{out}");
    assert_eq!(
        test.count("select count(*) from mensagem_processada").await,
        1
    );

    let (code, _) = test
        .tool(&["retention", "--retention", "1h", "--force-retention"])
        .await;
    assert_eq!(code, Some(0));
}

/// Retention deleted the first DLT record of a partition: the tools start
/// at the low watermark, show and redrive what is left, and say what expired.
#[tokio::test]
async fn dlt_tools_start_at_the_low_watermark_and_report_expired_records() {
    let broker = PrivateBroker::start().await;
    let test = InventoryTest::on(broker.address.clone(), &inventory_server(), PARTITIONS).await;
    let service = test.start(&[], &[]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let mut broken = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
        broken.value = Some("{oops".to_owned());
        ids.push(broken.message_id().unwrap().to_owned());
        test.produce(&broken.on_partition(0)).await;
    }
    test.dlt_records(3).await;
    service.service.terminate(Duration::from_secs(30)).await;

    broker.expire_records_before(&test.dlt, 0, 1).await;

    let listed = test.tool_output(&["dlt", "list"]).await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    assert!(!listed.stdout.contains(&ids[0]), "{listed:?}");
    assert!(
        listed.stdout.contains(&ids[1]) && listed.stdout.contains(&ids[2]),
        "{listed:?}"
    );
    assert!(
        listed
            .stderr
            .contains("partition 0: 1 record(s) before offset 1 expired"),
        "{listed:?}"
    );
    let dry = test.tool_output(&["dlt", "redrive", "--dry-run"]).await;
    assert_eq!(dry.code, Some(0), "{dry:?}");
    assert_eq!(dry.stdout.matches("would redrive").count(), 2, "{dry:?}");
    assert!(
        dry.stderr
            .contains("partition 0: 1 record(s) before offset 1 expired"),
        "{dry:?}"
    );
    let redrive = test.tool_output(&["dlt", "redrive", "--rate", "100"]).await;
    assert_eq!(redrive.code, Some(0), "{redrive:?}");
    assert!(
        redrive.stderr.contains("redrove 2 record(s)"),
        "{redrive:?}"
    );
    assert!(
        redrive
            .stderr
            .contains("partition 0: 1 record(s) before offset 1 expired"),
        "{redrive:?}"
    );
    let redriven = test
        .dlt_reader()
        .read_available(Duration::from_secs(1))
        .await;
    assert_eq!(redriven.len(), 2, "the DLT itself is unchanged");
    let topic = TopicReader::new(&test.bootstrap, &test.topic)
        .read_at_least(5, Duration::from_secs(30))
        .await;
    let copies: Vec<Option<String>> = topic
        .iter()
        .filter(|r| r.header("dlt-redriven-from").is_some())
        .map(|r| r.header("id"))
        .collect();
    assert_eq!(copies, [Some(ids[1].clone()), Some(ids[2].clone())]);
}

#[tokio::test]
async fn dlt_list_and_show_print_a_records_control_characters_escaped() {
    let test = InventoryTest::new().await;
    let service = test.start(&[], &[]).await;
    let mut hostile = Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]);
    hostile.key = Some(format!("key{CONTROL}"));
    hostile.value = Some(format!("{{value{CONTROL}"));
    hostile
        .headers
        .push(("note", Some(format!("header{CONTROL}"))));
    test.produce(&hostile.on_partition(1)).await;
    let dead = test.dlt_records(1).await;
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("invalid-json")
    );
    let offset = dead[0].offset.to_string();

    let listed = test.tool_output(&["dlt", "list"]).await;
    let shown = test
        .tool_output(&["dlt", "show", "--partition", "1", "--offset", &offset])
        .await;
    for output in [&shown, &listed] {
        assert_eq!(output.code, Some(0), "{output:?}");
        assert_no_terminal_control(&format!("{}{}", output.stdout, output.stderr));
    }
    assert!(
        listed.stdout.contains(&format!("key{CONTROL_ESCAPED}")),
        "{listed:?}"
    );
    for expected in [
        format!("key:       key{CONTROL_ESCAPED}"),
        format!("value:     {{value{CONTROL_ESCAPED}"),
        format!("note: header{CONTROL_ESCAPED}"),
    ] {
        assert!(
            shown.stdout.contains(&expected),
            "no {expected:?} in:\n{}",
            shown.stdout
        );
    }
    service.service.terminate(Duration::from_secs(30)).await;
}
