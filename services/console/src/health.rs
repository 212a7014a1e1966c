//! The pipeline's health on one page: the numbers compose/prometheus/
//! alerts.yml watches, read at their sources. Lag and DLT depth come from
//! the broker (group offsets, watermarks), the outbox backlog and the relay
//! leader from each database, circuits and database availability from the
//! services' own /metrics. A source that does not answer is reported as
//! such; it never hides the others.

use std::time::Duration;

use time::OffsetDateTime;

use crate::kafka::{self, ScanError, Start};
use crate::sources::{Db, Flow, Sources};
use crate::text::chain;

/// Thresholds of compose/prometheus/alerts.yml, shown beside the numbers.
pub const LAG_ALERT: i64 = 1_000;
pub const BACKLOG_ALERT: i64 = 5_000;
pub const OLDEST_PENDING_ALERT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    #[serde(rename = "readAt", with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub read_at: OffsetDateTime,
    pub topics: Vec<TopicHealth>,
    pub outboxes: Vec<OutboxHealth>,
    pub services: Vec<ServiceHealth>,
    /// Alerts that would fire on these numbers.
    pub alerts: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct TopicHealth {
    pub topic: String,
    pub group: String,
    /// Per partition: end offset, the group's committed offset, lag.
    pub partitions: Vec<PartitionLag>,
    pub lag: i64,
    pub dlt: DltHealth,
    /// Why the numbers are missing, when the broker did not answer.
    pub error: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct PartitionLag {
    pub partition: i32,
    pub end: i64,
    pub committed: Option<i64>,
    pub lag: i64,
}

#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct DltHealth {
    pub topic: String,
    /// Records in the DLT (end minus first still there).
    pub depth: i64,
    /// Of those, not yet redriven (past the redrive group's offset).
    pub unredriven: i64,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub newest: Option<OffsetDateTime>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct OutboxHealth {
    pub database: Db,
    pub topic: String,
    pub pending: Option<i64>,
    #[serde(rename = "oldestPendingSeconds")]
    pub oldest_pending_seconds: Option<f64>,
    pub parked: Option<i64>,
    /// Rows waiting behind a parked row of their aggregate.
    pub held: Option<i64>,
    /// The relay that leads, as PostgreSQL sees it.
    pub leader: Option<Leader>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Leader {
    /// poll (the advisory lock) or cdc (the replication slot).
    pub mode: String,
    pub pid: i32,
    #[serde(rename = "applicationName")]
    pub application_name: Option<String>,
    #[serde(rename = "clientAddr")]
    pub client_addr: Option<String>,
    /// Seconds since the leader's session last changed state (its lease's
    /// heartbeat in poll mode).
    #[serde(rename = "idleSeconds")]
    pub idle_seconds: Option<f64>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ServiceHealth {
    pub name: String,
    pub url: String,
    pub up: bool,
    /// 1 while its DLQ circuit is open (consumers).
    #[serde(rename = "circuitOpen")]
    pub circuit_open: Option<bool>,
    #[serde(rename = "databaseAvailable")]
    pub database_available: Option<bool>,
    /// 1 while it leads (relays).
    pub leader: Option<bool>,
    pub error: Option<String>,
}

pub async fn read(sources: &Sources) -> Health {
    let mut topics = Vec::new();
    for flow in &sources.flows {
        topics.push(topic_health(sources, flow).await);
    }
    let mut outboxes = Vec::new();
    for flow in &sources.flows {
        outboxes.push(outbox_health(sources, flow).await);
    }
    let mut services = Vec::new();
    for service in &sources.services {
        services.push(service_health(sources, &service.name, service.url.as_str()).await);
    }
    let alerts = alerts(&topics, &outboxes, &services);
    Health {
        read_at: OffsetDateTime::now_utc(),
        topics,
        outboxes,
        services,
        alerts,
    }
}

async fn topic_health(sources: &Sources, flow: &Flow) -> TopicHealth {
    let mut health = TopicHealth {
        topic: flow.topic.clone(),
        group: flow.group.clone(),
        partitions: Vec::new(),
        lag: 0,
        dlt: DltHealth {
            topic: flow.dlt.clone(),
            ..DltHealth::default()
        },
        error: None,
    };
    let config = sources.kafka.clone();
    let flow = flow.clone();
    let read = kafka::blocking(move || {
        let consumer = kafka::reader(&config)?;
        let partitions = kafka::partition_count(&consumer, &flow.topic)?;
        let committed = kafka::committed(&config, &flow.group, &flow.topic, partitions)?;
        let mut lags = Vec::new();
        for (partition, committed) in (0..partitions).zip(committed) {
            let (low, end) = kafka::watermarks(&consumer, &flow.topic, partition)?;
            let lag = (end - committed.unwrap_or(low)).max(0);
            lags.push(PartitionLag {
                partition,
                end,
                committed,
                lag,
            });
        }
        let dlt = dlt_health(&config, &consumer, &flow)?;
        Ok((lags, dlt))
    })
    .await;
    match read {
        Ok((partitions, dlt)) => {
            health.lag = partitions.iter().map(|p| p.lag).sum();
            health.partitions = partitions;
            health.dlt = dlt;
        }
        Err(error) => health.error = Some(chain(&error)),
    }
    health
}

fn dlt_health(
    config: &rdkafka::ClientConfig,
    consumer: &rdkafka::consumer::BaseConsumer,
    flow: &Flow,
) -> Result<DltHealth, ScanError> {
    let partitions = kafka::partition_count(consumer, &flow.dlt)?;
    let redriven = kafka::committed(config, &flow.redrive_group(), &flow.dlt, partitions)?;
    let mut health = DltHealth {
        topic: flow.dlt.clone(),
        ..DltHealth::default()
    };
    for (partition, redriven) in (0..partitions).zip(redriven) {
        let (low, end) = kafka::watermarks(consumer, &flow.dlt, partition)?;
        health.depth += end - low;
        health.unredriven += end - redriven.unwrap_or(low).max(low);
        if end > low {
            let last = kafka::scan(
                consumer,
                &flow.dlt,
                partition,
                Start::Offset(end - 1),
                1,
                &|_| true,
            )?;
            let at = last.records.first().and_then(kafka::written_at);
            health.newest = health.newest.max(at);
        }
    }
    Ok(health)
}

async fn outbox_health(sources: &Sources, flow: &Flow) -> OutboxHealth {
    let pool = sources.db(flow.producer);
    let mut health = OutboxHealth {
        database: flow.producer,
        topic: flow.topic.clone(),
        pending: None,
        oldest_pending_seconds: None,
        parked: None,
        held: None,
        leader: None,
        error: None,
    };
    match outbox::backlog(pool).await {
        Ok(backlog) => {
            health.pending = Some(backlog.pending);
            health.oldest_pending_seconds = Some(backlog.oldest_pending_age.as_secs_f64());
            health.parked = Some(backlog.parked);
            health.held = Some(backlog.held);
        }
        Err(error) => health.error = Some(chain(&error)),
    }
    // The advisory lock's key is split across two oid columns (the high
    // and low 32 bits); a CDC relay leads by holding its slot instead.
    let leader = sqlx::query_as!(
        Leader,
        r#"select a.pid as "pid!", a.application_name, host(a.client_addr) as client_addr,
                extract(epoch from now() - a.state_change)::float8 as idle_seconds,
                'poll' as "mode!"
         from pg_locks l join pg_stat_activity a on a.pid = l.pid
         where l.locktype = 'advisory' and l.granted and l.database = (
                   select oid from pg_database where datname = current_database())
           and l.classid = (($1::bigint >> 32) & 4294967295)::oid
           and l.objid = ($1::bigint & 4294967295)::oid and l.objsubid = 1
         union all
         select a.pid, a.application_name, host(a.client_addr),
                extract(epoch from now() - a.state_change)::float8, 'cdc'
         from pg_replication_slots s join pg_stat_activity a on a.pid = s.active_pid
         where s.database = current_database() and s.plugin = 'pgoutput'
         limit 1"#,
        sources.relay_lock_key,
    )
    .fetch_optional(pool)
    .await;
    match leader {
        Ok(leader) => health.leader = leader,
        Err(error) => {
            health.error.get_or_insert_with(|| chain(&error));
        }
    }
    health
}

async fn service_health(sources: &Sources, name: &str, url: &str) -> ServiceHealth {
    let mut health = ServiceHealth {
        name: name.to_owned(),
        url: url.to_owned(),
        up: false,
        circuit_open: None,
        database_available: None,
        leader: None,
        error: None,
    };
    let metrics_url = format!("{}/metrics", url.trim_end_matches('/'));
    let text = match sources.http.get(&metrics_url).send().await {
        Ok(response) if response.status().is_success() => response.text().await,
        Ok(response) => {
            health.error = Some(format!("{metrics_url}: HTTP {}", response.status()));
            return health;
        }
        Err(error) => Err(error),
    };
    match text {
        Ok(text) => {
            health.up = true;
            let flag = |name: &str| gauge(&text, name).map(|value| value >= 1.0);
            health.circuit_open = flag("consumer_dlq_circuit_open");
            health.database_available =
                gauge(&text, "consumer_database_available").map(|value| value >= 1.0);
            health.leader = flag("relay_leader");
        }
        Err(error) => health.error = Some(format!("{metrics_url}: {}", chain(&error))),
    }
    health
}

/// The largest value of a gauge in Prometheus text, across its labels.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            // The name must end here: `consumer_lag` is not `consumer_lag_x`.
            let rest = match rest.chars().next()? {
                '{' => &rest[rest.find('}')? + 1..],
                ' ' => rest,
                _ => return None,
            };
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .reduce(f64::max)
}

fn alerts(
    topics: &[TopicHealth],
    outboxes: &[OutboxHealth],
    services: &[ServiceHealth],
) -> Vec<String> {
    let mut alerts = Vec::new();
    for topic in topics {
        for partition in topic.partitions.iter().filter(|p| p.lag > LAG_ALERT) {
            alerts.push(format!(
                "ConsumerLagHigh: {} partition {} lag {} > {LAG_ALERT}",
                topic.topic, partition.partition, partition.lag
            ));
        }
        if topic.dlt.unredriven > 0 {
            alerts.push(format!(
                "DeadLetterRecords: {} holds {} unredriven record(s)",
                topic.dlt.topic, topic.dlt.unredriven
            ));
        }
        if let Some(error) = &topic.error {
            alerts.push(format!(
                "{}: the broker did not answer: {error}",
                topic.topic
            ));
        }
    }
    for outbox in outboxes {
        let db = outbox.database.name();
        if outbox
            .pending
            .is_some_and(|pending| pending > BACKLOG_ALERT)
        {
            alerts.push(format!(
                "OutboxBacklogGrowing: {db} outbox holds more than {BACKLOG_ALERT} rows"
            ));
        }
        if outbox
            .oldest_pending_seconds
            .is_some_and(|age| age > OLDEST_PENDING_ALERT.as_secs_f64())
        {
            alerts.push(format!("OutboxOldestRowStale: {db} outbox's oldest pending row is older than {OLDEST_PENDING_ALERT:?}"));
        }
        if outbox.parked.is_some_and(|parked| parked > 0) {
            alerts.push(format!("OutboxRowsParked: {db} outbox has parked rows"));
        }
        if outbox.error.is_none() && outbox.leader.is_none() {
            alerts.push(format!(
                "NoRelayLeading: no relay leads on the {db} database"
            ));
        }
    }
    for service in services {
        if !service.up {
            alerts.push(format!("{} is down or unreachable", service.name));
        }
        if service.circuit_open == Some(true) {
            alerts.push(format!("DlqCircuitOpen: {}", service.name));
        }
        if service.database_available == Some(false) {
            alerts.push(format!("database unavailable to {}", service.name));
        }
    }
    alerts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_is_read_by_its_exact_name_across_labels() {
        let text = "# HELP consumer_lag lag\n\
                    consumer_lag{partition=\"0\"} 3\n\
                    consumer_lag{partition=\"1\"} 7\n\
                    consumer_lag_total 99\n\
                    relay_leader 1\n";
        assert_eq!(gauge(text, "consumer_lag"), Some(7.0));
        assert_eq!(gauge(text, "relay_leader"), Some(1.0));
        assert_eq!(gauge(text, "consumer_dlq_circuit_open"), None);
        assert_eq!(gauge("relay_leader{x=\"}\"", "relay_leader"), None);
    }
}
