//! P5: the relay and the consumer with millions of rows of history (retained
//! outbox rows; processed-message rows), beside the same runs on empty tables.

use test_support::kafka::bootstrap_servers;

use crate::report::Figure;
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

pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let bootstrap = bootstrap_servers();
    let relay_args = relay::Args {
        rows: i64::try_from(args.rows).unwrap_or(i64::MAX),
        relay: "target/release/outbox-relay".to_owned(),
    };
    let consumer_args = consumer::Args {
        records: args.rows,
        service: "target/release/inventory-service".to_owned(),
    };
    // Both relay runs keep published rows, so only the history differs. The
    // empty case runs before and after: the broker's own storage grows
    // during a run, and a later run would otherwise be slower for that alone.
    let relay_history = relay::relay_rate(&relay_args, &bootstrap, Some(args.history)).await;
    let relay_empty = f64::midpoint(
        relay::relay_rate(&relay_args, &bootstrap, Some(0)).await,
        relay::relay_rate(&relay_args, &bootstrap, Some(0)).await,
    );
    let relay = Figure {
        name: format!(
            "P5 relay (retaining published rows), {} rows over {} retained",
            args.rows, args.history
        ),
        figure: format!("{relay_history:.0} rows/s"),
        baseline: format!(
            "same drain, no retained rows (mean of two runs): {relay_empty:.0} rows/s"
        ),
        ratio: Some(relay_history / relay_empty),
        target: "≥ 0.9".to_owned(),
    };
    println!("{}", relay.ratio_line());
    let batch = consumer::DEFAULT_BATCH_SIZE;
    let consumer_history =
        consumer::consumer_rate(&consumer_args, &bootstrap, batch, args.history).await;
    let consumer_empty = f64::midpoint(
        consumer::consumer_rate(&consumer_args, &bootstrap, batch, 0).await,
        consumer::consumer_rate(&consumer_args, &bootstrap, batch, 0).await,
    );
    let consumer = Figure {
        name: format!(
            "P5 consumer (batch {batch}), {} records over {} processed rows",
            args.rows, args.history
        ),
        figure: format!("{consumer_history:.0} records/s"),
        baseline: format!(
            "same records, empty mensagem_processada (mean of two runs): {consumer_empty:.0} records/s"
        ),
        ratio: Some(consumer_history / consumer_empty),
        target: "≥ 0.9".to_owned(),
    };
    println!("{}", consumer.ratio_line());
    vec![relay, consumer]
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}
