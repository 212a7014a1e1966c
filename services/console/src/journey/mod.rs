//! The journey of a message or an order: every place it has been, in time
//! order, with the evidence each place keeps. The databases say what was
//! written, published, processed and changed; the broker says which
//! records exist (every copy: a re-publish, a redrive) and which were
//! dead-lettered.

mod records;
mod rows; // what the databases hold // what the broker holds

use std::collections::BTreeMap;

use time::OffsetDateTime;
use uuid::Uuid;

use crate::kafka::ScanError;
use crate::sources::Sources;

#[derive(Debug, thiserror::Error)]
pub enum JourneyError {
    #[error("reading the database failed")]
    Database(#[from] sqlx::Error),
    #[error("reading the broker failed")]
    Broker(#[from] ScanError),
}

/// What the id that was looked up turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Matched {
    Order,
    Message,
}

/// One place a message or order has been.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Step {
    /// When, as that place recorded it.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<OffsetDateTime>,
    /// A table (`orders.outbox`) or a record's place (`pedido.eventos[3]@17`).
    pub place: String,
    /// What happened there: written, published, record, dead-lettered, …
    pub what: String,
    #[serde(rename = "messageId")]
    pub message_id: Option<Uuid>,
    #[serde(rename = "eventType")]
    pub event_type: Option<String>,
    /// The evidence, as that place shows it.
    pub evidence: BTreeMap<String, String>,
}

impl Step {
    fn new(at: Option<OffsetDateTime>, place: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            at,
            place: place.into(),
            what: what.into(),
            message_id: None,
            event_type: None,
            evidence: BTreeMap::new(),
        }
    }

    fn message(mut self, id: Option<Uuid>, event_type: Option<String>) -> Self {
        self.message_id = id;
        self.event_type = event_type;
        self
    }

    fn with(mut self, name: &str, value: impl ToString) -> Self {
        self.evidence.insert(name.to_owned(), value.to_string());
        self
    }

    fn with_some(self, name: &str, value: Option<impl ToString>) -> Self {
        match value {
            Some(value) => self.with(name, value),
            None => self,
        }
    }
}

/// The order as it is now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct OrderNow {
    pub status: String,
    #[serde(rename = "statusReason")]
    pub status_reason: Option<String>,
    #[serde(rename = "customerId")]
    pub customer_id: String,
    #[serde(rename = "createdAt", with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
}

/// Everything found about an id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Journey {
    /// The id looked up.
    pub id: Uuid,
    /// `None` when nothing anywhere knows the id.
    pub matched: Option<Matched>,
    /// The order (the records' key) the id belongs to.
    #[serde(rename = "orderId")]
    pub order_id: Option<String>,
    pub order: Option<OrderNow>,
    /// The messages of the journey, in order of first appearance.
    pub messages: Vec<Uuid>,
    pub steps: Vec<Step>,
    /// What the journey could not see, and why.
    pub notes: Vec<String>,
}

impl Journey {
    pub fn found(&self) -> bool {
        self.matched.is_some()
    }
}

/// The journey of `id`, a message id or an order id.
pub async fn find(sources: &Sources, id: Uuid) -> Result<Journey, JourneyError> {
    let mut notes = Vec::new();
    let ordered = rows::order_now(sources, &id.to_string()).await?;
    let (matched, key) = if ordered.is_some() {
        (Some(Matched::Order), Some(id.to_string()))
    } else if let Some(key) = rows::key_of_message(sources, id).await? {
        (Some(Matched::Message), Some(key))
    } else if let Some(key) = records::key_in_dead_letters(sources, id, &mut notes)
        .await
        .unwrap_or_else(|error| {
            notes.push(format!(
                "the DLTs could not be read: {}",
                crate::text::chain(&error)
            ));
            None
        })
    {
        (Some(Matched::Message), Some(key))
    } else {
        (None, None)
    };
    let Some(key) = key else {
        return Ok(Journey {
            id,
            matched: None,
            order_id: None,
            order: None,
            messages: Vec::new(),
            steps: Vec::new(),
            notes: {
                notes.insert(0, format!(
                    "no order, outbox row, delivery, reservation, status change or dead letter knows {id}"
                ));
                notes
            },
        });
    };

    let mut steps = rows::order_steps(sources, &key).await?;
    let order = match ordered {
        Some(order) => Some(order),
        None => rows::order_now(sources, &key).await?,
    };
    for flow in &sources.flows {
        let written = rows::outbox_steps(sources, flow, &key).await?;
        // The order's creation bounds the read from below even once its
        // outbox rows and log entries are gone.
        let since = match (written.earliest, order.as_ref().map(|o| o.created_at)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The broker not answering loses its evidence, not the databases'.
        match records::of_key(sources, flow, &key, &written, since, &mut notes).await {
            Ok(found) => steps.extend(found),
            Err(error) => notes.push(format!(
                "{} and {} could not be read: {}",
                flow.topic,
                flow.dlt,
                crate::text::chain(&error)
            )),
        }
        steps.extend(written.steps);
    }
    let messages = message_ids(&steps);
    for flow in &sources.flows {
        steps.extend(rows::processed_steps(sources, flow, &messages).await?);
    }
    steps.extend(rows::reservation_steps(sources, &key).await?);
    steps.extend(rows::redrive_steps(sources, &messages).await?);

    if matched == Some(Matched::Message) {
        steps.retain(|step| step.message_id == Some(id));
    }
    // Stable: steps of one moment keep the order the pipeline takes; in a
    // consumer's transaction (one `now()`), the dedupe row comes first.
    steps.sort_by_key(|step| {
        (
            step.at.is_none(),
            step.at,
            !step.place.ends_with("mensagem_processada"),
        )
    });
    Ok(Journey {
        id,
        matched,
        order_id: Some(key),
        order,
        messages: if matched == Some(Matched::Message) {
            vec![id]
        } else {
            messages
        },
        steps,
        notes,
    })
}

/// The message ids steps name, in order of first appearance.
fn message_ids(steps: &[Step]) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = Vec::new();
    for id in steps.iter().filter_map(|step| step.message_id) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}
