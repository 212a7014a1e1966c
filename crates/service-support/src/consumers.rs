//! The pipeline's two consumers as their services name them by default: the
//! consumer's name (its rows in `mensagem_processada`), the topic it reads,
//! its dead-letter topic and its group. Each service takes the last three
//! from its variables (`INVENTORY_TOPIC`, `INVENTORY_DLT_TOPIC`,
//! `INVENTORY_GROUP`; `ORDER_STATUS_TOPIC`, `ORDER_STATUS_DLT_TOPIC`,
//! `ORDER_STATUS_GROUP`) with these defaults, and so does the console: what
//! it says about a group (its lag, how far its redrive group got) is about
//! the group the service and its `dlt` tools use.

/// One consumer's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerNames {
    /// `mensagem_processada.consumidor`: not configurable, since another
    /// name would make every message the consumer processed new again.
    pub name: &'static str,
    /// The outbox `aggregatetype` of the events it consumes: the relay
    /// publishes them to `<aggregatetype>.eventos`.
    pub aggregate_type: &'static str,
    pub topic: &'static str,
    pub dlt_topic: &'static str,
    pub group: &'static str,
}

/// The inventory service's: reserves stock for the orders' events.
pub const INVENTORY: ConsumerNames = ConsumerNames {
    name: "estoque.reserva",
    aggregate_type: "pedido",
    topic: "pedido.eventos",
    dlt_topic: "pedido.eventos.dlt",
    group: "estoque",
};

/// The order service's: moves orders on with the inventory's outcomes.
pub const ORDER_STATUS: ConsumerNames = ConsumerNames {
    name: "pedido.status",
    aggregate_type: "estoque",
    topic: "estoque.eventos",
    dlt_topic: "estoque.eventos.dlt",
    group: "pedido",
};
