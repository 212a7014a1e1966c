//! What can be validated of compose/ without a Docker engine: the YAML
//! parses and references only files that exist, promtool accepts the alert
//! rules, the dashboard parses, and every metric the rules and the dashboard
//! name is exported by a running service.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::invariants::settle;
use e2e::load::place_orders;
use e2e::{Pipeline, PipelineOptions};

fn compose_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../compose")
}

fn yaml(path: &Path) -> serde_yaml::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()))
}

/// Host paths the compose file mounts or builds from, relative to compose/.
fn referenced_files(compose: &serde_yaml::Value) -> Vec<String> {
    let mut files = Vec::new();
    for (_, service) in compose["services"].as_mapping().unwrap() {
        if let Some(build) = service.get("build") {
            let context = build["context"].as_str().unwrap_or(".");
            files.push(context.to_owned());
            if let Some(dockerfile) = build["dockerfile"].as_str() {
                files.push(format!("{context}/{dockerfile}"));
            }
        }
        for volume in service
            .get("volumes")
            .and_then(|v| v.as_sequence())
            .into_iter()
            .flatten()
        {
            let host = volume.as_str().unwrap().split(':').next().unwrap();
            if host.starts_with('.') {
                files.push(host.to_owned());
            }
        }
    }
    files
}

#[test]
fn the_compose_file_parses_and_references_only_files_that_exist() {
    let compose = yaml(&compose_dir().join("docker-compose.yml"));
    let files = referenced_files(&compose);
    assert!(files.iter().any(|f| f.ends_with("Dockerfile")), "{files:?}");
    for file in files {
        assert!(
            compose_dir().join(&file).exists(),
            "compose references {file}, which does not exist"
        );
    }
    for service in [
        "postgres",
        "kafka",
        "topic-init",
        "order-service",
        "outbox-relay",
        "inventory-service",
        "connect",
        "prometheus",
        "grafana",
    ] {
        assert!(
            compose["services"].get(service).is_some(),
            "no service {service}"
        );
    }
    assert_eq!(compose["services"]["outbox-relay"]["profiles"][0], "relay");
    assert_eq!(compose["services"]["connect"]["profiles"][0], "debezium");
    yaml(&compose_dir().join("prometheus/prometheus.yml"));
    yaml(&compose_dir().join("grafana/provisioning/datasources/prometheus.yml"));
    yaml(&compose_dir().join("grafana/provisioning/dashboards/entrega.yml"));
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let promtool = std::env::var("ENTREGA_PROMTOOL")
        .expect("ENTREGA_PROMTOOL is set: run the tests through scripts/test");
    let output = std::process::Command::new(promtool)
        .args(["check", "rules"])
        .arg(compose_dir().join("prometheus/alerts.yml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// PromQL words that are not metric names.
const PROMQL: &[&str] = &[
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "by",
    "without",
    "rate",
    "increase",
    "irate",
    "histogram_quantile",
    "absent",
    "or",
    "and",
    "unless",
    "on",
    "le",
    "offset",
    "bool",
    "up",
];

/// Metric names in a PromQL expression: identifiers outside braces, ranges,
/// quotes and `by (...)` label lists that are not PromQL words or numbers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut depth = 0;
    let mut in_quote = false;
    let mut in_labels = false;
    let mut last_word = String::new();
    let mut word = String::new();
    let mut flush = |word: &mut String, depth: i32, in_labels: bool, last_word: &mut String| {
        if depth == 0
            && !in_labels
            && !word.is_empty()
            && !word.starts_with(|c: char| c.is_ascii_digit())
            && !PROMQL.contains(&word.as_str())
        {
            names.insert(word.clone());
        }
        if !word.is_empty() {
            *last_word = std::mem::take(word);
        }
    };
    for c in expr.chars() {
        match c {
            '"' => in_quote = !in_quote,
            _ if in_quote => {}
            '(' if matches!(last_word.as_str(), "by" | "without") && word.is_empty() => {
                in_labels = true
            }
            ')' if in_labels => {
                word.clear();
                in_labels = false;
                last_word.clear();
            }
            '{' | '[' => {
                flush(&mut word, depth, in_labels, &mut last_word);
                depth += 1;
            }
            '}' | ']' => depth -= 1,
            c if c.is_ascii_alphanumeric() || c == '_' || c == ':' => word.push(c),
            _ => flush(&mut word, depth, in_labels, &mut last_word),
        }
    }
    flush(&mut word, depth, in_labels, &mut last_word);
    names
}

fn referenced_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let rules = yaml(&compose_dir().join("prometheus/alerts.yml"));
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            names.extend(metric_names(rule["expr"].as_str().unwrap()));
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(compose_dir().join("grafana/dashboards/entrega.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            names.extend(metric_names(target["expr"].as_str().unwrap()));
        }
    }
    names
}

#[test]
fn metric_names_are_read_from_expressions() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(relay_batch_publish_duration_seconds_bucket{job="x"}[1m])))"#
        ),
        BTreeSet::from(["relay_batch_publish_duration_seconds_bucket".to_owned()])
    );
    assert_eq!(
        metric_names(r#"up{job="outbox-relay"} == 0 or absent(up{job="outbox-relay"})"#),
        BTreeSet::new()
    );
    assert_eq!(
        metric_names("sum by (reason, partition) (increase(consumer_dlt_total[5m])) > 0"),
        BTreeSet::from(["consumer_dlt_total".to_owned()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_rules_and_dashboard_name_is_exported() {
    let referenced = referenced_metrics();
    assert!(referenced.len() >= 10, "{referenced:?}");
    // CDC mode: its relay exports poll mode's metrics and the slot's.
    let pipeline = Pipeline::start(PipelineOptions {
        relay_mode: e2e::pipeline::RelayMode::Cdc,
        ..PipelineOptions::default()
    })
    .await;
    let placed = place_orders(&pipeline.order_service.http, 20, 4, 12).await;
    settle(&pipeline, &placed, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(11)).await; // one lag and backlog sample

    let mut exported = String::new();
    for running in [
        &pipeline.order_service,
        &pipeline.relays[0],
        &pipeline.consumers[0],
    ] {
        exported += &reqwest::get(format!("{}/metrics", running.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
    }
    let exported_names: BTreeSet<&str> = exported
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = referenced
        .iter()
        .filter(|name| !exported_names.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "named in compose/ but exported by no service: {missing:?}"
    );
    pipeline.stop().await;
}

/// docs/configuration.md is generated from the binaries' --help
/// (scripts/configuration-reference): every variable a binary reads is in it.
#[test]
fn the_configuration_reference_names_every_variable() {
    let reference = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md"),
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let bin_dir = exe.parent().and_then(Path::parent).unwrap();
    for binary in [
        "order-service",
        "outbox-relay",
        "inventory-service",
        "entrega",
    ] {
        let output = std::process::Command::new(bin_dir.join(binary))
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        let variables: Vec<&str> = help
            .split("[env: ")
            .skip(1)
            // `[env: NAME=value]`, or `[env: NAME]` for a variable whose
            // value --help hides (it may hold a secret).
            .filter_map(|rest| rest.split(['=', ']']).next())
            .collect();
        assert!(!variables.is_empty(), "{binary} --help names no variable");
        for variable in variables {
            assert!(
                reference.contains(&format!("[env: {variable}="))
                    || reference.contains(&format!("[env: {variable}]")),
                "docs/configuration.md lacks {variable} of {binary}: run scripts/configuration-reference"
            );
        }
    }
}
