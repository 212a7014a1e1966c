//! `docker compose up`, proven: the compose file users run, with the local
//! override that swaps each image for its stand-in (compose/README.md),
//! brought up with the Compose tool; orders placed on 127.0.0.1:8080 end
//! CONFIRMED or REJECTED through the whole stack, Prometheus scrapes every
//! service, no service is connected to PostgreSQL as a superuser or as the
//! databases' owner, and the stack comes down with its volumes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use e2e::load::place_orders;
use test_support::eventually::eventually;
use test_support::process::free_port;

const ORDER_API: &str = "http://127.0.0.1:8080";
const INVENTORY_API: &str = "http://127.0.0.1:8081";
const PROMETHEUS: &str = "http://127.0.0.1:9090";
/// The password of the stack's database roles.
const DB_PASSWORD: &str = "compose-test-password";

fn compose_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../compose")
}

/// The stack of one run, under a project name of its own; brought down
/// (containers, network, volumes) when dropped, pass or fail.
struct Stack {
    project: String,
    postgres_port: u16,
}

impl Stack {
    fn compose(&self, args: &[&str]) -> Output {
        let dir = compose_dir();
        let tool = std::env::var("ENTREGA_COMPOSE").unwrap_or_else(|_| "docker-compose".to_owned());
        let output = Command::new(&tool)
            .current_dir(&dir)
            .args([
                "-p",
                &self.project,
                "-f",
                "docker-compose.yml",
                "-f",
                "docker-compose.local.yml",
            ])
            .args(args)
            // The machine's own PostgreSQL may hold 5432 on loopback.
            .env("ENTREGA_POSTGRES_PORT", self.postgres_port.to_string())
            .env("INVENTORY_ADMIN_TOKEN", test_support::ADMIN_TOKEN)
            .env("ENTREGA_DB_PASSWORD", DB_PASSWORD)
            .output()
            .unwrap_or_else(|e| panic!("{tool} runs (scripts/docker up installs it): {e}"));
        print!("{}", String::from_utf8_lossy(&output.stdout));
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        output
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.compose(&["down", "--volumes", "--timeout", "20"]);
    }
}

async fn json(url: &str) -> Option<serde_json::Value> {
    reqwest::get(url).await.ok()?.json().await.ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compose_stack_reserves_orders_and_prometheus_scrapes_every_service() {
    let stack = Stack {
        project: format!(
            "entrega-test-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        postgres_port: free_port(),
    };
    let up = stack.compose(&["up", "--detach", "--no-build"]);
    assert!(up.status.success(), "docker-compose up failed");
    stack.compose(&["ps"]);

    eventually(
        "the order service is ready",
        Duration::from_secs(180),
        || async {
            reqwest::get(format!("{ORDER_API}/readyz"))
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
    let client = reqwest::Client::new();
    for sku in ["ABC-1", "XYZ-9", "DEF-2", "LOW-1"] {
        let available = if sku == "LOW-1" { 30 } else { 100_000 };
        eventually(
            &format!("stock of {sku} is set"),
            Duration::from_secs(120),
            || {
                let client = client.clone();
                async move {
                    client
                        .put(format!("{INVENTORY_API}/stock/{sku}"))
                        .bearer_auth(test_support::ADMIN_TOKEN)
                        .json(&serde_json::json!({"available": available}))
                        .send()
                        .await
                        .ok()
                        .filter(|r| r.status().is_success())
                }
            },
        )
        .await;
    }

    let placed = place_orders(ORDER_API, 100, 8, 17).await;
    let statuses = eventually(
        "every order is CONFIRMED or REJECTED",
        Duration::from_secs(180),
        || async {
            let mut statuses = Vec::with_capacity(placed.len());
            for order in &placed {
                let body = json(&format!("{ORDER_API}/orders/{}", order.id)).await?;
                let status = body["status"].as_str()?.to_owned();
                if status == "PENDING" {
                    return None;
                }
                statuses.push(status);
            }
            Some(statuses)
        },
    )
    .await;
    let confirmed = statuses.iter().filter(|s| *s == "CONFIRMED").count();
    let rejected = statuses.iter().filter(|s| *s == "REJECTED").count();
    assert_eq!(confirmed + rejected, placed.len(), "statuses: {statuses:?}");
    assert!(
        confirmed > 0 && rejected > 0,
        "both outcomes: {confirmed} confirmed, {rejected} rejected"
    );

    let jobs = [
        "order-service",
        "outbox-relay",
        "inventory-relay",
        "inventory-service",
    ];
    let targets = eventually(
        "Prometheus scrapes every service",
        Duration::from_secs(60),
        || async {
            let body = json(&format!("{PROMETHEUS}/api/v1/targets")).await?;
            let active = body["data"]["activeTargets"].as_array()?.clone();
            let up: Vec<String> = active
                .iter()
                .filter(|t| t["health"] == "up")
                .filter_map(|t| t["labels"]["job"].as_str().map(str::to_owned))
                .collect();
            jobs.iter()
                .all(|job| up.iter().any(|u| u == job))
                .then_some(active)
        },
    )
    .await;
    // Who is connected: every session of the stack's services is a role of
    // its own, none a superuser or the owner (which only migrated).
    let sessions = stack.compose(&[
        "exec",
        "-T",
        "postgres",
        "psql",
        "-U",
        "postgres",
        "-d",
        "postgres",
        "-At",
        "-c",
        "select distinct a.usename || ' ' || r.rolsuper from pg_stat_activity a \
         join pg_roles r on r.rolname = a.usename \
         where a.datname in ('orders', 'inventory') and a.backend_type = 'client backend' \
         and a.pid <> pg_backend_pid() order by 1",
    ]);
    let sessions = String::from_utf8_lossy(&sessions.stdout).into_owned();
    let sessions: Vec<&str> = sessions.lines().collect();
    assert_eq!(
        sessions,
        [
            "inventory_service false",
            "order_service false",
            "outbox_relay false"
        ],
        "the services' sessions"
    );
    // The roles and grants, as an operator would look at them.
    for database in ["orders", "inventory"] {
        stack.compose(&[
            "exec", "-T", "postgres", "psql", "-U", "postgres", "-d", database, "-c", "\\du", "-c",
            "\\dp",
        ]);
    }
    println!(
        "compose: orders={} confirmed={confirmed} rejected={rejected} prometheus_targets_up={}",
        placed.len(),
        targets.iter().filter(|t| t["health"] == "up").count()
    );
}
