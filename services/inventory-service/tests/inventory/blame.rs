//! Whom a database error blames. An error of a class that means "the server
//! cannot serve now" (08, 53, 57P0x…) pauses consumption until the database
//! answers, however long, and never counts against a record. But a record
//! may itself cause such an error while the database answers every probe:
//! that must end in the DLT, not in a partition that retries it for ever.

use std::time::Duration;

use idempotent_consumer::{Claimed, Handler, InvalidMessage, Record, Verdict};
use sqlx::PgConnection;
use test_support::eventually::eventually;
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};
use crate::in_process::{InProcess, create_applied, record_applied, value_text};

/// Records each value; on the value `limit` raises SQLSTATE 53400
/// (configuration_limit_exceeded), as a record that needs more than a
/// server limit allows would.
struct ExceedsALimit;

impl Handler for ExceedsALimit {
    type Message = String;

    fn consumer_name(&self) -> &'static str {
        "test.exceeds-a-limit"
    }

    fn parse(&self, record: &Record) -> Result<String, InvalidMessage> {
        Ok(value_text(record))
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, String>],
    ) -> Result<Vec<Verdict>, sqlx::Error> {
        for claimed in messages {
            if claimed.message == "limit" {
                sqlx::query(
                    "do $$ begin raise exception 'this record exceeds a limit' \
                     using errcode = '53400'; end $$",
                )
                .execute(&mut *tx)
                .await?;
            }
            record_applied(tx, claimed).await?;
        }
        Ok(vec![Verdict::Applied("applied"); messages.len()])
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_that_fails_as_unavailable_while_the_database_answers_is_dead_lettered() {
    let test = InventoryTest::new().await;
    create_applied(&test).await;
    let consumer = InProcess::start(&test, ExceedsALimit);
    let records: Vec<Outgoing> = ["before", "limit", "after"]
        .iter()
        .map(|value| Outgoing {
            key: Some("k".to_owned()),
            value: Some((*value).to_owned()),
            headers: vec![("id", Some(Uuid::now_v7().to_string()))],
            partition: Some(1),
        })
        .collect();
    test.produce_all(&records).await;

    eventually(
        "the record after it is applied",
        Duration::from_secs(90),
        || async {
            (test
                .count("select count(*) from applied where value = 'after'")
                .await
                == 1)
                .then_some(())
        },
    )
    .await;
    let dead = test.dlt_records(1).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value_text(), "limit");
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("retries-exhausted")
    );
    assert_eq!(dead[0].header("dlt-attempts").as_deref(), Some("4"));
    assert!(
        consumer.health.problems().is_empty(),
        "{:?}",
        consumer.health.problems()
    );
    consumer.stop().await;
}
