//! Retention of `mensagem_processada`: a row may go once its message can no
//! longer arrive, i.e. after the topic's retention plus the redrive window.
//! Deleting earlier would let a late redelivery or a redrive apply twice.

use std::time::Duration;

use rdkafka::ClientConfig;
use sqlx::PgPool;

use crate::config::RetentionArgs;
use crate::inventory;
use idempotent_consumer::topics;

const BATCH: i64 = 5_000;

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(
        "retention {retention} is shorter than the topic's retention ({topic_retention}) plus the redrive window \
         ({redrive_window}): a message redelivered or redriven after that would be applied twice; \
         use a longer --retention, or --force-retention if you accept that"
    )]
    TooShort {
        retention: String,
        topic_retention: String,
        redrive_window: String,
    },
    #[error(
        "the topic keeps records forever (retention.ms=-1), so no retention of processed rows is safe; \
         use --force-retention if you accept that"
    )]
    TopicKeepsForever,
    #[error(transparent)]
    Topic(#[from] topics::TopicError),
    #[error("deleting processed rows failed")]
    Database(#[from] sqlx::Error),
}

fn human(duration: Duration) -> String {
    format!("{} h", duration.as_secs() / 3_600)
}

/// Refuses a retention that is not safe for `topic`, unless forced.
pub async fn check(
    kafka: &ClientConfig,
    topic: &str,
    args: &RetentionArgs,
) -> Result<(), RetentionError> {
    if args.force_retention {
        return Ok(());
    }
    let Some(topic_retention) = topics::retention(kafka, topic).await? else {
        return Err(RetentionError::TopicKeepsForever);
    };
    if args.retention < topic_retention + args.redrive_window {
        return Err(RetentionError::TooShort {
            retention: human(args.retention),
            topic_retention: human(topic_retention),
            redrive_window: human(args.redrive_window),
        });
    }
    Ok(())
}

/// Deletes expired rows in batches; returns how many went.
pub async fn run_once(pool: &PgPool, retention: Duration) -> Result<u64, RetentionError> {
    let deleted = inventory::delete_processed_before(pool, retention, BATCH).await?;
    metrics::counter!("retention_deleted_total").increment(deleted);
    Ok(deleted)
}
