//! CPU per component while a load runs: on a shared two-core machine a
//! latency is as much about who else was busy as about the code measured.
//! Read from /proc, so Linux only.

use std::collections::HashMap;
use std::future::Future;
use std::time::Instant;

use sqlx::Connection;

/// `/proc` counts CPU time in USER_HZ, which the kernel's ABI fixes at 100
/// whatever its internal tick rate.
const TICKS_PER_SECOND: f64 = 100.0;

/// What a component is, for reading its CPU time.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// One process.
    Process(u32),
    /// A PostgreSQL server: the postmaster, the backends and workers it
    /// runs now, and those that ended (the postmaster reaped them, so their
    /// time is in its children's counts).
    Server(u32),
}

/// The components of a stack, by name.
#[derive(Debug, Default)]
pub(crate) struct Components {
    named: Vec<(String, Source)>,
}

/// CPU seconds used so far, per component, and when that was read.
#[derive(Debug)]
pub(crate) struct Sample {
    at: Instant,
    seconds: Vec<f64>,
}

impl Components {
    pub(crate) fn process(&mut self, name: &str, pid: Option<u32>) {
        if let Some(pid) = pid {
            self.named.push((name.to_owned(), Source::Process(pid)));
        }
    }

    /// The PostgreSQL server of `url`, named by what it holds; one entry per
    /// server however many databases it hosts.
    pub(crate) async fn server(&mut self, holds: &str, url: &str) {
        let Ok(mut connection) = sqlx::PgConnection::connect(url).await else {
            return;
        };
        let backend = sqlx::query_scalar::<_, i32>("select pg_backend_pid()")
            .fetch_one(&mut connection)
            .await;
        // A server in a container or on another host has a backend pid of
        // another pid namespace: count nothing rather than a stranger. The
        // backend is looked up while the connection holds it: once closed,
        // it may be gone from /proc (seen: a P3 run without its server).
        let postmaster = backend
            .ok()
            .and_then(|backend| u32::try_from(backend).ok())
            .filter(|pid| is_postgres(*pid))
            .and_then(parent)
            .filter(|pid| is_postgres(*pid));
        let _ = connection.close().await;
        let Some(postmaster) = postmaster else {
            return;
        };
        for (name, source) in &mut self.named {
            if matches!(source, Source::Server(pid) if *pid == postmaster) {
                name.push_str(", ");
                name.push_str(holds);
                return;
            }
        }
        self.named
            .push((format!("PostgreSQL: {holds}"), Source::Server(postmaster)));
    }

    /// The Kafka-protocol broker listening on `bootstrap`'s first address
    /// on this machine, and the PostgreSQL server it stores in
    /// (`ENTREGA_BROKER_STORAGE_URL`, as `scripts/services env` sets it).
    pub(crate) async fn broker(&mut self, bootstrap: &str) {
        let port = bootstrap
            .split(',')
            .next()
            .and_then(|address| address.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok());
        self.process("broker", port.and_then(listening_on));
        if let Ok(storage) = std::env::var("ENTREGA_BROKER_STORAGE_URL") {
            self.server("broker storage", &storage).await;
        }
    }

    /// Runs `work`; with its output, each component's share of the CPU
    /// meanwhile ([`Self::between`]).
    pub(crate) async fn during<T>(&self, work: impl Future<Output = T>) -> (T, String) {
        let before = self.sample();
        let output = work.await;
        (output, self.between(&before, &self.sample()))
    }

    pub(crate) fn sample(&self) -> Sample {
        let stats = all_stats();
        let seconds = self
            .named
            .iter()
            .map(|(_, source)| {
                let ticks = match *source {
                    Source::Process(pid) => stats.get(&pid).map_or(0, |s| s.own),
                    Source::Server(postmaster) => stats
                        .iter()
                        .filter(|(pid, s)| **pid == postmaster || s.parent == postmaster)
                        .map(|(pid, s)| {
                            if *pid == postmaster {
                                s.own + s.children
                            } else {
                                s.own
                            }
                        })
                        .sum(),
                };
                ticks as f64 / TICKS_PER_SECOND
            })
            .collect();
        Sample {
            at: Instant::now(),
            seconds,
        }
    }

