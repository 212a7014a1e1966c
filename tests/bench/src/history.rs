//! P5: the relay and the consumer with millions of rows of history (retained
//! outbox rows; processed-message rows), beside the same runs on empty tables.

use test_support::kafka::bootstrap_servers;

use crate::report::{Figure, Ratio};
use crate::{consumer, relay};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rows of history.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) history: i64,
    /// Rows drained and records consumed in each run.
    #[arg(long, default_value_t = 30_000)]
    pub(crate) rows: usize,
}

/// `rate` with `history` rows, and the mean of `rate` on empty tables just
/// before and just after: the broker's own storage grows during a run, so a
/// later run is slower for that alone, and bracketing cancels it.
async fn bracketed<F, Fut>(rate: F, history: i64) -> (f64, f64)
where
    F: Fn(i64) -> Fut,
    Fut: Future<Output = f64>,
{
    let empty_before = rate(0).await;
    let with_history = rate(history).await;
    let empty_after = rate(0).await;
    (with_history, f64::midpoint(empty_before, empty_after))
}

/// A P5 figure: the rate with history beside the rate on empty tables.
fn figure(name: String, unit: &str, baseline: &str, with_history: f64, empty: f64) -> Figure {
    let figure = Figure {
        name,
        figure: format!("{with_history:.0} {unit}"),
        baseline: format!("{baseline} (mean of the runs before and after): {empty:.0} {unit}"),
        ratio: Some(Ratio::single(with_history / empty)),
        target: "≥ 0.9".to_owned(),
    };
    println!("{}", figure.ratio_line());
    figure
}

pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let bootstrap = bootstrap_servers();
    let broker = consumer::Broker::plaintext(bootstrap.clone());
    let relay_args = relay::Args {
        rows: i64::try_from(args.rows).unwrap_or(i64::MAX),
        relay: "target/release/outbox-relay".to_owned(),
        setups: vec![relay::Setup::Poll],
        rounds: 1,
    };
    let consumer_args =
        consumer::Args::consuming(args.rows, "target/release/inventory-service".to_owned());
    // Both relay runs keep published rows, so only the history differs.
    let (relay_history, relay_empty) = bracketed(
        |history| relay::relay_rate(&relay_args, relay::Setup::Poll, &bootstrap, Some(history)),
        args.history,
    )
    .await;
    let relay = figure(
        format!(
            "P5 relay (retaining published rows), {} rows over {} retained",
            args.rows, args.history
        ),
        "rows/s",
        "same drain, no retained rows",
        relay_history,
        relay_empty,
    );
    let batch = consumer::DEFAULT_BATCH_SIZE;
    let (consumer_history, consumer_empty) = bracketed(
        |history| consumer::consumer_rate(&consumer_args, &broker, batch, Some(history), &[], 1),
        args.history,
    )
    .await;
    let consumer = figure(
        format!(
            "P5 consumer (batch {batch}), {} records over {} processed rows",
            args.rows, args.history
        ),
        "records/s",
        "same records, empty mensagem_processada",
        consumer_history,
        consumer_empty,
    );
    vec![relay, consumer]
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}
