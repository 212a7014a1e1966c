//! What must hold at the end of every scenario, measured rather than assumed.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use test_support::eventually::{eventually, within};
use test_support::kafka::TopicReader;
use uuid::Uuid;

use crate::load::Placed;
use crate::pipeline::{BACK_DLT, BACK_TOPIC, DLT, Pipeline, TOPIC};

/// The figures of one scenario.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    pub orders: usize,
    pub faults: u32,
    /// Accepted orders without exactly one `PedidoCriado` (its outbox row,
    /// or its distinct event on the topic when the relays delete published
    /// rows), without exactly one reservation outcome, or whose outcome came
    /// from another message than their own event; accepted cancellations
    /// without exactly one `PedidoCancelado`.
    pub lost: usize,
    /// Stock moved more (or less) than the reserved outcomes say; processed
    /// rows that are not one per distinct message.
    pub double_effects: usize,
    /// Per key, events not applied in outbox order: on `pedido.eventos` a
    /// `PedidoCancelado` before its `PedidoCriado`; on `estoque.eventos` an
    /// `EstoqueLiberado` before its `EstoqueReservado`; in the inventory a
    /// cancellation applied before the creation it follows (status
    /// CANCELLED: the creation came after).
    pub order_violations: usize,
    /// Accepted orders whose status in the order service does not agree
    /// with the inventory's record (RESERVED: CONFIRMED, REJECTED:
    /// REJECTED; a cancelled order: CANCELLED, and RELEASED or REJECTED), or
    /// whose history is not the allowed path to it, each step caused by a
    /// distinct message.
    pub status_mismatches: usize,
    /// Orders cancelled (accepted by the API).
    pub cancelled: usize,
    /// Deliveries absorbed by the dedupe: relay re-publishes plus consumer
    /// redeliveries.
    pub duplicates_absorbed: usize,
    /// Records in the dead-letter topic.
    pub dlt: usize,
    /// DLT records by reason.
    pub dlt_reasons: HashMap<String, usize>,
    /// Records in the status consumer's dead-letter topic, by reason.
    pub back_dlt_reasons: HashMap<String, usize>,
}

/// Waits until every accepted order has its reservation outcome, and the
/// outcome is back in the order service.
pub async fn settle(pipeline: &Pipeline, placed: &[Placed], deadline: Duration) {
    settle_with_cancellations(pipeline, placed, &[], deadline).await;
}

/// An outbox row's id, type, published and parked times, attempts, deferrals.
type OutboxState = (
    Uuid,
    String,
    Option<time::OffsetDateTime>,
    Option<time::OffsetDateTime>,
    i32,
    i32,
);

/// Prints where the orders still PENDING stopped on their way back: their
/// reservation, the inventory's outbox rows for them, the status consumer.
async fn explain_pending(pipeline: &Pipeline, ids: &[Uuid]) {
    let pending: Vec<Uuid> =
        sqlx::query_scalar("select id from orders where id = any($1) and status = 'PENDING'")
            .bind(ids)
            .fetch_all(&pipeline.orders)
            .await
            .unwrap_or_default();
    eprintln!("{} order(s) still PENDING", pending.len());
    for id in pending.iter().take(5) {
        let reservation: Option<(String, Option<String>)> =
            sqlx::query_as("select status, reason from reservations where order_id = $1")
                .bind(id)
                .fetch_optional(&pipeline.inventory)
                .await
                .unwrap_or_default();
        let rows: Vec<OutboxState> =
            sqlx::query_as(
                "select id, type, published_at, parked_at, attempts, deferrals from outbox where aggregateid = $1",
            )
            .bind(id.to_string())
            .fetch_all(&pipeline.inventory)
            .await
            .unwrap_or_default();
        eprintln!("order {id}: reservation {reservation:?}, inventory outbox {rows:?}");
    }
    let back = TopicReader::new(pipeline.broker.address(), BACK_TOPIC)
        .read_all(Duration::from_secs(30))
        .await;
    let on_topic: HashSet<String> = back.iter().map(|r| r.key_text()).collect();
    let missing = pending
        .iter()
        .filter(|id| !on_topic.contains(&id.to_string()))
        .count();
    eprintln!(
        "{} record(s) on {BACK_TOPIC}; {missing} of the PENDING orders have none there",
        back.len()
    );
    eprintln!(
        "status consumer: processed {:?}, assigned partitions {:?}, lag {:?}",
        pipeline
            .order_service
            .metric("consumer_processed_total")
            .await,
        pipeline
            .order_service
            .metric("consumer_assigned_partitions")
            .await,
        pipeline.order_service.metric("consumer_lag").await,
    );
}

/// Waits until every order has its reservation outcome in the inventory
/// (for orders the order service does not have: events injected straight
/// into the topic).
pub async fn settle_reservations(pipeline: &Pipeline, orders: &[Placed], deadline: Duration) {
    let ids: Vec<Uuid> = orders.iter().map(|p| p.id).collect();
    let expected = i64::try_from(ids.len()).unwrap_or(i64::MAX);
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
            (decided == expected).then_some(())
        },
    )
    .await;
}

