use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A child process of the test, killed (SIGKILL) if still running on drop.
#[derive(Debug)]
pub struct Service {
    pub name: String,
    child: Child,
}

impl Service {
    /// Starts `program` with `envs` added to the environment. Its output
    /// goes to the test's output only with TEST_LOG set.
    pub fn start(name: &str, program: &str, args: &[&str], envs: &[(&str, String)]) -> Self {
        let quiet = std::env::var_os("TEST_LOG").is_none();
        let output = || {
            if quiet {
                Stdio::null()
            } else {
                Stdio::inherit()
            }
        };
        let child = Command::new(program)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(output())
            .stderr(output())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({program}): {e}"));
        Self {
            name: name.to_owned(),
            child,
        }
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
    pub async fn wait(mut self, deadline: Duration) -> Option<i32> {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => panic!("{} did not exit within {deadline:?}", self.name),
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
