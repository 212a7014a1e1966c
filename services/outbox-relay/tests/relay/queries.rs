//! The relay's statements cost the same with ten million retained rows as
//! with none: none of them reads the whole outbox table.

use std::time::Duration;

use outbox_relay::store::{self, AfterPublish, Delivery, DeliveryLog};
use sqlx::postgres::PgPoolOptions;

use crate::helpers::RelayTest;

async fn outbox_seq_scans(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("select seq_scan from pg_stat_user_tables where relname = 'outbox'")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_read_skips_rows_in_flight_and_the_later_rows_of_their_aggregates() {
    let test = RelayTest::new().await;
    test.insert_events(3, 2).await;
    let mut conn = test.pool.acquire().await.unwrap();
    let ids = |rows: &[outbox_relay::record::OutboxRow]| -> Vec<uuid::Uuid> {
        rows.iter().map(|row| row.id).collect()
    };

    let heads = store::fetch_pending(&mut conn, 100, &[]).await.unwrap();
    assert_eq!(heads.len(), 3);
    // The first aggregate's head is in flight: its second row must wait.
    let rest = store::fetch_pending(&mut conn, 100, &[heads[0].id])
        .await
        .unwrap();
    assert_eq!(ids(&rest), ids(&heads[1..]));
    let none = store::fetch_pending(&mut conn, 100, &ids(&heads))
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn no_relay_statement_scans_the_whole_outbox() {
    let test = RelayTest::new().await;
    let ids = test.insert_events(3, 2).await;
    // A table this small is scanned whatever its indexes; with sequential
    // scans priced out, the planner still scans only where no index serves.
    sqlx::query(&format!(
        "alter database \"{}\" set enable_seqscan = off",
        test.database.name
    ))
    .execute(&test.pool)
    .await
    .unwrap();
    let before = outbox_seq_scans(&test.pool).await;

    // One connection, so that one backend's statistics tell the whole story.
    let relay = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(test.database.options.clone())
        .await
        .unwrap();
    {
        let mut conn = relay.acquire().await.unwrap();
        // One row per aggregate: the earliest of each.
        let pending = store::fetch_pending(&mut conn, 100, &[]).await.unwrap();
        assert_eq!(pending.len(), 3);
        let delivery = |i: usize| Delivery {
            id: ids[i],
            topic: "pedido.eventos".to_owned(),
            partition: Some(3),
            offset: Some(100 + i64::try_from(i).unwrap()),
        };
        store::mark_published(
            &mut conn,
            &[delivery(0), delivery(1)],
            AfterPublish::Retain,
            DeliveryLog::On,
        )
        .await
        .unwrap();
        store::mark_published(
            &mut conn,
            &[delivery(2)],
            AfterPublish::Delete,
            DeliveryLog::On,
        )
        .await
        .unwrap();
        store::record_poison(&mut conn, &[(ids[3], "too large".to_owned())], 1)
            .await
            .unwrap();
        store::record_transient(
            &mut conn,
            &[(ids[4], "broker down".to_owned())],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    }
    let backlog = store::backlog(&relay).await.unwrap();
    assert_eq!((backlog.pending, backlog.parked, backlog.held), (2, 1, 0));
    store::purge_published(&relay, Duration::from_secs(3600), 100)
        .await
        .unwrap();
    store::purge_deliveries(&relay, Duration::from_secs(3600), 100)
        .await
        .unwrap();
    // Both marks logged where each row went, retained or deleted.
    let logged: Vec<(uuid::Uuid, i32, i64)> =
        sqlx::query_as("select id, partition, \"offset\" from outbox_delivery order by \"offset\"")
            .fetch_all(&test.pool)
            .await
            .unwrap();
    assert_eq!(
        logged,
        [(ids[0], 3, 100), (ids[1], 3, 101), (ids[2], 3, 102)]
    );
    // Statistics reach shared memory when the backend goes idle; make the
    // next idle moment flush them, then pass through one.
    sqlx::query("select pg_stat_force_next_flush()")
        .execute(&relay)
        .await
        .unwrap();
    sqlx::query("select 1").execute(&relay).await.unwrap();

    assert_eq!(
        outbox_seq_scans(&test.pool).await,
        before,
        "a relay statement read the whole outbox table"
    );
}

/// Rows read from the outbox table by scans of any kind, so far.
async fn outbox_rows_scanned(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "select coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
         from pg_stat_user_tables where relname = 'outbox'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A broken topic's backlog: 20 000 rows stepped aside, waiting out a
/// broker fault, and a few fresh rows behind them. A read must cost what
/// it returns, not what waits: before, both halves of the read walked
/// every pending row (the deferred ones fail its filters one by one), so
/// every poll got slower as the backlog grew, until reads outlasted the
/// lease's send window (issue 34, item 4).
#[tokio::test]
async fn a_read_does_not_walk_the_rows_waiting_out_a_broker_fault() {
    let test = RelayTest::new().await;
    sqlx::query(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, deferrals,
                             next_attempt_at, last_error)
         select gen_random_uuid(), 'broken', 'b-' || i, 'TestEvent', '{}', 3,
                now() + interval '1 hour', 'UnknownTopicOrPartition'
         from generate_series(1, 20000) as i",
    )
    .execute(&test.pool)
    .await
    .unwrap();
    let fresh = test.insert_events(5, 1).await;
    sqlx::query("analyze outbox")
        .execute(&test.pool)
        .await
        .unwrap();

    let relay = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(test.database.options.clone())
        .await
        .unwrap();
    let flush = async || {
        sqlx::query("select pg_stat_force_next_flush()")
            .execute(&relay)
            .await
            .unwrap();
        sqlx::query("select 1").execute(&relay).await.unwrap();
    };
    flush().await;
    let before = outbox_rows_scanned(&test.pool).await;
    let pending = {
        let mut conn = relay.acquire().await.unwrap();
        store::fetch_pending(&mut conn, 100, &[]).await.unwrap()
    };
    flush().await;
    let scanned = outbox_rows_scanned(&test.pool).await - before;

    let mut read: Vec<uuid::Uuid> = pending.iter().map(|row| row.id).collect();
    read.sort();
    let mut expected = fresh.clone();
    expected.sort();
    assert_eq!(read, expected, "the fresh rows, none that waits");
    assert!(
        scanned < 1_000,
        "one read scanned {scanned} outbox rows to return {}: it walks the waiting backlog",
        pending.len()
    );
}
