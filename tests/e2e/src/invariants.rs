//! What must hold at the end of every scenario, measured rather than assumed.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use test_support::eventually::eventually;
use test_support::kafka::TopicReader;
use uuid::Uuid;

use crate::load::Placed;
use crate::pipeline::{DLT, Pipeline, TOPIC};

/// The figures of one scenario.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    pub orders: usize,
    pub faults: u32,
    /// Accepted orders without exactly one outbox row (without exactly one
    /// distinct event on the topic, when the relays delete published rows),
    /// or without exactly one reservation outcome.
    pub lost: usize,
    /// Stock moved more (or less) than the reserved outcomes say; processed
    /// rows that are not one per distinct message.
    pub double_effects: usize,
    /// Orders whose outcome came from another message than their own event.
    pub order_violations: usize,
    /// Deliveries absorbed by the dedupe: relay re-publishes plus consumer
    /// redeliveries.
    pub duplicates_absorbed: usize,
    /// Records in the dead-letter topic.
    pub dlt: usize,
    /// DLT records by reason.
    pub dlt_reasons: HashMap<String, usize>,
}

/// Waits until every accepted order has its reservation outcome.
pub async fn settle(pipeline: &Pipeline, placed: &[Placed], deadline: Duration) {
    let ids: Vec<Uuid> = placed.iter().map(|p| p.id).collect();
    eventually(
        "every order has its reservation outcome",
        deadline,
        || async {
            let decided: i64 =
                sqlx::query_scalar("select count(*) from reservations where order_id = any($1)")
                    .bind(&ids)
                    .fetch_one(&pipeline.inventory)
                    .await
                    .ok()?;
            (decided == i64::try_from(ids.len()).unwrap_or(i64::MAX)).then_some(())
        },
    )
    .await;
}

/// Checks every invariant; the caller asserts on the figures. `injected` are
/// orders whose events were produced straight to the topic (no outbox row):
/// their stock effects count, their outbox rows are not looked for.
pub async fn check(pipeline: &Pipeline, placed: &[Placed], injected: &[Placed]) -> Outcome {
    let ids: Vec<Uuid> = placed.iter().map(|p| p.id).collect();
    // What travelled: relay re-publishes show as repeated ids on the topic.
    let all = TopicReader::new(&pipeline.broker.address, TOPIC)
        .read_all(Duration::from_secs(60))
        .await;
    // One event per accepted order: its outbox row when the relays keep
    // published rows; otherwise its distinct id on the topic (a row the
    // relay never published has none, and its order counts as lost).
    let mut outbox_by_order: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    if pipeline.endpoints.retain_published {
        let outbox: Vec<(String, Uuid)> =
            sqlx::query_as("select aggregateid, id from outbox where type = 'PedidoCriado'")
                .fetch_all(&pipeline.orders)
                .await
                .unwrap();
        for (order, id) in &outbox {
            outbox_by_order
                .entry(Uuid::parse_str(order).unwrap())
                .or_default()
                .push(*id);
        }
    } else {
        for record in all
            .iter()
            .filter(|r| r.header("eventType").as_deref() == Some("PedidoCriado"))
        {
            let (Ok(order), Some(Ok(id))) = (
                Uuid::parse_str(&record.key_text()),
                record.header("id").map(|id| Uuid::parse_str(&id)),
            ) else {
                continue;
            };
            let ids = outbox_by_order.entry(order).or_default();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    let reservations: Vec<(Uuid, String, Uuid)> =
        sqlx::query_as("select order_id, status, message_id from reservations")
            .fetch_all(&pipeline.inventory)
            .await
            .unwrap();
    let outcome_of: HashMap<Uuid, (String, Uuid)> = reservations
        .iter()
        .map(|(order, status, message)| (*order, (status.clone(), *message)))
        .collect();
    let lost = ids
        .iter()
        .filter(|id| {
            outbox_by_order.get(id).map_or(0, Vec::len) != 1 || !outcome_of.contains_key(id)
        })
        .count();
    let order_violations = ids
        .iter()
        .filter(|id| match (outcome_of.get(id), outbox_by_order.get(id)) {
            (Some((_, message)), Some(rows)) => !rows.contains(message),
            _ => false,
        })
        .count();

    // Stock: initial - available = reserved = what the RESERVED outcomes hold.
    let mut expected_reserved: HashMap<String, i64> = HashMap::new();
    for order in placed.iter().chain(injected) {
        if outcome_of
            .get(&order.id)
            .is_some_and(|(status, _)| status == "RESERVED")
        {
            for (sku, quantity) in &order.items {
                *expected_reserved.entry(sku.clone()).or_default() += i64::from(*quantity);
            }
        }
    }
    let stock: Vec<(String, i64, i64)> =
        sqlx::query_as("select sku, available, reserved from stock")
            .fetch_all(&pipeline.inventory)
            .await
            .unwrap();
    let mut double_effects = stock
        .iter()
        .filter(|(sku, available, reserved)| {
            let initial = i64::from(pipeline.initial_stock.get(sku).copied().unwrap_or(0));
            let expected = expected_reserved.get(sku).copied().unwrap_or(0);
            *reserved != expected || initial - *available != expected || *available < 0
        })
        .count();
    // Processed rows: one per distinct message that had an effect.
    let processed: Vec<Uuid> = sqlx::query_scalar("select mensagem_id from mensagem_processada")
        .fetch_all(&pipeline.inventory)
        .await
        .unwrap();
    let distinct: HashSet<Uuid> = processed.iter().copied().collect();
    let outcome_messages: HashSet<Uuid> = reservations.iter().map(|(_, _, m)| *m).collect();
    if distinct.len() != processed.len() || !outcome_messages.is_subset(&distinct) {
        double_effects += 1;
    }

    let distinct_on_topic: HashSet<String> = all.iter().filter_map(|r| r.header("id")).collect();
    let relay_duplicates = all.len() - distinct_on_topic.len();
    let consumer_duplicates = pipeline.consumer_duplicates().await as usize;

    let dlt_records = TopicReader::new(&pipeline.broker.address, DLT)
        .read_all(Duration::from_secs(60))
        .await;
    let mut dlt_reasons: HashMap<String, usize> = HashMap::new();
    for record in &dlt_records {
        *dlt_reasons
            .entry(record.header("dlt-reason").unwrap_or_default())
            .or_default() += 1;
    }
    Outcome {
        orders: placed.len(),
        faults: pipeline.faults,
        lost,
        double_effects,
        order_violations,
        duplicates_absorbed: consumer_duplicates.max(relay_duplicates),
        dlt: dlt_records.len(),
        dlt_reasons,
    }
}
