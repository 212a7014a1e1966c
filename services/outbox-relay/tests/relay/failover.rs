//! A leader that crashes, freezes, loses its database connection or blocks
//! on a row lock, under load: a standby leads within the lease, the old
//! leader sends nothing after it, and per aggregate nothing on the topic
//! goes back in `seq` order.
//!
//! `FAILOVER_ROUNDS=5 FAILOVER_LEASE=10s` repeats each stall and prints the
//! failover times (docs/benchmarks.md, "Relay failover").

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use test_support::broker::PrivateBroker;
use test_support::eventually::eventually;
use test_support::proxy::TcpProxy;

use outbox_relay::leadership::{DEFAULT_LOCK_KEY, Election, Leader};
use outbox_relay::publisher::{Outcome, Publisher, kafka};
use outbox_relay::store;
use sqlx::Connection;

use crate::helpers::{Mode, RelayProcess, RelayTest, delivery};
use test_support::kafka::bootstrap_servers;

/// How the leader is taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stall {
    /// SIGKILL: its sockets close.
    Crash,
    /// SIGSTOP while its read of pending rows is on its way back, then
    /// SIGCONT once the standby leads: it wakes holding rows to send.
    Freeze,
    /// Its database connection stops carrying bytes; its sockets stay open.
    Blackhole,
}

/// The lease the tests run with, unless FAILOVER_LEASE says otherwise.
fn lease() -> Duration {
    std::env::var("FAILOVER_LEASE")
        .ok()
        .map(|text| humantime::parse_duration(&text).unwrap())
        .unwrap_or(Duration::from_secs(5))
}

fn rounds() -> usize {
    std::env::var("FAILOVER_ROUNDS")
        .ok()
        .map(|text| text.parse().unwrap())
        .unwrap_or(1)
}

/// Arguments with the lease and a delivery timeout that fits in it.
fn lease_args(lease: Duration) -> Vec<String> {
    // The relay takes a lease of at least the delivery timeout + 3 s.
    let delivery_timeout = lease
        .checked_sub(Duration::from_secs(3))
        .filter(|timeout| *timeout >= Duration::from_secs(1))
        .expect("FAILOVER_LEASE is at least 4s");
    vec![
        "--batch-size".into(),
        "50".into(),
        "--lease".into(),
        humantime::format_duration(lease).to_string(),
        "--delivery-timeout".into(),
        humantime::format_duration(delivery_timeout).to_string(),
    ]
}

async fn wait_for_role(relay: &RelayProcess, role: &str, what: &str, deadline: Duration) {
    eventually(what, deadline, || async {
        (relay.role().await.as_deref() == Some(role)).then_some(())
    })
    .await;
}

/// One stall under load; returns how long the standby took to lead.
async fn fail_over(stall: Stall) -> Duration {
    fail_over_in(stall, Mode::Poll).await
}

