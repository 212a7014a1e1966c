//! The outbox table is the same wherever it comes from: built step by step
//! by the orders database's history (orders/0001-0004, then the shared set's
//! later versions, as the order service applies them), or by
//! migrations/outbox alone on any other database. A relay (or Debezium) must
//! not be able to tell them apart.

// A failed unwrap in a test is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

use sqlx::PgPool;
use test_support::database::TestDatabase;

fn server() -> String {
    std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned())
}

/// Columns, constraints and indexes of `outbox`, as text to compare.
async fn shape(pool: &PgPool) -> Vec<String> {
    let mut shape: Vec<String> = sqlx::query_scalar(
        "select format('column %s %s null=%s default=%s identity=%s', column_name, data_type,
                       is_nullable, coalesce(column_default, '-'), coalesce(identity_generation, '-'))
         from information_schema.columns where table_name = 'outbox'
         union all
         select format('constraint %s', pg_get_constraintdef(oid))
         from pg_constraint where conrelid = 'outbox'::regclass
         union all
         select format('index %s', indexdef) from pg_indexes where tablename = 'outbox'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    shape.sort();
    shape
}

#[tokio::test]
async fn the_shared_set_builds_the_table_the_orders_history_built() {
    let orders = outbox::with_outbox(sqlx::migrate!("../../migrations/orders"));
    let (_history, built_by_history) =
        TestDatabase::create_migrated(&server(), "outbox_shape", &orders, 2).await;
    let (_shared, built_at_once) =
        TestDatabase::create_migrated(&server(), "outbox_shape", &[outbox::migrator()], 2).await;
    let expected = shape(&built_by_history).await;
    assert!(expected.len() > 20, "{expected:#?}");
    assert_eq!(shape(&built_at_once).await, expected);

    // On a database that has it, the shared set changes nothing.
    outbox::migrator().run(&built_by_history).await.unwrap();
    assert_eq!(shape(&built_by_history).await, expected);
}

#[tokio::test]
async fn pending_names_what_a_database_lacks_and_nothing_once_migrated() {
    let orders = outbox::with_outbox(sqlx::migrate!("../../migrations/orders"));
    let (_database, pool) =
        TestDatabase::create_migrated(&server(), "outbox_pending", &[], 2).await;
    let all = outbox::pending(&pool, &orders).await.unwrap();
    let versions: Vec<i64> = all.iter().map(|pending| pending.version).collect();
    assert_eq!(
        versions[0], 1,
        "a new database lacks every migration: {all:?}"
    );
    assert!(versions.contains(&1000), "the outbox set too: {all:?}");
    assert_eq!(all[0].to_string(), "0001 orders and outbox");

    // Only the orders set applied: the outbox set's are what is left.
    orders[0].run(&pool).await.unwrap();
    let left = outbox::pending(&pool, &orders).await.unwrap();
    assert!(
        !left.is_empty() && left.iter().all(|pending| pending.version >= 1000),
        "{left:?}"
    );

    outbox::migrate(&pool, &orders).await.unwrap();
    assert_eq!(outbox::pending(&pool, &orders).await.unwrap(), []);
}
