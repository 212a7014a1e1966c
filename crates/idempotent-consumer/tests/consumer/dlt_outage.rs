//! The dead-letter producer across a broker outage longer than its
//! delivery timeout (30 s): the consumer as a service runs it ([`serve`]),
//! against a private broker that the test stops while a dead letter is
//! being published.

use std::sync::Mutex;
use std::time::Duration;

use idempotent_consumer::{
    Circuit, Claimed, ConsumerOptions, Database, DltReason, Handler, Health, InvalidMessage,
    Record, Retention, Verdict, serve,
};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgConnection;
use test_support::broker::PrivateBroker;
use test_support::eventually::within;
use test_support::kafka::{TopicReader, create_topic, unique_name};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::consumer_database;

/// Refuses every message (it goes to the DLT). The first refusal waits,
/// before it returns, until the test says go: the test stops the broker
/// in between, so that the dead letter is published into the outage.
#[derive(Debug)]
struct RefusesAll {
    first: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

impl Handler for RefusesAll {
    type Message = ();

    fn consumer_name(&self) -> &'static str {
        "test.refuses-all"
    }

    fn parse(&self, _record: &Record) -> Result<(), InvalidMessage> {
        Ok(())
    }

    async fn apply(
        &self,
        _tx: &mut PgConnection,
        messages: &[Claimed<'_, ()>],
    ) -> Result<Vec<Verdict>, sqlx::Error> {
        let gate = self.first.lock().unwrap().take();
        if let Some((reached, go)) = gate {
            let _ = reached.send(());
            let _ = go.await;
        }
        Ok(messages
            .iter()
            .map(|_| {
                Verdict::Refused(InvalidMessage::new(
                    DltReason::UnknownAggregate,
                    "refused by the test",
                ))
            })
            .collect())
    }
}

/// Produces a record with a fresh `id` header to `partition`; its id.
async fn produce_to(bootstrap: &str, topic: &str, partition: i32) -> Uuid {
    let id = Uuid::now_v7();
    let producer: FutureProducer = test_support::kafka::client_config(bootstrap)
        .create()
        .unwrap();
    let text = id.to_string();
    let headers = OwnedHeaders::new().insert(Header {
        key: "id",
        value: Some(text.as_bytes()),
    });
    producer
        .send(
            FutureRecord::to(topic)
                .partition(partition)
                .key(text.as_str())
                .payload("{}")
                .headers(headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(error, _)| error)
        .unwrap();
    id
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_reach_the_dlt_after_a_broker_outage_longer_than_the_delivery_timeout() {
    let mut broker = PrivateBroker::start().await;
    let (_database, pool) = consumer_database().await;
    let topic = unique_name("dltoutage");
    let dlt = format!("{topic}.dlt");
    // Two partitions: the second dead letter is another partition's, so
    // it shows whether the producer itself works again, not only whether
    // the first record's retries end.
    create_topic(&broker.address, &topic, 2).await;
    create_topic(&broker.address, &dlt, 2).await;
    let options = ConsumerOptions {
        bootstrap_servers: broker.address.clone(),
        topic: topic.clone(),
        dlt_topic: dlt.clone(),
        group: unique_name("dltoutage"),
        batch_size: 1,
        retries: 0,
        retry_backoff: Duration::from_millis(10),
        session_timeout: Duration::from_secs(6),
        revoke_grace: Duration::from_secs(10),
        retention: Retention {
            keep: Duration::from_secs(14 * 86_400),
            redrive_window: Duration::from_secs(7 * 86_400),
            force: false,
        },
        retention_every: None,
        rabbitmq: None,
    };
    let health = Health::new(Circuit::new(100, 0.5, 20), Database::new(pool));
    let (reached, at_gate) = oneshot::channel();
    let (go, gate) = oneshot::channel();
    let handler = RefusesAll {
        first: Mutex::new(Some((reached, gate))),
    };
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn({
        let (health, shutdown) = (health.clone(), shutdown.clone());
        async move { serve(handler, &options, health, shutdown).await }
    });

    let first = produce_to(&broker.address, &topic, 0).await;
    tokio::time::timeout(Duration::from_secs(60), at_gate)
        .await
        .expect("the consumer refused the first record within 60 s")
        .unwrap();
    broker.stop().await;
    let _ = go.send(());
    // Longer than the dead-letter producer's delivery timeout (30 s): the
    // first publish attempt fails while the broker is away.
    tokio::time::sleep(Duration::from_secs(35)).await;
    broker.restart().await;
    let second = produce_to(&broker.address, &topic, 1).await;

    let reader = TopicReader::new(&broker.address, &dlt);
    let expected = [first.to_string(), second.to_string()];
    let seen = Mutex::new(Vec::new());
    let both = within(Duration::from_secs(60), || async {
        let ids = reader.read_available(Duration::from_millis(200)).await;
        let mut seen = seen.lock().unwrap();
        seen.extend(ids.into_iter().filter_map(|record| record.header("id")));
        expected.iter().all(|id| seen.contains(id)).then_some(())
    })
    .await;
    let problems = health.problems();
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), consumer).await;
    assert!(
        both.is_some(),
        "not both dead letters on the DLT within 60 s of the broker's return: \
         expected {first} (partition 0, published into the outage) and {second} \
         (partition 1, after it); the DLT holds {:?}; readiness problems: {problems:?}",
        seen.lock().unwrap()
    );
    stopped
        .expect("the consumer stopped within 30 s")
        .unwrap()
        .unwrap();
}
