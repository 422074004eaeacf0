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
    browse_with(url, at, &[], screenshot)
}

/// [`browse`] with more arguments for scripts/web-browser.py (`--exec-at`, `--size`, …).
fn browse_with(url: &str, at: &[f64], extra: &[String], screenshot: &Path) -> Value {
    let out = browser_command(url, at, extra, screenshot).output().expect("python3");
    assert!(out.status.success(), "web-browser.py failed: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("screenshot: {}", screenshot.display());
    serde_json::from_slice(&out.stdout).expect("web-browser.py prints JSON")
}

fn browser_command(url: &str, at: &[f64], extra: &[String], screenshot: &Path) -> Command {
    let chromium = require_env("GPUMON_TEST_CHROMIUM");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/web-browser.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(url).arg("--chromium").arg(chromium).arg("--screenshot").arg(screenshot).arg("--full-page");
    for t in at {
        cmd.arg("--at").arg(t.to_string());
    }
    // The timeline starts when the page is live (a loaded machine can take seconds to bring it
    // up), unless the test says otherwise.
    if !extra.iter().any(|a| a == "--start-when") {
        cmd.args(["--start-when", "live"]);
    }
    cmd.args(extra);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    cmd
}

/// Runs the browser in the background while the caller acts on the agent (restarts it, frees
/// a stream slot) when the page's timeline reaches a point: the browser `touch`es `marker`
/// at `when` seconds after the page first shows `start_when` (`--exec-at`, `--start-when`);
/// the first closure returned waits for the browser's result, the second for the marker.
fn browse_around(
    url: &str,
    at: &[f64],
    when: f64,
    marker: &Path,
    screenshot: &Path,
    start_when: &str,
) -> (impl FnOnce() -> Value, impl Fn()) {
    let touch = format!("{when}:touch '{}'", marker.display());
    let extra = ["--exec-at".to_owned(), touch, "--start-when".to_owned(), start_when.to_owned()];
    let child = browser_command(url, at, &extra, screenshot).spawn().expect("python3");
    let marker = marker.to_owned();
    let wait_marker = move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !marker.exists() {
            assert!(std::time::Instant::now() < deadline, "the browser never reached its marker");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let screenshot = screenshot.to_owned();
    let result = move || {
        let out = child.wait_with_output().expect("web-browser.py");
        assert!(out.status.success(), "web-browser.py failed: {}", String::from_utf8_lossy(&out.stderr));
        eprintln!("screenshot: {}", screenshot.display());
        serde_json::from_slice(&out.stdout).expect("web-browser.py prints JSON")
    };
    (result, wait_marker)
}

/// [`start`] on the mock with `count` H100s named `gpu_name` (a profile written to `dir` as
/// `<profile>.toml`), on the host `host`.
fn start_named(dir: &Path, profile: &str, count: u32, gpu_name: &str, host: &str) -> (AgentProcess, String) {
    let path = dir.join(format!("{profile}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"{profile}\"\n[[devices]]\nmodel = \"h100\"\ncount = {count}\noverrides = {{ name = {gpu_name:?} }}\n"
        ),
    )
    .unwrap();
    start(&["--backend", "mock", "--mock-profile", path.to_str().unwrap(), "--host", host])
}

fn shots_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-web-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A folder of its own under [`shots_dir`], for one test's files.
fn shots_subdir(name: &str) -> PathBuf {
    let dir = shots_dir().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// [`assert_clean`] for a page whose agent went away on purpose: the browser logs the broken
/// or refused stream (`net::…`), and nothing else may show.
fn assert_clean_but_network(run: &Value) {
    assert_eq!(run["dialogs"], serde_json::json!([]), "the page opened a dialog");
    assert_eq!(run["exceptions"], serde_json::json!([]), "script errors");
    for e in run["console_errors"].as_array().unwrap() {
        let e = e.as_str().unwrap();
        assert!(e.starts_with("Failed to load resource:"), "console error: {e}");
    }
}

fn assert_clean(run: &Value) {
    assert_eq!(run["dialogs"], serde_json::json!([]), "the page opened a dialog");
    assert_eq!(run["exceptions"], serde_json::json!([]), "script errors");
    assert_eq!(run["console_errors"], serde_json::json!([]), "console errors (CSP violations show here)");
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_eight_live_cards_for_h100x8() {
    // The detail view's PCIe link, ECC and NVLink rows are of opt-in families (docs/fleet.md §8):
    // the page shows what the agent exports.
    let (_agent, base) = start(&["--backend", "mock", "--mock-profile", "h100x8", "--enable", "pcie_link,ecc,nvlink"]);
    let snap = snapshot(&base);
    // Hover over GPU 0's first chart; open its detail view.
    let extra = [
        "--network",
        "--hover-at",
        "5.0:#gpus .card:first-child .chart .u-over",
        "--click-at",
        "5.2:#gpus .card:first-child details.more summary",
    ]
    .map(String::from);
    let run = browse_with(&format!("{base}/"), &[3.0, 6.0], &extra, &shots_dir().join("h100x8.png"));
    assert_clean(&run);
    // The browser negotiated gzip for the page, its API and its live stream.
    for r in run["network"].as_array().unwrap() {
        let path = r["path"].as_str().unwrap();
        if path == "/favicon.ico" {
            continue;
        }
        assert_eq!(r["encoding"], "gzip", "{r}");
        if path == "/api/stream" {
            let (wire, decoded) = (r["encoded"].as_f64().unwrap(), r["decoded"].as_f64().unwrap());
            assert!(wire * 3.0 < decoded, "the stream compresses: {r}");
        }
    }
    assert!(run["network"].as_array().unwrap().iter().any(|r| r["path"] == "/api/stream"));
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
    assert_eq!(second["conn_state"], "live", "{}", second["conn"]);
    // The live stream works: three seconds later the figures are not the same.
    let figures = |p: &Value| p["cards"].as_array().unwrap().iter().map(|c| c["figures"].clone()).collect::<Vec<_>>();
    assert_ne!(figures(first), figures(second), "figures did not change in 3 s");
    assert!(second["host"].as_str().unwrap().contains("mock"));
    assert!(
        second["title"].as_str().unwrap().starts_with(snap["system"]["hostname"].as_str().unwrap()),
        "the title names the host"
    );
    let gpu0 = &second["cards"][0];
    // A time axis, values on hover, the chart in words.
    assert_eq!(gpu0["chart_axes"], 2, "a time axis and a value axis: {gpu0}");
    let hovered = gpu0["legend_values"].as_array().unwrap();
    assert!(hovered.iter().any(|v| v.as_str().unwrap().ends_with(" %")), "a value under the pointer: {hovered:?}");
    let words = gpu0["chart_labels"][0].as_str().unwrap();
    assert!(words.starts_with("utilisation over the last 10 min: now ") && words.contains("max"), "{words}");
    // The detail view: what the snapshot knows about this GPU beyond the five figures.
    let detail: std::collections::HashMap<String, String> = gpu0["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| (row[0].as_str().unwrap().to_owned(), row[1].as_str().unwrap().to_owned()))
        .collect();
    for key in
        ["clock event reasons", "PCIe link", "ECC corrected / uncorrected", "XID errors", "NVLink", "NVLink errors"]
    {
        assert!(detail.contains_key(key), "{key} missing from the detail view: {detail:?}");
    }
    let links = devices[0]["nvlink"]["links"].as_array().unwrap();
    let up = links.iter().filter(|l| l["state"] == "up").count();
    assert!(detail["NVLink"].starts_with(&format!("{up} of {} links up", links.len())), "{detail:?}");
    let pcie = &devices[0]["pcie"];
    assert!(
        detail["PCIe link"].starts_with(&format!("Gen{} x{}", pcie["link_generation"], pcie["link_width"])),
        "{detail:?}"
    );
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_hostile_names_as_text() {
    const HOSTILE: &str = "<img src=x onerror=alert(1)>";
    const HOST: &str = "<script>alert(2)</script><b>node</b>";
    let dir = shots_dir();
    let (_agent, base) = start_named(&dir, "hostile", 2, HOSTILE, HOST);
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
    assert_eq!(tags["script"], 3, "only the page's own scripts: {tags}");
    assert_eq!(probe["pwned"], false);
}

#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_findings_with_advice_and_processes() {
    let (_agent, base) = start(&[
        "--backend",
        "mock",
        "--mock-profile",
        "h100x8",
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
    // Evidence of more than three GPUs is folded, however the finding grew to them.
    for g in probe["finding_groups"].as_array().unwrap() {
        assert_eq!(g["folded"], g["evidence"].as_u64().unwrap() > 3, "{g}");
    }
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

fn cards(probe: &Value) -> &Vec<Value> {
    probe["cards"].as_array().unwrap()
}

/// An agent stopped with SIGSTOP sends nothing, yet its stream stays open: the page must say
/// stale within three sampling intervals (500 ms here), grey the figures, and go live again
/// when the agent resumes.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_says_stale_within_three_intervals_of_a_stopped_agent_and_live_after() {
    let (agent, base) = start(&["--backend", "mock", "--mock-profile", "h100x8"]);
    let pid = agent.id();
    let (stop, cont) = (4.0, 8.0);
    let extra = [format!("{stop}:kill -STOP {pid}"), format!("{cont}:kill -CONT {pid}")]
        .into_iter()
        .flat_map(|e| ["--exec-at".to_owned(), e])
        .collect::<Vec<_>>();
    // Three intervals after the stop; then later while stopped; then 1.5 s after resuming.
    let run =
        browse_with(&format!("{base}/"), &[3.5, stop + 1.5, 7.5, cont + 1.5], &extra, &shots_dir().join("stale.png"));
    assert_clean(&run);
    let p = run["probes"].as_array().unwrap();
    // Stale within three intervals of the last sample, whenever the probe looked.
    let stale_at = p[1]["stale_at_age"].as_f64().expect("the page records when it went stale");
    assert!(stale_at <= 1.5, "stale only when the sample was {stale_at} s old");
    for (probe, state) in [(&p[0], "live"), (&p[1], "stale"), (&p[2], "stale"), (&p[3], "live")] {
        assert_eq!(probe["conn_state"], state, "at {}: {}", probe["at"], probe["conn"]);
        assert_eq!(cards(probe).len(), 8);
        for card in cards(probe) {
            let opacity = card["figure_opacity"].as_f64().unwrap();
            assert_eq!(opacity < 1.0, state == "stale", "figures greyed exactly while stale: {card}");
        }
    }
    // The stale state says how old the data is, and the age grows.
    let age = |probe: &Value| -> f64 {
        let text = probe["conn"].as_str().unwrap();
        let num = text.split("last sample ").nth(1).and_then(|r| r.split(' ').next()).expect("an age");
        num.parse().unwrap_or_else(|_| panic!("{text}"))
    };
    let waited = p[2]["at"].as_f64().unwrap() - p[1]["at"].as_f64().unwrap();
    assert!(age(&p[1]) >= 1.25 && age(&p[2]) >= age(&p[1]) + waited - 0.6, "{} then {}", p[1]["conn"], p[2]["conn"]);
    // The outage is a gap in the charts, and their text says so.
    let words = cards(&p[3])[0]["chart_labels"][0].as_str().unwrap();
    assert!(words.contains("1 gap without samples"), "{words}");
    // Live again: the figures move.
    let figures = |p: &Value| cards(p).iter().map(|c| c["figures"].clone()).collect::<Vec<_>>();
    assert_ne!(figures(&p[2]), figures(&p[3]), "no new sample after SIGCONT");
}

/// A replay (`--replay`): the page never calls a recorded sample live. It says the data is
/// replayed, with the time the sample was recorded (the trace's own), beside the REPLAYED DATA
/// banner — and keeps saying so while the trace plays, slower than recorded.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_says_replayed_with_the_recorded_time_during_a_replay() {
    let dir = shots_subdir("replay");
    let trace = dir.join("run.gpumon-trace.gz");
    let (code, _, stderr) = common::run(
        agent().args(["--backend", "mock", "--interval", "500ms", "--duration", "4s", "--record"]).arg(&trace),
    );
    assert_eq!(code, 0, "{stderr}");
    let recorded: Vec<String> = gpumon::core::trace::TraceReader::open(&trace)
        .unwrap()
        .map(|s| {
            let at = humantime::format_rfc3339_seconds(s.unwrap().taken_at).to_string();
            at.replace('T', " ").replace('Z', " UTC")
        })
        .collect();
    assert!(recorded.len() >= 6, "{recorded:?}");
    // A quarter of real time: the eight or so snapshots take 14 s or more to play.
    let (_agent, base) = start(&["--replay", trace.to_str().unwrap(), "--replay-speed", "0.25"]);
    let extra = ["--start-when", "replay"].map(String::from);
    let run = browse_with(&format!("{base}/"), &[0.5, 6.5], &extra, &dir.join("replay.png"));
    assert_clean(&run);
    for probe in run["probes"].as_array().unwrap() {
        assert_eq!(probe["conn_state"], "replay", "{}", probe["conn"]);
        let conn = probe["conn"].as_str().unwrap();
        let at = conn.strip_prefix("replayed · sample recorded ").unwrap_or_else(|| panic!("{conn}"));
        assert!(recorded.iter().any(|r| r == at), "`{at}` is not a recorded time: {recorded:?}");
        assert!(!conn.contains("live") && !probe["host"].as_str().unwrap().contains("live"), "{probe}");
        assert_eq!(probe["banner"], true, "{probe}");
        assert!(probe["banner_text"].as_str().unwrap().starts_with("REPLAYED DATA"), "{probe}");
    }
    let at = |p: &Value| p["conn"].as_str().unwrap().to_owned();
    assert_ne!(at(&run["probes"][0]), at(&run["probes"][1]), "the recorded time follows the replay");
}

/// Without NVML every tick is a failed sample: the page says so, once — not "waiting", a green
/// "live" and "FAILED" together.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_one_clear_state_when_sampling_fails() {
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let _agent = agent_process()
        .args(["--backend", "auto", "--web-listen", &addr.to_string(), "--interval", "500ms"])
        .args(["--nvml-library", "/nonexistent/libnvidia-ml.so.1"])
        .ready(Ready::Http(addr, "/".to_owned()))
        .spawn();
    let extra = ["--start-when", "failed"].map(String::from);
    let run = browse_with(&format!("http://{addr}/"), &[1.0], &extra, &shots_dir().join("failed.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    assert_eq!(probe["conn_state"], "failed", "{}", probe["conn"]);
    let conn = probe["conn"].as_str().unwrap();
    assert!(conn.contains("sampling failed") && conn.contains("/nonexistent/libnvidia-ml.so.1"), "{conn}");
    let empty = probe["empty"].as_str().expect("the empty state says why");
    assert!(empty.starts_with("No GPU data") && !empty.contains("Waiting"), "{empty}");
    let host = probe["host"].as_str().unwrap();
    assert!(!host.contains("FAILED") && !host.contains("live"), "one state, in one place: {host}");
    assert_eq!(cards(probe).len(), 0);
}

/// A restart on a smaller host: the 40 cards of a MIG host (8 GPUs, 32 instances) become the 4
/// of the new host — no card of a GPU or MIG instance that is gone stays behind.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_cards_follow_the_devices_across_a_restart_on_a_smaller_host() {
    let dir = shots_subdir("restart");
    let (mut first, base) = start(&["--backend", "mock", "--mock-profile", "a100x8-mig"]);
    let addr = first.addr();
    let marker = dir.join("restart-now");
    let (result, reached) =
        browse_around(&format!("{base}/"), &[3.5, 25.0], 4.0, &marker, &dir.join("restart.png"), "live");
    reached();
    first.kill();
    let second = agent_process()
        .args([
            "--web-listen",
            &addr.to_string(),
            "--interval",
            "500ms",
            "--backend",
            "mock",
            "--mock-profile",
            "a100x4",
        ])
        .ready(Ready::Http(addr, "/api/snapshot".to_owned()))
        .spawn();
    let run = result();
    assert_clean_but_network(&run);
    let (before, after) = (&run["probes"][0], &run["probes"][1]);
    assert_eq!(cards(before).len(), 40, "{}", before["host"]);
    let now = snapshot(&second.url());
    let uuids = |v: &Vec<Value>, key: &dyn Fn(&Value) -> Value| v.iter().map(key).collect::<Vec<_>>();
    assert_eq!(
        uuids(cards(after), &|c| c["uuid"].clone()),
        uuids(now["devices"].as_array().unwrap(), &|d| d["info"]["uuid"].clone()),
        "the cards are the new host's devices, in order"
    );
    assert_eq!(after["overview"].as_array().unwrap().len(), 4, "one overview cell per device");
    assert_eq!(after["conn_state"], "live", "{}", after["conn"]);
}

/// A 503 from a full server (max_clients) does not stop the page: it says why it waits,
/// retries with backoff and goes live when a slot frees.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_retries_a_full_server_and_says_why() {
    use std::io::{Read, Write};
    let dir = shots_subdir("full");
    let port = free_port();
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "[agent]\nbackend = \"mock\"\ninterval = \"500ms\"\n[mock]\nprofile = \"h100x8\"\n\
             [web]\nlisten = \"127.0.0.1:{port}\"\nmax_clients = 1\n"
        ),
    )
    .unwrap();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let agent = agent_process().arg("--config").arg(&cfg).ready(Ready::Http(addr, "/api/snapshot".to_owned())).spawn();
    // Take the only live-stream slot.
    let mut held = std::net::TcpStream::connect(addr).unwrap();
    held.write_all(b"GET /api/stream HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    held.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "the held stream got the slot");
    // Read it, or the server cuts it off as too slow and frees the slot by itself.
    let mut reading = held.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while matches!(reading.read(&mut buf), Ok(n) if n > 0) {}
    });
    let marker = dir.join("release");
    let (result, reached) = browse_around(&agent.url(), &[0.5, 14.0], 1.0, &marker, &dir.join("full.png"), "waiting");
    reached();
    held.shutdown(std::net::Shutdown::Both).unwrap();
    reader.join().unwrap();
    let run = result();
    assert_clean_but_network(&run);
    let (waiting, live) = (&run["probes"][0], &run["probes"][1]);
    assert_eq!(waiting["conn_state"], "waiting", "{}", waiting["conn"]);
    let text = waiting["conn"].as_str().unwrap();
    assert!(text.contains("server full") && text.contains("retrying in"), "{text}");
    // The server's own reason, not only its status.
    assert!(text.contains("too many live clients"), "{text}");
    assert_eq!(live["conn_state"], "live", "went live once the slot was free: {}", live["conn"]);
    assert_eq!(cards(live).len(), 8);
}

/// MIG (`a100x8-mig`): GPUs and instances counted apart, every instance labelled by its parent
/// and profile, only the figures an instance has (no empty chart), and the process table names
/// the instance.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_labels_mig_instances_by_parent_and_profile() {
    let (_agent, base) = start(&["--backend", "mock", "--mock-profile", "a100x8-mig", "--enable", "processes"]);
    let snap = snapshot(&base);
    let run = browse(&format!("{base}/"), &[4.0], &shots_dir().join("mig.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    let host = probe["host"].as_str().unwrap();
    assert!(host.contains("GPUs8") && host.contains("MIG instances32"), "{host}");
    assert!(!host.contains("busy"), "MIG-mode GPUs report no utilisation: no busy count made of nothing: {host}");
    let devices = snap["devices"].as_array().unwrap();
    assert_eq!(cards(probe).len(), devices.len());
    let mut labels = std::collections::HashSet::new();
    for (card, dev) in cards(probe).iter().zip(devices) {
        assert_eq!(card["uuid"], dev["info"]["uuid"]);
        let label = card["label"].as_str().unwrap();
        assert!(labels.insert(label.to_owned()), "two cards labelled {label}");
        let mig = &dev["info"]["mig"];
        if mig.is_null() {
            assert_eq!(label, format!("GPU {}", dev["info"]["index"]));
        } else {
            let expected = format!(
                "GPU {} · MIG {} ({})",
                dev["info"]["index"],
                mig["mig_index"],
                mig["profile"].as_str().unwrap()
            );
            assert_eq!(label, expected);
            assert_eq!(card["shown_figures"], serde_json::json!(["mem"]), "an instance has its memory only: {card}");
        }
        for chart in card["chart_labels"].as_array().unwrap() {
            assert!(!chart.as_str().unwrap().contains("no data"), "an empty chart: {card}");
        }
    }
    // Processes on instances are named by the instance.
    let rows = probe["process_rows"].as_array().unwrap();
    let mut on_instances = 0;
    for dev in devices.iter().filter(|d| !d["info"]["mig"].is_null()) {
        let mig = &dev["info"]["mig"];
        for p in dev["processes"].as_array().unwrap() {
            let label = format!(
                "GPU {} · MIG {} ({})",
                dev["info"]["index"],
                mig["mig_index"],
                mig["profile"].as_str().unwrap()
            );
            let pid = p["pid"].to_string();
            assert!(rows.iter().any(|r| r[0] == label.as_str() && r[1] == pid.as_str()), "{label} {pid}: {rows:?}");
            on_instances += 1;
        }
    }
    assert!(on_instances > 0, "the profile runs processes on instances");
}

/// 64 GPUs: one overview cell per GPU above the cards, coloured by utilisation and findings,
/// a click jumps to the GPU's card; findings grouped per kind with their GPU list folded. Prints
/// the page height and the page's per-event main-thread time (the report's figures).
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_overview_and_folded_findings_for_64_gpus() {
    let (_agent, base) = start(&[
        "--backend",
        "mock",
        "--mock-profile",
        "h100x64",
        "--mock-scenario",
        "imbalance",
        "--diagnose-window",
        "2s",
    ]);
    let target = 40;
    let click = format!("9:#overview .cell:nth-child({})", target + 1);
    let extra = ["--metrics".to_owned(), "--click-at".to_owned(), click];
    let run = browse_with(&format!("{base}/"), &[8.0, 9.5, 20.0], &extra, &shots_dir().join("h100x64.png"));
    assert_clean(&run);
    let p = run["probes"].as_array().unwrap();
    let probe = &p[0];
    let cells = probe["overview"].as_array().unwrap();
    assert_eq!(cells.len(), 64);
    let first_card_top = cards(probe)[0]["top"].as_i64().unwrap();
    assert!(probe["overview_bottom"].as_i64().unwrap() < first_card_top, "the overview is above the cards");
    let ov_rows: std::collections::BTreeSet<i64> = cells.iter().map(|c| c["top"].as_i64().unwrap()).collect();
    assert!(ov_rows.len() <= 3, "64 cells in at most 3 rows at 1280 px: {ov_rows:?}");
    // Utilisation as the cells say it matches the cards' figures (the same snapshot).
    for (cell, card) in cells.iter().zip(cards(probe)) {
        assert_eq!(cell["uuid"], card["uuid"]);
        let util = card["figures"]["util"].as_str().unwrap().trim_end_matches(" %");
        assert_eq!(cell["util"].as_str().unwrap(), util, "{cell} {card}");
    }
    // The imbalance scenario: the odd GPUs wait. Each finding kind is one entry, its GPU list folded.
    let groups = probe["finding_groups"].as_array().unwrap();
    assert!(!groups.is_empty(), "{}", probe["findings"]);
    let kinds: std::collections::HashSet<_> = groups.iter().map(|g| g["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.len(), groups.len(), "one entry per kind");
    for g in groups {
        if g["evidence"].as_u64().unwrap() > 3 {
            assert_eq!(g["folded"], true, "{g}");
            assert!(g["height"].as_i64().unwrap() < 150, "a folded finding stays short: {g}");
        }
    }
    assert!(cells.iter().any(|c| c["finding"] != ""), "cells with findings are marked");
    // The click scrolled the page to GPU 40's card.
    let after = &p[1];
    let card = &cards(after)[target];
    let (top, scroll) = (card["top"].as_i64().unwrap(), after["page"]["scroll_y"].as_i64().unwrap());
    assert!(scroll > 0 && (top - scroll).abs() < 40, "card top {top}, scrolled to {scroll}: {}", run["actions"]);
    // Figures for the report.
    let page = &p[2]["page"];
    assert_eq!(page["width"], page["viewport"], "no horizontal scroll");
    let (m0, m1) = (&p[1]["metrics"], &p[2]["metrics"]);
    let ticks = p[2]["ticks"]["n"].as_f64().unwrap() - p[1]["ticks"]["n"].as_f64().unwrap();
    let task = (m1["TaskDuration"].as_f64().unwrap() - m0["TaskDuration"].as_f64().unwrap()) * 1000.0 / ticks;
    eprintln!(
        "64 GPUs: page height {} px; per event: page script median {:.1} ms, p95 {:.1} ms; renderer main-thread {task:.1} ms/event over {ticks} events",
        page["height"], p[2]["ticks"]["median_ms"].as_f64().unwrap(), p[2]["ticks"]["p95_ms"].as_f64().unwrap()
    );
    assert!(page["height"].as_i64().unwrap() < 9000, "page height {}", page["height"]);
}

/// Names of any length: a 55-character GPU name without spaces and a 2 000-character host name
/// keep the page as wide as the window (at 1280 px and at 360 px), the full name on hover; the
/// title names the host.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_layout_holds_long_names_at_any_width() {
    let name = "NVIDIA-H100-80GB-HBM3-with-a-very-long-unbroken-name-xx";
    assert_eq!(name.len(), 55);
    let host = "n".repeat(2000);
    let dir = shots_dir();
    let (_agent, base) = start_named(&dir, "long", 3, name, &host);
    for width in [1280, 360] {
        let size = ["--size".to_owned(), format!("{width}x800")];
        let run = browse_with(&format!("{base}/"), &[3.0], &size, &dir.join(format!("long-{width}.png")));
        assert_clean(&run);
        let probe = &run["probes"][0];
        assert_eq!(probe["page"]["width"], width, "the page is as wide as the window: {}", probe["page"]);
        assert!(probe["title"].as_str().unwrap().starts_with(&host[..100]), "the title names the host");
        assert_eq!(cards(probe).len(), 3);
        for card in cards(probe) {
            assert_eq!(card["name_title"], name, "the full name on hover");
            assert_eq!(card["overflows"], false, "{card}");
            assert!(card["right"].as_i64().unwrap() <= width, "{card}");
        }
    }
}

/// A run that marks its steps (the steps socket): the page shows the run, the time of its
/// recent steps and the per-GPU figures of the last one.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_training_steps_when_a_run_marks_them() {
    use std::io::Write;
    let dir = shots_subdir("steps");
    let socket = dir.join("steps.sock");
    let (_agent, base) =
        start(&["--backend", "mock", "--mock-scenario", "training", "--steps-socket", socket.to_str().unwrap()]);
    let marks = std::thread::spawn(move || {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        for step in 0..60 {
            // A rank driving all eight GPUs (rank 0 alone would be GPU 0's).
            writeln!(s, "{{\"job\":\"train\",\"rank\":0,\"gpu\":\"0,1,2,3,4,5,6,7\",\"step\":{step}}}").unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let run = browse(&format!("{base}/"), &[6.0], &dir.join("steps.png"));
    marks.join().unwrap();
    assert_clean(&run);
    let probe = &run["probes"][0];
    let runs = probe["step_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{}", probe["steps"]);
    let r = &runs[0];
    assert_eq!(r["job"], "train");
    let what = r["what"].as_str().unwrap();
    assert!(what.contains("rank 0") && what.contains("s per step"), "{what}");
    // Recent steps, newest first, each about the 300 ms between marks.
    let recent = r["recent"].as_array().unwrap();
    assert!(recent.len() >= 3, "{recent:?}");
    let step = |row: &Value| row[0].as_str().unwrap().parse::<u64>().unwrap();
    assert!(recent.windows(2).all(|w| step(&w[0]) > step(&w[1])), "{recent:?}");
    for row in recent {
        let secs: f64 = row[1].as_str().unwrap().trim_end_matches(" s").parse().unwrap();
        assert!((0.1..1.5).contains(&secs), "{row}");
        assert!(row[2].as_str().unwrap().ends_with('%'), "{row}");
    }
    // The last step's figures for each of the 8 GPUs, named as the cards are.
    let per_gpu = r["per_gpu"].as_array().unwrap();
    assert_eq!(per_gpu.len(), 8, "{per_gpu:?}");
    assert_eq!(per_gpu[0][0], "GPU 0");
    assert!(per_gpu.iter().all(|row| row[1].as_str().unwrap().ends_with('%')), "{per_gpu:?}");
}

/// A failed sample keeps the cards but greys them with the reason (one state: `failed`), a lost
/// GPU says LOST in words, and the page is live again once sampling recovers.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_greys_cards_with_the_reason_while_sampling_fails() {
    let dir = shots_subdir("failing");
    let scenario = dir.join("failing.toml");
    // At 500 ms: GPU 3 lost from 1 s; every sample fails from 8 s to 13 s (after the page is
    // up, however long a loaded machine takes to bring it up, within 6 s).
    std::fs::write(
        &scenario,
        "name = \"failing\"\n[[phases]]\nshape = \"steady\"\nbusy = 0.9\n\
         [[faults]]\nkind = \"device_lost\"\ndevice = 3\nat_tick = 2\n\
         [[faults]]\nkind = \"unavailable\"\nfrom_tick = 16\nuntil_tick = 26\n",
    )
    .unwrap();
    let (_agent, base) =
        start(&["--backend", "mock", "--mock-profile", "a100x4", "--mock-scenario", scenario.to_str().unwrap()]);
    let run =
        browse(&format!("{base}/"), &[2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 17.0], &dir.join("failing.png"));
    assert_clean(&run);
    let probes = run["probes"].as_array().unwrap();
    let failed: Vec<&Value> = probes.iter().filter(|p| p["conn_state"] == "failed").collect();
    assert!(
        !failed.is_empty(),
        "no probe saw the failure: {:?}",
        probes.iter().map(|p| &p["conn"]).collect::<Vec<_>>()
    );
    for p in &failed {
        let reason = p["conn"].as_str().unwrap().strip_prefix("sampling failed · ").expect("the reason").to_owned();
        assert!(!reason.is_empty());
        assert_eq!(cards(p).len(), 4, "the last cards stay: {p}");
        for card in cards(p) {
            assert_eq!(card["failed"], true, "{card}");
            assert_eq!(card["why"], format!("sampling failed: {reason}"), "{card}");
            assert!(card["figure_opacity"].as_f64().unwrap() < 1.0, "greyed: {card}");
        }
    }
    let last = probes.last().unwrap();
    assert_eq!(last["conn_state"], "live", "{}", last["conn"]);
    for card in cards(last) {
        assert_eq!(card["failed"], false, "{card}");
        assert_eq!(card["figure_opacity"], 1.0, "{card}");
        let lost = card["label"] == "GPU 3";
        assert_eq!(card["state"], if lost { Value::from("LOST") } else { Value::Null }, "{card}");
    }
}

/// `hh:mm:ss`: a time-axis label with minutes.
fn is_clock_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 8
        && b[2] == b':'
        && b[5] == b':'
        && s.split(':').all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_digit()))
}

/// `holds since 14:05:30 (12 s)` → 12.
fn held_seconds(since: &str) -> u64 {
    let rest = since.strip_prefix("holds since ").unwrap_or_else(|| panic!("{since}"));
    let (at, held) = rest.split_once(" (").unwrap_or_else(|| panic!("{since}"));
    assert!(is_clock_time(at), "{since}");
    let held = held.strip_suffix(')').unwrap_or_else(|| panic!("{since}"));
    match held.split_once(" min ") {
        Some((m, s)) => m.parse::<u64>().unwrap() * 60 + s.trim_end_matches(" s").parse::<u64>().unwrap(),
        None => held.trim_end_matches(" s").parse().unwrap_or_else(|_| panic!("{since}")),
    }
}

/// #44: a starving node read at a glance. Utilisation on 0–100 % and memory on 0–total, so a
/// GPU at 8 % never looks like one at 94 %; charts tall enough for several y-ticks, with clock
/// times on the time axis; "busy" as diagnosis says it (the window's mean ≥ 60 %), so the count
/// holds still while each GPU's reading swings between ~0 and ~95 % every tick; findings say
/// since when they hold, and their evidence never calls one tick "idle" and "busy" at once.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_reads_a_starving_node_at_a_glance() {
    let (_agent, base) = start(&[
        "--backend",
        "mock",
        "--mock-profile",
        "h100x8",
        "--mock-scenario",
        "dataloader-starved",
        "--diagnose-window",
        "2s",
    ]);
    let total_gib: Vec<f64> = snapshot(&base)["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["memory"]["total"].as_f64().unwrap() / f64::from(1u32 << 30))
        .collect();
    let run = browse(&format!("{base}/"), &[4.0, 5.0, 6.0, 7.0, 8.0, 10.0], &shots_dir().join("glance.png"));
    assert_clean(&run);
    let probes = run["probes"].as_array().unwrap();
    for probe in probes {
        assert_eq!(cards(probe).len(), 8);
        for (card, total) in cards(probe).iter().zip(&total_gib) {
            let charts = card["charts"].as_array().unwrap();
            let chart = |field: &str| charts.iter().find(|c| c["field"] == field).unwrap_or_else(|| panic!("{card}"));
            let (util, mem) = (chart("util"), chart("mem"));
            assert_eq!((util["y_min"].as_f64(), util["y_max"].as_f64()), (Some(0.0), Some(100.0)), "{util}");
            assert_eq!(mem["y_min"].as_f64(), Some(0.0), "{mem}");
            assert!((mem["y_max"].as_f64().unwrap() - total).abs() < 1e-6, "memory up to its total {total}: {mem}");
            for c in charts {
                assert!(c["height"].as_u64().unwrap() >= 100, "a readable height: {c}");
                assert!(c["y_ticks"].as_u64().unwrap() >= 3, "several y-ticks: {c}");
                let labels = c["x_labels"].as_array().unwrap();
                assert!(!labels.is_empty() && labels.iter().all(|l| is_clock_time(l.as_str().unwrap())), "{c}");
            }
        }
    }
    // Each GPU swings between ~0 and ~95 % (a mean of ~30–40 %): none is busy, on every probe.
    let busy: Vec<&str> = probes.iter().map(|p| p["busy"].as_str().unwrap_or("-")).collect();
    assert!(busy.iter().all(|b| *b == "0 of 8"), "busy over the window, not one reading: {busy:?}");
    let starving = |p: &Value| {
        p["finding_groups"].as_array().unwrap().iter().find(|g| g["kind"] == "dataloader_starvation").cloned()
    };
    let (first, last) = (starving(&probes[0]).expect("raised"), starving(probes.last().unwrap()).expect("held"));
    let (held_then, held_now) =
        (held_seconds(first["since"].as_str().unwrap()), held_seconds(last["since"].as_str().unwrap()));
    assert!(held_now >= held_then + 4, "the time it holds moves on: {first} → {last}");
    for e in last["evidence_text"].as_array().unwrap() {
        let e = e.as_str().unwrap();
        assert!(!(e.contains("idle (≤") && e.contains("busy (≥")), "idle and busy on the same ticks: {e}");
    }
}

/// #44: one GPU fills the width instead of a third of it.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_gives_a_single_gpu_the_whole_width() {
    let (_agent, base) = start(&["--backend", "mock", "--mock-profile", "rtx4090x1"]);
    let run = browse(&format!("{base}/"), &[2.0], &shots_dir().join("single.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    assert_eq!(cards(probe).len(), 1);
    let (card, grid) = (cards(probe)[0]["width"].as_f64().unwrap(), probe["grid_width"].as_f64().unwrap());
    assert!(card >= grid - 2.0, "the card is {card} px of {grid} px");
}

/// #44: an agent restarted on other GPUs under the same UUIDs (the mock's UUIDs are its seed
/// and the GPU's index): the cards take the new snapshot's names, not the old host's.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_cards_take_the_new_names_of_gpus_under_the_same_uuids() {
    let dir = shots_subdir("renamed");
    let (mut first, base) = start(&["--backend", "mock", "--mock-profile", "h100x8"]);
    let addr = first.addr();
    let before = snapshot(&base);
    let marker = dir.join("restart-now");
    let (result, reached) =
        browse_around(&format!("{base}/"), &[2.0, 20.0], 3.0, &marker, &dir.join("renamed.png"), "live");
    reached();
    first.kill();
    let second = agent_process()
        .args([
            "--web-listen",
            &addr.to_string(),
            "--interval",
            "500ms",
            "--backend",
            "mock",
            "--mock-profile",
            "a100x4",
        ])
        .ready(Ready::Http(addr, "/api/snapshot".to_owned()))
        .spawn();
    let now = snapshot(&second.url());
    let run = result();
    assert_clean_but_network(&run);
    let field = |v: &Value, key: &str| -> Vec<String> {
        v["devices"].as_array().unwrap().iter().map(|d| d["info"][key].as_str().unwrap().to_owned()).collect()
    };
    let (uuids_before, uuids_now) = (field(&before, "uuid"), field(&now, "uuid"));
    assert_eq!(uuids_before[..4], uuids_now[..], "the premise: the same UUIDs");
    assert_ne!(field(&before, "name")[..4], field(&now, "name")[..], "the premise: other GPUs");
    let after = &run["probes"][1];
    assert_eq!(after["conn_state"], "live", "{}", after["conn"]);
    let names: Vec<String> = cards(after).iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, field(&now, "name"), "the cards follow the snapshot's names");
    let uuids: Vec<String> = cards(after).iter().map(|c| c["uuid"].as_str().unwrap().to_owned()).collect();
    assert_eq!(uuids, uuids_now);
}

/// #44 and #44's replay rule: a trace recorded on the mock replays marked simulated (the
/// snapshot's `recorded_backend`, the banner "simulated when recorded"), and its end reads
/// "replay finished", not "cannot reach the agent".
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_says_simulated_when_recorded_and_replay_finished() {
    let dir = shots_subdir("replay-end");
    let trace = dir.join("run.gpumon-trace.gz");
    let (code, _, stderr) = common::run(
        agent().args(["--backend", "mock", "--interval", "500ms", "--duration", "5s", "--record"]).arg(&trace),
    );
    assert_eq!(code, 0, "{stderr}");
    // A quarter of real time: the ten or so snapshots play for 20 s or more, time enough for a
    // browser on a loaded machine to come up while the replay still plays.
    let (_agent, base) = start(&["--replay", trace.to_str().unwrap(), "--replay-speed", "0.25"]);
    let system = snapshot(&base)["system"].clone();
    assert_eq!((system["backend"].as_str(), system["recorded_backend"].as_str()), (Some("replay"), Some("mock")));
    let extra = ["--start-when", "replay"].map(String::from);
    let run = browse_with(&format!("{base}/"), &[0.2, 30.0], &extra, &dir.join("replay-end.png"));
    assert_clean_but_network(&run);
    let (playing, ended) = (&run["probes"][0], &run["probes"][1]);
    assert_eq!(playing["conn_state"], "replay", "{}", playing["conn"]);
    let banner = playing["banner_text"].as_str().unwrap();
    assert!(banner.starts_with("REPLAYED DATA, simulated when recorded"), "{banner}");
    assert_eq!(ended["conn_state"], "finished", "{}", ended["conn"]);
    let conn = ended["conn"].as_str().unwrap();
    assert!(conn.starts_with("replay finished") && !conn.contains("cannot reach"), "{conn}");
}

/// #44: "busy" is diagnosis' own verdict, read from the snapshot (`diagnosis.busy`), over its
/// own window: the page says that window (2 s here, not a copy's 30 s) and counts what the
/// snapshot says; with diagnosis off the page makes no busy count of its own.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_busy_is_the_diagnosis_verdict_over_its_own_window() {
    let (agent, base) = start(&["--backend", "mock", "--mock-profile", "h100x2", "--diagnose-window", "2s"]);
    let run = browse(&format!("{base}/"), &[3.0, 4.0], &shots_dir().join("busy.png"));
    assert_clean(&run);
    let probe = run["probes"].as_array().unwrap().last().unwrap().clone();
    let busy = &snapshot(&base)["diagnosis"]["busy"];
    assert_eq!((busy["window_seconds"].as_f64(), busy["level"].as_f64()), (Some(2.0), Some(0.6)), "{busy}");
    let judged = busy["gpus"].as_array().unwrap();
    assert_eq!(judged.len(), 2, "{busy}");
    assert!(judged.iter().all(|g| g["busy"] == true), "the healthy mock runs at ~94 %: {busy}");
    assert_eq!(probe["busy"], "2 of 2", "{probe}");
    let title = probe["busy_title"].as_str().unwrap();
    assert!(title.contains("(the last 2 s)") && title.contains("at least 60 %"), "{title}");
    drop(agent);

    let (_agent, base) = start(&["--backend", "mock", "--mock-profile", "h100x2", "--no-diagnose"]);
    let run = browse(&format!("{base}/"), &[2.0], &shots_dir().join("busy-no-diagnosis.png"));
    assert_clean(&run);
    let probe = &run["probes"][0];
    assert!(probe["busy"].is_null(), "no diagnosis, no busy count: {probe}");
    assert!(!probe["host"].as_str().unwrap().contains("busy"), "{probe}");
}

