//! The pipeline against a real PostgreSQL (and, for dead letters, the real
//! broker): what a batch comes to when duplicates and refusals sit among
//! fresh records.

use std::time::Duration;

use idempotent_consumer::{
    Circuit, Claimed, Database, DeadLetterPolicy, DltProducer, DltReason, Handler, Header, Health,
    InvalidMessage, Outcome, Pipeline, Record, RetryPolicy, Verdict,
};
use rdkafka::Timestamp;
use sqlx::{Executor, PgConnection, PgPool};
use test_support::database::TestDatabase;
use test_support::kafka::{TopicReader, bootstrap_servers, create_topic, unique_name};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::consumer_database;

/// Records each applied message in `effects`; refuses a record whose value
/// is `refuse`.
#[derive(Debug)]
struct Effects;

impl Handler for Effects {
    type Message = bool;

    fn consumer_name(&self) -> &'static str {
        "test.effects"
    }

    fn parse(&self, record: &Record) -> Result<bool, InvalidMessage> {
        Ok(record.value.as_deref() == Some(b"refuse".as_slice()))
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, bool>],
    ) -> Result<Vec<Verdict>, sqlx::Error> {
        let mut verdicts = Vec::new();
        for claimed in messages {
            if *claimed.message {
                verdicts.push(Verdict::Refused(InvalidMessage::new(
                    DltReason::UnknownAggregate,
                    "nothing here to apply it to",
                )));
            } else {
                sqlx::query("insert into effects (message_id) values ($1)")
                    .bind(claimed.id)
                    .execute(&mut *tx)
                    .await?;
                verdicts.push(Verdict::Applied("done"));
            }
        }
        Ok(verdicts)
    }
}

struct Setup {
    _database: TestDatabase,
    pool: PgPool,
    pipeline: Pipeline<Effects>,
    topic: String,
    dlt: String,
}

async fn setup() -> Setup {
    let (database, pool) = consumer_database().await;
    pool.execute("create table effects (message_id uuid primary key)")
        .await
        .unwrap();
    let bootstrap = bootstrap_servers();
    let topic = unique_name("pipelinetest");
    let dlt = format!("{topic}.dlt");
    create_topic(&bootstrap, &dlt, 1).await;
    let health = Health::new(Circuit::new(100, 0.5, 20), Database::new(pool.clone()));
    let producer_config = test_support::kafka::client_config(&bootstrap);
    let pipeline = Pipeline {
        handler: Effects,
        policy: DeadLetterPolicy {
            dlt: DltProducer::new(producer_config, &dlt, "test", health.clone()).unwrap(),
            retry: RetryPolicy::fixed(1, Duration::from_millis(10)),
            health,
            consuming: CancellationToken::new(),
        },
    };
    Setup {
        _database: database,
        pool,
        pipeline,
        topic,
        dlt,
    }
}

fn record(topic: &str, offset: i64, id: Uuid, value: &str) -> Record {
    Record {
        topic: topic.to_owned(),
        partition: 0,
        offset,
        timestamp: Timestamp::NotAvailable,
        key: Some(b"k".to_vec()),
        value: Some(value.as_bytes().to_vec()),
        headers: vec![Header::new("id", Some(id.to_string().as_bytes()))],
        unreadable_headers: false,
    }
}

async fn effects(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_fresh_record_after_a_duplicate_in_one_batch_is_reported_applied() {
    let setup = setup().await;
    let cancel = CancellationToken::new();
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    let first = setup
        .pipeline
        .process(&[record(&setup.topic, 0, a, "x")], &cancel)
        .await;
    assert_eq!(first, [Outcome::Applied("done")]);
    let batch = [
        record(&setup.topic, 0, a, "x"),
        record(&setup.topic, 1, b, "x"),
    ];
    let outcomes = setup.pipeline.process(&batch, &cancel).await;
    assert_eq!(outcomes, [Outcome::Duplicate, Outcome::Applied("done")]);
    assert_eq!(effects(&setup.pool).await, 2);
}

#[tokio::test]
async fn a_refused_record_is_dead_lettered_in_its_place_without_a_claim() {
    let setup = setup().await;
    let cancel = CancellationToken::new();
    let (a, refused, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let batch = [
        record(&setup.topic, 0, a, "x"),
        record(&setup.topic, 1, refused, "refuse"),
        record(&setup.topic, 2, c, "x"),
    ];
    let outcomes = setup.pipeline.process(&batch, &cancel).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Applied("done"),
            Outcome::DeadLettered(DltReason::UnknownAggregate),
            Outcome::Applied("done"),
        ]
    );
    assert_eq!(effects(&setup.pool).await, 2);
    let claims: Vec<Uuid> = sqlx::query_scalar("select mensagem_id from mensagem_processada")
        .fetch_all(&setup.pool)
        .await
        .unwrap();
    assert!(
        !claims.contains(&refused),
        "the refused record kept its claim"
    );
    let dead = TopicReader::new(&bootstrap_servers(), &setup.dlt)
        .read_at_least(1, Duration::from_secs(30))
        .await;
    assert_eq!(dead[0].header("id"), Some(refused.to_string()));
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("unknown-aggregate")
    );

    // Delivered again (a redrive): refused again, never a silent duplicate.
    let again = setup
        .pipeline
        .process(&[record(&setup.topic, 3, refused, "refuse")], &cancel)
        .await;
    assert_eq!(again, [Outcome::DeadLettered(DltReason::UnknownAggregate)]);
}
