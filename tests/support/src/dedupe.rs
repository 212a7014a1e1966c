//! Rows of the idempotent consumer's dedupe table (`mensagem_processada`),
//! made as old as a retention test needs.

use sqlx::PgPool;

/// Inserts `count` dedupe rows of `consumer`, processed `days_ago` days ago.
pub async fn aged_rows(pool: &PgPool, consumer: &str, count: i32, days_ago: i32) {
    sqlx::query(
        "insert into mensagem_processada (consumidor, mensagem_id, processada_em)
         select $1, gen_random_uuid(), now() - make_interval(days => $3) from generate_series(1, $2)",
    )
    .bind(consumer)
    .bind(count)
    .bind(days_ago)
    .execute(pool)
    .await
    .expect("the dedupe rows are inserted");
}