/// [`settle`], and every accepted cancellation applied by the inventory.
pub async fn settle_with_cancellations(
    pipeline: &Pipeline,
    placed: &[Placed],
    cancelled: &[Uuid],
    deadline: Duration,
) {
    settle_reservations(pipeline, placed, deadline).await;
    let ids: Vec<Uuid> = placed.iter().map(|p| p.id).collect();
    let expected = i64::try_from(ids.len()).unwrap_or(i64::MAX);
    let left = within(deadline, || async {
        let left: i64 = sqlx::query_scalar(
            "select count(*) from orders where id = any($1) and status <> 'PENDING'",
        )
        .bind(&ids)
        .fetch_one(&pipeline.orders)
        .await
        .ok()?;
        (left == expected).then_some(())
    })
    .await;
    if left.is_none() {
        explain_pending(pipeline, &ids).await;
        panic!("not within {deadline:?}: every order has left PENDING in the order service");
    }
    if cancelled.is_empty() {
        return;
    }
    let cancellations: Vec<Uuid> = sqlx::query_scalar(
        "select message_id from order_status_history where status = 'CANCELLED' and order_id = any($1)",
    )
    .bind(cancelled)
    .fetch_all(&pipeline.orders)
    .await
    .unwrap();
    eventually(
        "every cancellation is applied by the inventory",
        deadline,
        || async {
            let applied: i64 = sqlx::query_scalar(
                "select count(*) from mensagem_processada where consumidor = 'estoque.reserva' and mensagem_id = any($1)",
            )
            .bind(&cancellations)
            .fetch_one(&pipeline.inventory)
            .await
            .ok()?;
            (usize::try_from(applied).ok()? == cancellations.len()).then_some(())
        },
    )
    .await;
}

/// An order's id and status, and its history's statuses and message ids.
type OrderWithHistory = (Uuid, String, Vec<String>, Vec<Option<Uuid>>);

/// Accepted orders whose status disagrees with the inventory's record, or
/// whose history is not an allowed path to it, each entry caused by a
/// distinct message.
async fn status_mismatches(
    pipeline: &Pipeline,
    ids: &[Uuid],
    cancelled: &HashSet<Uuid>,
    outcome_of: &HashMap<Uuid, (String, Uuid)>,
) -> usize {
    let orders: Vec<OrderWithHistory> = sqlx::query_as(
        "select o.id, o.status,
                array_agg(h.status order by h.position),
                array_agg(h.message_id order by h.position)
         from orders o join order_status_history h on h.order_id = o.id
         where o.id = any($1)
         group by o.id",
    )
    .bind(ids)
    .fetch_all(&pipeline.orders)
    .await
    .unwrap();
    let agreed = orders
        .iter()
        .filter(|(id, status, history, messages)| {
            let inventory = outcome_of.get(id).map(|(s, _)| s.as_str());
            let history: Vec<&str> = history.iter().map(String::as_str).collect();
            let agrees = if cancelled.contains(id) {
                status == "CANCELLED"
                    && match inventory {
                        // Cancelled while PENDING or after CONFIRMED: the
                        // reservation went back.
                        Some("RELEASED") => {
                            history == ["PENDING", "CANCELLED"]
                                || history == ["PENDING", "CONFIRMED", "CANCELLED"]
                        }
                        // Cancelled while PENDING; nothing was reserved.
                        Some("REJECTED") => history == ["PENDING", "CANCELLED"],
                        _ => false,
                    }
            } else {
                let expected = match inventory {
                    Some("RESERVED") => "CONFIRMED",
                    Some("REJECTED") => "REJECTED",
                    _ => return false,
                };
                status == expected && history == ["PENDING", expected]
            };
            let distinct: HashSet<Option<Uuid>> = messages.iter().copied().collect();
            agrees && distinct.len() == history.len() && !distinct.contains(&None)
        })
        .count();
    ids.len() - agreed
}

/// Checks every invariant; the caller asserts on the figures. `injected` are
/// orders whose events were produced straight to the topic (no outbox row):
/// their stock effects count, their outbox rows are not looked for.
pub async fn check(pipeline: &Pipeline, placed: &[Placed], injected: &[Placed]) -> Outcome {
    check_with_cancellations(pipeline, placed, injected, &[]).await
}

/// The first offset of each (key, event type) on `records`: per key, one
/// partition, so offsets order the events as consumers see them.
fn first_offsets(records: &[test_support::kafka::Record]) -> HashMap<(String, String), i64> {
    let mut first: HashMap<(String, String), i64> = HashMap::new();
    for record in records {
        let event = (
            record.key_text(),
            record.header("eventType").unwrap_or_default(),
        );
        let offset = first.entry(event).or_insert(record.offset);
        *offset = (*offset).min(record.offset);
    }
    first
}

