use std::time::Duration;

use e2e::invariants::{check, settle};
use e2e::load::place_orders_in_background;
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};

/// Terminates every other session on the pool's database.
async fn terminate_sessions(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid()) terminated",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_connections_terminated_mid_load_lose_nothing() {
    let mut pipeline = Pipeline::start(PipelineOptions::default()).await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 4, 9);

    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let orders = terminate_sessions(&pipeline.orders).await;
        let inventory = terminate_sessions(&pipeline.inventory).await;
        assert!(orders + inventory > 0, "no session was there to terminate");
        pipeline.faults += 1;
    }
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("postgres_terminate_backend", &outcome);
    assert_sound(&outcome);
    // The database was back within a second each time: a record dead-lettered
    // here would be a healthy one that drew dead pooled connections.
    assert_eq!(outcome.dlt, 0, "records dead-lettered: {outcome:?}");
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_restart_and_a_postgres_crash_mid_load_lose_nothing() {
    let mut pipeline = Pipeline::start(PipelineOptions {
        own_postgres: true,
        ..PipelineOptions::default()
    })
    .await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 4, 11);

    tokio::time::sleep(Duration::from_secs(1)).await;
    let cluster = pipeline.postgres.as_mut().unwrap();
    cluster.stop().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.restart().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.crash().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.restart().await;
    pipeline.faults += 2;
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("postgres_restart_and_crash", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}
