//! `<service> retention`: the dedupe table's retention, run once by an
//! operator (its options are [`consumer_args!`](crate::consumer_args)'s).
//! The rule and the purge are the engine's ([`idempotent_consumer::processed`]).

use idempotent_consumer::{Retention, RetentionError, processed};
use rdkafka::ClientConfig;
use sqlx::PgPool;

/// `<service> retention`: refuses a window that is not safe for `topic`,
/// then deletes `consumer`'s expired rows once; returns how many went.
pub async fn run(
    kafka: &ClientConfig,
    topic: &str,
    pool: &PgPool,
    consumer: &str,
    retention: Retention,
) -> Result<u64, RetentionError> {
    retention.check(kafka, topic).await?;
    processed::purge(pool, consumer, retention.keep).await
}
