//! The Docker API shim's socket is root's way to the Docker engine: it must
//! live in a directory nobody else can swap it out of.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use test_support::eventually::eventually;
use test_support::process::Service;

use crate::{Scratch, root};

fn start_shim(directory: &Path) -> Service {
    let shim = root().join("scripts/lib/docker_api_shim.py");
    let socket = directory.join("docker.sock");
    Service::start(
        "docker-api-shim",
        "python3",
        &[
            &shim.display().to_string(),
            "--listen",
            &socket.display().to_string(),
            // Never reached: the shim connects to the engine per client.
            "--engine",
            "/nonexistent/docker.sock",
            "--max-version",
            "1.41",
        ],
        &[],
    )
}

async fn assert_refused(directory: &Path, why: &str) {
    let (code, log) = start_shim(directory).exit(Duration::from_secs(20)).await;
    assert_ne!(code, Some(0), "the shim exited 0 for {why}: {log}");
    assert!(
        log.contains(&directory.display().to_string()),
        "the shim's refusal does not name {}: {log}",
        directory.display()
    );
    assert!(
        !directory.join("docker.sock").exists(),
        "the shim listened in {why}"
    );
}

#[tokio::test]
async fn the_docker_api_shim_refuses_a_directory_it_does_not_own() {
    let scratch = Scratch::new("entrega-shim");
    // Another user's directory: as root, one the test gives to nobody.
    if nix::unistd::geteuid().is_root() {
        let theirs = scratch.0.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_refused(&theirs, "a directory owned by nobody").await;
    }
    // Ours, but anyone may replace what is in it.
    let open = scratch.0.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_refused(&open, "a directory others may write").await;
    // Ours and private: the shim listens there.
    let private = scratch.0.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut shim = start_shim(&private);
    let socket = private.join("docker.sock");
    eventually(
        "the shim listens in its own private directory",
        Duration::from_secs(20),
        || {
            let listening = socket.exists();
            let running = shim.is_running();
            async move { (listening || !running).then_some(()) }
        },
    )
    .await;
    assert!(shim.is_running(), "the shim exited: {}", shim.log());
    assert_eq!(shim.terminate(Duration::from_secs(10)).await, Some(0));
}
