//! The web page for a tenant, in headless Chromium (scripts/web-browser.py with the tenant's
//! `Authorization` header on every request, the live stream included): the page loads and goes
//! live with the tenant's credential, and shows only what the tenant holds. On the mock nobody
//! owns a process, so the tenant's page has the host but no GPU card, while the admin's has all
//! eight.
//!
//! `#[ignore = "needs scripts/test.sh (chromium)"]`, like tests/web_browser.rs.
#![cfg(all(feature = "agent", feature = "web"))]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::{free_port, Credential, Ready, TempDir};
use serde_json::Value;

mod common;
use common::agent_process;

/// `Authorization: Basic base64(user:password)`.
fn basic(user: &str, password: &str) -> String {
    Credential::basic(user, password).header()
}

fn browse(url: &str, header: &str) -> Value {
    let chromium = require_env("GPUMON_TEST_CHROMIUM");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/web-browser.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(url)
        .args(["--chromium", &chromium, "--header", header, "--start-when", "live", "--at", "1"])
        .output()
        .expect("python3");
    assert!(out.status.success(), "web-browser.py failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("web-browser.py prints JSON")
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn a_tenants_page_goes_live_and_shows_only_its_gpus() {
    let port = free_port();
    let dir = TempDir::new("web-tenancy");
    let cfg = dir.file(
        "agent.toml",
        &format!(
            "[agent]\nbackend = \"mock\"\ninterval = \"500ms\"\nenable = [\"processes\"]\n\
             [mock]\nprofile = \"h100x8\"\n\
             [web]\nlisten = \"127.0.0.1:{port}\"\nauth = {{ basic = {{ username = \"ops\", password = \"pw-ops\" }} }}\n\
             [[web.tenants]]\nname = \"team-a\"\nselector = {{ namespace = \"team-a\" }}\n\
             basic = {{ username = \"team-a\", password = \"pw-a\" }}\n"
        ),
    );
    // The agent's web view listens within 20 s.
    let agent = agent_process().arg("--config").arg(&cfg).ready(Ready::Port(([127, 0, 0, 1], port).into())).spawn();
    let base = agent.url();
    std::thread::sleep(Duration::from_millis(1500)); // a few samples

    let admin = browse(&format!("{base}/"), &basic("ops", "pw-ops"));
    let tenant = browse(&format!("{base}/"), &basic("team-a", "pw-a"));
    for (who, run) in [("admin", &admin), ("team-a", &tenant)] {
        assert_eq!(run["exceptions"], serde_json::json!([]), "{who}: script errors");
        assert_eq!(run["console_errors"], serde_json::json!([]), "{who}: console errors (a 401 shows here)");
        let probe = &run["probes"][0];
        assert_eq!(probe["conn_state"], "live", "{who}: the live stream did not connect: {probe}");
        assert!(probe["host"].as_str().is_some_and(|h| h.contains("mock")), "{who}: no host summary: {probe}");
    }
    assert_eq!(admin["probes"][0]["cards"].as_array().unwrap().len(), 8);
    // Nobody is known to own the mock's processes: the tenant holds no GPU and sees none.
    assert_eq!(tenant["probes"][0]["cards"], serde_json::json!([]), "{}", tenant["probes"][0]);
    assert_eq!(tenant["probes"][0]["processes"], Value::Null, "{}", tenant["probes"][0]);
}
