//! The scripts install Debian packages as root when a command they need is
//! missing. They say which before apt-get runs, and with ENTREGA_NO_INSTALL=1
//! they install nothing and fail with the list instead. apt-get here is a
//! stand-in on PATH that only records how it was called: the test must not
//! change the machine's packages.

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use crate::{Scratch, root};

/// What the stand-in apt-get writes to the log before its arguments.
const CALLED: &str = "[stand-in apt-get called with]";

struct Installer {
    scratch: Scratch,
}

impl Installer {
    fn new() -> Self {
        let scratch = Scratch::new("entrega-install");
        let bin = scratch.0.join("bin");
        std::fs::create_dir(&bin).unwrap();
        let apt_get = bin.join("apt-get");
        std::fs::write(
            &apt_get,
            format!("#!/bin/sh\necho \"{CALLED} $*\" >>\"$LOG\"\n"),
        )
        .unwrap();
        std::fs::set_permissions(&apt_get, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { scratch }
    }

    /// `require_command "$@"` from scripts/lib/common.sh, its standard error
    /// and apt-get's calls in one log, in the order they happened.
    async fn require_command(&self, args: &[&str], envs: &[(&str, &str)]) -> (Output, String) {
        let log = self.scratch.0.join("log");
        let path = format!(
            "{}:{}",
            self.scratch.0.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let output = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(r#"source "$COMMON" && require_command "$@" 2>>"$LOG""#)
            .arg("require_command")
            .args(args)
            .env("COMMON", root().join("scripts/lib/common.sh"))
            .env("LOG", &log)
            .env("PATH", path)
            .env_remove("ENTREGA_NO_INSTALL")
            .envs(envs.iter().copied())
            .output()
            .await
            .unwrap();
        (output, std::fs::read_to_string(&log).unwrap_or_default())
    }
}

#[tokio::test]
async fn with_entrega_no_install_a_missing_command_fails_with_the_packages_to_install() {
    let installer = Installer::new();
    let (output, log) = installer
        .require_command(
            &[
                "entrega-test-absent-a",
                "entrega-test-package-a",
                "entrega-test-absent-b",
                "entrega-test-package-b",
            ],
            &[("ENTREGA_NO_INSTALL", "1")],
        )
        .await;
    assert!(!output.status.success(), "it succeeded: {log}");
    assert!(
        !log.contains(CALLED),
        "apt-get ran with ENTREGA_NO_INSTALL=1:\n{log}"
    );
    for package in ["entrega-test-package-a", "entrega-test-package-b"] {
        assert!(
            log.contains(package),
            "the failure does not name {package}:\n{log}"
        );
    }
    assert!(
        log.contains("ENTREGA_NO_INSTALL"),
        "the failure does not say why nothing was installed:\n{log}"
    );
}

#[tokio::test]
async fn the_packages_to_install_are_named_before_apt_get_runs() {
    if !nix::unistd::geteuid().is_root() {
        // Only root installs; anyone else is told what to install, which
        // the test above covers.
        return;
    }
    let installer = Installer::new();
    let (output, log) = installer
        .require_command(
            &[
                "entrega-test-absent-a",
                "entrega-test-package-a",
                "entrega-test-absent-b",
                "entrega-test-package-b",
            ],
            &[],
        )
        .await;
    assert!(output.status.success(), "it failed:\n{log}");
    let said = log
        .find("entrega-test-package-a entrega-test-package-b")
        .unwrap_or_else(|| panic!("the packages are not named together:\n{log}"));
    let install = format!("{CALLED} install");
    let installed = log
        .find(&install)
        .unwrap_or_else(|| panic!("apt-get install did not run:\n{log}"));
    assert!(said < installed, "apt-get ran before it was said:\n{log}");
    assert_eq!(
        log.matches(&install).count(),
        1,
        "one apt-get install for both packages:\n{log}"
    );
}
