//! The relay's metrics, described once.

use std::sync::Once;

use service_support::metrics::PrometheusHandle;

pub fn recorder() -> PrometheusHandle {
    static DESCRIBED: Once = Once::new();
    let handle = service_support::metrics::recorder();
    DESCRIBED.call_once(|| {
        metrics::describe_gauge!(
            "outbox_backlog_rows",
            "Outbox rows not yet published (parked rows excluded)"
        );
        metrics::describe_gauge!(
            "outbox_oldest_pending_age_seconds",
            metrics::Unit::Seconds,
            "Age of the oldest outbox row not yet published"
        );
        metrics::describe_gauge!(
            "outbox_parked_rows",
            "Outbox rows parked after repeated failures"
        );
        metrics::describe_gauge!(
            "outbox_held_rows",
            "Outbox rows waiting behind a parked row of their aggregate (per-aggregate order)"
        );
        metrics::describe_counter!(
            "outbox_published_total",
            "Outbox rows published and acknowledged by the broker"
        );
        metrics::describe_counter!("outbox_parked_total", "Outbox rows parked by this relay");
        metrics::describe_histogram!(
            "relay_batch_publish_duration_seconds",
            metrics::Unit::Seconds,
            "Time from sending a batch to its last delivery report"
        );
        metrics::describe_histogram!(
            "relay_statement_duration_seconds",
            metrics::Unit::Seconds,
            "Poll mode: round trip of the leader's outbox statements, by statement (read: a read that found rows; mark: the published rows of a batch)"
        );
        metrics::describe_counter!(
            "relay_publish_failures_total",
            "Rows that failed to publish, by kind (poison, transient)"
        );
        metrics::describe_gauge!("relay_leader", "1 while this relay is the active one");
        metrics::describe_counter!(
            "relay_records_sent_total",
            "Records handed to the producer (sent; published once acknowledged)"
        );
        metrics::describe_counter!(
            "relay_withheld_rows_total",
            "Rows read but not sent because the leader's lease ran too short (a stall)"
        );
        metrics::describe_counter!(
            "relay_leaders_deposed_total",
            "Stalled leaders this relay deposed (their session still for longer than the lease)"
        );
        metrics::describe_gauge!(
            "relay_topic_durability_unsafe",
            "1 for a target topic whose replication factor or min.insync.replicas is below 2: acks=all cannot survive one broker's disk loss"
        );
        metrics::describe_counter!(
            "relay_producer_rebuilds_total",
            "Producers rebuilt after a fatal error"
        );
        metrics::describe_gauge!(
            "relay_slot_retained_wal_bytes",
            metrics::Unit::Bytes,
            "CDC mode: WAL the server keeps for the relay's slot"
        );
        metrics::describe_gauge!(
            "relay_slot_lag_bytes",
            metrics::Unit::Bytes,
            "CDC mode: WAL written since the position the relay last confirmed"
        );
        metrics::describe_gauge!(
            "relay_slot_safe_wal_bytes",
            metrics::Unit::Bytes,
            "CDC mode: WAL that may still be written before the slot is invalidated (+Inf without max_slot_wal_keep_size)"
        );
        metrics::describe_gauge!(
            "relay_slot_lost",
            "CDC mode: 1 when the slot is invalidated or gone: the relay stops, see docs/relay.md"
        );
        metrics::describe_gauge!(
            "relay_cdc_unclean_rows",
            "CDC mode: published rows whose mark or delete has not found them yet (their commit not yet visible); retried"
        );
        metrics::describe_gauge!(
            "relay_cdc_confirmed_lsn",
            "CDC mode: the WAL position last confirmed to the server"
        );
        metrics::describe_counter!(
            "relay_overlapped_batches_total",
            "Batches read and sent while the batch before awaited its acknowledgements (a backlog draining: reads came back full)"
        );
        metrics::describe_counter!(
            "relay_fenced_batches_total",
            "Batches of which nothing could be sent: even after a renewal the lease was too short (statements outlast the send window); the leader backs off"
        );
        metrics::describe_counter!(
            "relay_lease_renewals_total",
            "Lease renewals before sending, by what made them needed (a statement that used up most of the send window)"
        );
        metrics::describe_counter!(
            "relay_delivery_log_failures_total",
            "Batches marked without their delivery log entries: outbox_delivery could not be written (revoked, dropped, full)"
        );
        metrics::describe_counter!(
            "relay_streams_ended_total",
            "CDC mode: walsenders of a previous leader this relay ended to take the slot"
        );
        metrics::describe_counter!(
            "relay_cdc_stepped_aside_total",
            "CDC mode: records the stream stepped aside into the outbox table (the broker did not take them, or an earlier row of their aggregate waits there)"
        );
        metrics::describe_counter!(
            "relay_cdc_other_table_rows_total",
            "CDC mode: inserts of tables other than the outbox in the stream, ignored (the publication was widened after start-up)"
        );
        // Exported from the start at 0, so that an alert on their increase
        // sees the first one.
        for name in [
            "relay_withheld_rows_total",
            "relay_leaders_deposed_total",
            "relay_fenced_batches_total",
            "relay_overlapped_batches_total",
            "relay_delivery_log_failures_total",
        ] {
            metrics::counter!(name).increment(0);
        }
    });
    handle
}
