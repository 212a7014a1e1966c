//! The pipeline against PostgreSQL and the broker in containers on a real
//! Docker engine (testcontainers), and the compose stack brought up with the
//! Compose tool. `scripts/test` runs them whenever an engine answers
//! (`scripts/docker up` provides one as root on Debian); docs/containers.md
//! says which images are used where.

// A failed unwrap in a scenario is a failed assertion with a backtrace.
#![allow(clippy::unwrap_used)]

mod compose;
mod scenarios;
