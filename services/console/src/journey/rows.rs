//! The journey's evidence in the databases: the order and its status
//! changes, outbox rows and the relay's delivery log, processed rows,
//! reservations, the redrive audit.

use time::OffsetDateTime;
use uuid::Uuid;

use super::{OrderNow, Step};
use crate::sources::{Db, Flow, Sources};
use crate::text::rfc3339;
use idempotent_consumer::processed;

/// The key (order id) of the message `id`, from whatever still knows it.
pub(super) async fn key_of_message(
    sources: &Sources,
    id: Uuid,
) -> Result<Option<String>, sqlx::Error> {
    // The indexed places first; the effects' message ids last (the
    // reservations' are not indexed: looked up only for a message that no
    // outbox row or delivery log entry knows any more).
    for db in [Db::Orders, Db::Inventory] {
        if let Some(key) = outbox::read::key_of(sources.db(db), id).await? {
            return Ok(Some(key));
        }
    }
    // The services' own tables: the console knows them as their pages do
    // (docs/order-service.md, docs/inventory-service.md).
    let in_orders = sqlx::query_scalar!(
        r#"select order_id::text as "order_id!" from order_status_history
           where message_id = $1 limit 1"#,
        id,
    )
    .fetch_optional(sources.db(Db::Orders))
    .await?;
    if in_orders.is_some() {
        return Ok(in_orders);
    }
    sqlx::query_scalar!(
        r#"select order_id::text as "order_id!" from reservations
           where message_id = $1 or cancel_message_id = $1 limit 1"#,
        id,
    )
    .fetch_optional(sources.db(Db::Inventory))
    .await
}

fn order_id(key: &str) -> Option<Uuid> {
    key.parse().ok()
}

pub(super) async fn order_now(
    sources: &Sources,
    key: &str,
) -> Result<Option<OrderNow>, sqlx::Error> {
    let Some(id) = order_id(key) else {
        return Ok(None);
    };
    sqlx::query_as!(
        OrderNow,
        "select status, status_reason, customer_id, created_at from orders where id = $1",
        id,
    )
    .fetch_optional(sources.db(Db::Orders))
    .await
}

/// The order's status changes (its first is its creation).
pub(super) async fn order_steps(sources: &Sources, key: &str) -> Result<Vec<Step>, sqlx::Error> {
    let Some(id) = order_id(key) else {
        return Ok(Vec::new());
    };
    let rows = sqlx::query!(
        "select status, reason, message_id, changed_at from order_status_history
         where order_id = $1 order by position",
        id,
    )
    .fetch_all(sources.db(Db::Orders))
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            Step::new(
                Some(row.changed_at),
                "orders.order_status_history",
                format!("order {}", row.status),
            )
            .message(row.message_id, None)
            .with("status", &row.status)
            .with_some("reason", row.reason)
        })
        .collect())
}

/// What one flow's outbox holds of a key.
#[derive(Debug, Default)]
pub(super) struct Written {
    pub(super) steps: Vec<Step>,
    /// The delivery log's positions: `(message id, partition, offset)`.
    pub(super) deliveries: Vec<(Uuid, i32, i64)>,
    /// When the earliest row was written.
    pub(super) earliest: Option<OffsetDateTime>,
}

pub(super) async fn outbox_steps(
    sources: &Sources,
    flow: &Flow,
    key: &str,
) -> Result<Written, sqlx::Error> {
    let db = sources.db(flow.producer);
    let table = format!("{}.outbox", flow.producer.name());
    let rows = outbox::read::rows(db, flow.aggregate_type, key).await?;
    let delivered = outbox::read::deliveries(db, flow.aggregate_type, key).await?;

    let mut written = Written::default();
    for outbox::read::Row {
        id,
        event_type,
        created_at,
        attempts,
        last_error,
        parked_at,
        published_at,
        deferrals,
        next_attempt_at,
    } in rows
    {
        written.earliest = written.earliest.min(Some(created_at)).or(Some(created_at));
        let state = match (parked_at, published_at) {
            (Some(_), _) => "parked",
            (None, Some(_)) => "published, retained",
            (None, None) => "pending",
        };
        written.steps.push(
            Step::new(Some(created_at), &table, "written")
                .message(Some(id), Some(event_type.clone()))
                .with("state", state)
                .with("attempts", attempts)
                .with("deferrals", deferrals)
                .with_some("last_error", last_error.clone())
                .with_some("next_attempt_at", next_attempt_at.map(rfc3339)),
        );
        if let Some(at) = parked_at {
            written.steps.push(
                Step::new(Some(at), &table, "parked")
                    .message(Some(id), Some(event_type.clone()))
                    .with("attempts", attempts)
                    .with_some("last_error", last_error)
                    .with(
                        "unpark",
                        format!(
                            "update outbox set parked_at = null, attempts = 0, last_error = null, deferrals = greatest(deferrals, 1), next_attempt_at = now() where id = '{id}'"
                        ),
                    ),
            );
        }
        if let Some(at) = published_at
            && !delivered.iter().any(|entry| entry.id == id)
        {
            written.steps.push(
                Step::new(Some(at), &table, "published")
                    .message(Some(id), Some(event_type))
                    .with("row", "retained (--outbox-cleanup retain)"),
            );
        }
    }
    let log = format!("{}.outbox_delivery", flow.producer.name());
    for outbox::read::Delivery {
        id,
        event_type,
        written_at,
        topic,
        partition,
        offset,
        published_at,
    } in delivered
    {
        written.earliest = written.earliest.min(Some(written_at)).or(Some(written_at));
        // The row itself is gone (deleted on publish): its writing is known
        // from the log.
        if !written
            .steps
            .iter()
            .any(|s| s.message_id == Some(id) && s.what == "written")
        {
            written.steps.push(
                Step::new(Some(written_at), &log, "written")
                    .message(Some(id), Some(event_type.clone()))
                    .with("state", "published, row deleted"),
            );
        }
        let published =
            Step::new(Some(published_at), &log, "published").message(Some(id), Some(event_type));
        match (partition, offset) {
            (Some(partition), Some(offset)) => {
                written
                    .steps
                    .push(published.with("record", format!("{topic}[{partition}]@{offset}")));
                written.deliveries.push((id, partition, offset));
            }
            // RabbitMQ: confirmed by the broker, at no position.
            _ => written.steps.push(published.with("exchange", topic)),
        }
    }
    Ok(written)
}

