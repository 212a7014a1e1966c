//! Least privilege (docs/security.md): the databases owned by a role that is
//! not a superuser and migrates them (`<service> migrate`); every part of
//! the pipeline logged in as a role that owns nothing, member of its group
//! of migrations/roles.sql and holding exactly migrations/grants/. The
//! pipeline works that way — orders, cancellations, a dead letter
//! redriven through the console — and each role is refused what is not its
//! part.

use std::time::Duration;

use e2e::console::{
    dead_lettered_order, entrega, journey, quick_statement_timeout, wait_for_status,
};
use e2e::invariants::{check, check_with_cancellations, settle, settle_with_cancellations};
use e2e::load::{cancel_orders, place_orders};
use e2e::pipeline::{DLT, RelayMode};
use e2e::report::{assert_sound, report};
use e2e::roles::LeastPrivilege;
use e2e::{Pipeline, PipelineOptions};
use sqlx::{Connection, PgConnection};
use test_support::database::{Login, TestDatabase};

#[tokio::test(flavor = "multi_thread")]
async fn every_part_runs_as_a_role_that_owns_nothing_with_exactly_the_documented_grants() {
    let mut stock = PipelineOptions::default().stock;
    stock.push(("CNS-1", 100));
    let pipeline = Pipeline::start(PipelineOptions {
        least_privilege: true,
        stock,
        environment: quick_statement_timeout(),
        ..PipelineOptions::default()
    })
    .await;
    let http = pipeline.order_service.http.clone();
    let placed = place_orders(&http, 300, 8, 1).await;
    let victims = placed.iter().step_by(5).map(|placed| placed.id).collect();
    let cancelled = cancel_orders(http, victims, 4).await;
    settle_with_cancellations(&pipeline, &placed, &cancelled, Duration::from_secs(120)).await;
    let outcome = check_with_cancellations(&pipeline, &placed, &[], &cancelled).await;
    report("least_privilege", &outcome);
    assert_sound(&outcome);
    assert!(outcome.cancelled > 0, "cancellations applied");

    // The console reads as its read-only role and records a redrive as the
    // redrive role (console_args).
    let (stuck, message) = dead_lettered_order(&pipeline, "CNS-1").await;
    let dead = journey(&pipeline, &message.to_string()).await;
    let place = dead["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|step| step["what"] == "dead-lettered")
        .and_then(|step| step["place"].as_str())
        .unwrap_or_else(|| panic!("no dead letter in {dead:#}"))
        .to_owned();
    let (partition, offset) = place
        .trim_start_matches(DLT)
        .trim_start_matches('[')
        .split_once("]@")
        .unwrap();
    let redrive = entrega(
        &pipeline,
        &[
            "dlt",
            "redrive",
            DLT,
            partition,
            offset,
            "--operator",
            "e2e",
        ],
    )
    .await;
    assert!(redrive.success, "{}", redrive.stderr);
    wait_for_status(&pipeline, stuck, "CONFIRMED").await;
    let health = entrega(&pipeline, &["health"]).await;
    assert!(health.success, "{}", health.stderr);

    let roles = pipeline.least_privilege.as_ref().unwrap();
    refusals(&pipeline, roles).await;
    print_roles_and_grants(&pipeline, roles).await;
    pipeline.stop().await;
}

/// CDC mode: the relay's login is a replication role that owns nothing; the
/// publication was made by the owner's `migrate` (only a table's owner may).
#[tokio::test(flavor = "multi_thread")]
async fn the_cdc_relay_streams_as_a_replication_role_that_owns_nothing() {
    let pipeline = Pipeline::start(PipelineOptions {
        least_privilege: true,
        relay_mode: RelayMode::Cdc,
        retain_published: false,
        ..PipelineOptions::default()
    })
    .await;
    let placed = place_orders(&pipeline.order_service.http, 200, 8, 1).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;
    let outcome = check(&pipeline, &placed, &[]).await;
    report("least_privilege_cdc", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}

/// Debezium in place of the relays (debezium/*.json; compose's debezium
/// profile). No Kafka Connect can run here, so this does, as the
/// connectors' login and in each database, what Debezium 3's PostgreSQL
/// connector does there: its start-up role check, the publication it is
/// told to use and may not create (`publication.autocreate.mode=disabled`),
/// a pgoutput stream of that publication, the snapshot and the heartbeat —
/// and checks that the login may do nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn debeziums_login_streams_the_owners_publication_reads_the_outbox_and_nothing_more() {
    let server = std::env::var("ENTREGA_CDC_POSTGRES_URL")
        .expect("ENTREGA_CDC_POSTGRES_URL is not set: run the tests through scripts/test");
    let orders = TestDatabase::create(&server, "dbz_orders").await;
    let inventory = TestDatabase::create(&server, "dbz_inventory").await;
    let roles = LeastPrivilege::set_up(&orders, &inventory, true).await;
    let connectors = [
        (
            include_str!("../../../../debezium/outbox-connector.json"),
            &orders,
            &roles.order_service,
            "select * from orders",
        ),
        (
            include_str!("../../../../debezium/inventory-outbox-connector.json"),
            &inventory,
            &roles.inventory_service,
            "select * from stock",
        ),
    ];
    for (connector, database, service, elsewhere) in connectors {
        let connector: serde_json::Value = serde_json::from_str(connector).unwrap();
        let config = &connector["config"];
        assert_eq!(config["publication.autocreate.mode"], "disabled");
        let publication = config["publication.name"].as_str().unwrap();
        let url = roles.debezium.url(&database.url());
        let mut debezium = PgConnection::connect(&url).await.unwrap();

        // PostgresConnector.checkLoginReplicationRoles.
        let (login, replication): (bool, bool) = sqlx::query_as(
            "select rolcanlogin, rolreplication from pg_roles where rolname = current_user",
        )
        .fetch_one(&mut debezium)
        .await
        .unwrap();
        assert!(login && replication, "{}", roles.debezium.name);
        // PostgresReplicationConnection.initPublication: with autocreation
        // disabled the publication must exist; migrate made it, for the
        // outbox alone.
        let all_tables: Option<bool> =
            sqlx::query_scalar("select puballtables from pg_publication where pubname = $1")
                .bind(publication)
                .fetch_optional(&mut debezium)
                .await
                .unwrap();
        assert_eq!(all_tables, Some(false), "publication {publication}");
        let tables: Vec<String> = sqlx::query_scalar(
            "select tablename::text from pg_publication_tables where pubname = $1",
        )
        .bind(publication)
        .fetch_all(&mut debezium)
        .await
        .unwrap();
        assert_eq!(tables, ["outbox"]);

        // The stream: the connector makes its slot over the replication
        // protocol; the SQL functions need the same REPLICATION attribute.
        // Temporary: gone with the session, whatever fails (a slot left
        // behind would hold the server's WAL and its database).
        let slot = format!("dbz_{}", uuid::Uuid::new_v4().simple());
        sqlx::query("select pg_create_logical_replication_slot($1, 'pgoutput', true)")
            .bind(&slot)
            .execute(&mut debezium)
            .await
            .unwrap();
        let id = uuid::Uuid::now_v7();
        let mut writer = PgConnection::connect(&service.url(&database.url()))
            .await
            .unwrap();
        sqlx::query(
            "insert into outbox (id, aggregatetype, aggregateid, type, payload)
             values ($1, 'pedido', 'debezium-test', 'PedidoCriado', '{}')",
        )
        .bind(id)
        .execute(&mut writer)
        .await
        .unwrap();
        writer.close().await.unwrap();
        let changes: Vec<Vec<u8>> = sqlx::query_scalar(
            "select data from pg_logical_slot_get_binary_changes($1, null, null,
                 'proto_version', '1', 'publication_names', $2)",
        )
        .bind(&slot)
        .bind(publication)
        .fetch_all(&mut debezium)
        .await
        .unwrap();
        sqlx::query("select pg_drop_replication_slot($1)")
            .bind(&slot)
            .execute(&mut debezium)
            .await
            .unwrap();
        let needle = id.to_string().into_bytes();
        assert!(
            changes
                .iter()
                .any(|change| change.windows(needle.len()).any(|w| w == needle)),
            "the stream of {publication} does not carry the inserted row {id}"
        );

        // The snapshot (PostgresSnapshotChangeEventSource, locking mode
        // shared), then the heartbeat's action query.
        sqlx::raw_sql(
            "begin isolation level repeatable read, read only;
             lock table outbox in access share mode;",
        )
        .execute(&mut debezium)
        .await
        .unwrap();
        let snapshot: Vec<uuid::Uuid> = sqlx::query_scalar("select id from outbox")
            .fetch_all(&mut debezium)
            .await
            .unwrap();
        sqlx::raw_sql("commit")
            .execute(&mut debezium)
            .await
            .unwrap();
        assert_eq!(snapshot, [id]);
        sqlx::raw_sql(config["heartbeat.action.query"].as_str().unwrap())
            .execute(&mut debezium)
            .await
            .unwrap();

        let mut allowed = Vec::new();
        for statement in [
            "create publication intruder for table outbox",
            "drop publication entrega_outbox",
            "update outbox set attempts = 1",
            "delete from outbox",
            "insert into outbox (id, aggregatetype, aggregateid, type, payload)
             values (gen_random_uuid(), 'pedido', 'x', 'x', '{}')",
            elsewhere,
        ] {
            if let Err(what) = refused(&mut debezium, statement).await {
                allowed.push(format!("debezium may {statement:?}: {what}"));
            }
        }
        assert!(allowed.is_empty(), "{}", allowed.join("\n"));
        debezium.close().await.unwrap();
    }
    // The databases first: a role that owns one cannot be dropped.
    drop((orders, inventory));
    drop(roles);
}

