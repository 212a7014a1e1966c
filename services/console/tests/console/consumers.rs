//! The console names each consumer's group as its service does, from the
//! same variables: what it says about a group is about the group the
//! service and its `dlt` tools use.

use consumer_tools::{self as tools, DltCommand, DltFilter, RedriveArgs};
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use crate::helpers::{ConsoleTest, Message, ORDERS_DLT, ORDERS_TOPIC, STOCK_DLT, STOCK_TOPIC};

/// `<service> dlt redrive` as the service runs it when its group variable
/// says `group`: the library's tools, handed the service's group.
async fn redrive_as_the_service(
    test: &ConsoleTest,
    dlt: &str,
    group: &str,
    database: PgConnectOptions,
) {
    let redrive = RedriveArgs {
        filter: DltFilter::default(),
        dry_run: false,
        rate: 1_000,
        operator: Some("ana".to_owned()),
        redrive_group: None,
    };
    tools::run(
        DltCommand::Redrive(redrive),
        test.kafka(),
        dlt.to_owned(),
        group,
        database,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn with_a_non_default_group_the_console_sees_what_the_services_redrive_did() {
    let test = ConsoleTest::new().await;
    let flows = [
        (
            "INVENTORY_GROUP",
            ORDERS_TOPIC,
            ORDERS_DLT,
            test.inventory.options.clone(),
        ),
        (
            "ORDER_STATUS_GROUP",
            STOCK_TOPIC,
            STOCK_DLT,
            test.orders.options.clone(),
        ),
    ];
    for (variable, topic, dlt, database) in flows {
        let group = format!("custom-{}", Uuid::new_v4().simple());
        let key = Uuid::now_v7().to_string();
        let id = Uuid::now_v7().to_string();
        let offset = test
            .dead_letter(
                topic,
                dlt,
                &group,
                1,
                Message {
                    key: key.as_bytes(),
                    value: b"{oops",
                    headers: &[("id", id.as_bytes())],
                },
            )
            .await;
        redrive_as_the_service(&test, dlt, &group, database).await;

        let offset = offset.to_string();
        let args = [
            "dlt",
            "redrive",
            dlt,
            "1",
            &offset,
            "--dry-run",
            "--operator",
            "ana",
        ];
        let configured = test.entrega(&args, &[(variable, &group)]).await;
        assert_eq!(configured.code, Some(0), "{}", configured.stderr);
        assert!(
            configured.stdout.contains(&format!(
                "already redriven: the redrive group {group}.redrive is past this offset"
            )),
            "{variable}={group}: the console looked at another group:\n{}",
            configured.stdout
        );
        // The same record, the console left at the default group: that
        // group redrove nothing.
        let default = test.entrega(&args, &[]).await;
        assert_eq!(default.code, Some(0), "{}", default.stderr);
        assert!(
            !default.stdout.contains("already redriven"),
            "{}",
            default.stdout
        );

        let health = test
            .entrega(&["health", "--json"], &[(variable, &group)])
            .await;
        assert_eq!(health.code, Some(0), "{}", health.stderr);
        let health: serde_json::Value = serde_json::from_str(&health.stdout).unwrap();
        let consumed = health["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["topic"] == topic)
            .unwrap_or_else(|| panic!("no {topic} in {health:#}"));
        assert_eq!(consumed["group"], group.as_str(), "{health:#}");
        assert_eq!(consumed["dlt"]["unredriven"], 0, "{health:#}");
    }
}
