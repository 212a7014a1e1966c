//! The consumer library against the real PostgreSQL and broker: a fresh
//! database and topics per test; a private broker where a test stops it.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod dlt_outage;
mod pipeline;
mod processed;
mod rabbitmq;

use sqlx::PgPool;
use test_support::database::TestDatabase;

fn server() -> String {
    std::env::var("INVENTORY_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inventory".to_owned())
}

/// A fresh database with nothing but this library's tables: the consumer
/// needs no table from the service.
async fn consumer_database() -> (TestDatabase, PgPool) {
    TestDatabase::create_migrated(
        &server(),
        "consumer_test",
        &[idempotent_consumer::migrator()],
        4,
    )
    .await
}
