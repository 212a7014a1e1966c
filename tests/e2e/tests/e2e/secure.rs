//! Against a broker as managed Kafka offers it: SASL/SCRAM-SHA-512 over TLS
//! with hostname verification (a private tansu with `--authentication`
//! behind a TLS-terminating proxy, the run's own CA). The pipeline runs
//! whole over it; and each way a client can be turned away ends start-up
//! within a bound, with an error that names the cause.

use std::time::{Duration, Instant};

use e2e::invariants::{check, settle};
use e2e::load::place_orders;
use e2e::pipeline::{BACK_DLT, BACK_TOPIC, DLT, PARTITIONS, SecureSetup, TOPIC, binary};
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};
use test_support::database::TestDatabase;
use test_support::kafka::create_topic;
use test_support::tls::TlsProxy;

#[tokio::test(flavor = "multi_thread")]
async fn over_sasl_ssl_every_service_is_ready_and_every_order_gets_exactly_one_outcome() {
    let pipeline = Pipeline::start(PipelineOptions {
        secure: true,
        ..PipelineOptions::default()
    })
    .await;
    let services = [&pipeline.order_service]
        .into_iter()
        .chain(&pipeline.relays)
        .chain(&pipeline.consumers)
        .chain(&pipeline.inventory_relays);
    for service in services {
        service.wait_for("/readyz").await;
    }

    let placed = place_orders(&pipeline.order_service.http, 300, 8, 1).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;
    let outcome = check(&pipeline, &placed, &[]).await;
    report("sasl_ssl", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}

/// How a service ended: its exit status, what it printed, how long it took.
struct Ended {
    /// Still running after 90 s, then stopped.
    hung: bool,
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// Runs `name` with `args` and `envs` until it exits; one still running
/// after 90 s is stopped and reported as hung.
async fn run_to_exit(name: &str, args: &[&str], envs: &[(&str, String)]) -> Ended {
    run_for(name, args, envs, Duration::from_secs(90)).await
}

/// [`run_to_exit`], stopping it after `limit`.
async fn run_for(name: &str, args: &[&str], envs: &[(&str, String)], limit: Duration) -> Ended {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary(name))
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "warn,librdkafka=info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Read both pipes while it runs: a full pipe would block its logging.
    let read = |pipe: Option<_>| {
        tokio::spawn(async move {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut text).await;
            }
            text
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    );
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => Some(status.unwrap()),
        Err(_) => {
            child.kill().await.unwrap();
            None
        }
    };
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout.await.unwrap()),
        String::from_utf8_lossy(&stderr.await.unwrap())
    );
    Ended {
        hung: status.is_none(),
        code: status.and_then(|status| status.code()),
        stderr: printed,
        took: started.elapsed(),
    }
}

