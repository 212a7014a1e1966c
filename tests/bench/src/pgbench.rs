//! pgbench as the baseline: the same SQL transaction, at the same
//! concurrency, with nothing of entrega around it.

use std::time::Duration;

/// Runs `script` with `clients` connections for `duration` against `url`;
/// returns transactions per second.
pub(crate) async fn tps(url: &str, script: &str, clients: u32, duration: Duration) -> f64 {
    let dir =
        std::env::temp_dir().join(format!("entrega-pgbench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("transaction.sql");
    std::fs::write(&file, script).unwrap();
    let output = tokio::process::Command::new("pgbench")
        .args(["--no-vacuum", "--protocol=prepared", "--file"])
        .arg(&file)
        .args([
            "--client",
            &clients.to_string(),
            "--jobs",
            "2",
            "--time",
            &duration.as_secs().to_string(),
        ])
        .arg(url)
        .output()
        .await
        .expect("pgbench runs (Debian package postgresql-client)");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find(|line| line.starts_with("tps = "))
        .and_then(|line| line.split_whitespace().nth(2))
        .and_then(|tps| tps.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench output:\n{stdout}"))
}
