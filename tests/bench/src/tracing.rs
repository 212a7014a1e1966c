//! P6: what tracing costs. P1 (POST /orders) and P3 (the consumer, batched)
//! with the OTLP exporter on, every trace sampled, one in ten and none,
//! beside the same benchmark with tracing off, in the same run. The spans go to an OTLP/HTTP
//! receiver in this process, which decodes and counts them, as a collector
//! on the same machine would.

use std::time::Duration;

use test_support::otlp::OtlpReceiver;

use crate::report::{Figure, Ratio, rates};
use crate::{api, consumer};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The order service binary (a release build).
    #[arg(long, default_value = "target/release/order-service")]
    pub(crate) order_service: String,
    /// The inventory service binary (a release build).
    #[arg(long, default_value = "target/release/inventory-service")]
    pub(crate) inventory_service: String,
    /// How long each P1 side runs, per round.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Records each P3 side consumes, per round.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) records: usize,
    /// Off/on rounds, interleaved; the ratio is the median of the rounds'.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
}

/// The exporter on, sampling `ratio` of the traces (a parent's decision
/// wins, as in production).
fn tracing_on(receiver: &OtlpReceiver, ratio: f64) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".to_owned()),
        ("OTEL_TRACES_SAMPLER_ARG", ratio.to_string()),
    ]
}

fn figure(name: String, unit: &str, off: &[f64], on: &[f64], spans: usize) -> Figure {
    let figure = Figure {
        name,
        figure: format!("{} {unit} with tracing ({spans} spans received)", rates(on)),
        baseline: format!("tracing off: {} {unit}", rates(off)),
        ratio: Some(Ratio::of_rounds(on, off)),
        target: "≥ 0.9".to_owned(),
    };
    println!("{}", figure.ratio_line());
    figure
}

/// Rates with tracing off, then on at each sampling ratio: one list of
/// rounds per set-up, rounds interleaved so that drift hits all alike. `run`
/// gets the environment and the ratio (1 when off).
async fn rounds<F, Fut>(args: &Args, receiver: &OtlpReceiver, run: F) -> Vec<(Vec<f64>, usize)>
where
    F: Fn(Vec<(&'static str, String)>, f64) -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let setups: Vec<(Vec<(&'static str, String)>, f64)> = std::iter::once((Vec::new(), 1.0))
        .chain(
            SAMPLING
                .iter()
                .map(|ratio| (tracing_on(receiver, *ratio), *ratio)),
        )
        .collect();
    let mut results = vec![(Vec::new(), 0); setups.len()];
    for _ in 0..args.rounds {
        for ((environment, ratio), result) in setups.iter().zip(&mut results) {
            let (before, _) = receiver.counts();
            result.0.push(run(environment.clone(), *ratio).await);
            result.1 += receiver.counts().0 - before;
        }
    }
    results
}

/// 0 %: the OpenTelemetry layer and its spans, nothing exported.
const SAMPLING: [f64; 3] = [1.0, 0.1, 0.0];

pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let receiver = OtlpReceiver::start_counting().await;
    let concurrency = 16;
    let api = rounds(args, &receiver, |environment, _| async move {
        api::api_rate(
            &args.order_service,
            concurrency,
            None,
            args.duration,
            &environment,
        )
        .await
    })
    .await;
    let broker = consumer::Broker::shared();
    let consumer_args = consumer::Args::consuming(args.records, args.inventory_service.clone());
    let batch = consumer::DEFAULT_BATCH_SIZE;
    // Records carry the upstream decision in their traceparent, which a
    // parent-based sampler follows: one in ten sampled at 10 %.
    let consumer = rounds(args, &receiver, |environment, ratio| {
        let (consumer_args, broker) = (&consumer_args, &broker);
        let one_in = if ratio > 0.0 {
            (1.0 / ratio).round() as usize
        } else {
            usize::MAX
        };
        async move {
            consumer::consumer_rate(consumer_args, broker, batch, None, &environment, one_in).await
        }
    })
    .await;
    let (spans, requests) = receiver.counts();
    println!("OTLP receiver: {spans} spans in {requests} export requests");
    let mut figures = Vec::new();
    for (i, ratio) in SAMPLING.iter().enumerate() {
        let percent = ratio * 100.0;
        figures.push(figure(
            format!(
                "P6 tracing on P1: POST /orders, {concurrency} connections, sampling {percent:.0} %"
            ),
            "req/s",
            &api[0].0,
            &api[i + 1].0,
            api[i + 1].1,
        ));
        figures.push(figure(
            format!(
                "P6 tracing on P3: consumer, {} records, batch {batch}, sampling {percent:.0} %",
                args.records
            ),
            "records/s",
            &consumer[0].0,
            &consumer[i + 1].0,
            consumer[i + 1].1,
        ));
    }
    figures
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}
