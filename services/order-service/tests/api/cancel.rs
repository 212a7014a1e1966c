//! POST /orders/{id}/cancel: CANCELLED and one PedidoCancelado in one
//! transaction, only from PENDING or CONFIRMED; 404, 409 and key reuse as
//! problem documents that write nothing.

use uuid::Uuid;

use crate::helpers::{TestApp, order_body, spawn_app};

async fn place(app: &TestApp) -> String {
    let reply = app
        .post_order(&order_body("c-cancel", &[("ABC-1", 2)]))
        .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    reply.body["id"].as_str().unwrap().to_owned()
}

async fn cancel(app: &TestApp, id: &str, key: Option<&str>) -> crate::helpers::Reply {
    let mut request = app.client.post(app.url(&format!("/orders/{id}/cancel")));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    crate::helpers::Reply {
        status,
        headers,
        body,
    }
}

/// The order's outbox rows: (event type, message id, key), in order.
async fn outbox(app: &TestApp, id: &str) -> Vec<(String, Uuid, String)> {
    sqlx::query_as("select type, id, aggregateid from outbox where aggregateid = $1 order by seq")
        .bind(id)
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pending_order_is_cancelled_with_one_pedido_cancelado_in_its_history() {
    let app = spawn_app().await;
    let id = place(&app).await;
    let reply = cancel(&app, &id, None).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["status"], "CANCELLED");

    let rows = outbox(&app, &id).await;
    let types: Vec<&str> = rows.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(types, ["PedidoCriado", "PedidoCancelado"]);
    assert!(
        rows.iter().all(|(_, _, key)| key == &id),
        "one aggregate, one key"
    );
    let history = reply.body["history"].as_array().unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[1]["status"], "CANCELLED");
    assert_eq!(history[1]["messageId"], rows[1].1.to_string());
    let payload: serde_json::Value =
        sqlx::query_scalar("select payload from outbox where type = 'PedidoCancelado'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(payload["pedidoId"], id.as_str());
    assert_eq!(app.get(&format!("/orders/{id}")).await.body, reply.body);
}

#[tokio::test]
async fn a_confirmed_order_can_be_cancelled_and_a_rejected_or_cancelled_one_cannot() {
    let app = spawn_app().await;
    let (confirmed, rejected) = (place(&app).await, place(&app).await);
    // The statuses the status consumer would have written.
    for (id, status) in [(&confirmed, "CONFIRMED"), (&rejected, "REJECTED")] {
        sqlx::query("update orders set status = $2, status_reason = 'test' where id = $1::uuid")
            .bind(id)
            .bind(status)
            .execute(&app.pool)
            .await
            .unwrap();
    }
    assert_eq!(cancel(&app, &confirmed, None).await.status, 200);

    for id in [&confirmed, &rejected] {
        let before = outbox(&app, id).await.len();
        let reply = cancel(&app, id, None).await;
        reply.assert_problem(409, "/problems/order-status-conflict");
        assert_eq!(outbox(&app, id).await.len(), before, "nothing written");
    }
    assert_eq!(
        app.get(&format!("/orders/{rejected}")).await.body["status"],
        "REJECTED"
    );
}

#[tokio::test]
async fn an_unknown_order_gets_404_and_a_malformed_id_400() {
    let app = spawn_app().await;
    cancel(&app, &Uuid::now_v7().to_string(), None)
        .await
        .assert_problem(404, "/problems/not-found");
    cancel(&app, "not-a-uuid", None)
        .await
        .assert_problem(400, "/problems/invalid-id");
    app.assert_nothing_written().await;
}

#[tokio::test]
async fn a_repeated_cancel_with_its_key_replays_and_the_key_elsewhere_is_refused() {
    let app = spawn_app().await;
    let (id, other) = (place(&app).await, place(&app).await);
    let first = cancel(&app, &id, Some("cancel-1")).await;
    assert_eq!(first.status, 200);
    let again = cancel(&app, &id, Some("cancel-1")).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(outbox(&app, &id).await.len(), 2, "one PedidoCancelado");

    cancel(&app, &other, Some("cancel-1"))
        .await
        .assert_problem(422, "/problems/idempotency-key-reused");
    assert_eq!(
        app.get(&format!("/orders/{other}")).await.body["status"],
        "PENDING"
    );
}

/// A cancel that waited for a concurrent change of the same order reports
/// the status that change left, not the one it read before waiting.
#[tokio::test]
async fn a_cancel_that_waited_for_a_concurrent_change_reports_the_status_it_left() {
    let app = spawn_app().await;
    let id = place(&app).await;
    let mut other = app.pool.begin().await.unwrap();
    sqlx::query("update orders set status = 'CANCELLED' where id = $1::uuid")
        .bind(&id)
        .execute(&mut *other)
        .await
        .unwrap();
    let pool = &app.pool;
    let release_when_blocked = async move {
        test_support::eventually::eventually(
            "the cancel waits for the other transaction's row lock",
            std::time::Duration::from_secs(30),
            || async {
                sqlx::query_scalar::<_, bool>(
                    "select exists (select 1 from pg_stat_activity
                     where wait_event_type = 'Lock' and datname = current_database())",
                )
                .fetch_one(pool)
                .await
                .unwrap()
                .then_some(())
            },
        )
        .await;
        other.commit().await.unwrap();
    };
    let (reply, ()) = tokio::join!(cancel(&app, &id, None), release_when_blocked);
    assert_eq!(reply.status, 409, "{}", reply.body);
    let detail = reply.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("is CANCELLED"), "{detail}");
}

/// `--outbox-delete-in-transaction` (for a relay reading the WAL): each
/// event's row is inserted and deleted in the order's own transaction. A
/// trigger records every insert the WAL would carry.
#[tokio::test]
async fn with_delete_in_transaction_the_rows_are_written_and_gone_at_commit() {
    let app =
        crate::helpers::spawn_app_with(&["--no-status-consumer", "--outbox-delete-in-transaction"])
            .await;
    sqlx::raw_sql(
        "create table outbox_inserts (id uuid, type text, aggregateid text);
         create function note_outbox_insert() returns trigger language plpgsql as $$
         begin insert into outbox_inserts values (new.id, new.type, new.aggregateid); return new; end $$;
         create trigger note_outbox_insert after insert on outbox
             for each row execute function note_outbox_insert();",
    )
    .execute(&app.pool)
    .await
    .unwrap();

    let id = place(&app).await;
    let cancelled = cancel(&app, &id, None).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);

    assert_eq!(app.count("outbox").await, 0, "the table stays empty");
    let written: Vec<(String, String)> =
        sqlx::query_as("select type, aggregateid from outbox_inserts order by type desc")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        written,
        [
            ("PedidoCriado".to_owned(), id.clone()),
            ("PedidoCancelado".to_owned(), id.clone())
        ]
    );
}
