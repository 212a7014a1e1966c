//! Reading the Prometheus text a service serves on `/metrics`.

/// The sum of the values of every sample line that starts with `prefix`
/// (all label sets of a metric); 0 when there is none.
pub fn sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
