//! What the agent tests share: launching the example agent as a user runs it, and loopback ports.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/agent`, which `cargo test` builds alongside the tests, with no
/// GPU-visibility variables from the caller's environment and warn-level logs.
pub fn agent() -> Command {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin: PathBuf = dir.join("examples").join("agent");
    assert!(bin.exists(), "{} not built; run `cargo test` (it builds examples)", bin.display());
    let mut cmd = Command::new(bin);
    cmd.env_remove("CUDA_VISIBLE_DEVICES").env_remove("NVIDIA_VISIBLE_DEVICES").env("GPUMON_LOG", "warn");
    cmd
}

/// Runs `cmd` to completion: (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
