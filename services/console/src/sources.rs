//! What the console reads: the two databases (in read-only sessions), the
//! broker, the services' metrics; and the pipeline's shape, fixed by
//! docs/architecture.md: which topic goes from which outbox to which
//! consumer, with the topics and groups the services are configured with.

use std::time::Duration;

use consumer_tools as tools;
use rdkafka::ClientConfig;
use service_support::consumers;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::{ServiceUrl, SourceArgs};

/// One of the two databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Db {
    Orders,
    Inventory,
}

impl Db {
    pub fn name(self) -> &'static str {
        match self {
            Self::Orders => "orders",
            Self::Inventory => "inventory",
        }
    }
}

/// One leg of the pipeline: an outbox, its topic, the consumer of that
/// topic and its DLT. Topics and group are the consumer's service's
/// configuration, read from the same variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub topic: String,
    pub dlt: String,
    /// The outbox's `aggregatetype` (topic = aggregatetype + ".eventos").
    pub aggregate_type: &'static str,
    /// Where the outbox is.
    pub producer: Db,
    /// The consumer's name in `mensagem_processada`, its group, its database.
    pub consumer: &'static str,
    pub group: String,
    pub consumer_db: Db,
}

impl Flow {
    /// The group whose offsets on the DLT mark what was redriven: the one
    /// the service's `dlt redrive` uses.
    pub fn redrive_group(&self) -> String {
        tools::redrive_group(&self.group)
    }
}

/// The way out (an order to the inventory) and the way back.
fn flows(args: &SourceArgs) -> [Flow; 2] {
    [
        Flow {
            topic: args.inventory_topic.clone(),
            dlt: args.inventory_dlt_topic.clone(),
            aggregate_type: consumers::INVENTORY.aggregate_type,
            producer: Db::Orders,
            consumer: consumers::INVENTORY.name,
            group: args.inventory_group.clone(),
            consumer_db: Db::Inventory,
        },
        Flow {
            topic: args.order_status_topic.clone(),
            dlt: args.order_status_dlt_topic.clone(),
            aggregate_type: consumers::ORDER_STATUS.aggregate_type,
            producer: Db::Inventory,
            consumer: consumers::ORDER_STATUS.name,
            group: args.order_status_group.clone(),
            consumer_db: Db::Orders,
        },
    ]
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("invalid Kafka configuration")]
    Kafka(#[from] service_support::kafka::PassthroughError),
}

/// Everything the console reads, and the write access a redrive needs.
#[derive(Debug, Clone)]
pub struct Sources {
    orders: PgPool,
    inventory: PgPool,
    /// Where redrives are audited, per database: connected on first use.
    orders_redrive: PgConnectOptions,
    inventory_redrive: PgConnectOptions,
    pub kafka: ClientConfig,
    /// The pipeline's two legs, as configured.
    pub flows: [Flow; 2],
    pub services: Vec<ServiceUrl>,
    pub scan_limit: u32,
    pub relay_lock_key: i64,
    pub http: reqwest::Client,
}

/// A pool whose sessions cannot write: inspection must never change what
/// it inspects, whatever rights its role has.
fn read_only(options: &PgConnectOptions) -> PgPool {
    let options = options
        .clone()
        .application_name("entrega-console")
        .options([
            ("default_transaction_read_only", "on"),
            ("statement_timeout", "10s"),
        ]);
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options)
}

impl Sources {
    pub fn new(args: &SourceArgs) -> Result<Self, SourceError> {
        let kafka = service_support::kafka::client_config(
            &args.bootstrap_servers,
            // The console only reads what is there: a fetch that waits for
            // more (tansu holds every fetch for its full wait) only delays it.
            &[
                ("fetch.wait.max.ms", "20"),
                ("enable.partition.eof", "false"),
            ],
        )?;
        let redrive = |url: &Option<service_support::config::DatabaseUrl>,
                       fallback: &service_support::config::DatabaseUrl| {
            url.as_ref()
                .unwrap_or(fallback)
                .options
                .clone()
                .application_name("entrega-console-redrive")
        };
        Ok(Self {
            orders: read_only(&args.orders_database_url.options),
            inventory: read_only(&args.inventory_database_url.options),
            orders_redrive: redrive(&args.orders_redrive_database_url, &args.orders_database_url),
            inventory_redrive: redrive(
                &args.inventory_redrive_database_url,
                &args.inventory_database_url,
            ),
            kafka,
            flows: flows(args),
            services: args.services.clone(),
            scan_limit: args.scan_limit,
            relay_lock_key: args.relay_lock_key,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()
                .unwrap_or_default(),
        })
    }

    /// The flow whose DLT is `dlt`.
    pub fn flow_of_dlt(&self, dlt: &str) -> Option<&Flow> {
        self.flows.iter().find(|flow| flow.dlt == dlt)
    }

    /// The read-only pool of `db`.
    pub fn db(&self, db: Db) -> &PgPool {
        match db {
            Db::Orders => &self.orders,
            Db::Inventory => &self.inventory,
        }
    }

    /// Where a redrive in `db` is audited.
    pub fn redrive_database(&self, db: Db) -> PgConnectOptions {
        match db {
            Db::Orders => self.orders_redrive.clone(),
            Db::Inventory => self.inventory_redrive.clone(),
        }
    }
}
