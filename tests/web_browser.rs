//! The web view in a real browser: headless Chromium (Debian's `chromium`, installed by
//! scripts/backends/install.sh) driven in real time over the DevTools protocol by
//! scripts/web-browser.py, against the example agent on the mock backend.
//!
//! The browser tests are `#[ignore = "needs scripts/test.sh (chromium)"]`; scripts/test.sh sets
//! GPUMON_TEST_CHROMIUM and runs them. Without it they fail (never pass by skipping).
//! Screenshots go to a temporary directory (printed).
#![cfg(all(feature = "agent", feature = "web"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::{free_port, AgentProcess, Ready};
use serde_json::Value;

mod common;
use common::{agent, agent_process, proc_root_owning};

fn http() -> reqwest::blocking::Client {
    #[cfg(feature = "tls")]
    gpumon::sinks::tls::install_crypto_provider();
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build().unwrap()
}

/// The agent with its web view on a free port, once the view serves a snapshot (20 s at most).
fn start(args: &[&str]) -> (AgentProcess, String) {
    let addr = ([127, 0, 0, 1], free_port()).into();
    let running = agent_process()
        .args(["--web-listen", &format!("{addr}"), "--interval", "500ms"])
        .args(args)
        .ready(Ready::Http(addr, "/api/snapshot".to_owned()))
        .spawn();
    let base = running.url();
    (running, base)
}

fn snapshot(base: &str) -> Value {
    serde_json::from_str(&http().get(format!("{base}/api/snapshot")).send().unwrap().text().unwrap()).unwrap()
}

