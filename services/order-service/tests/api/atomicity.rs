use crate::helpers::{order_body, spawn_app};

/// A failure after the order insert (here: the outbox refuses the row) must
/// leave neither the order, nor its items, nor an outbox row, nor a key.
#[tokio::test]
async fn a_failed_outbox_insert_leaves_no_order_behind() {
    let app = spawn_app().await;
    sqlx::query(
        "alter table outbox add constraint refuse_every_row check (aggregatetype <> 'pedido')",
    )
    .execute(&app.pool)
    .await
    .unwrap();

    let failed = app
        .post_order_with(
            &order_body("c-42", &[("ABC-1", 2)]),
            &[("Idempotency-Key", "atomic-1")],
        )
        .await;

    failed.assert_problem(500, "/problems/internal");
    assert!(
        !failed.body["detail"]
            .as_str()
            .unwrap()
            .contains("refuse_every_row"),
        "database details leak to the client: {}",
        failed.body
    );
    app.assert_nothing_written().await;

    // Once the cause is gone, the same key works: the failed attempt left no claim.
    sqlx::query("alter table outbox drop constraint refuse_every_row")
        .execute(&app.pool)
        .await
        .unwrap();
    let retried = app
        .post_order_with(
            &order_body("c-42", &[("ABC-1", 2)]),
            &[("Idempotency-Key", "atomic-1")],
        )
        .await;
    assert_eq!(retried.status, 201);
    assert_eq!(retried.header("idempotent-replayed"), None);
    assert_eq!(app.count("outbox").await, 1);
}