/// Keys whose `later` event comes before their `earlier` one on the topic.
fn reordered(first: &HashMap<(String, String), i64>, earlier: &str, later: &str) -> usize {
    first
        .iter()
        .filter(|((key, event), offset)| {
            event == later
                && first
                    .get(&(key.clone(), earlier.to_owned()))
                    .is_some_and(|before| before > *offset)
        })
        .count()
}

/// [`check`], with the orders whose cancellation the API accepted.
pub async fn check_with_cancellations(
    pipeline: &Pipeline,
    placed: &[Placed],
    injected: &[Placed],
    cancelled: &[Uuid],
) -> Outcome {
    let ids: Vec<Uuid> = placed.iter().map(|p| p.id).collect();
    let cancelled: HashSet<Uuid> = cancelled.iter().copied().collect();
    // What travelled: relay re-publishes show as repeated ids on the topic.
    let all = TopicReader::new(pipeline.broker.address(), TOPIC)
        .read_all(Duration::from_secs(60))
        .await;
    // One event per accepted order: its outbox row when the relays keep
    // published rows; otherwise its distinct id on the topic (a row the
    // relay never published has none, and its order counts as lost).
    let mut outbox_by_order: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    let mut cancels_by_order: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    if pipeline.endpoints.retain_published {
        let outbox: Vec<(String, Uuid, String)> =
            sqlx::query_as("select aggregateid, id, type from outbox")
                .fetch_all(&pipeline.orders)
                .await
                .unwrap();
        for (order, id, event_type) in &outbox {
            let by_order = match event_type.as_str() {
                "PedidoCriado" => &mut outbox_by_order,
                _ => &mut cancels_by_order,
            };
            by_order
                .entry(Uuid::parse_str(order).unwrap())
                .or_default()
                .push(*id);
        }
    } else {
        for record in &all {
            let by_order = match record.header("eventType").as_deref() {
                Some("PedidoCriado") => &mut outbox_by_order,
                Some("PedidoCancelado") => &mut cancels_by_order,
                _ => continue,
            };
            let (Ok(order), Some(Ok(id))) = (
                Uuid::parse_str(&record.key_text()),
                record.header("id").map(|id| Uuid::parse_str(&id)),
            ) else {
                continue;
            };
            let ids = by_order.entry(order).or_default();
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
            let own_outcome = match (outcome_of.get(id), outbox_by_order.get(id)) {
                // A cancellation that came first records its own message.
                (Some((status, message)), Some(rows)) => {
                    rows.contains(message) || status == "CANCELLED"
                }
                _ => false,
            };
            outbox_by_order.get(id).map_or(0, Vec::len) != 1 || !own_outcome
        })
        .count()
        + cancelled
            .iter()
            .filter(|id| cancels_by_order.get(id).map_or(0, Vec::len) != 1)
            .count();
    let back = TopicReader::new(pipeline.broker.address(), BACK_TOPIC)
        .read_all(Duration::from_secs(60))
        .await;
    let order_violations = reordered(&first_offsets(&all), "PedidoCriado", "PedidoCancelado")
        + reordered(&first_offsets(&back), "EstoqueReservado", "EstoqueLiberado")
        + ids
            .iter()
            .filter(|id| {
                outcome_of
                    .get(id)
                    .is_some_and(|(status, _)| status == "CANCELLED")
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

    let status_mismatches = status_mismatches(pipeline, &ids, &cancelled, &outcome_of).await;

    let distinct_on_topic: HashSet<String> = all.iter().filter_map(|r| r.header("id")).collect();
    let relay_duplicates = all.len() - distinct_on_topic.len();
    let consumer_duplicates = pipeline.consumer_duplicates().await as usize;

    let dlt_records = TopicReader::new(pipeline.broker.address(), DLT)
        .read_all(Duration::from_secs(60))
        .await;
    let mut dlt_reasons: HashMap<String, usize> = HashMap::new();
    for record in &dlt_records {
        *dlt_reasons
            .entry(record.header("dlt-reason").unwrap_or_default())
            .or_default() += 1;
    }
    let mut back_dlt_reasons: HashMap<String, usize> = HashMap::new();
    for record in TopicReader::new(pipeline.broker.address(), BACK_DLT)
        .read_all(Duration::from_secs(60))
        .await
    {
        *back_dlt_reasons
            .entry(record.header("dlt-reason").unwrap_or_default())
            .or_default() += 1;
    }
    Outcome {
        orders: placed.len(),
        faults: pipeline.faults,
        lost,
        double_effects,
        order_violations,
        status_mismatches,
        cancelled: cancelled.len(),
        duplicates_absorbed: consumer_duplicates.max(relay_duplicates),
        dlt: dlt_records.len(),
        dlt_reasons,
        back_dlt_reasons,
    }
}
