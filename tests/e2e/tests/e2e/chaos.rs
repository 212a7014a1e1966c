//! The long, still bounded version: random faults for CHAOS_DURATION
//! (default 10 minutes) under a steady load. Run by `scripts/chaos`.

use std::time::{Duration, Instant};

use e2e::invariants::{check, settle};
use e2e::load::place_orders;
use e2e::pipeline::{Kind, SESSION_TIMEOUT};
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};

fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *seed >> 33
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "long: run with scripts/chaos"]
async fn chaos_random_faults_under_load() {
    let duration = std::env::var("CHAOS_DURATION")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(600), Duration::from_secs);
    let mut seed = u64::from(std::process::id());
    println!("chaos: {duration:?}, seed {seed}");
    let mut pipeline = Pipeline::start(PipelineOptions {
        relays: 2,
        consumers: 2,
        ..PipelineOptions::default()
    })
    .await;
    let started = Instant::now();
    let mut placed = Vec::new();
    let mut round = 0;
    while started.elapsed() < duration {
        round += 1;
        let url = pipeline.order_service.http.clone();
        let load = tokio::spawn(async move { place_orders(&url, 200, 4, round).await });
        tokio::time::sleep(Duration::from_millis(200 + next(&mut seed) % 1_000)).await;
        match next(&mut seed) % 4 {
            0 if !pipeline.relays.is_empty() => {
                pipeline.kill(Kind::Relay, 0).await;
                pipeline.start_relay().await;
            }
            1 if pipeline.consumers.len() > 1 => {
                pipeline.kill(Kind::Inventory, 0).await;
                tokio::time::sleep(SESSION_TIMEOUT + Duration::from_secs(1)).await;
                pipeline.start_consumer().await;
            }
            2 => {
                pipeline.broker.kill().await;
                pipeline.faults += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
                pipeline.broker.restart().await;
            }
            _ => {
                sqlx::query("select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()")
                    .execute(&pipeline.inventory)
                    .await
                    .unwrap();
                pipeline.faults += 1;
            }
        }
        placed.extend(load.await.unwrap());
    }
    settle(&pipeline, &placed, Duration::from_secs(300)).await;
    let outcome = check(&pipeline, &placed, &[]).await;
    report("chaos", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}