/// #44: a held finding's evidence on the page is as of now — formatted again while it holds
/// (every third of the 2 s window here) — not the text of the tick that raised it.
#[test]
#[ignore = "needs scripts/test.sh (chromium)"]
fn browser_shows_a_held_findings_evidence_as_of_now() {
    let (_agent, base) = start(&[
        "--backend",
        "mock",
        "--mock-profile",
        "a100x3",
        "--mock-scenario",
        "dataloader-starved",
        "--diagnose-window",
        "2s",
    ]);
    let run = browse(&format!("{base}/"), &[4.0, 6.0, 8.0, 10.0, 12.0], &shots_dir().join("evidence-now.png"));
    assert_clean(&run);
    let mut texts: Vec<String> = Vec::new();
    for probe in run["probes"].as_array().unwrap() {
        let groups = probe["finding_groups"].as_array().unwrap();
        let Some(g) = groups.iter().find(|g| g["kind"] == "dataloader_starvation") else { continue };
        assert_eq!(g["folded"], false, "three GPUs: the evidence is shown, and refreshed each tick");
        let gpu0 = g["evidence_text"].as_array().unwrap().iter().find(|e| e.as_str().unwrap().starts_with("GPU 0: "));
        texts.extend(gpu0.map(|e| e.as_str().unwrap().to_owned()));
    }
    assert!(texts.len() >= 4, "held on GPU 0 at most probes: {texts:#?}");
    texts.dedup();
    assert!(texts.len() >= 2, "the evidence follows the readings while the finding holds: {texts:#?}");
}
