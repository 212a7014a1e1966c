//! One line per scenario, and its record for the summary line.

use std::path::PathBuf;

use crate::invariants::Outcome;

fn results_dir() -> PathBuf {
    let dir = std::env::var_os("E2E_RESULTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Prints the scenario's line and records it.
pub fn report(scenario: &str, outcome: &Outcome) {
    println!(
        "scenario={scenario} orders={} cancelled={} faults={} lost={} double_effects={} order_violations={} status_mismatches={} duplicates_absorbed={} dlt={} back_dlt={}",
        outcome.orders,
        outcome.cancelled,
        outcome.faults,
        outcome.lost,
        outcome.double_effects,
        outcome.order_violations,
        outcome.status_mismatches,
        outcome.duplicates_absorbed,
        outcome.dlt,
        outcome.back_dlt_reasons.values().sum::<usize>()
    );
    let record = serde_json::json!({"scenario": scenario, "outcome": outcome});
    std::fs::write(
        results_dir().join(format!("{scenario}.json")),
        record.to_string(),
    )
    .unwrap();
}

/// Asserts what every scenario must show.
pub fn assert_sound(outcome: &Outcome) {
    assert_eq!(outcome.lost, 0, "orders lost: {outcome:?}");
    assert_eq!(outcome.double_effects, 0, "double effects: {outcome:?}");
    assert_eq!(outcome.order_violations, 0, "order violations: {outcome:?}");
    assert_eq!(
        outcome.status_mismatches, 0,
        "status mismatches: {outcome:?}"
    );
}
