//! The one retry helper of the workspace: attempts, waits between them, and
//! cancellation. Every retry goes through it: in the consumer a record's
//! transaction (3 × 1 s by default), a dead letter's publication and the
//! database probe (both until they succeed, with a capped exponential
//! wait); in the relay its reads, sends and elections ([`Backoff`], where
//! the attempts are steps of a loop that does more than retry); and every
//! wait for a broker or database at start-up.

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
    /// Did not come to a verdict: it waited out something outside the
    /// operation (a database that could not be reached) and is to be run
    /// again at once, not counted as an attempt.
    NotCounted,
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
    /// to `max_wait` (never below `first_wait`).
    pub fn forever(first_wait: Duration, max_wait: Duration) -> Self {
        Self {
            retries: None,
            first_wait,
            factor: 2,
            max_wait: max_wait.max(first_wait),
        }
    }

    /// The waits of this policy, for a loop that counts its own failures.
    pub fn backoff(self) -> Backoff {
        Backoff {
            policy: self,
            failures: 0,
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
                Err(AttemptError::NotCounted) => continue,
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
            if !sleep(wait, cancel).await {
                return Err(GaveUp::Cancelled);
            }
            number += 1;
        }
    }
}

/// A policy's waits, one failure at a time, for a loop whose attempts are
/// steps among others (a relay's read, send and mark): each failure asks
/// for the next wait, a success resets it.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    failures: u32,
}

impl Backoff {
    /// The wait after one more failure.
    pub fn next_wait(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.wait_after(self.failures)
    }

    /// After a success: the next failure waits the first wait again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Waits for `interval`'s next tick unless `cancel` fires first; true if it
/// ticked. A periodic task is `while retry::tick(&mut interval, &token).await`.
pub async fn tick(interval: &mut tokio::time::Interval, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = interval.tick() => true,
        () = cancel.cancelled() => false,
    }
}

/// Sleeps for `duration` unless `cancel` fires first; true if it slept.
pub async fn sleep(duration: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(duration) => true,
        () = cancel.cancelled() => false,
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

    #[test]
    fn a_backoff_doubles_up_to_its_ceiling_and_resets() {
        let mut backoff =
            RetryPolicy::forever(Duration::from_millis(100), Duration::from_millis(350)).backoff();
        let waits: Vec<u128> = (0..4).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_millis(100));
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
    async fn an_attempt_not_counted_runs_again_at_once_without_using_the_policy_up() {
        let policy = RetryPolicy::fixed(1, Duration::from_secs(1));
        let calls = Cell::new(0);
        let started = tokio::time::Instant::now();
        let result: Result<(), _> = policy
            .run(&CancellationToken::new(), |n| {
                calls.set(calls.get() + 1);
                let call = calls.get();
                async move {
                    if call <= 3 {
                        Err(AttemptError::NotCounted)
                    } else {
                        Err(AttemptError::Failed(format!("attempt {n}")))
                    }
                }
            })
            .await;
        assert_eq!(
            result,
            Err(GaveUp::Exhausted {
                error: "attempt 2".to_owned(),
                attempts: 2
            })
        );
        assert_eq!(calls.get(), 5, "three not counted, then two attempts");
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "one wait, between the two attempts"
        );
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