/// Whether `statement` is refused for want of privilege (42501); if not,
/// what happened instead.
async fn refused(connection: &mut PgConnection, statement: &str) -> Result<(), String> {
    match sqlx::raw_sql(statement).execute(connection).await {
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42501") => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// What each role must not do, with the database it tries it in.
async fn refusals(pipeline: &Pipeline, roles: &LeastPrivilege) {
    let (orders, inventory) = (
        pipeline.endpoints.orders_url.as_str(),
        pipeline.endpoints.inventory_url.as_str(),
    );
    let attempts: [(&Login, &str, &str); 20] = [
        (&roles.order_service, orders, "drop table orders"),
        (
            &roles.order_service,
            orders,
            "create table intruder (x int)",
        ),
        (&roles.order_service, orders, "delete from orders"),
        (
            &roles.order_service,
            orders,
            "update orders set customer_id = 'x'",
        ),
        (&roles.order_service, orders, "select payload from outbox"),
        (&roles.order_service, orders, "delete from dlt_redrive"),
        (&roles.order_service, inventory, "select * from stock"),
        (
            &roles.order_service,
            inventory,
            "select * from reservations",
        ),
        (&roles.inventory_service, inventory, "drop table stock"),
        (&roles.inventory_service, inventory, "delete from stock"),
        (&roles.inventory_service, orders, "select * from orders"),
        (&roles.relay, orders, "select * from orders"),
        (&roles.relay, orders, "drop table outbox"),
        (&roles.relay, inventory, "update stock set available = 0"),
        (&roles.console, orders, "select payload from outbox"),
        (
            &roles.console,
            orders,
            "update orders set status = 'CANCELLED'",
        ),
        (&roles.console, inventory, "delete from mensagem_processada"),
        (&roles.console, inventory, "select * from stock"),
        (&roles.redrive, orders, "select * from orders"),
        (&roles.redrive, orders, "delete from dlt_redrive"),
    ];
    let mut allowed = Vec::new();
    for (login, database, statement) in attempts {
        let mut connection = PgConnection::connect(&login.url(database)).await.unwrap();
        if let Err(what) = refused(&mut connection, statement).await {
            allowed.push(format!("{} may {statement:?}: {what}", login.name));
        }
        connection.close().await.unwrap();
    }
    assert!(allowed.is_empty(), "{}", allowed.join("\n"));

    // No part owns anything, or is more than a login; the owner owns it all.
    for pool in [&pipeline.orders, &pipeline.inventory] {
        let owners: Vec<String> = sqlx::query_scalar(
            "select distinct pg_get_userbyid(relowner)::text from pg_class
             where relnamespace = 'public'::regnamespace",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(owners, std::slice::from_ref(&roles.owner.name));
    }
    let powerful: Vec<String> = sqlx::query_scalar(
        "select rolname::text from pg_roles where rolname = any($1)
           and (rolsuper or rolcreaterole or rolcreatedb or rolbypassrls)",
    )
    .bind(
        [
            &roles.owner,
            &roles.order_service,
            &roles.inventory_service,
            &roles.relay,
            &roles.console,
            &roles.redrive,
            &roles.debezium,
        ]
        .map(|login| login.name.clone())
        .to_vec(),
    )
    .fetch_all(&pipeline.orders)
    .await
    .unwrap();
    assert!(powerful.is_empty(), "{powerful:?}");
}

/// The roles and the grants, as `\du` and `\dp` show them, for the record.
async fn print_roles_and_grants(pipeline: &Pipeline, roles: &LeastPrivilege) {
    let members: Vec<(String, String, String)> = sqlx::query_as(
        "select r.rolname::text,
                concat_ws(', ', case when r.rolcanlogin then 'login' else 'cannot login' end,
                          case when r.rolreplication then 'replication' end,
                          case when r.rolsuper then 'superuser' end),
                coalesce((select string_agg(g.rolname, ', ' order by g.rolname)
                          from pg_auth_members m join pg_roles g on g.oid = m.roleid
                          where m.member = r.oid), '')
         from pg_roles r
         where r.rolname like 'entrega\\_%' or r.rolname like $1
         order by 1",
    )
    .bind(format!("{}%", roles.owner.name.trim_end_matches("owner")))
    .fetch_all(&pipeline.orders)
    .await
    .unwrap();
    println!("roles (\\du):");
    for (name, attributes, member_of) in members {
        println!("  {name:<32} {attributes:<26} {{{member_of}}}");
    }
    for (database, pool) in [
        ("orders", &pipeline.orders),
        ("inventory", &pipeline.inventory),
    ] {
        let grants: Vec<(String, String, String)> = sqlx::query_as(
            "select c.relname::text,
                    coalesce(array_to_string(c.relacl, ' '), ''),
                    coalesce((select string_agg(a.attname || ': ' || array_to_string(a.attacl, ' '),
                                                '; ' order by a.attnum)
                              from pg_attribute a where a.attrelid = c.oid and a.attacl is not null), '')
             from pg_class c
             where c.relnamespace = 'public'::regnamespace and c.relkind = 'r'
             order by 1",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        println!("{database} (\\dp):");
        for (table, privileges, columns) in grants {
            println!("  {table}\n    table:   {privileges}\n    columns: {columns}");
        }
    }
}
