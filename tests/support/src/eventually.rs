use std::future::Future;
use std::time::Duration;

/// Polls `check` until it returns `Some`, or panics with `what` once
/// `deadline` has passed. The only way tests wait for something to become
/// true: never a bare sleep.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(deadline, check)
        .await
        .unwrap_or_else(|| panic!("not within {deadline:?}: {what}"))
}

/// Polls `check` until it returns `Some`; `None` once `deadline` has
/// passed, for a caller that explains the failure before it fails.
pub async fn within<T, F, Fut>(deadline: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if started.elapsed() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
