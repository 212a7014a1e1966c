//! The dedupe table is this library's: its migration makes it where no
//! service did, and adopts the one that the inventory (0001) and orders
//! (0005) sets made before it owned the table, rows and all.

use std::time::Duration;

use idempotent_consumer::{migrator, processed};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use test_support::database::TestDatabase;
use test_support::dedupe::aged_rows as rows;

use crate::server;

const FOURTEEN_DAYS: Duration = Duration::from_secs(14 * 86_400);

/// The table's columns and indexes, as text to compare.
async fn schema(pool: &PgPool) -> (String, String) {
    sqlx::query_as(
        "select (select string_agg(column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, ''),
                                   ', ' order by ordinal_position)
                 from information_schema.columns where table_name = 'mensagem_processada'),
                (select string_agg(indexdef, '; ' order by indexname)
                 from pg_indexes where tablename = 'mensagem_processada')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from mensagem_processada")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A database migrated by a service's old set, with rows in it: the
/// library's set applies (twice, as every start-up does) and changes
/// neither the table nor its rows, and the library's retention works on them.
async fn adopted(prefix: &str, old: Migrator, consumer: &str) {
    let (_database, pool) = TestDatabase::create_migrated(&server(), prefix, &[old], 2).await;
    rows(&pool, consumer, 3, 30).await;
    rows(&pool, consumer, 2, 1).await;
    let before = schema(&pool).await;
    assert!(
        before.1.contains("mensagem_processada_processada_em_idx"),
        "{before:?}"
    );

    migrator().run(&pool).await.unwrap();
    migrator().run(&pool).await.unwrap();

    assert_eq!(
        schema(&pool).await,
        before,
        "the adopted table is unchanged"
    );
    assert_eq!(count(&pool).await, 5, "its rows are all there");
    let deleted = processed::purge(&pool, consumer, FOURTEEN_DAYS)
        .await
        .unwrap();
    assert_eq!(deleted, 3);
    assert_eq!(count(&pool).await, 2);
}

#[tokio::test]
async fn a_database_migrated_by_the_inventorys_0001_is_adopted_with_its_rows() {
    adopted(
        "consumer_adopt_inventory",
        sqlx::migrate!("../../migrations/inventory"),
        "estoque.reserva",
    )
    .await;
}

#[tokio::test]
async fn a_database_migrated_by_the_orders_0005_is_adopted_with_its_rows() {
    adopted(
        "consumer_adopt_orders",
        sqlx::migrate!("../../migrations/orders"),
        "pedido.status",
    )
    .await;
}

/// Where no service made the table, the library's set makes it, the same
/// table the services' sets made.
#[tokio::test]
async fn the_librarys_set_alone_makes_the_table_the_services_made() {
    let (_old, old) = TestDatabase::create_migrated(
        &server(),
        "consumer_schema_old",
        &[sqlx::migrate!("../../migrations/inventory")],
        1,
    )
    .await;
    let (_new, new) =
        TestDatabase::create_migrated(&server(), "consumer_schema_new", &[migrator()], 1).await;
    assert_eq!(schema(&new).await, schema(&old).await);
}

/// Retention goes by age and by consumer: the rows of another consumer in
/// the same table follow the window of its own topic.
#[tokio::test]
async fn a_purge_deletes_only_its_consumers_rows_older_than_the_window() {
    let (_database, pool) = crate::consumer_database().await;
    rows(&pool, "mine", 12_000, 15).await;
    rows(&pool, "mine", 4, 13).await;
    rows(&pool, "theirs", 7, 30).await;
    let deleted = processed::purge(&pool, "mine", FOURTEEN_DAYS)
        .await
        .unwrap();
    assert_eq!(deleted, 12_000, "in batches of 5 000, all of them");
    assert_eq!(count(&pool).await, 11);
}
