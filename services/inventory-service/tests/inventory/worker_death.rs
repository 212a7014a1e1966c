//! A partition worker that dies (a panic in the handler: a bug) loses the
//! records it held in memory. The consumer must fail readiness, rewind the
//! partition to the last stored offset and start a new worker: every
//! record applied, none skipped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotent_consumer::{Claimed, Handler, InvalidMessage, Record, Verdict};
use sqlx::PgConnection;
use test_support::eventually::eventually;
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};
use crate::in_process::{InProcess, create_applied, record_applied, value_text};

/// Records each message's value in a table; panics on the value `panic`
/// the first time it sees it.
#[derive(Debug, Default)]
struct PanicsOnce {
    panicked: AtomicBool,
}

impl Handler for PanicsOnce {
    type Message = String;

    fn consumer_name(&self) -> &'static str {
        "test.panics-once"
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
            if claimed.message == "panic" && !self.panicked.swap(true, Ordering::SeqCst) {
                panic!("a bug in the handler");
            }
            record_applied(tx, claimed).await?;
        }
        Ok(vec![Verdict::Applied("applied"); messages.len()])
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_that_dies_fails_readiness_and_its_partition_resumes_from_the_last_stored_offset()
{
    let test = InventoryTest::new().await;
    create_applied(&test).await;
    let consumer = InProcess::start(&test, PanicsOnce::default());

    let values: Vec<String> = (0..10)
        .map(|i| {
            if i == 4 {
                "panic".to_owned()
            } else {
                format!("v{i}")
            }
        })
        .collect();
    let records: Vec<Outgoing> = values
        .iter()
        .map(|value| Outgoing {
            key: Some("k".to_owned()),
            value: Some(value.clone()),
            headers: vec![("id", Some(Uuid::now_v7().to_string()))],
            partition: Some(3),
        })
        .collect();
    test.produce_all(&records).await;

    eventually(
        "readiness names the dead worker",
        Duration::from_secs(30),
        || async {
            consumer
                .health
                .problems()
                .iter()
                .any(|p| p.contains("worker died"))
                .then_some(())
        },
    )
    .await;
    eventually(
        "every record is applied",
        Duration::from_secs(60),
        || async { (test.count("select count(*) from applied").await == 10).then_some(()) },
    )
    .await;
    let applied: Vec<String> = sqlx::query_scalar("select value from applied order by id")
        .fetch_all(&test.pool)
        .await
        .unwrap();
    assert_eq!(applied, values, "each record once, in order");
    consumer.stop().await;
}