/// Runs scripts/web-browser.py: probes of the live page at each time, and a screenshot.
fn browse(url: &str, at: &[f64], screenshot: &Path) -> Value {
    let chromium = require_env("GPUMON_TEST_CHROMIUM");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/web-browser.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(url).arg("--chromium").arg(chromium).arg("--screenshot").arg(screenshot).arg("--full-page");
    for t in at {
        cmd.arg("--at").arg(t.to_string());
    }
    let out = cmd.output().expect("python3");
    assert!(out.status.success(), "web-browser.py failed: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("screenshot: {}", screenshot.display());
    serde_json::from_slice(&out.stdout).expect("web-browser.py prints JSON")
}

fn shots_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-web-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn assert_clean(run: &Value) {
    assert_eq!(run["dialogs"], serde_json::json!([]), "the page opened a dialog");
    assert_eq!(run["exceptions"], serde_json::json!([]), "script errors");
    assert_eq!(run["console_errors"], serde_json::json!([]), "console errors (CSP violations show here)");
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_eight_live_cards_for_h100x8() {
    let (_agent, base) = start(&["--backend", "mock", "--mock-profile", "h100x8"]);
    let snap = snapshot(&base);
    let run = browse(&format!("{base}/"), &[3.0, 6.0], &shots_dir().join("h100x8.png"));
    assert_clean(&run);
    let (first, second) = (&run["probes"][0], &run["probes"][1]);
    let cards = first["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 8, "{first}");
    let devices = snap["devices"].as_array().unwrap();
    for (card, dev) in cards.iter().zip(devices) {
        // The profile's names and UUIDs, in index order.
        assert_eq!(card["uuid"], dev["info"]["uuid"]);
        assert_eq!(card["name"], dev["info"]["name"]);
        assert_eq!(card["name"], "NVIDIA H100 80GB HBM3");
        assert_eq!(card["canvases"], 5, "five live charts per card");
        for field in ["util", "mem", "power", "temp", "sm_clock"] {
            let v = card["figures"][field].as_str().unwrap();
            assert!(v.chars().next().unwrap().is_ascii_digit(), "{field}: {v}");
        }
    }
    assert_eq!(first["banner"], true, "simulated data must say so");
    assert_eq!(second["conn"], "live");
    // The live stream works: three seconds later the figures are not the same.
    let figures = |p: &Value| p["cards"].as_array().unwrap().iter().map(|c| c["figures"].clone()).collect::<Vec<_>>();
    assert_ne!(figures(first), figures(second), "figures did not change in 3 s");
    assert!(second["host"].as_str().unwrap().contains("mock"));
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_hostile_names_as_text() {
    const HOSTILE: &str = "<img src=x onerror=alert(1)>";
    const HOST: &str = "<script>alert(2)</script><b>node</b>";
    let dir = shots_dir();
    let profile = dir.join("hostile.toml");
    std::fs::write(
        &profile,
        format!("name = \"hostile\"\n[[devices]]\nmodel = \"h100\"\ncount = 2\noverrides = {{ name = {HOSTILE:?} }}\n"),
    )
    .unwrap();
    let (_agent, base) = start(&["--backend", "mock", "--mock-profile", profile.to_str().unwrap(), "--host", HOST]);
    let run = browse(&format!("{base}/"), &[3.0], &dir.join("hostile.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    let cards = probe["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 2, "{probe}");
    for card in cards {
        assert_eq!(card["name"], HOSTILE, "shown literally");
        assert_eq!(card["name_children"], 0, "no element made from the name");
    }
    assert!(probe["host"].as_str().unwrap().contains(HOST), "{}", probe["host"]);
    let tags = &probe["tags"];
    assert!(tags.get("img").is_none(), "an <img> was created: {tags}");
    assert!(tags.get("b").is_none(), "a <b> was created: {tags}");
    assert_eq!(tags["script"], 2, "only the page's own scripts: {tags}");
    assert_eq!(probe["pwned"], false);
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_findings_with_advice_and_processes() {
    let (_agent, base) = start(&[
        "--backend",
        "mock",
        "--mock-profile",
        "a100x4",
        "--mock-scenario",
        "dataloader-starved",
        "--diagnose-window",
        "2s",
        "--enable",
        "processes",
    ]);
    let run = browse(&format!("{base}/"), &[7.0], &shots_dir().join("findings.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    let findings = probe["findings"].as_array().expect("the findings section is shown");
    assert!(
        findings
            .iter()
            .any(|f| f.as_str().unwrap().contains("dataloader_starvation") && f.as_str().unwrap().contains("→")),
        "{findings:?}"
    );
    assert!(probe["processes"].as_u64().unwrap() > 0, "{probe}");
    assert_eq!(probe["steps"], Value::Null, "no steps section without steps in the snapshot");
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_owners_of_gpus_and_processes_as_text() {
    // A user name that would be markup if the page built elements from it.
    const USER: &str = "<img src=x onerror=alert(3)>";
    // GPU 0's first simulated process (the mock's pids are the profile's), given an owner by a
    // fixture proc root; the other simulated pids have none.
    let out =
        agent().args(["--backend", "mock", "--once", "--stdout-format", "json", "--enable", "processes"]).output();
    let out = out.expect("run the example agent");
    let plain: Value = serde_json::from_slice(out.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
    let gpu0 = &plain["devices"][0];
    let pid = gpu0["processes"][0]["pid"].as_u64().expect("the mock's GPU 0 has processes");
    let dir = shots_dir().join("owners");
    let (proc_root, passwd) = proc_root_owning(&dir, u32::try_from(pid).unwrap(), USER);
    let (_agent, base) = start(&[
        "--backend",
        "mock",
        "--attribution",
        "--proc-root",
        proc_root.to_str().unwrap(),
        "--passwd-file",
        passwd.to_str().unwrap(),
    ]);
    let run = browse(&format!("{base}/"), &[3.0], &dir.join("owners.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    let expected = format!("user {USER}");
    for card in probe["cards"].as_array().unwrap() {
        if card["uuid"] == gpu0["info"]["uuid"] {
            assert_eq!(card["owner"], expected.as_str(), "GPU 0 is held by the fixture's user: {card}");
            assert_eq!(card["owner_children"], 0, "no element made from the owner");
        } else {
            assert_eq!(card["owner"], Value::Null, "no owner known, none shown: {card}");
        }
    }
    // The process table: an owner column, the fixture's process with its user, the others empty.
    let rows = probe["process_rows"].as_array().unwrap();
    let row = |r: &Value| r.as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_owned()).collect::<Vec<_>>();
    let mine: Vec<_> = rows.iter().map(row).filter(|r| r[1] == pid.to_string()).collect();
    assert_eq!(mine.len(), 1, "{rows:?}");
    assert_eq!(mine[0][3], expected, "{rows:?}");
    assert!(rows.iter().map(row).filter(|r| r[1] != pid.to_string()).all(|r| r[3].is_empty()), "{rows:?}");
    assert!(probe["tags"].get("img").is_none(), "an <img> was created: {}", probe["tags"]);
    assert_eq!(probe["pwned"], false);
}

/// Not a browser test: with --web-listen the web view is an exporting sink, so `--backend auto`
/// never falls back to simulated GPUs (no GPU here: failed samples rather than a mock's data).
#[test]
fn web_listen_never_gets_the_mock_fallback() {
    let addr = ([127, 0, 0, 1], free_port()).into();
    let listen = format!("{addr}");
    // The web view comes up: its page answers (with a 2xx).
    let mut running = agent_process()
        .args(["--backend", "auto", "--web-listen", &listen, "--interval", "200ms"])
        .args(["--nvml-library", "/nonexistent/libnvidia-ml.so.1"])
        .ready(Ready::Http(addr, "/".to_owned()))
        .spawn();
    let client = http();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // Wait until a tick has reached the web view: without NVML it is a failed sample, which the
    // snapshot endpoint reports (503, and why) instead of any GPU data, simulated or not.
    let body = loop {
        let r = client.get(format!("http://{listen}/api/snapshot")).send().unwrap();
        assert_eq!(r.status().as_u16(), 503, "no GPU data, and certainly no simulated data");
        let body = r.text().unwrap();
        if body.contains("last sample failed") {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "no tick reached the web view: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(body.contains("/nonexistent/libnvidia-ml.so.1"), "says why: {body}");
    running.kill();
    let out = running.log();
    assert!(!out.contains("MOCK"), "{out}");
}
