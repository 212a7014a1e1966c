//! One benchmark result and the generated table in `docs/benchmarks.md`.

use std::fmt::Write as _;
use std::future::Future;
use std::path::Path;
use std::process::Command;

/// Between these markers `bench all` rewrites the table; the analysis
/// around it is written by people.
const BEGIN: &str = "<!-- bench all: generated from here -->";
const END: &str = "<!-- bench all: generated up to here -->";

#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) name: String,
    pub(crate) figure: String,
    pub(crate) baseline: String,
    pub(crate) ratio: Option<Ratio>,
    pub(crate) target: String,
}

impl Figure {
    pub(crate) fn ratio_line(&self) -> String {
        let ratio = self
            .ratio
            .map_or_else(|| "n/a".to_owned(), |r| r.to_string());
        format!(
            "{}: {} beside {} ratio={ratio} (target {})",
            self.name, self.figure, self.baseline, self.target
        )
    }
}

fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn conditions() -> String {
    let commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
    let dirty =
        if command_output("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty() {
            ""
        } else {
            " with uncommitted changes"
        };
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let memory = command_output("sh", &["-c", "free -g | awk '/^Mem:/ {print $2}'"]);
    let postgres = command_output(
        "psql",
        &[
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-Atc",
            "show server_version",
        ],
    );
    let logical = command_output(
        "psql",
        &[
            &crate::relay::logical_server(),
            "-Atc",
            "show server_version",
        ],
    );
    format!(
        "Run {date} at commit `{commit}`{dirty}. Machine: {cores} cores, {memory} GiB, \
         shared with other work. PostgreSQL {postgres} on 127.0.0.1:5432 with its stock settings \
         (`synchronous_commit=on`); broker tansu 0.6.0 with PostgreSQL 17 storage on the same \
         machine; release builds; every service and baseline on loopback. Rows that name the \
         *logical server* ran their orders database on the scripts' PostgreSQL {logical} \
         (`wal_level=logical`), the one that also stores the broker's data."
    )
}

fn table(figures: &[Figure]) -> String {
    let mut text = format!("{BEGIN}\n\n{}\n\n", conditions());
    text.push_str("| benchmark | figure | baseline (same run) | ratio | target |\n");
    text.push_str("|---|---|---|---|---|\n");
    for f in figures {
        let ratio = f.ratio.map_or_else(|| "n/a".to_owned(), |r| r.to_string());
        let _ = writeln!(
            text,
            "| {} | {} | {} | {ratio} | {} |",
            f.name, f.figure, f.baseline, f.target
        );
    }
    text.push('\n');
    text.push_str(END);
    text
}

/// Replaces the generated table in `path`, keeping what people wrote around it.
pub(crate) fn write(path: &Path, figures: &[Figure]) -> std::io::Result<()> {
    let generated = table(figures);
    let current = std::fs::read_to_string(path).unwrap_or_default();
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(begin), Some(end)) if begin < end => format!(
            "{}{generated}{}",
            &current[..begin],
            &current[end + END.len()..]
        ),
        _ => format!("# Benchmarks\n\n{generated}\n{current}"),
    };
    std::fs::write(path, updated)
}

/// A benchmark's ratio to its baseline: one run's, or the median of
/// interleaved rounds with their spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ratio {
    pub(crate) median: f64,
    pub(crate) lowest: f64,
    pub(crate) highest: f64,
    pub(crate) rounds: usize,
}

impl Ratio {
    /// One run of each side.
    pub(crate) fn single(ratio: f64) -> Self {
        Self {
            median: ratio,
            lowest: ratio,
            highest: ratio,
            rounds: 1,
        }
    }

    /// Round `i`'s ratio is `figures[i] / baselines[i]`: each pair ran
    /// back to back, so what the machine was doing meanwhile hit both.
    pub(crate) fn of_rounds(figures: &[f64], baselines: &[f64]) -> Self {
        let ratios: Vec<f64> = figures
            .iter()
            .zip(baselines)
            .map(|(figure, baseline)| figure / baseline)
            .collect();
        assert!(!ratios.is_empty(), "no rounds");
        Self {
            median: median(&ratios),
            lowest: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            highest: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            rounds: ratios.len(),
        }
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.rounds == 1 {
            write!(f, "{:.2}", self.median)
        } else {
            write!(
                f,
                "{:.2} ({:.2}–{:.2}, {} rounds)",
                self.median, self.lowest, self.highest, self.rounds
            )
        }
    }
}

/// The median of `values`.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 0 {
        f64::midpoint(sorted[middle - 1], sorted[middle])
    } else {
        sorted[middle]
    }
}

/// Rates as a short list: "2410, 2388, 2502".
pub(crate) fn rates(rates: &[f64]) -> String {
    rates
        .iter()
        .map(|rate| format!("{rate:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the measured side and its baseline `rounds` times, interleaved,
/// each going first in turn (whatever the first run leaves behind — a
/// warmer cache, a busier checkpoint — falls on both alike); returns the
/// two sides' figures, round by round.
pub(crate) async fn interleaved<A, FA, TA, B, FB, TB>(
    rounds: usize,
    mut measured: A,
    mut baseline: B,
) -> (Vec<TA>, Vec<TB>)
where
    A: FnMut() -> FA,
    FA: Future<Output = TA>,
    B: FnMut() -> FB,
    FB: Future<Output = TB>,
{
    let (mut figures, mut baselines) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for round in 0..rounds {
        if round % 2 == 0 {
            figures.push(measured().await);
            baselines.push(baseline().await);
        } else {
            baselines.push(baseline().await);
            figures.push(measured().await);
        }
    }
    (figures, baselines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(ratio: Option<Ratio>) -> Figure {
        Figure {
            name: "P0".to_owned(),
            figure: "1 req/s".to_owned(),
            baseline: "2 tps".to_owned(),
            ratio,
            target: "≥ 0.8".to_owned(),
        }
    }

    #[test]
    fn rewrites_only_the_generated_part() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("benchmarks.md");
        std::fs::write(
            &path,
            format!("# B\n\nintro\n\n{BEGIN}\nold\n{END}\n\nanalysis\n"),
        )
        .unwrap();
        write(&path, &[figure(Some(Ratio::single(0.5)))]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# B\n\nintro\n\n"));
        assert!(text.ends_with("\n\nanalysis\n"));
        assert!(text.contains("| P0 | 1 req/s | 2 tps | 0.50 | ≥ 0.8 |"));
        assert!(!text.contains("old"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_figure_without_baseline_says_so() {
        assert!(figure(None).ratio_line().contains("ratio=n/a"));
    }

    #[test]
    fn a_ratio_of_rounds_is_their_median_with_the_spread() {
        let odd = Ratio::of_rounds(&[9.0, 7.0, 11.0], &[10.0, 10.0, 10.0]);
        assert_eq!((odd.median, odd.lowest, odd.highest), (0.9, 0.7, 1.1));
        let even = Ratio::of_rounds(&[1.0, 0.5, 0.75, 0.25], &[1.0; 4]);
        assert_eq!((even.median, even.rounds), (0.625, 4));
        assert_eq!(odd.to_string(), "0.90 (0.70–1.10, 3 rounds)");
        assert_eq!(Ratio::single(0.5).to_string(), "0.50");
    }
}
