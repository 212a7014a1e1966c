//! The one retry helper: attempts, waits between them, and cancellation.
//! Every retry in the consumer goes through it: a record's transaction
//! (3 × 1 s by default), a dead letter's publication and the database
//! probe (both until they succeed, with a capped exponential wait).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often and how far apart to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts after the first; `None` tries until success or cancellation.
    pub retries: Option<u32>,
    /// Wait before the first retry.
    pub first_wait: Duration,
    /// Each wait is the previous one times this (1: a fixed wait)...
    pub factor: u32,
    /// ...up to this.
    pub max_wait: Duration,
}

/// Why a retried operation gave up.
#[derive(Debug, PartialEq, Eq)]
pub enum GaveUp<E> {
    /// Every attempt failed; the last error, and how many attempts there were.
    Exhausted { error: E, attempts: u32 },
    /// The token was cancelled before an attempt succeeded.
    Cancelled,
}

/// How one attempt ended, when it did not succeed.
#[derive(Debug, PartialEq, Eq)]
pub enum AttemptError<E> {
    /// Failed: worth another attempt, if the policy allows one.
    Failed(E),
    /// Stopped by cancellation while it waited for something.
    Cancelled,
}

impl RetryPolicy {
    /// `retries` more attempts after the first, `wait` apart.
    pub fn fixed(retries: u32, wait: Duration) -> Self {
        Self {
            retries: Some(retries),
            first_wait: wait,
            factor: 1,
            max_wait: wait,
        }
    }

    /// Until success, waiting `first_wait`, then twice as long each time, up
    /// to `max_wait`.
    pub fn forever(first_wait: Duration, max_wait: Duration) -> Self {
        Self {
            retries: None,
            first_wait,
            factor: 2,
            max_wait,
        }
    }

    /// The wait after failed attempt number `attempt` (1-based).
    pub fn wait_after(&self, attempt: u32) -> Duration {
        let growth = self.factor.saturating_pow(attempt.saturating_sub(1));
        self.first_wait.saturating_mul(growth).min(self.max_wait)
    }

    /// Runs `attempt` (given its 1-based number) until it succeeds, the
    /// policy runs out, or `cancel` fires. A cancelled token stops before the
    /// next attempt and during waits; an attempt already running is not
    /// interrupted, so a transaction in flight ends by itself.
    pub async fn run<T, E, F, Fut>(
        &self,
        cancel: &CancellationToken,
        mut attempt: F,
    ) -> Result<T, GaveUp<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, AttemptError<E>>>,
        E: std::fmt::Display,
    {
        let mut number = 1;
        loop {
            if cancel.is_cancelled() {
                return Err(GaveUp::Cancelled);
            }
            let error = match attempt(number).await {
                Ok(value) => return Ok(value),
                Err(AttemptError::Cancelled) => return Err(GaveUp::Cancelled),
                Err(AttemptError::Failed(error)) => error,
            };
            if self.retries.is_some_and(|retries| number > retries) {
                return Err(GaveUp::Exhausted {
                    error,
                    attempts: number,
                });
            }
            let wait = self.wait_after(number);
            tracing::warn!(attempt = number, retry_in = ?wait, error.message = %error, "attempt failed; retrying");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = cancel.cancelled() => return Err(GaveUp::Cancelled),
            }
            number += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn waits_grow_to_their_cap() {
        let fixed = RetryPolicy::fixed(3, Duration::from_secs(1));
        assert_eq!(fixed.wait_after(1), Duration::from_secs(1));
        assert_eq!(fixed.wait_after(3), Duration::from_secs(1));
        let forever = RetryPolicy::forever(Duration::from_millis(250), Duration::from_secs(5));
        let waits: Vec<u128> = (1..=7).map(|n| forever.wait_after(n).as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(forever.wait_after(u32::MAX), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn three_retries_mean_four_attempts_then_the_last_error() {
        let policy = RetryPolicy::fixed(3, Duration::from_secs(1));
        let calls = Cell::new(0);
        let started = tokio::time::Instant::now();
        let result: Result<(), _> = policy
            .run(&CancellationToken::new(), |n| {
                calls.set(calls.get() + 1);
                async move { Err(AttemptError::Failed(format!("failure {n}"))) }
            })
            .await;
        assert_eq!(
            result,
            Err(GaveUp::Exhausted {
                error: "failure 4".to_owned(),
                attempts: 4
            })
        );
        assert_eq!(calls.get(), 4);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn success_after_failures_returns_the_value() {
        let policy = RetryPolicy::forever(Duration::from_millis(100), Duration::from_secs(1));
        let result = policy
            .run(&CancellationToken::new(), |n| async move {
                if n < 5 {
                    Err(AttemptError::Failed("not yet"))
                } else {
                    Ok(n)
                }
            })
            .await;
        assert_eq!(result, Ok(5));
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_stops_the_wait_and_the_next_attempt() {
        let policy = RetryPolicy::fixed(3, Duration::from_secs(60));
        let cancel = CancellationToken::new();
        let calls = Cell::new(0);
        let canceller = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                cancel.cancel();
            })
        };
        let result: Result<(), GaveUp<&str>> = policy
            .run(&cancel, |_| {
                calls.set(calls.get() + 1);
                async { Err(AttemptError::Failed("failed")) }
            })
            .await;
        canceller.await.unwrap();
        assert_eq!(result, Err(GaveUp::Cancelled));
        assert_eq!(calls.get(), 1);
    }
}
