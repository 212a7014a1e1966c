//! `KAFKA_*` pass-through: Kubernetes service variables never stop the
//! relay, and a variable that would weaken delivery stops it at start-up.

use std::time::Duration;

use crate::helpers::RelayTest;

/// What Kubernetes injects into every pod for a Service named `kafka`.
fn kubernetes_service_variables() -> Vec<(&'static str, String)> {
    vec![
        ("KAFKA_PORT", "tcp://127.0.0.1:9092".to_owned()),
        ("KAFKA_SERVICE_HOST", "127.0.0.1".to_owned()),
        ("KAFKA_SERVICE_PORT", "9092".to_owned()),
        ("KAFKA_PORT_9092_TCP_ADDR", "127.0.0.1".to_owned()),
    ]
}

#[tokio::test]
async fn kubernetes_service_variables_do_not_stop_the_relay() {
    let test = RelayTest::new().await;
    test.insert_row(&test.aggregate_type, "k8s", r#"{"n": 1}"#)
        .await;
    let relay = test.start_relay_with_env(&[], &kubernetes_service_variables());

    test.wait_until_drained(Duration::from_secs(60)).await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_kafka_variable_that_would_weaken_delivery_is_refused_at_start_up() {
    let test = RelayTest::new().await;
    let relay = test.start_relay_with_env(&[], &[("KAFKA_ACKS", "1".to_owned())]);
    let (code, log) = relay.service.exit(Duration::from_secs(30)).await;

    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains(
            "KAFKA_ACKS would set the librdkafka property acks, which the delivery guarantees depend on"
        ),
        "{log}"
    );
}

/// The lease and the send fence assume that librdkafka gives up on a record
/// after --delivery-timeout: a variable that stretches that (or lingers
/// longer than it) would let a deposed leader deliver after a standby
/// published later rows of the same aggregates.
#[tokio::test]
async fn a_kafka_variable_that_would_move_the_send_fence_is_refused_at_start_up() {
    let test = RelayTest::new().await;
    for (variable, value, expected) in [
        (
            "KAFKA_MESSAGE_TIMEOUT_MS",
            "60000",
            "KAFKA_MESSAGE_TIMEOUT_MS would set the librdkafka property message.timeout.ms",
        ),
        (
            "KAFKA_DELIVERY_TIMEOUT_MS",
            "60000",
            "KAFKA_DELIVERY_TIMEOUT_MS would set the librdkafka property delivery.timeout.ms",
        ),
        (
            "KAFKA_LINGER_MS",
            "60000",
            "KAFKA_LINGER_MS would set the librdkafka property linger.ms",
        ),
        (
            "KAFKA_QUEUE_BUFFERING_MAX_MS",
            "60000",
            "KAFKA_QUEUE_BUFFERING_MAX_MS would set the librdkafka property queue.buffering.max.ms",
        ),
    ] {
        let relay = test.start_relay_with_env(&[], &[(variable, value.to_owned())]);
        let (code, log) = relay.service.exit(Duration::from_secs(30)).await;
        assert_ne!(code, Some(0), "{variable} was accepted:\n{log}");
        assert!(log.contains(expected), "{variable}:\n{log}");
        assert!(
            log.contains("--delivery-timeout"),
            "{variable}: the error does not say which option to use instead:\n{log}"
        );
    }
}
