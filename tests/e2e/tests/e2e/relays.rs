use std::time::Duration;

use e2e::invariants::{check, settle};
use e2e::load::place_orders_in_background;
use e2e::pipeline::{Kind, RelayMode};
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};
use test_support::eventually::eventually;

/// Locks the pending outbox rows (once there are some), so the relay
/// publishes a batch and then blocks recording it; returns once it blocks
/// there (and tries again when it blocked anywhere else).
/// Killing it then is a kill between publish and record, for certain.
async fn block_the_relay_after_publishing(
    pipeline: &Pipeline,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    loop {
        let mut tx = pipeline.orders.begin().await.unwrap();
        let locked = sqlx::query("select id from outbox where published_at is null for update")
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
        if locked == 0 {
            tx.rollback().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let waiting = eventually("the relay waits on the locked rows", Duration::from_secs(30), || async {
            let waiting: Vec<String> = sqlx::query_scalar(
                "select query from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'",
            )
            .fetch_all(&pipeline.orders)
            .await
            .unwrap();
            (!waiting.is_empty()).then_some(waiting)
        })
        .await;
        // Only a wait to record a published batch is the window this test
        // is after; a relay recording a failed send (a deferral) on the same
        // rows has published nothing, and a kill there re-publishes nothing.
        // (The mark, with the delivery log, is a `with published as (...)`.)
        if waiting.iter().any(|query| {
            query.starts_with("with published as")
                || query.starts_with("update outbox set published_at")
                || query.starts_with("delete from outbox where id = any")
        }) {
            return tx;
        }
        tx.rollback().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_relay_killed_again_and_again_under_load_loses_nothing() {
    relay_killed_again_and_again(RelayMode::Poll, true, "relay_kill_9").await;
}

/// The same with the relay's default: published rows deleted.
#[tokio::test(flavor = "multi_thread")]
async fn the_relay_deleting_published_rows_killed_again_and_again_loses_nothing() {
    relay_killed_again_and_again(RelayMode::Poll, false, "relay_kill_9_delete").await;
}

/// CDC mode: each restart resumes from the slot's confirmed position and
/// re-sends the unconfirmed tail. The relay confirms a batch only after
/// recording it, so the first kill (blocked recording) leaves one for sure.
#[tokio::test(flavor = "multi_thread")]
async fn the_cdc_relay_killed_again_and_again_under_load_loses_nothing() {
    relay_killed_again_and_again(RelayMode::Cdc, false, "cdc_relay_kill_9").await;
}

async fn relay_killed_again_and_again(
    relay_mode: RelayMode,
    retain_published: bool,
    scenario: &str,
) {
    let mut pipeline = Pipeline::start(PipelineOptions {
        retain_published,
        relay_mode,
        ..PipelineOptions::default()
    })
    .await;
    let load = place_orders_in_background(&pipeline.order_service.http, 1_000, 4, 2);

    // First a kill exactly between publishing and recording a batch (in CDC
    // mode also before confirming it). The killed relay's session would
    // still finish its waiting statement once the lock goes (PostgreSQL
    // notices a vanished client only when it writes to it): end that
    // session too, as a crash of the whole host would.
    let lock = block_the_relay_after_publishing(&pipeline).await;
    pipeline.kill(Kind::Relay, 0).await;
    sqlx::query(
        "select pg_terminate_backend(pid) from pg_stat_activity
         where datname = current_database() and wait_event_type = 'Lock'
           and (query like 'with published as%' or query like 'update outbox%'
                or query like 'delete from outbox%')",
    )
    .execute(&pipeline.orders)
    .await
    .unwrap();
    lock.rollback().await.unwrap();
    pipeline.start_relay().await;
    // ...then kills wherever they land.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        pipeline.kill(Kind::Relay, 0).await;
        pipeline.start_relay().await;
    }
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(120)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report(scenario, &outcome);
    assert_sound(&outcome);
    assert!(
        outcome.duplicates_absorbed > 0,
        "no re-published record: the kills did not test what they claim"
    );
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_relays_and_three_consumers_with_rebalances_mid_load() {
    two_relays_and_three_consumers(RelayMode::Poll, "two_relays_three_consumers").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_cdc_relays_and_three_consumers_with_rebalances_mid_load() {
    two_relays_and_three_consumers(RelayMode::Cdc, "two_cdc_relays_three_consumers").await;
}

async fn two_relays_and_three_consumers(relay_mode: RelayMode, scenario: &str) {
    let mut pipeline = Pipeline::start(PipelineOptions {
        relays: 2,
        consumers: 3,
        relay_mode,
        ..PipelineOptions::default()
    })
    .await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 8, 3);

    tokio::time::sleep(Duration::from_secs(1)).await;
    // The leader dies; the standby takes over.
    let mut leader = None;
    for (index, relay) in pipeline.relays.iter().enumerate() {
        if relay.metric("relay_leader").await == Some(1.0) {
            leader = Some(index);
        }
    }
    pipeline.kill(Kind::Relay, leader.unwrap_or(0)).await;
    pipeline.start_relay().await;
    // A fourth consumer joins, then one leaves gracefully: two rebalances.
    pipeline.start_consumer().await;
    pipeline.faults += 1;
    let leaving = pipeline.consumers.remove(0);
    assert_eq!(
        leaving.service.terminate(Duration::from_secs(60)).await,
        Some(0)
    );
    pipeline.faults += 1;
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(120)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report(scenario, &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}
