//! `bench load`: places orders through the order service's API, at a target
//! rate or as fast as it can, for a duration; then the counts and latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use reqwest::header::{CONTENT_TYPE, HeaderValue};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The order service.
    #[arg(long, env = "ORDER_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    target: String,
    /// Orders per second; 0 means as fast as the concurrency allows.
    #[arg(long, default_value_t = 0)]
    rate: u32,
    /// How long to run, e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

/// What a run produced.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) client_errors: u64,
    pub(crate) server_errors: u64,
    pub(crate) transport_errors: u64,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) elapsed: Duration,
}

impl Summary {
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted[index.min(sorted.len() - 1)]
    }

    pub(crate) fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// Adds a worker's counts and latencies.
    fn merge(&mut self, worker: Self) {
        self.sent += worker.sent;
        self.ok += worker.ok;
        self.client_errors += worker.client_errors;
        self.server_errors += worker.server_errors;
        self.transport_errors += worker.transport_errors;
        self.latencies.extend(worker.latencies);
    }
}

fn body(n: u64) -> String {
    let skus = ["ABC-1", "XYZ-9", "DEF-2"];
    format!(
        r#"{{"customerId":"c-load-{}","items":[{{"sku":"{}","quantity":{}}}]}}"#,
        n % 1000,
        skus[(n % 3) as usize],
        1 + n % 3
    )
}

/// The bodies of the load, built once: the generator should cost the
/// machine it shares with the service as little as it can.
fn bodies() -> Arc<[bytes::Bytes]> {
    // body(n) repeats every 3 000 tickets (1 000 customers, 3 skus).
    (0..3_000).map(|n| bytes::Bytes::from(body(n))).collect()
}

/// Runs the load; with `progress`, draws a bar on stderr.
pub(crate) async fn run_load(
    target: &str,
    rate: u32,
    duration: Duration,
    concurrency: usize,
    progress: bool,
    idempotency_keys: bool,
) -> Summary {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = reqwest::Url::parse(&format!("http://{target}/orders")).unwrap();
    let bodies = bodies();
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let bar = progress.then(|| {
        let bar = ProgressBar::new(duration.as_secs());
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} s {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    // Each worker takes the next ticket; with a rate, ticket n may start at
    // n / rate. Each keeps its own summary: no lock between requests.
    let workers = (0..concurrency).map(|_| {
        let (client, url, bodies, next, ok, bar) = (
            client.clone(),
            url.clone(),
            Arc::clone(&bodies),
            Arc::clone(&next),
            Arc::clone(&ok),
            bar.clone(),
        );
        async move {
            let mut summary = Summary::default();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if rate > 0 {
                    let due = started + Duration::from_secs_f64(n as f64 / f64::from(rate));
                    if due >= started + duration {
                        return summary;
                    }
                    tokio::time::sleep_until(due.into()).await;
                } else if started.elapsed() >= duration {
                    return summary;
                }
                let sent = Instant::now();
                let mut request = client
                    .post(url.clone())
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                    .body(bodies[(n % bodies.len() as u64) as usize].clone());
                if idempotency_keys {
                    request = request.header(
                        "Idempotency-Key",
                        format!("load-{}-{n}", std::process::id()),
                    );
                }
                // The body is read to its end: a response dropped unread
                // would leave its connection unusable for the next request.
                let reply = match request.send().await {
                    Ok(response) => {
                        let status = response.status();
                        response.bytes().await.map(|_| status)
                    }
                    Err(error) => Err(error),
                };
                let latency = sent.elapsed();
                summary.sent += 1;
                match reply {
                    Ok(status) if status.is_success() => {
                        summary.ok += 1;
                        summary.latencies.push(latency);
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(status) if status.is_client_error() => summary.client_errors += 1,
                    Ok(_) => summary.server_errors += 1,
                    Err(_) => summary.transport_errors += 1,
                }
                if let Some(bar) = &bar {
                    bar.set_position(started.elapsed().as_secs());
                    bar.set_message(format!("{} ok", ok.load(Ordering::Relaxed)));
                }
            }
        }
    });
    let mut summary = Summary::default();
    for worker in futures::future::join_all(workers).await {
        summary.merge(worker);
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    summary.elapsed = started.elapsed();
    summary
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let summary = run_load(
        &args.target,
        args.rate,
        args.duration,
        args.concurrency,
        true,
        true,
    )
    .await;
    println!(
        "load: sent={} 2xx={} 4xx={} 5xx={} transport_errors={} rate={:.0}/s p50={:.1}ms p99={:.1}ms",
        summary.sent,
        summary.ok,
        summary.client_errors,
        summary.server_errors,
        summary.transport_errors,
        summary.rate(),
        summary.percentile(0.50).as_secs_f64() * 1000.0,
        summary.percentile(0.99).as_secs_f64() * 1000.0,
    );
    Ok(())
}
