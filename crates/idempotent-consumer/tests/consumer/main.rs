//! The consumer library against the real PostgreSQL and broker: a fresh
//! database and topics per test; a private broker where a test stops it.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod dlt_outage;
mod pipeline;

use sqlx::{Executor, PgPool};
use test_support::database::TestDatabase;

/// A fresh database with the table a service brings for the consumer:
/// `mensagem_processada`, the dedupe rows.
async fn consumer_database() -> (TestDatabase, PgPool) {
    let server = std::env::var("INVENTORY_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inventory".to_owned());
    let (database, pool) = TestDatabase::create_migrated(&server, "consumer_test", &[], 4).await;
    pool.execute(
        "create table mensagem_processada (consumidor text, mensagem_id uuid, processada_em timestamptz default now(),
                                           primary key (consumidor, mensagem_id))",
    )
    .await
    .unwrap();
    (database, pool)
}