/// The consumer of `flow` processed these messages (its dedupe rows).
pub(super) async fn processed_steps(
    sources: &Sources,
    flow: &Flow,
    ids: &[Uuid],
) -> Result<Vec<Step>, sqlx::Error> {
    let rows = processed::processed_at(sources.db(flow.consumer_db), flow.consumer, ids).await?;
    let place = format!("{}.mensagem_processada", flow.consumer_db.name());
    Ok(rows
        .into_iter()
        .map(|(id, at)| {
            Step::new(Some(at), &place, "processed")
                .message(Some(id), None)
                .with("consumer", flow.consumer)
        })
        .collect())
}

/// The inventory's effect: the reservation, and its release or cancellation.
pub(super) async fn reservation_steps(
    sources: &Sources,
    key: &str,
) -> Result<Vec<Step>, sqlx::Error> {
    let Some(id) = order_id(key) else {
        return Ok(Vec::new());
    };
    let row = sqlx::query!(
        "select r.status, r.reason, r.message_id, r.created_at, r.cancelled_at, r.cancel_message_id,
                (select string_agg(i.sku || ' x' || i.quantity, ', ' order by i.line)
                   from reservation_items i where i.order_id = r.order_id) as items
         from reservations r where r.order_id = $1",
        id,
    )
    .fetch_optional(sources.db(Db::Inventory))
    .await?;
    let Some(row) = row else {
        return Ok(Vec::new());
    };
    let (status, reason, message_id, created_at, cancelled_at, cancel_message_id, items) = (
        row.status,
        row.reason,
        row.message_id,
        row.created_at,
        row.cancelled_at,
        row.cancel_message_id,
        row.items,
    );
    let mut steps = Vec::new();
    // A cancellation that arrived first leaves a CANCELLED row with no
    // reservation behind it.
    if cancel_message_id != Some(message_id) {
        let decided = match (status.as_str(), &reason) {
            (_, Some(_)) => "stock rejected",
            _ => "stock reserved",
        };
        steps.push(
            Step::new(Some(created_at), "inventory.reservations", decided)
                .message(Some(message_id), None)
                .with_some("items", items)
                .with_some("reason", reason),
        );
    }
    if let Some(at) = cancelled_at {
        steps.push(
            Step::new(
                Some(at),
                "inventory.reservations",
                format!("reservation {status}"),
            )
            .message(cancel_message_id, None)
            .with("status", &status),
        );
    }
    Ok(steps)
}

/// Redrives of these messages, from both databases' audits.
pub(super) async fn redrive_steps(
    sources: &Sources,
    ids: &[Uuid],
) -> Result<Vec<Step>, sqlx::Error> {
    let mut steps = Vec::new();
    for db in [Db::Orders, Db::Inventory] {
        let place = format!("{}.dlt_redrive", db.name());
        for entry in consumer_tools::audit::history(sources.db(db), ids).await? {
            let redriven = &entry.redriven;
            steps.push(
                Step::new(Some(entry.redriven_at), &place, "redriven")
                    .message(redriven.message_id, None)
                    .with("operator", &entry.operator)
                    .with("via", &entry.via)
                    .with(
                        "from",
                        format!(
                            "{}[{}]@{}",
                            redriven.dlt_topic, redriven.dlt_partition, redriven.dlt_offset
                        ),
                    )
                    .with(
                        "to",
                        format!(
                            "{}[{}]@{}",
                            redriven.to_topic, redriven.to_partition, redriven.to_offset
                        ),
                    )
                    .with_some("reason", redriven.reason.clone()),
            );
        }
    }
    Ok(steps)
}
