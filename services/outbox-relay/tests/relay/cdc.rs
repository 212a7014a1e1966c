//! CDC mode (`--mode cdc`). The decoding against what PostgreSQL really
//! sends: the outbox table, a publication and a pgoutput slot on a cluster
//! of the test's own (`wal_level=logical`), the slot's changes read back
//! with `pg_logical_slot_get_binary_changes` — the same bytes a replication
//! connection streams — and each row compared with poll mode's read of it.
//! Then the relay binary in CDC mode: takeover, a PostgreSQL crash, an idle
//! outbox beside busy tables, an invalidated slot, delete-in-transaction,
//! set-up errors. The contract, kill and broker tests run in both modes
//! (contract.rs, crashes.rs).

use std::time::Duration;

use nix::sys::signal::Signal;
use outbox_relay::cdc::pgoutput::{self, Message, Relations};
use outbox_relay::cdc::row::outbox_row;
use outbox_relay::record::topic_for;
use outbox_relay::store;
use sqlx::{Connection, PgConnection, PgPool};
use test_support::eventually::eventually;
use test_support::kafka::bootstrap_servers;
use test_support::postgres::PrivatePostgres;
use uuid::Uuid;

use crate::helpers::{Mode, RelayTest};

#[tokio::test]
async fn rows_from_the_wal_are_the_rows_poll_mode_reads_and_make_the_same_records() {
    let cluster = PrivatePostgres::start().await;
    let mut db = PgConnection::connect(&cluster.url("postgres"))
        .await
        .unwrap();
    outbox::migrator().run(&mut db).await.unwrap();
    sqlx::query("create publication cdc_test for table outbox with (publish = 'insert')")
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("select pg_create_logical_replication_slot('cdc_test', 'pgoutput')")
        .execute(&mut db)
        .await
        .unwrap();

    // Two transactions; payloads with what jsonb rewrites (spacing, key
    // order, escapes, non-ASCII), one row without a trace context.
    let insert = "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                                      tracingspancontext)
                  values (gen_random_uuid(), $1, $2, $3, $4::jsonb, $5,
                          'traceparent=' || $5 || E'\\ntracestate=congo=t61rcWkgMzE\\n')";
    let mut tx = db.begin().await.unwrap();
    for (aggregate, payload, trace) in [
        (
            "o-1",
            r#"{"pedidoId":"o-1","itens":[{"sku":"ABC-1","quantidade":2}]}"#,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ),
        (
            "o-2",
            r#"{"clienteId": "cliente é \"7\"\n", "z": 1, "a": [1, 2]}"#,
            None,
        ),
    ] {
        sqlx::query(insert)
            .bind("pedido")
            .bind(aggregate)
            .bind("PedidoCriado")
            .bind(payload)
            .bind(trace)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    sqlx::query(insert)
        .bind("estoque")
        .bind("o-1")
        .bind("EstoqueReservado")
        .bind(r#"{"pedidoId": "o-1", "motivo": "\u00e9"}"#)
        .bind(None::<String>)
        .execute(&mut db)
        .await
        .unwrap();
    // Another table's writes are not in the publication.
    for statement in ["create table other (n int)", "insert into other values (1)"] {
        sqlx::query(statement).execute(&mut db).await.unwrap();
    }

    let changes: Vec<Vec<u8>> = sqlx::query_scalar(
        "select data from pg_logical_slot_get_binary_changes('cdc_test', null, null,
             'proto_version', '1', 'publication_names', 'cdc_test')",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    let mut relations = Relations::default();
    let mut tags = String::new();
    let mut from_wal = Vec::new();
    for change in &changes {
        match pgoutput::decode(change).unwrap() {
            Message::Relation(relation) => {
                tags.push('R');
                relations.learn(relation);
            }
            Message::Insert { relation, tuple } => {
                tags.push('I');
                let (table, row) = relations.named(relation, tuple).unwrap();
                assert_eq!(table, "public.outbox");
                from_wal.push(outbox_row(row).unwrap());
            }
            Message::Other(tag) => tags.push(char::from(tag)),
        }
    }
    assert_eq!(
        tags, "BRIICBIC",
        "Begin, Relation, rows, Commit per transaction"
    );

    let polled = store::fetch_pending(&mut db, 100, &[]).await.unwrap();
    assert_eq!(from_wal.len(), 3);
    assert_eq!(from_wal, polled, "the same rows, in the same order");
    for (wal, poll) in from_wal.iter().zip(&polled) {
        let (wal_topic, poll_topic) = (
            topic_for(&wal.aggregatetype),
            topic_for(&poll.aggregatetype),
        );
        let (wal_trace, poll_trace) = (wal.stored_trace(), poll.stored_trace());
        assert_eq!(
            wal.to_record(&wal_topic.unwrap(), wal_trace.as_ref()),
            poll.to_record(&poll_topic.unwrap(), poll_trace.as_ref())
        );
    }
}

/// Inserts `transactions` transactions of `rows` rows each (one aggregate
/// per row position, so every aggregate has one event per transaction).
async fn insert_transactions(test: &RelayTest, transactions: usize, rows: usize) -> Vec<Uuid> {
    let mut inserted = Vec::with_capacity(transactions * rows);
    for _ in 0..transactions {
        inserted.extend(test.insert_events(rows, 1).await);
    }
    inserted
}

/// Writes about `megabytes` MB of WAL on a table outside the publication.
async fn write_other_wal(pool: &PgPool, megabytes: usize) {
    sqlx::query("create table if not exists other (n int, filler text)")
        .execute(pool)
        .await
        .unwrap();
    for _ in 0..megabytes {
        sqlx::query("insert into other select g, repeat('x', 1000) from generate_series(1, 900) g")
            .execute(pool)
            .await
            .unwrap();
    }
    sqlx::query("truncate other").execute(pool).await.unwrap();
}

async fn retained_wal(pool: &PgPool, slot: &str) -> i64 {
    sqlx::query_scalar(
        "select coalesce((pg_current_wal_lsn() - restart_lsn)::bigint, 0)
         from pg_replication_slots where slot_name = $1",
    )
    .bind(slot)
    .fetch_one(pool)
    .await
    .unwrap()
}

const MB: f64 = 1024.0 * 1024.0;

#[tokio::test]
async fn a_standby_takes_over_the_slot_when_the_leader_dies() {
    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let first = test.start_relay(&[]);
    first
        .wait_for_metric(
            "the first relay leads",
            "relay_leader 1",
            Duration::from_secs(30),
        )
        .await;
    let second = test.start_relay(&[]);
    eventually(
        "the second relay stands by",
        Duration::from_secs(30),
        || async { (second.role().await.as_deref() == Some("standby")).then_some(()) },
    )
    .await;
    let mut inserted = insert_transactions(&test, 20, 50).await;

    first.service.kill().await;
    inserted.extend(insert_transactions(&test, 20, 50).await);
    second
        .wait_for_metric(
            "the standby leads",
            "relay_leader 1",
            Duration::from_secs(30),
        )
        .await;
    let result = test.delivery_once_drained(&inserted).await;
    println!("cdc takeover: {result:?}");
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    second.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_postgres_crash_mid_stream_loses_nothing() {
    let mut cluster = PrivatePostgres::start().await;
    let test =
        RelayTest::on_server(&cluster.url("postgres"), Mode::Cdc, &bootstrap_servers()).await;
    let relay = test.start_relay(&["--batch-size", "50"]);
    relay
        .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
        .await;
    let mut inserted = test.insert_events(100, 1).await;
    let first_insert = test.last_insert_lsn();
    inserted.extend(insert_transactions(&test, 59, 100).await);
    eventually("the stream starts", Duration::from_secs(60), || async {
        test.started_publishing(first_insert.as_deref())
            .await
            .then_some(())
    })
    .await;

    cluster.crash().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart().await;
    inserted.extend(insert_transactions(&test, 20, 100).await);

    let result = test.delivery_once_drained(&inserted).await;
    println!("postgres crash (cdc mode): {result:?}");
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    relay.service.terminate(Duration::from_secs(30)).await;
}

/// An hour of an idle outbox, compressed: other tables keep writing, the
/// outbox gets nothing. The relay confirms the keepalives' positions, so its
/// slot holds little WAL; a slot nobody confirms, beside it, holds it all.
#[tokio::test]
async fn an_idle_outbox_does_not_pin_the_wal_of_other_writes() {
    let cluster = PrivatePostgres::start().await;
    let test =
        RelayTest::on_server(&cluster.url("postgres"), Mode::Cdc, &bootstrap_servers()).await;
    let slot = test.cdc_slot.clone().unwrap();
    let relay = test.start_relay(&[]);
    relay
        .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
        .await;
    sqlx::query("select pg_create_logical_replication_slot('nobody_reads', 'pgoutput')")
        .execute(&test.pool)
        .await
        .unwrap();
    let start: i64 = sqlx::query_scalar("select (pg_current_wal_lsn() - '0/0')::bigint")
        .fetch_one(&test.pool)
        .await
        .unwrap();

    for _ in 0..8 {
        write_other_wal(&test.pool, 16).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let written: i64 = sqlx::query_scalar("select (pg_current_wal_lsn() - '0/0')::bigint - $1")
        .bind(start)
        .fetch_one(&test.pool)
        .await
        .unwrap();
    // The slot's restart position moves at the next running-transactions
    // record (a checkpoint writes one) after a confirmation.
    let retained = eventually(
        "the relay's slot lets go of the WAL",
        Duration::from_secs(90),
        || async {
            sqlx::query("checkpoint").execute(&test.pool).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let retained = retained_wal(&test.pool, &slot).await;
            (retained < 16 * 1024 * 1024).then_some(retained)
        },
    )
    .await;
    let unconfirmed = retained_wal(&test.pool, "nobody_reads").await;
    println!(
        "idle outbox: wal_written={:.1} MB retained_by_relay_slot={:.2} MB retained_by_unread_slot={:.1} MB",
        written as f64 / MB,
        retained as f64 / MB,
        unconfirmed as f64 / MB
    );
    assert!(
        unconfirmed >= written * 9 / 10,
        "the baseline slot should hold the WAL written"
    );
    relay
        .wait_for_metric(
            "the slot-lag gauge is exported",
            "relay_slot_retained_wal_bytes",
            Duration::from_secs(20),
        )
        .await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

/// max_slot_wal_keep_size exceeded while the relay is frozen: the slot is
/// invalidated; the relay stops (it does not poll by itself) and says how
/// to rebuild.
#[tokio::test]
async fn an_invalidated_slot_stops_the_relay_with_the_commands_to_rebuild() {
    let cluster = PrivatePostgres::start().await;
    let test = RelayTest::on_server(&cluster.url("postgres"), Mode::Cdc, &bootstrap_servers())
        .await
        .keeping_rows();
    for statement in [
        "alter system set max_slot_wal_keep_size = '48MB'",
        "select pg_reload_conf()",
    ] {
        sqlx::query(statement).execute(&test.pool).await.unwrap();
    }
    let slot = test.cdc_slot.clone().unwrap();
    let relay = test.start_relay(&[]);
    let mut inserted = insert_transactions(&test, 2, 10).await;
    let result = test.delivery_once_drained(&inserted).await;
    assert_eq!(result.lost, 0);

    relay.service.signal(Signal::SIGSTOP);
    // Written while the relay is frozen: in the WAL the server removes.
    inserted.extend(insert_transactions(&test, 2, 10).await);
    eventually(
        "the slot is invalidated",
        Duration::from_secs(120),
        || async {
            write_other_wal(&test.pool, 32).await;
            sqlx::query("checkpoint").execute(&test.pool).await.unwrap();
            let status: Option<String> = sqlx::query_scalar(
                "select wal_status from pg_replication_slots where slot_name = $1",
            )
            .bind(&slot)
            .fetch_one(&test.pool)
            .await
            .unwrap();
            (status.as_deref() == Some("lost")).then_some(())
        },
    )
    .await;
    relay.service.signal(Signal::SIGCONT);

    let (code, log) = relay.service.exit(Duration::from_secs(60)).await;
    println!("invalidated slot: exit code {code:?}");
    assert_eq!(code, Some(1), "{log}");
    for expected in [
        "wal_status = lost",
        "pg_drop_replication_slot",
        "delete-in-transaction",
    ] {
        assert!(log.contains(expected), "{expected:?} not in:\n{log}");
    }
    // A restart refuses at once with the same explanation.
    let again = test.start_relay(&[]);
    let (code, log) = again.service.exit(Duration::from_secs(60)).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("wal_status = lost"), "{log}");

    // The rebuild the message describes: drop the slot, start again.
    sqlx::query("select pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&test.pool)
        .await
        .unwrap();
    let rebuilt = test.start_relay(&[]);
    let result = test.delivery_once_drained(&inserted).await;
    println!("invalidated slot, rebuilt: {result:?}");
    assert_eq!(result.lost, 0);
    rebuilt.service.terminate(Duration::from_secs(30)).await;
}

/// `--outbox-cleanup delete-in-transaction`: the writer deletes its rows
/// in the inserting transaction; the WAL still carries the inserts. A row
/// that cannot become a record is parked (written back with parked_at) and
/// the rows behind it go on.
#[tokio::test]
async fn rows_deleted_in_their_own_transaction_are_published_and_poison_is_parked() {
    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let relay = test.start_relay(&["--outbox-cleanup", "delete-in-transaction"]);
    relay
        .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
        .await;
    let mut tx = test.pool.begin().await.unwrap();
    let mut ids: Vec<Uuid> = Vec::new();
    for (aggregate_type, n) in [
        (test.aggregate_type.as_str(), 0),
        ("not a topic!", 1),
        (test.aggregate_type.as_str(), 2),
    ] {
        ids.push(
            sqlx::query_scalar(
                "insert into outbox (id, aggregatetype, aggregateid, type, payload)
                 values (gen_random_uuid(), $1, 'agg-0', 'TestEvent', jsonb_build_object('n', $2::int))
                 returning id",
            )
            .bind(aggregate_type)
            .bind(n)
            .fetch_one(&mut *tx)
            .await
            .unwrap(),
        );
    }
    sqlx::query("delete from outbox where id = any($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let records = test
        .reader()
        .read_at_least(2, Duration::from_secs(60))
        .await;
    let published: Vec<String> = records.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(published, [ids[0].to_string(), ids[2].to_string()]);
    let parked = eventually(
        "the poison row is parked",
        Duration::from_secs(30),
        || async {
            sqlx::query_as::<_, (Uuid, Option<String>)>(
                "select id, last_error from outbox where parked_at is not null",
            )
            .fetch_optional(&test.pool)
            .await
            .unwrap()
        },
    )
    .await;
    assert_eq!(parked.0, ids[1]);
    let remaining: i64 = sqlx::query_scalar("select count(*) from outbox")
        .fetch_one(&test.pool)
        .await
        .unwrap();
    assert_eq!(remaining, 1, "only the parked row is in the table");
    relay
        .wait_for_metric(
            "the parking is counted",
            "outbox_parked_total 1",
            Duration::from_secs(10),
        )
        .await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_role_without_replication_gets_a_clear_error() {
    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let role = format!("norepl_{}", &Uuid::new_v4().simple().to_string()[..12]);
    let url = test.database.login_role(&role).await;
    sqlx::query(&format!("grant all on outbox, outbox_delivery to {role}"))
        .execute(&test.pool)
        .await
        .unwrap();
    let relay = test.start_relay_on(&url, &[], &[]);
    let (code, log) = relay.service.exit(Duration::from_secs(30)).await;
    sqlx::raw_sql(&format!("drop owned by {role}; drop role {role}"))
        .execute(&test.pool)
        .await
        .ok();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!("role {role} may not stream a replication slot")),
        "{log}"
    );
}

#[tokio::test]
async fn a_server_without_logical_wal_gets_a_clear_error() {
    // The machine's own server runs wal_level=replica; where it runs
    // logical, a private cluster started with replica stands in.
    let test = RelayTest::new().await;
    let wal_level: String = sqlx::query_scalar("show wal_level")
        .fetch_one(&test.pool)
        .await
        .unwrap();
    if wal_level == "logical" {
        println!("the orders server runs wal_level=logical: nothing to check here");
        return;
    }
    let relay = test.start_relay(&["--mode", "cdc", "--cdc-slot", "never_created"]);
    let (code, log) = relay.service.exit(Duration::from_secs(30)).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("wal_level is 'replica'"), "{log}");
    assert!(log.contains("--mode poll"), "{log}");
}

/// Sets server settings on `cluster` and reloads them.
async fn reconfigure(pool: &PgPool, settings: &[&str]) {
    for setting in settings {
        sqlx::query(setting).execute(pool).await.unwrap();
    }
    sqlx::query("select pg_reload_conf()")
        .execute(pool)
        .await
        .unwrap();
}

/// A commit reaches the slot's stream once it is in the WAL, a moment before
/// other sessions see its rows (seen in P4 at 75 % load: ten published
/// rows that no mark found, stale in the backlog for good). Here the moment
/// lasts: the writer's commit waits for a synchronous standby that does not
/// exist (flushed and streamed, not yet visible), while the relay's own
/// commits are local. The relay publishes the row, its mark finds nothing;
/// once the commit is visible, the row must be marked.
#[tokio::test]
async fn a_row_published_before_its_commit_is_visible_is_marked_once_it_is() {
    let cluster = PrivatePostgres::start().await;
    let test = RelayTest::on_server(&cluster.url("postgres"), Mode::Cdc, &bootstrap_servers())
        .await
        .keeping_rows();
    reconfigure(
        &test.pool,
        &[
            "alter system set synchronous_standby_names = 'nobody'",
            "alter system set synchronous_commit = 'local'",
        ],
    )
    .await;
    let relay = test.start_relay(&["--outbox-cleanup", "retain", "--retain-published", "1d"]);
    let streamed = test
        .insert_row(&test.aggregate_type, "agg-0", r#"{"n": 0}"#)
        .await;
    eventually("the stream runs", Duration::from_secs(60), || async {
        test.pending().await.eq(&0).then_some(())
    })
    .await;

    let mut writer = PgConnection::connect(&test.database.url()).await.unwrap();
    sqlx::query("set synchronous_commit = on")
        .execute(&mut writer)
        .await
        .unwrap();
    sqlx::query("begin").execute(&mut writer).await.unwrap();
    let held: Uuid = sqlx::query_scalar(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload)
         values (gen_random_uuid(), $1, 'agg-1', 'TestEvent', '{\"n\": 1}') returning id",
    )
    .bind(&test.aggregate_type)
    .fetch_one(&mut writer)
    .await
    .unwrap();
    let commit = tokio::spawn(async move { sqlx::query("commit").execute(&mut writer).await });
    let records = test
        .reader()
        .read_at_least(2, Duration::from_secs(60))
        .await;
    let mut ids: Vec<String> = records.iter().filter_map(|r| r.header("id")).collect();
    let mut expected = vec![streamed.to_string(), held.to_string()];
    ids.sort();
    expected.sort();
    assert_eq!(
        ids, expected,
        "both published, the held one while invisible"
    );
    // The relay marks right after the broker's acknowledgement; give it
    // time to have tried, then let the commit complete.
    relay
        .wait_for_metric(
            "both rows count as published",
            "outbox_published_total 2",
            Duration::from_secs(30),
        )
        .await;
    assert!(
        !commit.is_finished(),
        "the commit is still waiting for the standby"
    );
    reconfigure(
        &test.pool,
        &["alter system reset synchronous_standby_names"],
    )
    .await;
    commit.await.unwrap().unwrap();

    eventually(
        "the held row is marked published",
        Duration::from_secs(30),
        || async { test.pending().await.eq(&0).then_some(()) },
    )
    .await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

/// How long the undeliverable-record test runs: `CDC_UNDELIVERABLE_FOR`
/// (the closing note of issue 34 ran it for 5 minutes), 60 s by default.
fn undeliverable_for() -> Duration {
    std::env::var("CDC_UNDELIVERABLE_FOR")
        .ok()
        .map(|text| humantime::parse_duration(&text).unwrap())
        .unwrap_or(Duration::from_secs(60))
}

/// One record the broker cannot take (its topic does not exist), under a
/// trickle of healthy orders and other tables' writes. Before, the stream
/// ended at every attempt and replayed from the confirmed position for
/// ever: nothing after the record was confirmed, and the slot kept all the
/// WAL written since. Now the record steps aside into the table, the stream
/// goes on, and the slot lets go of the WAL.
#[tokio::test]
async fn cdc_one_undeliverable_record_neither_stops_the_stream_nor_pins_the_wal() {
    let cluster = PrivatePostgres::start().await;
    let test =
        RelayTest::on_server(&cluster.url("postgres"), Mode::Cdc, &bootstrap_servers()).await;
    let slot = test.cdc_slot.clone().unwrap();
    let relay = test.start_relay(&["--delivery-timeout", "2s"]);
    test.wait_until_streaming(&relay).await;
    let missing_type = test_support::kafka::unique_name("cdcmissing").replace('-', "");
    let stuck = test.write_row(&missing_type, "m", r#"{"n": 0}"#).await;
    let retained_at_start = retained_wal(&test.pool, &slot).await;

    let started = std::time::Instant::now();
    let mut inserted = Vec::new();
    while started.elapsed() < undeliverable_for() {
        inserted.extend(test.insert_events(2, 1).await);
        write_other_wal(&test.pool, 1).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let last = test.last_insert_lsn().unwrap();
    eventually(
        "the slot confirms past the last healthy order",
        Duration::from_secs(60),
        || async { test.confirmed_past(&last).await.then_some(()) },
    )
    .await;
    let retained_at_end = eventually(
        "the slot lets go of the WAL",
        Duration::from_secs(60),
        || async {
            sqlx::query("checkpoint").execute(&test.pool).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let retained = retained_wal(&test.pool, &slot).await;
            (retained < 32 * 1024 * 1024).then_some(retained)
        },
    )
    .await;
    let written: i64 = sqlx::query_scalar("select (pg_current_wal_lsn() - '0/0')::bigint")
        .fetch_one(&test.pool)
        .await
        .unwrap();
    println!(
        "one undeliverable record for {:?}: retained WAL at start={:.2} MB, at end={:.2} MB (server WAL position {:.0} MB); {} healthy rows",
        undeliverable_for(),
        retained_at_start as f64 / MB,
        retained_at_end as f64 / MB,
        written as f64 / MB,
        inserted.len()
    );
    let records = test
        .reader()
        .read_at_least(inserted.len(), Duration::from_secs(60))
        .await;
    let result = crate::helpers::delivery(&records, &inserted);
    assert_eq!((result.lost, result.order_violations), (0, 0), "{result:?}");
    let (parked, error): (Option<time::OffsetDateTime>, Option<String>) =
        sqlx::query_as("select parked_at, last_error from outbox where id = $1")
            .bind(stuck)
            .fetch_one(&test.pool)
            .await
            .unwrap();
    assert!(parked.is_none(), "a missing topic is not the row's fault");
    assert!(error.is_some(), "the stepped-aside row says why it waits");
    relay.service.terminate(Duration::from_secs(30)).await;
}

/// `CDC_BIG_TRANSACTION_ROWS` (200 000 by default) rows committed in one
/// transaction: before, the whole transaction was one batch, handed to the
/// producer against one lease's send window; most of it was withheld, the
/// stream ended and replayed it, for ever.
#[tokio::test]
async fn cdc_a_transaction_of_200_000_rows_is_delivered_once_and_completely() {
    let rows: usize = std::env::var("CDC_BIG_TRANSACTION_ROWS")
        .ok()
        .map(|text| text.parse().unwrap())
        .unwrap_or(200_000);
    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let relay = test.start_relay(&[]);
    test.wait_until_streaming(&relay).await;
    let started = std::time::Instant::now();
    let inserted = test.insert_events(rows, 1).await;
    let written = started.elapsed();
    // A few thousand records a second on this machine's broker, with room.
    let deadline = Duration::from_secs(60 + u64::try_from(rows / 500).unwrap());
    test.wait_until_drained(deadline).await;
    let delivered = started.elapsed();
    let records = test
        .reader()
        .read_at_least(rows, Duration::from_secs(300))
        .await;
    let result = crate::helpers::delivery(&records, &inserted);
    println!(
        "one transaction of {rows} rows: written in {:.1}s, delivered (confirmed) {:.1}s after the write began; {result:?}",
        written.as_secs_f64(),
        delivered.as_secs_f64()
    );
    assert_eq!(
        (result.lost, result.duplicates, result.order_violations),
        (0, 0, 0),
        "{result:?}"
    );
    relay.service.terminate(Duration::from_secs(30)).await;
}

/// A publication that carries another table would send its rows down the
/// stream too; before, the first such insert ended the stream, and every
/// session after it ended there again.
#[tokio::test]
async fn a_publication_that_carries_other_tables_is_refused_at_start_up() {
    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let publication = format!("wide_{}", &Uuid::new_v4().simple().to_string()[..12]);
    for statement in [
        "create table other (n int)".to_owned(),
        format!(
            "create publication {publication} for table outbox, other with (publish = 'insert')"
        ),
    ] {
        sqlx::query(&statement).execute(&test.pool).await.unwrap();
    }
    let relay = test.start_relay(&["--cdc-publication", &publication]);
    let (code, log) = relay.service.exit(Duration::from_secs(30)).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "publication {publication} carries other tables too (public.other)"
        )),
        "{log}"
    );
}

/// A new leader ends the walsender that still holds its own slot, and no
/// other: relays of other databases stream slots on the same server. Seen
/// in CI before: the condition on the slot's name was not evaluated first,
/// and a neighbour's stream (there, its slot being created) was cut off.
#[tokio::test]
async fn ending_a_stale_stream_ends_only_the_one_on_this_relays_slot() {
    let neighbour = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let relay = neighbour.start_relay(&[]);
    neighbour.wait_until_streaming(&relay).await;
    let slot = neighbour.cdc_slot.clone().unwrap();
    let walsender = |pool: PgPool, slot: String| async move {
        sqlx::query_scalar::<_, Option<i32>>(
            "select active_pid from pg_replication_slots where slot_name = $1",
        )
        .bind(slot)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let streaming = walsender(neighbour.pool.clone(), slot.clone()).await;
    assert!(streaming.is_some());

    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers()).await;
    let own = test.cdc_slot.clone().unwrap();
    sqlx::query("select pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(&own)
        .execute(&test.pool)
        .await
        .unwrap();
    let mut conn = test.pool.acquire().await.unwrap();
    let ended = outbox_relay::cdc::slot::end_stream(&mut conn, &own)
        .await
        .unwrap();
    assert_eq!(ended, None, "nothing streamed this relay's slot");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        walsender(neighbour.pool.clone(), slot).await,
        streaming,
        "the neighbour's stream was ended"
    );
    relay.service.terminate(Duration::from_secs(30)).await;
}
