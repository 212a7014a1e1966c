//! The consumer over RabbitMQ, against the machine's broker: a quorum
//! queue of the test's own, its dead-letter exchange and queue, the same
//! pipeline as over Kafka.

use std::time::Duration;

use idempotent_consumer::amqp::{self, AmqpSettings};
use idempotent_consumer::{
    Circuit, Claimed, Database, DeadLetterPolicy, DltProducer, DltReason, Handler, Health,
    InvalidMessage, Pipeline, Record, RetryPolicy, Verdict,
};
use lapin::types::{AMQPValue, ByteArray, FieldTable, LongString};
use sqlx::{Executor, PgConnection, PgPool};
use test_support::amqp::{TestQueue, amqp_url, delete, publish};
use test_support::eventually::eventually;
use test_support::proxy::TcpProxy;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::consumer_database;

/// Applies `{"n": k}` by recording it in `effects` in apply order; a body
/// `{"n": k, "fail": true}` fails its transaction every time (a
/// message-scoped transient failure); `{"n": k, "panic": true}` panics in
/// `apply`; anything else is invalid JSON.
#[derive(Debug)]
struct Ordered;

impl Handler for Ordered {
    type Message = (i64, bool, bool);

    fn consumer_name(&self) -> &'static str {
        "test.rabbitmq"
    }

    fn parse(&self, record: &Record) -> Result<(i64, bool, bool), InvalidMessage> {
        let invalid = || InvalidMessage::new(DltReason::InvalidJson, "not {\"n\": …}");
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap_or_default())
                .map_err(|_| invalid())?;
        let n = value["n"].as_i64().ok_or_else(invalid)?;
        let flag = |name: &str| value[name].as_bool().unwrap_or(false);
        Ok((n, flag("fail"), flag("panic")))
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, (i64, bool, bool)>],
    ) -> Result<Vec<Verdict>, sqlx::Error> {
        let mut verdicts = Vec::new();
        for claimed in messages {
            let (n, fail, panics) = *claimed.message;
            assert!(!panics, "the test's handler panics on message {n}");
            if fail {
                sqlx::query("select 1 / 0").execute(&mut *tx).await?;
            }
            let key = claimed
                .record
                .key
                .as_deref()
                .map(|key| String::from_utf8_lossy(key).into_owned());
            sqlx::query("insert into effects (message_id, key, n) values ($1, $2, $3)")
                .bind(claimed.id)
                .bind(key)
                .bind(n)
                .execute(&mut *tx)
                .await?;
            verdicts.push(Verdict::Applied("done"));
        }
        Ok(verdicts)
    }
}

fn headers(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert((*name).into(), value.clone());
    }
    table
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The relay's headers for message `id` of aggregate `key`.
fn relay_headers(id: Uuid, key: &str) -> FieldTable {
    headers(&[
        ("id", text(&id.to_string())),
        ("eventType", text("TestEvent")),
        ("aggregateId", text(key)),
    ])
}

/// The pipeline `serve` would build over RabbitMQ, retrying once.
fn pipeline(
    pool: &PgPool,
    settings: &AmqpSettings,
    shutdown: &CancellationToken,
) -> Pipeline<Ordered> {
    let health = Health::new(Circuit::new(100, 0.5, 20), Database::new(pool.clone()));
    Pipeline {
        handler: Ordered,
        policy: DeadLetterPolicy {
            dlt: DltProducer::amqp(
                amqp::DeadLetterExchange::new(
                    settings.url.clone(),
                    settings.dead_letter_exchange(),
                ),
                "test",
                health.clone(),
            ),
            retry: RetryPolicy::fixed(1, Duration::from_millis(10)),
            health,
            // As `serve` makes it: shutdown stops consuming too.
            consuming: shutdown.child_token(),
        },
    }
}

/// A fresh database with an `effects` table, and a queue of the test's own.
async fn setup() -> (test_support::database::TestDatabase, PgPool, AmqpSettings) {
    let (database, pool) = consumer_database().await;
    pool.execute(
        "create table effects (seq bigserial, message_id uuid primary key, key text, n bigint)",
    )
    .await
    .unwrap();
    let name = format!("rmqtest{}", &Uuid::new_v4().simple().to_string()[..12]);
    let settings = AmqpSettings {
        url: amqp_url().parse().unwrap(),
        exchange: format!("{name}.eventos"),
        queue: format!("{name}.reserva"),
        prefetch: 20,
        delivery_limit: 20,
        max_batch: 10,
    };
    // Declared before anything is published, as the service does at start-up.
    let connection = test_support::amqp::connect().await;
    amqp::declare(&connection, &settings).await.unwrap();
    let _ = connection.close(200, "declared".into()).await;
    (database, pool, settings)
}

/// A confirm channel to publish on.
async fn publisher() -> (lapin::Connection, lapin::Channel) {
    let connection = test_support::amqp::connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    (connection, channel)
}

