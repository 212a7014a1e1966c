use std::future::Future;
use std::time::Duration;

/// Polls `check` until it returns `Some`, or panics with `what` once
/// `deadline` has passed. The only way tests wait for something to become
/// true: never a bare sleep.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            started.elapsed() < deadline,
            "not within {deadline:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
