//! Migrations apart from serving: `order-service migrate` as the database's
//! owner (with the grants of migrations/grants/), and a service started
//! with ORDER_NO_MIGRATE that refuses a database whose migrations are
//! behind, naming them and the command that applies them.

use std::process::Output;

use sqlx::{Connection, PgConnection};
use test_support::database::TestDatabase;

use crate::helpers::{printed, run_to_exit, server_url};

async fn order_service(url: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let args = [&["--database-url", url][..], args].concat();
    run_to_exit(&args, envs).await
}

#[tokio::test]
async fn serving_without_migrating_refuses_a_database_that_is_behind_naming_what_is_missing() {
    let database = TestDatabase::create(&server_url(), "no_migrate").await;
    let url = database.url();
    let no_migrate = [("ORDER_NO_MIGRATE", "true")];

    let empty = order_service(&url, &[], &no_migrate).await;
    let said = printed(&empty);
    assert!(
        !empty.status.success(),
        "it served an empty database:\n{said}"
    );
    for expected in [
        "0001 orders and outbox",
        "order-service migrate",
        "ORDER_NO_MIGRATE",
    ] {
        assert!(said.contains(expected), "{expected:?} not in:\n{said}");
    }

    // The roles the grants name (an administrator's step, once per cluster).
    let mut admin = PgConnection::connect_with(&database.options).await.unwrap();
    sqlx::raw_sql(include_str!("../../../../migrations/roles.sql"))
        .execute(&mut admin)
        .await
        .unwrap();
    let migrated = order_service(&url, &["migrate"], &[]).await;
    assert!(migrated.status.success(), "{}", printed(&migrated));
    let granted: bool = sqlx::query_scalar(
        "select has_table_privilege('entrega_order_service', 'orders', 'insert')
            and has_column_privilege('entrega_order_service', 'orders', 'status', 'update')
            and not has_column_privilege('entrega_order_service', 'orders', 'customer_id', 'update')
            and has_table_privilege('entrega_relay', 'outbox_delivery', 'insert')
            and not has_table_privilege('entrega_console', 'outbox', 'insert')",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(granted, "the grants of migrations/grants/ are in place");

    // One migration forgotten: only it is named.
    sqlx::query("delete from _sqlx_migrations where version = 6")
        .execute(&mut admin)
        .await
        .unwrap();
    let behind = order_service(&url, &[], &no_migrate).await;
    let said = printed(&behind);
    assert!(!behind.status.success(), "{said}");
    assert!(said.contains("(0006 status history message idx)"), "{said}");
    admin.close().await.unwrap();
}
