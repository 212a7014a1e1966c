//! The consumer run inside the test, with a handler of the test's own,
//! against the real broker and database: for failures the service's own
//! handler cannot be made to show (a panic, an error of a given SQLSTATE).

use std::time::Duration;

use idempotent_consumer::{
    Circuit, Claimed, ConsumerError, Database, DeadLetterPolicy, DltProducer, Handler, Health,
    Pipeline, Record, RetryPolicy,
};
use sqlx::PgConnection;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::helpers::InventoryTest;

pub(crate) struct InProcess {
    pub(crate) health: Health,
    shutdown: CancellationToken,
    running: JoinHandle<Result<(), ConsumerError>>,
}

impl InProcess {
    /// Consumes the test's topic with `handler`, one record per batch, the
    /// service's retry policy (3 × 1 s) and its circuit.
    pub(crate) fn start<H: Handler>(test: &InventoryTest, handler: H) -> Self {
        let health = Health::new(Circuit::new(100, 0.5, 20), Database::new(test.pool.clone()));
        let client = |settings: &[(&str, String)]| {
            let mut config = test_support::kafka::client_config(&test.bootstrap);
            for (key, value) in settings {
                config.set(*key, value);
            }
            config
        };
        let shutdown = CancellationToken::new();
        let pipeline = Pipeline {
            handler,
            policy: DeadLetterPolicy {
                dlt: DltProducer::new(
                    client(&idempotent_consumer::producer_settings()),
                    &test.dlt,
                    &test.group,
                    health.clone(),
                )
                .unwrap(),
                retry: RetryPolicy::fixed(3, Duration::from_secs(1)),
                health: health.clone(),
                consuming: shutdown.child_token(),
            },
        };
        let settings = idempotent_consumer::Settings {
            topic: test.topic.clone(),
            group: test.group.clone(),
            revoke_grace: Duration::from_secs(10),
            lag_interval: Duration::from_secs(5),
            max_batch: 1,
        };
        let config = client(&idempotent_consumer::consumer_settings(
            &test.group,
            "test",
            Duration::from_secs(6),
        ));
        let running = tokio::spawn(idempotent_consumer::run(
            settings,
            config,
            pipeline,
            shutdown.clone(),
        ));
        Self {
            health,
            shutdown,
            running,
        }
    }

    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        self.running.await.unwrap().unwrap();
    }
}

/// The test handlers' message: the record's value as text.
pub(crate) fn value_text(record: &Record) -> String {
    String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned()
}

/// The test handlers' effect: a row in `applied` (see [`create_applied`]).
pub(crate) async fn record_applied(
    tx: &mut PgConnection,
    claimed: &Claimed<'_, String>,
) -> Result<(), sqlx::Error> {
    sqlx::query("insert into applied (id, value) values ($1, $2)")
        .bind(claimed.id)
        .bind(claimed.message)
        .execute(&mut *tx)
        .await
        .map(drop)
}

pub(crate) async fn create_applied(test: &InventoryTest) {
    sqlx::query("create table applied (id uuid primary key, value text not null)")
        .execute(&test.pool)
        .await
        .unwrap();
}