    /// Each component's share of one core between two samples, busiest
    /// first: "tansu 61 %, PostgreSQL: orders 48 %, …".
    pub(crate) fn between(&self, before: &Sample, after: &Sample) -> String {
        let wall = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let mut shares: Vec<(&str, f64)> = self
            .named
            .iter()
            .zip(before.seconds.iter().zip(&after.seconds))
            .map(|((name, _), (b, a))| (name.as_str(), (a - b).max(0.0) / wall * 100.0))
            .collect();
        shares.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = shares.iter().map(|(_, share)| share).sum();
        let listed: Vec<String> = shares
            .iter()
            .map(|(name, share)| format!("{name} {share:.0} %"))
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        format!(
            "{} (sum {total:.0} % of {} %)",
            listed.join(", "),
            cores * 100
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct Stat {
    parent: u32,
    /// utime + stime, in ticks.
    own: u64,
    /// cutime + cstime: reaped children's.
    children: u64,
}

fn stat_of(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// One `/proc/<pid>/stat` line (proc(5)).
fn parse_stat(text: &str) -> Option<Stat> {
    // The command name is in parentheses and may hold spaces or ')'.
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Counted from field 3 (state): ppid is field 4, utime 14 … cstime 17.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        parent: u32::try_from(field(4)?).ok()?,
        own: field(14)? + field(15)?,
        children: field(16)? + field(17)?,
    })
}

fn is_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim_end() == "postgres")
}

fn parent(pid: u32) -> Option<u32> {
    stat_of(pid).map(|stat| stat.parent)
}

/// The process with a socket listening on `port` (IPv4 or IPv6), found
/// through the socket's inode: in `/proc/net/tcp*`, then among the
/// processes' open files.
fn listening_on(port: u16) -> Option<u32> {
    const LISTEN: &str = "0A";
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|table| {
            table.lines().skip(1).find_map(|line| {
                // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                let fields: Vec<&str> = line.split_whitespace().collect();
                let local_port = fields.get(1)?.rsplit_once(':')?.1;
                let (state, inode) = (fields.get(3)?, fields.get(9)?);
                (u16::from_str_radix(local_port, 16).ok()? == port && *state == LISTEN)
                    .then(|| format!("socket:[{inode}]"))
            })
        })?;
    pids().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.filter_map(Result::ok).any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.as_os_str() == inode.as_str())
            })
        })
    })
}

/// The processes running now (none if /proc cannot be read).
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
}

fn all_stats() -> HashMap<u32, Stat> {
    pids()
        .filter_map(|pid| Some((pid, stat_of(pid)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_of_a_port_is_this_process_when_it_listens() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listening_on(port), Some(std::process::id()));
        drop(listener);
        assert_eq!(listening_on(port), None);
    }

    #[test]
    fn a_process_spending_cpu_is_seen_spending_it() {
        let mut components = Components::default();
        components.process("bench", Some(std::process::id()));
        let before = components.sample();
        assert_eq!(before.seconds.len(), 1);
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        let mut spin = 0_u64;
        let mut after = components.sample();
        while after.seconds[0] - before.seconds[0] < 0.05 && Instant::now() < deadline {
            for _ in 0..1_000_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
            after = components.sample();
        }
        assert!(
            after.seconds[0] - before.seconds[0] >= 0.05,
            "no CPU time seen for this process in /proc"
        );
        assert!(components.between(&before, &after).starts_with("bench "));
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime …
        let line = "4242 (a) b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 1 0";
        let stat = parse_stat(line).unwrap();
        assert_eq!((stat.parent, stat.own, stat.children), (17, 300, 10));
        assert!(parse_stat("4242 (no closing parenthesis S 17").is_none());
        assert!(parse_stat("4242 (short) S 17 1 1").is_none());
    }
}
