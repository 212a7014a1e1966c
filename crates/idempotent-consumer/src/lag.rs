//! Consumer lag per owned partition: the high watermark minus the committed
//! offset, sampled periodically (librdkafka calls block: off the runtime).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::consumer::Consumer;
use service_support::retry;
use tokio_util::sync::CancellationToken;

use super::poller::KafkaConsumer;

const TIMEOUT: Duration = Duration::from_secs(5);

fn lag_now(consumer: &KafkaConsumer) -> Vec<(i32, i64)> {
    let Ok(assignment) = consumer.assignment() else {
        return Vec::new();
    };
    let Ok(committed) = consumer.committed_offsets(assignment, TIMEOUT) else {
        return Vec::new();
    };
    committed
        .elements()
        .iter()
        .filter_map(|element| {
            let (low, high) = consumer
                .fetch_watermarks(element.topic(), element.partition(), TIMEOUT)
                .ok()?;
            let position = match element.offset() {
                Offset::Offset(offset) => offset,
                _ => low,
            };
            Some((element.partition(), (high - position).max(0)))
        })
        .collect()
}

pub(super) async fn sample(
    consumer: Arc<KafkaConsumer>,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    while retry::tick(&mut interval, &shutdown).await {
        let consumer = Arc::clone(&consumer);
        let Ok(lags) = tokio::task::spawn_blocking(move || lag_now(&consumer)).await else {
            continue;
        };
        for (partition, lag) in lags {
            metrics::gauge!("consumer_lag", "partition" => partition.to_string()).set(lag as f64);
        }
    }
}
