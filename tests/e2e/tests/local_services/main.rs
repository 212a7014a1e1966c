//! What the scripts in scripts/ promise about the machine they run on: the
//! PostgreSQL that `scripts/services` runs lets in only who holds its
//! password, the Docker API shim listens only in a directory of its own, and
//! nothing is installed as root behind the user's back. These run the
//! scripts themselves (and psql, as an attacker would), like ops_config.rs
//! checks compose/ from the e2e suite.

// A failed unwrap here is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod install;
mod postgres;
mod shim;

use std::path::{Path, PathBuf};

/// The clone's root directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh directory of the test's own under the system's temporary
/// directory, removed (with everything in it) when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&path).unwrap();
        Self(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