/// Every key's values in apply order are increasing.
fn assert_in_order(effects: &[(String, i64)]) {
    let mut last: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for (key, n) in effects {
        if let Some(previous) = last.insert(key, *n) {
            assert!(
                previous < *n,
                "{key}: {n} applied after {previous}; in apply order: {:?}",
                effects.iter().map(|(_, n)| n).collect::<Vec<_>>()
            );
        }
    }
}

async fn applied(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("select coalesce(key, ''), n from effects order by seq")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn over_rabbitmq_each_message_applies_once_in_order_and_hostile_ones_reach_the_dlq() {
    let (_database, pool, settings) = setup().await;
    let (dlx, dlq) = (
        settings.dead_letter_exchange(),
        settings.dead_letter_queue(),
    );
    let (_connection, channel) = publisher().await;

    // Five aggregates, ten events each, interleaved; every fifth published
    // twice (a relay that re-sent it); hostile messages among them.
    let exchange = settings.exchange.as_str();
    let mut expected = Vec::new();
    for n in 0..50_i64 {
        let key = format!("agg-{}", n % 5);
        let id = Uuid::now_v7();
        let body = format!(r#"{{"n": {n}}}"#);
        let times = if n % 5 == 0 { 2 } else { 1 };
        for _ in 0..times {
            publish(
                &channel,
                exchange,
                "TestEvent",
                Some(&id.to_string()),
                relay_headers(id, &key),
                body.as_bytes(),
            )
            .await;
        }
        expected.push((key.clone(), n));
        match n {
            10 => {
                // No id at all: neither header nor message_id.
                let none = headers(&[("eventType", text("TestEvent"))]);
                publish(&channel, exchange, "TestEvent", None, none, br#"{"n": -1}"#).await;
            }
            20 => {
                // An id header whose value is not UTF-8.
                let bad = headers(&[(
                    "id",
                    AMQPValue::ByteArray(ByteArray::from(vec![0xff, 0xfe])),
                )]);
                publish(&channel, exchange, "TestEvent", None, bad, br#"{"n": -2}"#).await;
            }
            30 => {
                let id = Uuid::now_v7();
                publish(
                    &channel,
                    exchange,
                    "TestEvent",
                    Some(&id.to_string()),
                    relay_headers(id, "agg-x"),
                    b"\x00not json",
                )
                .await;
            }
            40 => {
                // 10 MB that is not JSON either.
                let id = Uuid::now_v7();
                let big = vec![b'x'; 10 * 1024 * 1024];
                publish(
                    &channel,
                    exchange,
                    "TestEvent",
                    Some(&id.to_string()),
                    relay_headers(id, "agg-y"),
                    &big,
                )
                .await;
            }
            45 => {
                // Fails its transaction on every try: retried, then dead.
                let id = Uuid::now_v7();
                publish(
                    &channel,
                    exchange,
                    "TestEvent",
                    Some(&id.to_string()),
                    relay_headers(id, "agg-z"),
                    br#"{"n": -5, "fail": true}"#,
                )
                .await;
            }
            _ => {}
        }
    }

    let shutdown = CancellationToken::new();
    let pipeline = pipeline(&pool, &settings, &shutdown);
    let consumer = tokio::spawn(amqp::run(settings.clone(), pipeline, shutdown.clone()));

    eventually(
        "every valid message applied",
        Duration::from_secs(60),
        || async { (applied(&pool).await.len() >= expected.len()).then_some(()) },
    )
    .await;
    let mut dead = TestQueue::existing(&dlq).await;
    let letters = dead.read_at_least(5, Duration::from_secs(30)).await;
    shutdown.cancel();
    consumer.await.unwrap().unwrap();

    // Once each (the duplicates absorbed), and per aggregate in order.
    let effects = applied(&pool).await;
    assert_eq!(effects.len(), expected.len(), "{effects:?}");
    assert_in_order(&effects);
    let mut reasons: Vec<String> = letters
        .iter()
        .map(|letter| letter.header("dlt-reason").unwrap_or_default())
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "invalid-header",
            "invalid-json",
            "invalid-json",
            "missing-header",
            "retries-exhausted"
        ],
        "{letters:?}"
    );
    for letter in &letters {
        assert_eq!(
            letter.header("kafka_dlt-original-topic").as_deref(),
            Some(settings.queue.as_str())
        );
        assert!(
            letter
                .header("kafka_dlt-exception-message")
                .is_some_and(|m| !m.is_empty())
        );
    }
    assert!(
        letters
            .iter()
            .any(|letter| letter.body.len() == 10 * 1024 * 1024),
        "the 10 MB message is dead-lettered whole"
    );
    delete(&[&settings.queue, &dlq], &[exchange, &dlx]).await;
}

/// A consumer that dies mid-stream (its connection cut, as a kill -9 cuts
/// it, with messages delivered and not acknowledged, some of them
/// committed) and a new one in its place: the broker delivers those again,
/// first; the dedupe rows absorb what was committed; nothing is lost or
/// applied twice, and every key stays in order.
#[tokio::test]
async fn a_consumer_killed_mid_stream_loses_nothing_and_applies_nothing_twice() {
    let (_database, pool, settings) = setup().await;
    let (_connection, channel) = publisher().await;
    let total = 1000_i64;
    for n in 0..total {
        let id = Uuid::now_v7();
        let key = format!("agg-{}", n % 8);
        publish(
            &channel,
            &settings.exchange,
            "TestEvent",
            Some(&id.to_string()),
            relay_headers(id, &key),
            format!(r#"{{"n": {n}}}"#).as_bytes(),
        )
        .await;
    }
    // Small batches and a small window: the stream lasts long enough for
    // the kills to land in it.
    let settings = AmqpSettings {
        prefetch: 5,
        max_batch: 5,
        ..settings
    };
    let all = usize::try_from(total).unwrap();
    let broker: std::net::SocketAddr = "127.0.0.1:5672".parse().unwrap();
    let mut kills_mid_stream = 0;
    for round in 0.. {
        // Each consumer reaches the broker through a proxy of its own, so
        // that its death can be a cut connection, not a polite close.
        let proxy = TcpProxy::start(broker).await;
        let through = AmqpSettings {
            url: proxy.url_through(&amqp_url()).parse().unwrap(),
            ..settings.clone()
        };
        let shutdown = CancellationToken::new();
        let consumer = tokio::spawn(amqp::run(
            through.clone(),
            pipeline(&pool, &through, &shutdown),
            shutdown.clone(),
        ));
        let before = applied(&pool).await.len();
        if round == 5 || before == all {
            eventually("every message applied", Duration::from_secs(60), || async {
                (applied(&pool).await.len() >= all).then_some(())
            })
            .await;
            shutdown.cancel();
            consumer.await.unwrap().unwrap();
            break;
        }
        eventually(
            "the consumer makes progress",
            Duration::from_secs(30),
            || async {
                let now = applied(&pool).await.len();
                (now >= (before + 20).min(all)).then_some(())
            },
        )
        .await;
        // Nothing more reaches the broker (no cancel, no close), the
        // consumer stops where it is, then its socket closes.
        proxy.blackhole();
        consumer.abort();
        let _ = consumer.await;
        drop(proxy);
        if applied(&pool).await.len() < all {
            kills_mid_stream += 1;
        }
    }
    assert!(
        kills_mid_stream >= 3,
        "only {kills_mid_stream} kills landed mid-stream"
    );
    let effects = applied(&pool).await;
    assert_eq!(effects.len(), usize::try_from(total).unwrap());
    assert_in_order(&effects);
    let claimed: i64 = sqlx::query_scalar("select count(*) from mensagem_processada")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(claimed, total, "one dedupe row per message");
    delete(
        &[&settings.queue, &settings.dead_letter_queue()],
        &[&settings.exchange, &settings.dead_letter_exchange()],
    )
    .await;
}

/// A message whose processing panics every time: the consumer reconnects
/// after each panic (the message goes back to the head of the queue, so
/// its key stays in order) until the broker's delivery limit dead-letters
/// it, with `x-death`; everything else is applied, in order.
#[tokio::test]
async fn a_message_that_panics_every_time_is_dead_lettered_at_the_delivery_limit() {
    let (_database, pool, settings) = setup().await;
    let settings = AmqpSettings {
        delivery_limit: 2,
        ..settings
    };
    // Declared again with the lower limit: a fresh queue takes it.
    delete(&[&settings.queue], &[]).await;
    let connection = test_support::amqp::connect().await;
    amqp::declare(&connection, &settings).await.unwrap();
    let _ = connection.close(200, "declared".into()).await;
    let (_connection, channel) = publisher().await;
    for n in 0..20_i64 {
        let id = Uuid::now_v7();
        let body = if n == 7 {
            format!(r#"{{"n": {n}, "panic": true}}"#)
        } else {
            format!(r#"{{"n": {n}}}"#)
        };
        publish(
            &channel,
            &settings.exchange,
            "TestEvent",
            Some(&id.to_string()),
            relay_headers(id, &format!("agg-{}", n % 2)),
            body.as_bytes(),
        )
        .await;
    }
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(amqp::run(
        settings.clone(),
        pipeline(&pool, &settings, &shutdown),
        shutdown.clone(),
    ));
    eventually(
        "every other message applied",
        Duration::from_secs(60),
        || async { (applied(&pool).await.len() >= 19).then_some(()) },
    )
    .await;
    let mut dead = TestQueue::existing(&settings.dead_letter_queue()).await;
    let letters = dead.read_at_least(1, Duration::from_secs(30)).await;
    shutdown.cancel();
    consumer.await.unwrap().unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].body, br#"{"n": 7, "panic": true}"#);
    let death = letters[0].header("x-death").unwrap_or_default();
    assert!(death.contains("delivery_limit"), "x-death: {death}");
    let effects = applied(&pool).await;
    assert_eq!(effects.len(), 19);
    assert_in_order(&effects);
    delete(
        &[&settings.queue, &settings.dead_letter_queue()],
        &[&settings.exchange, &settings.dead_letter_exchange()],
    )
    .await;
}
