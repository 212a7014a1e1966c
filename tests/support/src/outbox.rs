//! Outbox rows compared column by column: for writers whose own statement
//! inserts their rows, beside what `outbox::insert` writes.

use sqlx::PgPool;
use uuid::Uuid;

/// Asserts that the outbox rows `a` and `b` hold the same values in every
/// column but their identity and time (`id`, `seq`, `created_at`).
pub async fn assert_rows_alike(pool: &PgPool, a: Uuid, b: Uuid) {
    let rows: Vec<String> = sqlx::query_scalar(
        "select (to_jsonb(o) - 'id' - 'seq' - 'created_at')::text from outbox o
         where id = any($1) order by seq",
    )
    .bind([a, b])
    .fetch_all(pool)
    .await
    .expect("the outbox rows are read");
    assert_eq!(rows.len(), 2, "rows {a} and {b}: {rows:?}");
    assert_eq!(rows[0], rows[1], "rows {a} and {b} differ");
}