async fn fail_over_in(stall: Stall, mode: Mode) -> Duration {
    let test = match mode {
        Mode::Poll => RelayTest::new().await,
        // The rows stay in the table for the relay to delete (the default
        // cleanup): what a new leader must not publish a second time.
        Mode::Cdc => RelayTest::in_mode(mode, &bootstrap_servers())
            .await
            .keeping_rows(),
    };
    let lease = lease();
    let args = lease_args(lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let database: url::Url = test.database.url().parse().unwrap();
    let server = format!(
        "{}:{}",
        database.host_str().unwrap(),
        database.port().unwrap_or(5432)
    );
    let proxy = TcpProxy::start(server.parse().unwrap()).await;
    let leader = test.start_relay_on(&proxy.url_through(database.as_str()), &args, &[]);
    wait_for_role(
        &leader,
        "leader",
        "the first relay leads",
        Duration::from_secs(30),
    )
    .await;
    let standby = test.start_relay(&args);
    wait_for_role(
        &standby,
        "standby",
        "the second relay stands by",
        Duration::from_secs(30),
    )
    .await;

    let mut inserted = Vec::new();
    let load = async {
        // About 1 s before the stall, and on past the takeover.
        let until = Instant::now() + lease * 2 + Duration::from_secs(4);
        let mut counts = Vec::new();
        while Instant::now() < until {
            inserted.extend(test.insert_events(10, 3).await);
            counts.push((Instant::now(), inserted.len()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        counts
    };
    let fault = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stalled_at = match stall {
            Stall::Crash => {
                leader.service.signal(Signal::SIGKILL);
                Instant::now()
            }
            Stall::Freeze if mode == Mode::Cdc => {
                leader.service.signal(Signal::SIGSTOP);
                Instant::now()
            }
            Stall::Freeze => {
                let lock = hold_the_leader_in_its_read(&test).await;
                leader.service.signal(Signal::SIGSTOP);
                lock.commit().await.unwrap();
                Instant::now()
            }
            Stall::Blackhole => {
                proxy.blackhole();
                Instant::now()
            }
        };
        wait_for_role(&standby, "leader", "the standby takes over", lease * 3).await;
        let took = stalled_at.elapsed();
        if stall == Stall::Freeze {
            // Rows flow through the new leader before the old one wakes.
            tokio::time::sleep(Duration::from_secs(1)).await;
            leader.service.signal(Signal::SIGCONT);
            wait_for_role(&leader, "standby", "the woken leader stands by", lease * 2).await;
        }
        (took, stalled_at)
    };
    let (counts, (took, stalled_at)) = tokio::join!(load, fault);
    let inserted_by = |at: Instant| {
        counts
            .iter()
            .take_while(|(when, _)| *when <= at)
            .last()
            .map_or(0, |(_, count)| *count)
    };
    // How many rows were inserted when the leader stalled, and 3 s before:
    // what a CDC leader may have published without confirming it yet.
    let at_stall = (
        inserted_by(stalled_at),
        inserted_by(stalled_at - Duration::from_secs(3)),
    );

    let result = test.delivery_once_drained(&inserted).await;
    println!(
        "failover after {stall:?} ({mode:?}): took={:.2}s lease={lease:?} rows={} {result:?}",
        took.as_secs_f64(),
        inserted.len()
    );
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    match mode {
        Mode::Poll => assert_eq!(
            result.regressions, 0,
            "a record came after a later one of its aggregate: the old leader sent after the takeover"
        ),
        // The new leader streams again from the slot's confirmed position:
        // what the old one published since (confirmed once a second) comes
        // twice, and nothing more.
        Mode::Cdc => {
            let in_flight = at_stall.0 - at_stall.1;
            assert!(
                result.duplicates <= in_flight,
                "{} duplicates, more than the {in_flight} rows written in the 3 s before the freeze: the new leader published the backlog twice",
                result.duplicates
            );
            let log = standby.service.log();
            let waiting = log.split("leading:").next().unwrap_or_default();
            assert_eq!(
                waiting.matches("standing by").count(),
                1,
                "the standby says once that it waits:\n{log}"
            );
            assert!(
                !log.contains("is active for PID") && !waiting.contains("ERROR"),
                "the standby shouted while it waited:\n{log}"
            );
        }
    }
    // The bound the lease promises (a crash needs no lease: the socket
    // closes), with room for a loaded machine.
    let bound = match stall {
        Stall::Crash => Duration::from_secs(5),
        Stall::Freeze | Stall::Blackhole => lease + Duration::from_secs(5),
    };
    assert!(took <= bound, "failover took {took:?}, more than {bound:?}");
    if stall != Stall::Crash {
        let metrics = standby.metrics().await;
        assert!(
            metrics.contains("relay_leaders_deposed_total 1"),
            "the standby did not depose the stalled leader:\n{metrics}"
        );
    }
    if stall == Stall::Freeze && mode == Mode::Poll {
        // It woke with the answer to its read in its socket. Whichever it
        // saw first, the answer or its own lease timeout, it stepped down
        // without sending (either way the regression check above holds; the
        // send fence alone is tested below, where the race is not).
        let log = leader.service.log();
        assert!(
            log.contains("withheld them") || log.contains("did not answer within the lease"),
            "the woken leader did not notice it had lost the lease:\n{log}"
        );
    }
    standby.service.terminate(Duration::from_secs(30)).await;
    leader.service.kill().await;
    took
}

/// Locks the outbox table until the leader's read of pending rows waits on
/// it; returns the lock. Committing it lets the read finish: its rows are
/// then on their way to the leader.
async fn hold_the_leader_in_its_read(
    test: &RelayTest,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    loop {
        let mut lock = test.pool.begin().await.unwrap();
        sqlx::query("lock table outbox in access exclusive mode")
            .execute(&mut *lock)
            .await
            .unwrap();
        // The waiting statement may be the leader's delete, or the test's
        // own insert; only its read will do (the one statement with a
        // `union all`: store::fetch_pending).
        let waiting = eventually(
            "a statement waits on the lock",
            Duration::from_secs(10),
            || async {
                let queries: Vec<String> = sqlx::query_scalar(
                    "select query from pg_stat_activity
                 where datname = current_database() and wait_event_type = 'Lock'",
                )
                .fetch_all(&test.pool)
                .await
                .unwrap();
                (!queries.is_empty()).then_some(queries)
            },
        )
        .await;
        if waiting.iter().any(|query| query.contains("union all")) {
            return lock;
        }
        lock.rollback().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn fail_over_rounds(stall: Stall) {
    let mut took: Vec<f64> = Vec::new();
    for _ in 0..rounds() {
        took.push(fail_over(stall).await.as_secs_f64());
    }
    took.sort_by(f64::total_cmp);
    println!(
        "failover {stall:?}: rounds={} median={:.2}s max={:.2}s all={took:.2?}",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_leader_is_replaced_within_one_failover_interval() {
    fail_over_rounds(Stall::Crash).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_leader_is_deposed_within_the_lease_and_sends_nothing_when_it_wakes() {
    fail_over_rounds(Stall::Freeze).await;
}

/// Two CDC relays, orders placed and cancelled at once, the leader frozen.
/// Before, the standby waited for the server's `wal_sender_timeout` (60 s),
/// logging "slot is active" at ERROR twice a second, then published the
/// table's backlog and streamed the same inserts again.
#[tokio::test(flavor = "multi_thread")]
async fn cdc_a_frozen_leader_is_replaced_within_the_lease_without_publishing_the_backlog_twice() {
    let mut took: Vec<f64> = Vec::new();
    for _ in 0..rounds() {
        took.push(fail_over_in(Stall::Freeze, Mode::Cdc).await.as_secs_f64());
    }
    println!("failover Freeze (cdc): all={took:.2?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_cut_off_from_the_database_is_deposed_within_the_lease() {
    fail_over_rounds(Stall::Blackhole).await;
}

/// Before the lease, a leader waiting on a row lock kept leadership for as
/// long as the lock was held.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_blocked_on_a_row_lock_is_deposed_within_the_lease() {
    let test = RelayTest::new().await;
    let lease = lease();
    let args = lease_args(lease);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let inserted = test.insert_events(10, 3).await;
    let mut lock = test.pool.begin().await.unwrap();
    sqlx::query("select id from outbox for update")
        .execute(&mut *lock)
        .await
        .unwrap();
    let leader = test.start_relay(&args);
    eventually(
        "the leader blocks on the locked rows",
        Duration::from_secs(30),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock'",
            )
            .fetch_one(&test.pool)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        },
    )
    .await;
    let blocked_at = Instant::now();
    let standby = test.start_relay(&args);
    // Either may take over: the blocked leader gives up after the lease and
    // competes again; its stuck session is deposed by whichever comes first.
    eventually("a relay deposes the blocked session", lease * 3, || async {
        let mut deposed = 0.0;
        for relay in [&leader, &standby] {
            deposed += relay.metric("relay_leaders_deposed_total").await;
        }
        (deposed > 0.0).then_some(())
    })
    .await;
    let took = blocked_at.elapsed();
    lock.rollback().await.unwrap();

    let result = test.delivery_once_drained(&inserted).await;
    println!(
        "failover from a blocked leader: took={:.2}s {result:?}",
        took.as_secs_f64()
    );
    assert_eq!(result.lost, 0);
    assert_eq!(result.regressions, 0);
    assert!(
        took <= lease + Duration::from_secs(5),
        "failover took {took:?}"
    );
    standby.service.terminate(Duration::from_secs(30)).await;
    leader.service.kill().await;
}

/// Takes the lead of `test`'s outbox with `lease`, as a relay would, in the
/// test's own process.
async fn lead_alone(test: &RelayTest, lease: Duration) -> Leader {
    let election = Election {
        database: test.database.url().parse().unwrap(),
        lock_key: DEFAULT_LOCK_KEY,
        lease,
    };
    election
        .try_lead()
        .await
        .unwrap()
        .expect("the lock is free")
}

/// The fence on its own: a leader that read rows, then stalled past its
/// lease while a standby deposed it and published everything, sends none of
/// the rows it holds. (In the relay the stall can come anywhere; here it
/// comes exactly between the read and the send.)
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_lease_ran_out_sends_none_of_the_rows_it_read() {
    let test = RelayTest::new().await;
    let inserted = test.insert_events(10, 2).await;
    let lease = Duration::from_secs(4);
    let delivery_timeout = Duration::from_secs(1);
    let mut leader = lead_alone(&test, lease).await;
    let rows = leader
        .run(async |conn| store::fetch_pending(conn, 100, &[]).await)
        .await
        .unwrap();
    assert_eq!(rows.len(), 10, "one row per aggregate");

    // The stall: a standby deposes this session and publishes every row,
    // the second row of each aggregate included.
    let standby = test.start_relay(&["--lease", "4s", "--delivery-timeout", "1s"]);
    test.wait_until_drained(Duration::from_secs(60)).await;

    // Built as the relay builds it, KAFKA_* variables included.
    let config = kafka::client_config(&test.bootstrap, delivery_timeout).unwrap();
    let mut publisher = Publisher::Kafka(kafka::Publisher::new(config).unwrap());
    let outcomes = publisher
        .publish(&rows, leader.send_deadline(delivery_timeout))
        .await;
    assert!(
        outcomes.iter().all(|outcome| *outcome == Outcome::Withheld),
        "{outcomes:?}"
    );
    assert!(
        leader
            .run(async |conn| store::fetch_pending(conn, 1, &[]).await)
            .await
            .is_err(),
        "the deposed session still answers"
    );

    let records = test
        .reader()
        .read_at_least(inserted.len(), Duration::from_secs(60))
        .await;
    let result = delivery(&records, &inserted);
    assert_eq!(
        (result.lost, result.duplicates, result.regressions),
        (0, 0, 0),
        "{result:?}"
    );
    standby.service.terminate(Duration::from_secs(30)).await;
}

/// The fence's other half: records handed to librdkafka just before the
/// deadline, while the broker is out of reach, must be dropped by
/// librdkafka once --delivery-timeout passes, never delivered after a
/// standby took over and published the same aggregates. The producer is
/// built as the relay builds it, so a `KAFKA_*` variable that stretched the
/// timeout (`KAFKA_MESSAGE_TIMEOUT_MS=60000`, accepted before) makes this
/// test fail; the relay now refuses it (environment.rs).
#[tokio::test(flavor = "multi_thread")]
async fn records_handed_over_before_the_deadline_never_land_after_the_takeover() {
    let mut broker = PrivateBroker::start().await;
    let test = RelayTest::with_broker(&broker.address).await;
    // Long enough for the broker to stop between two statements.
    let lease = Duration::from_secs(8);
    let delivery_timeout = Duration::from_secs(1);
    let Ok(config) = kafka::client_config(&broker.address, delivery_timeout) else {
        println!("the relay refuses this environment's KAFKA_* variables: nothing it could send");
        return;
    };
    let mut publisher = Publisher::Kafka(kafka::Publisher::new(config).unwrap());
    // The idempotent producer's id, fetched before the broker goes away.
    let warm_up = test.insert_events(1, 1).await;
    let mut leader = lead_alone(&test, lease).await;
    let first = leader
        .run(async |conn| store::fetch_pending(conn, 100, &[]).await)
        .await
        .unwrap();
    // The first send may take longer than the 1 s timeout (the producer id).
    let mut tries = 0;
    loop {
        let sent = publisher
            .publish(&first, leader.send_deadline(delivery_timeout))
            .await;
        tries += 1;
        match &sent[..] {
            [Outcome::Published(_)] => break,
            _ if tries < 10 => continue,
            _ => panic!("the warm-up record was not published: {sent:?}"),
        }
    }
    leader
        .run(async |conn| {
            sqlx::query("delete from outbox where id = $1")
                .bind(warm_up[0])
                .execute(conn)
                .await
        })
        .await
        .unwrap();

    let inserted = test.insert_events(10, 2).await;
    broker.stop().await;
    let rows = leader
        .run(async |conn| store::fetch_pending(conn, 100, &[]).await)
        .await
        .unwrap();
    assert_eq!(rows.len(), 10, "one row per aggregate");
    // Handed over at once, well before the deadline; then the leader
    // stalls, the lease runs out, a standby deposes it and, once the broker
    // is back, publishes every row.
    let deadline = leader.send_deadline(delivery_timeout);
    let late = async {
        let outcomes = publisher.publish(&rows, deadline).await;
        publisher.flush(Duration::from_secs(1)).await;
        outcomes
    };
    let takeover = async {
        tokio::time::sleep(lease + Duration::from_secs(1)).await;
        // A relay starts once the broker answers (it checks its topics).
        broker.restart().await;
        let standby = test.start_relay(&["--lease", "8s", "--delivery-timeout", "1s"]);
        eventually(
            "the standby deposes the stalled leader",
            Duration::from_secs(30),
            || async { (standby.metric("relay_leaders_deposed_total").await > 0.0).then_some(()) },
        )
        .await;
        test.wait_until_drained(Duration::from_secs(60)).await;
        standby
    };
    let (outcomes, standby) = tokio::join!(late, takeover);
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Outcome::Transient(_))),
        "the stalled leader's records were not dropped: {outcomes:?}"
    );
    // Time for a record that would still land to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let records = test
        .reader()
        .read_at_least(inserted.len() + 1, Duration::from_secs(60))
        .await;
    let mut all = warm_up.clone();
    all.extend(&inserted);
    let result = delivery(&records, &all);
    assert_eq!(
        (result.lost, result.duplicates, result.regressions),
        (0, 0, 0),
        "{result:?}"
    );
    standby.service.terminate(Duration::from_secs(30)).await;
}

/// Deposing needs to see the holder's session: a standby running as
/// another role without `pg_read_all_stats` cannot, says so once and leaves
/// the holder alone; granted the two roles docs/relay.md names, it deposes.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_that_cannot_see_the_leader_says_so_and_deposes_once_granted() {
    let test = RelayTest::new().await;
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (holder, standby_role) = (
        format!("relay_holder_{suffix}"),
        format!("relay_standby_{suffix}"),
    );
    let holder_url = test.database.login_role(&holder).await;
    let standby_url = test.database.login_role(&standby_role).await;
    sqlx::query(&format!(
        "grant select, update, delete on outbox to {standby_role}"
    ))
    .execute(&test.pool)
    .await
    .unwrap();
    // A leader appends each delivery to the log (docs/relay.md).
    sqlx::query(&format!(
        "grant insert on outbox_delivery to {standby_role}"
    ))
    .execute(&test.pool)
    .await
    .unwrap();

    // A leader of another role that stalls with the lock.
    let mut stalled = sqlx::PgConnection::connect(&holder_url).await.unwrap();
    sqlx::query("select pg_advisory_lock($1)")
        .bind(DEFAULT_LOCK_KEY)
        .execute(&mut stalled)
        .await
        .unwrap();
    let standby = test.start_relay_on(
        &standby_url,
        &["--lease", "4s", "--delivery-timeout", "1s"],
        &[],
    );
    wait_for_role(
        &standby,
        "standby",
        "the relay stands by",
        Duration::from_secs(30),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(standby.role().await.as_deref(), Some("standby"));
    let warning = "cannot see the leader's session activity";
    assert_eq!(standby.service.log().matches(warning).count(), 1);

    sqlx::query(&format!(
        "grant pg_read_all_stats, pg_signal_backend to {standby_role}"
    ))
    .execute(&test.pool)
    .await
    .unwrap();
    wait_for_role(
        &standby,
        "leader",
        "the granted standby deposes and leads",
        Duration::from_secs(15),
    )
    .await;
    assert!(
        stalled.ping().await.is_err(),
        "the stalled session was not ended"
    );
    assert_eq!(standby.service.log().matches(warning).count(), 1);

    standby.service.terminate(Duration::from_secs(30)).await;
    for role in [&holder, &standby_role] {
        sqlx::query(&format!("drop owned by {role}"))
            .execute(&test.pool)
            .await
            .unwrap();
        sqlx::query(&format!("drop role {role}"))
            .execute(&test.pool)
            .await
            .unwrap();
    }
}
