use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The flags that make the outbox relay react quickly in tests: short idle
/// polls, failover tries and backoffs.
pub const RELAY_QUICK_FLAGS: &[&str] = &[
    "--poll-interval",
    "20ms",
    "--failover-interval",
    "200ms",
    "--max-backoff",
    "1s",
];

/// A child process of the test, killed (SIGKILL) if still running on drop.
/// Its standard output and error go to a log file of its own, which a test
/// may read ([`Service::log`]); with TEST_LOG set, the log is also printed
/// when the value is dropped.
#[derive(Debug)]
pub struct Service {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Service {
    /// Starts `program` with `envs` added to the environment.
    pub fn start(name: &str, program: &str, args: &[&str], envs: &[(&str, String)]) -> Self {
        let directory = std::env::temp_dir().join("entrega-test-logs");
        std::fs::create_dir_all(&directory).expect("creating the test log directory");
        let log = directory.join(format!("{name}-{}.log", uuid::Uuid::new_v4().simple()));
        let file = std::fs::File::create(&log).expect("creating a test log file");
        let errors = file.try_clone().expect("cloning the log file handle");
        let child = Command::new(program)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(errors)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({program}): {e}"));
        Self {
            name: name.to_owned(),
            child,
            log,
        }
    }

    /// Everything the process wrote so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let pid = Pid::from_raw(i32::try_from(pid).unwrap());
            let _ = kill(pid, signal);
        }
    }

    /// SIGKILL, and wait until it is gone.
    pub async fn kill(mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait().await;
    }

    /// SIGTERM, then wait up to `grace` for it to exit; returns its exit code.
    pub async fn terminate(mut self, grace: Duration) -> Option<i32> {
        self.signal(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => panic!("{} did not exit within {grace:?} of SIGTERM", self.name),
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to exit by itself; returns its exit code.
    pub async fn wait(self, deadline: Duration) -> Option<i32> {
        self.exit(deadline).await.0
    }

    /// Waits for the process to exit by itself; returns its exit code and
    /// everything it wrote.
    pub async fn exit(mut self, deadline: Duration) -> (Option<i32>, String) {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(Ok(status)) => (status.code(), self.log()),
            _ => panic!("{} did not exit within {deadline:?}", self.name),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if std::env::var_os("TEST_LOG").is_some() {
            eprintln!(
                "----- {} ({}) -----\n{}",
                self.name,
                self.log.display(),
                self.log()
            );
        }
        // A failing test keeps the logs of its processes for a post-mortem.
        if std::thread::panicking() {
            eprintln!("log of {}: {}", self.name, self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding an ephemeral port")
}
