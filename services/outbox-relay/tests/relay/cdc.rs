//! CDC mode's decoding against what PostgreSQL really sends: the outbox
//! table, a publication and a pgoutput slot on a cluster of the test's own
//! (`wal_level=logical`), the slot's changes read back with
//! `pg_logical_slot_get_binary_changes` — the same bytes a replication
//! connection streams — and each row compared with poll mode's read of it.

use outbox_relay::cdc::pgoutput::{self, Message, Relations};
use outbox_relay::cdc::row::outbox_row;
use outbox_relay::store;
use sqlx::{Connection, PgConnection};
use test_support::postgres::PrivatePostgres;

#[tokio::test]
async fn rows_from_the_wal_are_the_rows_poll_mode_reads_and_make_the_same_records() {
    let cluster = PrivatePostgres::start().await;
    let mut db = PgConnection::connect(&cluster.url("postgres"))
        .await
        .unwrap();
    outbox::migrator().run(&mut db).await.unwrap();
    sqlx::query("create publication cdc_test for table outbox with (publish = 'insert')")
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("select pg_create_logical_replication_slot('cdc_test', 'pgoutput')")
        .execute(&mut db)
        .await
        .unwrap();

    // Two transactions; payloads with what jsonb rewrites (spacing, key
    // order, escapes, non-ASCII), one row without a trace context.
    let insert = "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent)
                  values (gen_random_uuid(), $1, $2, $3, $4::jsonb, $5)";
    let mut tx = db.begin().await.unwrap();
    for (aggregate, payload, trace) in [
        (
            "o-1",
            r#"{"pedidoId":"o-1","itens":[{"sku":"ABC-1","quantidade":2}]}"#,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ),
        (
            "o-2",
            r#"{"clienteId": "cliente é \"7\"\n", "z": 1, "a": [1, 2]}"#,
            None,
        ),
    ] {
        sqlx::query(insert)
            .bind("pedido")
            .bind(aggregate)
            .bind("PedidoCriado")
            .bind(payload)
            .bind(trace)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    sqlx::query(insert)
        .bind("estoque")
        .bind("o-1")
        .bind("EstoqueReservado")
        .bind(r#"{"pedidoId": "o-1", "motivo": "\u00e9"}"#)
        .bind(None::<String>)
        .execute(&mut db)
        .await
        .unwrap();
    // Another table's writes are not in the publication.
    for statement in ["create table other (n int)", "insert into other values (1)"] {
        sqlx::query(statement).execute(&mut db).await.unwrap();
    }

    let changes: Vec<Vec<u8>> = sqlx::query_scalar(
        "select data from pg_logical_slot_get_binary_changes('cdc_test', null, null,
             'proto_version', '1', 'publication_names', 'cdc_test')",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    let mut relations = Relations::default();
    let mut tags = String::new();
    let mut from_wal = Vec::new();
    for change in &changes {
        match pgoutput::decode(change).unwrap() {
            Message::Relation(relation) => {
                tags.push('R');
                relations.learn(relation);
            }
            Message::Insert { relation, tuple } => {
                tags.push('I');
                let (table, row) = relations.named(relation, tuple).unwrap();
                assert_eq!(table, "public.outbox");
                from_wal.push(outbox_row(row).unwrap());
            }
            Message::Other(tag) => tags.push(char::from(tag)),
        }
    }
    assert_eq!(
        tags, "BRIICBIC",
        "Begin, Relation, rows, Commit per transaction"
    );

    let polled = store::fetch_pending(&mut db, 100).await.unwrap();
    assert_eq!(from_wal.len(), 3);
    assert_eq!(from_wal, polled, "the same rows, in the same order");
    for (wal, poll) in from_wal.iter().zip(&polled) {
        assert_eq!(wal.to_record().unwrap(), poll.to_record().unwrap());
    }
}