/// The last lines a service printed, its own (librdkafka repeats itself).
fn tail(printed: &str) -> String {
    let lines: Vec<&str> = printed
        .lines()
        .filter(|line| !line.contains("librdkafka:"))
        .collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_ca_password_plaintext_client_or_expired_certificate_ends_start_up_naming_the_cause()
 {
    let setup = SecureSetup::start().await;
    for topic in [TOPIC, DLT, BACK_TOPIC, BACK_DLT] {
        create_topic(&setup.broker.bootstrap, topic, PARTITIONS).await;
    }
    // The expired certificate: a second proxy in front of the same broker.
    let expired = TlsProxy::bind().await;
    let expired_bootstrap = format!("localhost:{}", expired.address.port());
    let upstream = setup.broker.broker.address.parse().unwrap();
    let _expired = expired.start(upstream, &setup.ca.expired);
    let wrong_password = setup.ca.dir().join("wrong-password");
    std::fs::write(&wrong_password, "not-the-password\n").unwrap();

    let good = setup.service_env();
    let with = |key: &'static str, value: String| {
        let mut env: Vec<(&'static str, String)> =
            good.iter().filter(|(k, _)| *k != key).cloned().collect();
        env.push((key, value));
        env
    };
    // (case, bootstrap, environment, what the error must say)
    type Case = (
        &'static str,
        String,
        Vec<(&'static str, String)>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "wrong CA",
            setup.broker.bootstrap.clone(),
            with(
                "KAFKA_SSL_CA_LOCATION",
                setup.ca.other_ca.display().to_string(),
            ),
            "certificate verify failed",
        ),
        (
            "wrong password",
            setup.broker.bootstrap.clone(),
            with(
                "KAFKA_SASL_PASSWORD_FILE",
                wrong_password.display().to_string(),
            ),
            "SASL authentication error",
        ),
        (
            // librdkafka sees only connections closed at its first request;
            // the start-up check asks the port whether it speaks TLS.
            "plaintext client",
            setup.broker.bootstrap.clone(),
            Vec::new(),
            "speaks TLS and this client does not",
        ),
        (
            "expired certificate",
            expired_bootstrap,
            good.clone(),
            // librdkafka does not say why verification failed.
            "certificate verify failed",
        ),
    ];
    let server = std::env::var("INVENTORY_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inventory".to_owned());
    let runs = cases.into_iter().map(|(case, bootstrap, env, cause)| {
        let server = server.clone();
        async move {
            let database = TestDatabase::create(&server, "e2e_refused").await;
            let url = database.url();
            let consumer = run_to_exit(
                "inventory-service",
                &[
                    "--database-url",
                    &url,
                    "--bootstrap-servers",
                    &bootstrap,
                    "--http-addr",
                    "127.0.0.1:0",
                ],
                &env,
            )
            .await;
            // The inventory service's migrations made the outbox this
            // relay reads.
            let relay = run_to_exit(
                "outbox-relay",
                &[
                    "--database-url",
                    &url,
                    "--bootstrap-servers",
                    &bootstrap,
                    "--topics",
                    BACK_TOPIC,
                    "--http-addr",
                    "127.0.0.1:0",
                ],
                &env,
            )
            .await;
            (case, cause, consumer, relay)
        }
    });
    let mut failures = Vec::new();
    for (case, cause, consumer, relay) in futures::future::join_all(runs).await {
        for (service, ended) in [("inventory-service", consumer), ("outbox-relay", relay)] {
            let shown = ended
                .stderr
                .lines()
                .rfind(|line| line.contains("refused this client"))
                .unwrap_or("(no refusal)")
                .trim()
                .to_owned();
            println!(
                "refused case=\"{case}\" service={service} hung={} exit={:?} took_ms={} error={shown}",
                ended.hung,
                ended.code,
                ended.took.as_millis()
            );
            // The whole of what it printed, for a failure's reader.
            let log = std::env::temp_dir()
                .join(format!("refused-{}-{service}.log", case.replace(' ', "-")));
            let _ = std::fs::write(&log, &ended.stderr);
            if ended.hung || ended.code == Some(0) || !ended.stderr.contains(cause) {
                failures.push(format!(
                    "{case}, {service}: expected \"{cause}\":\n{}",
                    tail(&ended.stderr)
                ));
            }
            if ended.stderr.contains(&setup.broker.password) {
                failures.push(format!("{case}, {service}: the password was printed"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// PostgreSQL that lets in only TLS: every service connects with
/// `sslmode=verify-full` against the run's CA, the relays stream the WAL
/// (CDC) over TLS too, and the pipeline's invariants hold. A client that
/// trusts another CA, or asks for no TLS, is turned away at start-up.
#[tokio::test(flavor = "multi_thread")]
async fn over_postgresql_tls_with_verify_full_the_pipeline_and_its_cdc_relays_work() {
    let pipeline = Pipeline::start(PipelineOptions {
        own_postgres: true,
        postgres_tls: true,
        relay_mode: e2e::pipeline::RelayMode::Cdc,
        ..PipelineOptions::default()
    })
    .await;
    let placed = place_orders(&pipeline.order_service.http, 200, 8, 1).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;
    let outcome = check(&pipeline, &placed, &[]).await;
    report("postgres_tls_cdc", &outcome);
    assert_sound(&outcome);

    let cluster = pipeline.postgres.as_ref().unwrap();
    let ca = cluster.ca().unwrap();
    let url = cluster.url("postgres");
    let cases = [
        (
            "another CA",
            url.replace(
                &ca.ca.display().to_string(),
                &ca.other_ca.display().to_string(),
            ),
            "certificate",
        ),
        (
            "no TLS",
            url.replace("sslmode=verify-full", "sslmode=disable"),
            "no encryption",
        ),
    ];
    for (case, url, cause) in cases {
        let ended = run_to_exit(
            "order-service",
            &["--http-addr", "127.0.0.1:0", "--no-status-consumer"],
            &[("ORDER_DATABASE_URL", url)],
        )
        .await;
        println!(
            "refused case=\"{case}\" service=order-service exit={:?} took_ms={}",
            ended.code,
            ended.took.as_millis()
        );
        assert_ne!(ended.code, Some(0), "{case}: {}", ended.stderr);
        assert!(
            ended.stderr.contains(cause),
            "{case}: expected \"{cause}\":\n{}",
            ended.stderr
        );
    }
    pipeline.stop().await;
}
