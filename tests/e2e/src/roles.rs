//! Least privilege for a pipeline: both databases owned by a role of their
//! own, which migrates them (`<service> migrate`, with the grants of
//! migrations/grants/), and each part logged in as a role that owns
//! nothing, member of its group of migrations/roles.sql — as
//! docs/security.md tells a deployment to do.

use sqlx::{Connection, Executor, PgConnection};
use test_support::database::{Login, TestDatabase, TestRoles};

use crate::pipeline::run_to_success;

/// The log-in roles of one pipeline.
#[derive(Debug)]
pub struct LeastPrivilege {
    /// Owns both databases; migrates them. Not a superuser.
    pub owner: Login,
    pub order_service: Login,
    pub inventory_service: Login,
    /// Both relays (of both databases): one login per relay group, so a
    /// standby may see and end the leader's session.
    pub relay: Login,
    pub console: Login,
    pub redrive: Login,
    /// Debezium's connectors, in place of the relays: a replication login
    /// that may only read the outbox.
    pub debezium: Login,
    _roles: TestRoles,
}

impl LeastPrivilege {
    /// Makes the roles on the databases' server (one server for both), gives
    /// the databases to the owner and migrates them as it. `replication`:
    /// the relay's login streams the WAL (CDC mode).
    pub async fn set_up(
        orders: &TestDatabase,
        inventory: &TestDatabase,
        replication: bool,
    ) -> Self {
        let mut admin = PgConnection::connect_with(&orders.options).await.unwrap();
        sqlx::raw_sql(include_str!("../../../migrations/roles.sql"))
            .execute(&mut admin)
            .await
            .unwrap();
        let mut roles = TestRoles::on(orders, "e2e");
        let owner = roles.login("owner", "").await;
        for database in [orders, inventory] {
            let alter = format!(
                r#"alter database "{}" owner to "{}""#,
                database.name, owner.name
            );
            admin.execute(alter.as_str()).await.unwrap();
        }
        admin.close().await.unwrap();
        for (service, database) in [("order-service", orders), ("inventory-service", inventory)] {
            run_to_success(
                service,
                &["--database-url", &owner.url(&database.url()), "migrate"],
            )
            .await;
        }
        let relay_attributes = if replication {
            "in role entrega_relay replication"
        } else {
            "in role entrega_relay"
        };
        Self {
            order_service: roles.login("order", "in role entrega_order_service").await,
            inventory_service: roles
                .login("inventory", "in role entrega_inventory_service")
                .await,
            relay: roles.login("relay", relay_attributes).await,
            console: roles.login("console", "in role entrega_console").await,
            redrive: roles.login("redrive", "in role entrega_redrive").await,
            debezium: roles
                .login("debezium", "in role entrega_debezium replication")
                .await,
            owner,
            _roles: roles,
        }
    }
}
