//! One benchmark result and the generated table in `docs/benchmarks.md`.

use std::fmt::Write as _;
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
    pub(crate) ratio: Option<f64>,
    pub(crate) target: String,
}

impl Figure {
    pub(crate) fn ratio_line(&self) -> String {
        let ratio = self
            .ratio
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
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
        let ratio = f
            .ratio
            .map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(ratio: Option<f64>) -> Figure {
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
        write(&path, &[figure(Some(0.5))]).unwrap();
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
}
