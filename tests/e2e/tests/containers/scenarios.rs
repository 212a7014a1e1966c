//! The local suite's invariants and figure line, with the infrastructure
//! in containers and the faults done the container way: `docker stop` and
//! `docker start` of the broker and of PostgreSQL. The services run as
//! processes on the host, against the containers on loopback.

use std::time::Duration;

use e2e::invariants::{check, settle};
use e2e::load::{place_orders, place_orders_in_background};
use e2e::pipeline::RelayMode;
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};

fn in_containers() -> PipelineOptions {
    PipelineOptions {
        containers: true,
        ..PipelineOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn in_containers_every_order_gets_exactly_one_outcome() {
    let pipeline = Pipeline::start(in_containers()).await;

    let placed = place_orders(&pipeline.order_service.http, 300, 8, 1).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("containers_happy_path", &outcome);
    assert_sound(&outcome);
    assert_eq!(outcome.dlt, 0);
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_containers_a_broker_container_stopped_and_killed_loses_nothing() {
    let mut pipeline = Pipeline::start(in_containers()).await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 4, 8);

    pipeline.stop_then_kill_the_broker().await;
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("containers_broker_restart", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}

/// With the relays in CDC mode: their slots live in the container's
/// PostgreSQL, and must survive its restart.
#[tokio::test(flavor = "multi_thread")]
async fn in_containers_a_postgres_container_restarted_under_cdc_relays_loses_nothing() {
    let mut pipeline = Pipeline::start(PipelineOptions {
        relay_mode: RelayMode::Cdc,
        ..in_containers()
    })
    .await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 4, 11);

    tokio::time::sleep(Duration::from_secs(2)).await;
    pipeline
        .postgres_container
        .as_mut()
        .unwrap()
        .restart()
        .await;
    pipeline.faults += 1;
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("containers_postgres_restart_cdc", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}
