//! What an inspector (the operations console) reads of the outbox: a
//! message's key, and a key's rows and delivery log entries. The table and
//! the log are this crate's (`migrations/outbox`), so their queries are too.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// An outbox row as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub id: Uuid,
    pub event_type: String,
    pub created_at: OffsetDateTime,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub parked_at: Option<OffsetDateTime>,
    pub published_at: Option<OffsetDateTime>,
    pub deferrals: i32,
    pub next_attempt_at: Option<OffsetDateTime>,
}

/// A delivery log entry: a row the relay published, and where to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: Uuid,
    pub event_type: String,
    pub written_at: OffsetDateTime,
    /// The Kafka topic, or the RabbitMQ exchange.
    pub topic: String,
    /// Kafka's position; none for a RabbitMQ confirm.
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub published_at: OffsetDateTime,
}

/// The key (`aggregateid`) of message `id`, from its row or, once the row
/// is gone, from the delivery log.
pub async fn key_of(pool: &PgPool, id: Uuid) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select aggregateid as "aggregateid!" from outbox where id = $1
           union all
           (select aggregateid from outbox_delivery where id = $1 limit 1)
           limit 1"#,
        id,
    )
    .fetch_optional(pool)
    .await
}

/// The rows of one aggregate, in the order they were written.
pub async fn rows(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Vec<Row>, sqlx::Error> {
    sqlx::query_as!(
        Row,
        "select id, type as event_type, created_at, attempts, last_error, parked_at, published_at,
                deferrals, next_attempt_at
         from outbox where aggregatetype = $1 and aggregateid = $2 order by seq",
        aggregate_type,
        aggregate_id,
    )
    .fetch_all(pool)
    .await
}

/// The delivery log of one aggregate, in the order the rows were published.
pub async fn deliveries(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Vec<Delivery>, sqlx::Error> {
    sqlx::query_as!(
        Delivery,
        r#"select id, type as event_type, written_at, topic, partition, "offset", published_at
           from outbox_delivery where aggregatetype = $1 and aggregateid = $2
           order by published_at"#,
        aggregate_type,
        aggregate_id,
    )
    .fetch_all(pool)
    .await
}
