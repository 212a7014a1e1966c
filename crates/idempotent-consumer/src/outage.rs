//! Waiting out a database that cannot be reached. Such a failure is not the
//! records' fault: the attempt waits until the database answers again and
//! is run again, not counted ([`AttemptError::NotCounted`]), however long
//! the outage lasts. Unless the run keeps failing that way while the
//! database answers: then the failure is the records' after all.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tokio_util::sync::CancellationToken;

use crate::database::Database;
use crate::failure::DatabaseFailure;
use service_support::retry::AttemptError;

/// A run that fails as "unavailable" this many times in a row, each time
/// right after the database answered the probe, is failing for a reason of
/// its own (a record that exceeds a server limit, class 53, or breaks the
/// protocol, 08P01): from then on the failure counts as an attempt, so the
/// record ends in the DLT instead of holding its partition for ever.
const UNAVAILABLE_WHILE_ANSWERING: u32 = 5;

/// What one run's attempts have seen of the database.
#[derive(Debug, Default)]
pub(crate) struct Outages {
    /// An outage was waited out: every pooled connection may be dead.
    waited: AtomicBool,
    /// Failures as "unavailable" right after the database answered.
    while_answering: AtomicU32,
}

impl Outages {
    /// Whether attempt number `attempt` must draw a connection that answers:
    /// a retry, or any attempt after an outage (after a database restart
    /// every pooled connection is dead).
    pub(crate) fn need_live_connection(&self, attempt: u32) -> bool {
        attempt > 1 || self.waited.load(Ordering::Relaxed)
    }

    /// Judges a failed attempt: an unavailable database is reported and
    /// waited for (`NotCounted`, or `Cancelled`); anything else, and an
    /// "unavailable" that persists while the database answers, is the
    /// records' failure (`Failed`).
    pub(crate) async fn judge(
        &self,
        database: &Database,
        error: sqlx::Error,
        cancel: &CancellationToken,
    ) -> AttemptError<sqlx::Error> {
        let while_answering = self.while_answering.load(Ordering::Relaxed);
        match DatabaseFailure::of(&error) {
            DatabaseFailure::Unavailable if while_answering >= UNAVAILABLE_WHILE_ANSWERING => {
                tracing::warn!(error.message = %error, failed_after_an_answer = while_answering,
                    "the run keeps failing as \"unavailable\" while the database answers: blamed on the records");
                self.while_answering.store(0, Ordering::Relaxed);
                AttemptError::Failed(error)
            }
            DatabaseFailure::Unavailable => {
                database.report_unavailable(&error);
                if database.wait_until_available(cancel).await.is_err() {
                    return AttemptError::Cancelled;
                }
                self.waited.store(true, Ordering::Relaxed);
                self.while_answering.fetch_add(1, Ordering::Relaxed);
                AttemptError::NotCounted
            }
            DatabaseFailure::MessageScoped => {
                self.while_answering.store(0, Ordering::Relaxed);
                AttemptError::Failed(error)
            }
        }
    }
}
