//! `KAFKA_*` pass-through: Kubernetes service variables never stop the
//! service, and a variable that would weaken delivery stops it at start-up.

use std::time::Duration;

use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};

#[tokio::test]
async fn kubernetes_service_variables_do_not_stop_the_service() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    // What Kubernetes injects into every pod for a Service named `kafka`.
    let injected = [
        ("KAFKA_PORT", "tcp://127.0.0.1:9092".to_owned()),
        ("KAFKA_SERVICE_HOST", "127.0.0.1".to_owned()),
        ("KAFKA_SERVICE_PORT", "9092".to_owned()),
        ("KAFKA_PORT_9092_TCP_ADDR", "127.0.0.1".to_owned()),
    ];
    let service = test.start(&[], &injected).await;
    let order = Uuid::now_v7();
    test.produce(&Outgoing::order(order, &[("ABC-1", 1)])).await;

    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_kafka_variable_that_would_weaken_delivery_is_refused_at_start_up() {
    let test = InventoryTest::new().await;
    let service = test.start_unready(
        &[],
        &[("KAFKA_ENABLE_AUTO_OFFSET_STORE", "true".to_owned())],
    );
    let (code, log) = service.service.exit(Duration::from_secs(30)).await;

    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains(
            "KAFKA_ENABLE_AUTO_OFFSET_STORE would set the librdkafka property enable.auto.offset.store, which the delivery guarantees depend on"
        ),
        "{log}"
    );
}
