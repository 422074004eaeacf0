//! Issue 45 at fleet shape: 16 agents, each its own `--host` and its own mix of GPUs, workloads,
//! tenants and jobs (owners changing hands half-way), replay 65 minutes of data time each at
//! full speed, with their recorded timestamps, into a real VictoriaMetrics and a real Prometheus
//! through remote write. `gpumon-agent fleet --json` against each must equal the sum of the
//! agents' own run reports (`--report-format json`) within 1 %.
//!
//! The traces are made here from the mock fleet (a simulated clock: tick `k` is taken at
//! `start + k × 10 s`), with each GPU's owner and the step marks' `job` written into them as
//! attribution and the step tracker would have; replay keeps them (docs/replay.md).
//!
//! Prometheus (2.42) takes remote-written samples only down to an hour before the newest sample
//! of its head block ("out of bounds" beyond) unless `storage.tsdb.out_of_order_time_window` is
//! set: agents replaying concurrently write an hour-old sample after another agent's newest, so
//! the test's Prometheus sets the window to 3 h. VictoriaMetrics takes old timestamps as they
//! come.

#![cfg(all(feature = "agent", feature = "fleet", feature = "remote-write"))]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{agent, env, run};
use gpumon::core::attribution::Owner;
use gpumon::core::report::Report;
use gpumon::core::steps::{RunSteps, Steps};
use gpumon::core::trace::TraceWriter;
use gpumon::core::{DeviceFilter, MetricSet, SampleRequest, Sampler};
use gpumon_mock::{FleetProfile, MockSampler, Scenario};

const AGENTS: usize = 16;
const INTERVAL: Duration = Duration::from_secs(10);
/// 65 minutes of data time at 10 s.
const TICKS: u64 = 390;

const TENANTS: [&str; 5] = ["team-a", "team-b", "team-c", "research", "platform"];
const JOBS: [&str; 4] = ["pretrain", "finetune", "eval", "notebook"];
const PROFILES: [&str; 4] = ["a100x4", "rtx4090x2", "a100x4", "rtx4090x2"];
const SCENARIOS: [&str; 8] = [
    "training",
    "dataloader-starved",
    "idle-allocated",
    "imbalance",
    "memory-bound",
    "thermal-throttling",
    "near-oom",
    "idle",
];

/// Who holds GPU `gpu` of host `host` at `tick`: `None` for the last GPU of every fourth host
/// (no owner known), and half the GPUs change hands half-way.
fn owner_of(host: usize, gpu: usize, tick: u64) -> Option<(Owner, String)> {
    if host % 4 == 2 && gpu == 3 {
        return None;
    }
    let moved = usize::from(tick >= TICKS / 2 && gpu % 2 == 1);
    let tenant = TENANTS[(host + gpu / 2 + moved) % TENANTS.len()];
    let job = format!("{tenant}-{}", JOBS[(host + gpu / 2 + moved) % JOBS.len()]);
    let mut owner = Owner::default();
    owner.namespace = Some(tenant.to_owned());
    owner.pod = Some(format!("{job}-{host}"));
    owner.container = Some("main".to_owned());
    owner.user = Some(format!("u-{tenant}"));
    Some((owner, job))
}

/// What the agents sample: the default families, i.e. what a default agent exports (the
/// accounts, diagnosis and the level series a fleet watches; docs/fleet.md §8). A live agent also
/// samples the opt-in families its stages read (high-resolution windows, GPM, NVLink, PCIe link,
/// ECC, remapped rows) and records them in its trace, but never exports them. They are left out
/// of these traces, which they would make several times slower to replay: they would sharpen the
/// findings (and so the accounts' causes), not change which series the TSDBs receive.
fn families() -> MetricSet {
    MetricSet::default()
}

/// Host `host`'s trace: its fleet and scenario, owners and jobs, `TICKS` ticks from `start`.
fn write_trace(path: &Path, host: usize, start: SystemTime) {
    let sampler = MockSampler::builder()
        .profile(FleetProfile::builtin(PROFILES[host % PROFILES.len()]).unwrap())
        .scenario(Scenario::builtin(SCENARIOS[host % SCENARIOS.len()]).unwrap())
        .seed(host as u64 + 1)
        .epoch(start)
        .build()
        .unwrap();
    let request = SampleRequest::new(families(), DeviceFilter::all());
    let mut writer = TraceWriter::create(path, Some(INTERVAL)).unwrap();
    writer.set_sampling(families(), true);
    for tick in 0..TICKS {
        let mut snapshot =
            sampler.sample(&request).unwrap().with_seq(tick + 1).with_taken_at(start + INTERVAL * tick as u32);
        let mut runs: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (gpu, device) in snapshot.devices.iter_mut().enumerate() {
            if let Some((owner, job)) = owner_of(host, gpu, tick) {
                device.owners = vec![Arc::new(owner)];
                runs.entry(job).or_default().push(device.info.index);
            }
        }
        let mut steps = Steps::default();
        for (job, gpus) in runs {
            let mut run = RunSteps::new(job, None);
            run.gpus = Some(gpus);
            steps.runs.push(run);
        }
        snapshot.attach(steps);
        writer.write(&snapshot).unwrap();
    }
    writer.finish().unwrap();
}

/// A backend started by its script under `BACKEND_INSTANCE`, stopped when dropped.
struct Backend {
    stop: PathBuf,
    instance: String,
}

impl Backend {
    fn start(script: &str, instance: &str, vars: &[(&str, String)]) -> Self {
        let dir = env("GPUMON_TEST_BACKENDS_DIR");
        let mut cmd = Command::new(format!("{dir}/start-{script}.sh"));
        cmd.env("BACKEND_INSTANCE", instance);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let (code, _, stderr) = run(&mut cmd);
        assert_eq!(code, 0, "start-{script}.sh: {stderr}");
        Self { stop: format!("{dir}/stop-{script}.sh").into(), instance: instance.to_owned() }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = Command::new(&self.stop).env("BACKEND_INSTANCE", &self.instance).status();
    }
}

/// The agents' reports summed: GPU-seconds observed, allocated, idle while allocated, energy
/// (J), and lost per cause.
#[derive(Debug, Default)]
struct Sums {
    observed: f64,
    allocated: f64,
    idle: f64,
    energy: f64,
    lost: BTreeMap<String, f64>,
    gpus: usize,
}

fn add(sums: &mut Sums, report: &Report) {
    for g in &report.gpus {
        sums.observed += g.observed_seconds;
        sums.allocated += g.allocated_seconds;
        sums.idle += g.idle_allocated_seconds;
        sums.energy += g.energy_joules.unwrap_or(0.0);
        sums.gpus += 1;
    }
    for c in &report.overview.causes {
        *sums.lost.entry(c.kind.name().to_owned()).or_default() += c.lost_gpu_seconds;
    }
}

/// `fleet --json` against `url`: its exit code, the JSON (if any) and stderr.
fn fleet(url: &str, extra: &[&str]) -> (i32, Option<serde_json::Value>, String) {
    let (code, stdout, stderr) =
        run(agent().args(["fleet", "--prometheus", url, "--since", "3h", "--json"]).args(extra));
    (code, serde_json::from_str(&stdout).ok(), stderr)
}

fn close(what: &str, got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 0.01 * want.abs().max(1e-9),
        "{what}: fleet says {got}, the reports sum to {want} ({:+.3} %)",
        100.0 * (got - want) / want
    );
}

/// Polls `fleet` until its observed GPU-hours reach the reports' (the servers make written
/// samples searchable within a second or two), then checks every figure.
fn check_fleet(server: &str, url: &str, sums: &Sums) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let json = loop {
        let (code, json, stderr) = fleet(url, &["--by", "namespace", "--top", "100"]);
        let observed = json.as_ref().and_then(|j| j["period"]["totals"]["observed_gpu_hours"].as_f64());
        if code == 0 && observed.is_some_and(|o| (o * 3600.0 - sums.observed).abs() <= 0.01 * sums.observed) {
            break json.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{server}: fleet never reached the reports' figures: {code} {json:?} {stderr}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let t = &json["period"]["totals"];
    let h = |v: &serde_json::Value| v.as_f64().unwrap() * 3600.0;
    close(&format!("{server} observed"), h(&t["observed_gpu_hours"]), sums.observed);
    close(&format!("{server} allocated"), h(&t["allocated_gpu_hours"]), sums.allocated);
    close(&format!("{server} idle while allocated"), h(&t["idle_allocated_gpu_hours"]), sums.idle);
    close(&format!("{server} energy"), t["energy_kwh"].as_f64().unwrap() * 3.6e6, sums.energy);
    let lost: BTreeMap<String, f64> =
        t["lost_gpu_hours"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), h(v))).collect();
    assert_eq!(lost.keys().collect::<Vec<_>>(), sums.lost.keys().collect::<Vec<_>>(), "{server}: causes");
    close(&format!("{server} lost, all causes"), lost.values().sum(), sums.lost.values().sum());
    for (cause, want) in &sums.lost {
        close(&format!("{server} lost to {cause}"), lost[cause], *want);
    }
    assert_eq!(json["period"]["gpus"].as_u64().unwrap() as usize, sums.gpus, "{server}: GPUs");
    assert_eq!(json["period"]["hosts"].as_u64().unwrap() as usize, AGENTS, "{server}: hosts");
    assert_eq!(json["period"]["simulated"], true, "{server}: replayed mock data says so");
    // The groups (every one listed) share out the idle time.
    let groups = json["groups"].as_array().unwrap();
    let namespaces: Vec<&str> = groups.iter().map(|g| g["labels"]["namespace"].as_str().unwrap()).collect();
    for tenant in TENANTS {
        assert!(namespaces.contains(&tenant), "{server}: {tenant} in {namespaces:?}");
    }
    assert!(namespaces.contains(&""), "{server}: the GPUs without an owner are a group of their own");
    let idle: f64 = groups.iter().map(|g| h(&g["idle_allocated_gpu_hours"])).sum();
    close(&format!("{server} idle summed over namespaces"), idle, sums.idle);
    assert!(groups
        .windows(2)
        .all(|w| w[0]["idle_allocated_gpu_hours"].as_f64() >= w[1]["idle_allocated_gpu_hours"].as_f64()));
    json
}

/// Every panel query of `dashboards/gpu-hours.json`, over the whole data (the time range 3 h,
/// the rate interval 2 m, every namespace), evaluated at `at` on the server at `url`, returns
/// data; so does its namespace variable.
fn dashboard_has_data(url: &str, at: SystemTime) {
    fn exprs(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            exprs(&p["panels"], out);
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push((p["title"].as_str().unwrap().to_owned(), t["expr"].as_str().unwrap().to_owned()));
            }
        }
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards/gpu-hours.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut all = Vec::new();
    exprs(&dashboard["panels"], &mut all);
    assert_eq!(all.len(), 10, "panel queries: {all:?}");
    let at = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64().to_string();
    let query = |q: &str| -> Vec<serde_json::Value> {
        let body = get_with(&format!("{url}/api/v1/query"), &[("query", q), ("time", &at)]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {body}");
        v["data"]["result"].as_array().unwrap().clone()
    };
    for (title, expr) in &all {
        let q = expr.replace("$__range", "3h").replace("$__rate_interval", "2m").replace("$namespace", ".*");
        assert!(!query(&q).is_empty(), "panel `{title}` has no data: {q}");
    }
    let variable = dashboard["templating"]["list"][1]["query"]["query"].as_str().unwrap();
    let metric = variable.strip_prefix("label_values(").and_then(|v| v.strip_suffix(", namespace)")).unwrap();
    let namespaces = query(&format!("count by (namespace) (last_over_time({metric}[3h]))"));
    assert_eq!(namespaces.len(), TENANTS.len() + 1, "every tenant, and no owner: {namespaces:?}");
}

/// GET `url` with `query`'s parameters: the body.
fn get_with(url: &str, query: &[(&str, &str)]) -> String {
    #[cfg(feature = "tls")]
    gpumon::sinks::tls::install_crypto_provider();
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    client.get(url).query(query).send().and_then(|r| r.text()).unwrap()
}

/// GET `url`'s body.
fn get(url: &str) -> String {
    #[cfg(feature = "tls")]
    gpumon::sinks::tls::install_crypto_provider();
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    client.get(url).send().and_then(|r| r.error_for_status()).and_then(|r| r.text()).unwrap()
}

/// The sum of a server's own `/metrics` series named `name` (with `filter` in its labels).
fn self_metric(metrics: &str, name: &str, filter: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What the fleet costs the TSDBs, printed (measured once for docs/fleet.md, not asserted):
/// series per GPU (Prometheus' head, host series included), samples appended per GPU-hour of
/// data, and VictoriaMetrics' bytes on disk per GPU-hour of data after a flush.
fn tsdb_figures(vm: &str, prom: &str, gpus: usize) {
    let head: serde_json::Value = serde_json::from_str(&get(&format!("{prom}/api/v1/status/tsdb"))).unwrap();
    let series = head["data"]["headStats"]["numSeries"].as_f64().unwrap();
    let samples = self_metric(&get(&format!("{prom}/metrics")), "prometheus_tsdb_head_samples_appended_total", "");
    let _ = get(&format!("{vm}/internal/force_flush"));
    std::thread::sleep(Duration::from_secs(2));
    let vm_bytes = self_metric(&get(&format!("{vm}/metrics")), "vm_data_size_bytes", "");
    let gpu_hours = gpus as f64 * (TICKS as f64 * INTERVAL.as_secs_f64()) / 3600.0;
    println!(
        "TSDB: {series} series for {gpus} GPUs ({:.1} per GPU, host series included) at a {INTERVAL:?} interval; \
         Prometheus appended {samples} samples ({:.0} per GPU-hour); VictoriaMetrics {vm_bytes} bytes on disk ({:.0} per GPU-hour)",
        series / gpus as f64,
        samples / gpu_hours,
        vm_bytes / gpu_hours
    );
}

fn replay(trace: &Path, host: usize, write_url: &str) -> Child {
    agent()
        .arg("--replay")
        .arg(trace)
        .args(["--replay-speed", "max", "--report-format", "json", "--host", &format!("node-{host:02}")])
        .args(["--remote-write-url", write_url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
#[ignore = "needs VictoriaMetrics and Prometheus: run by scripts/test.sh"]
fn sixteen_agents_an_hour_each_and_the_fleet_report_equals_their_reports() {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("gpumon-fleet-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The data ends a minute ago: an hour and five minutes of it.
    let start = SystemTime::now() - INTERVAL * TICKS as u32 - Duration::from_secs(60);
    let traces: Vec<PathBuf> = (0..AGENTS).map(|i| dir.join(format!("node-{i:02}.gpumon-trace.gz"))).collect();
    // Two at a time (CI has two cores).
    std::thread::scope(|scope| {
        for half in [0, 1] {
            let traces = &traces;
            scope.spawn(move || {
                for (i, trace) in traces.iter().enumerate().filter(|(i, _)| i % 2 == half) {
                    write_trace(trace, i, start);
                }
            });
        }
    });
    let made = started.elapsed();
    eprintln!("traces made in {made:.1?}");

    let vm_port = gpumon_mock::test_kit::free_port();
    let prom_port = gpumon_mock::test_kit::free_port();
    let _vm = Backend::start("victoria-metrics", "fleet-e2e", &[("VM_PORT", vm_port.to_string())]);
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        "global:\n  scrape_interval: 10s\nscrape_configs: []\nstorage:\n  tsdb:\n    out_of_order_time_window: 3h\n",
    )
    .unwrap();
    let _prom = Backend::start(
        "prometheus",
        "fleet-e2e",
        &[("PROM_PORT", prom_port.to_string()), ("PROM_CONFIG", config.display().to_string())],
    );
    let vm = format!("http://127.0.0.1:{vm_port}");
    let prom = format!("http://127.0.0.1:{prom_port}");

    // Before any data: a clear error, not an empty report.
    let (code, _, stderr) = fleet(&prom, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("holds no gpumon series"), "{stderr}");

    let agents: Vec<Child> = traces
        .iter()
        .enumerate()
        .flat_map(|(i, t)| [replay(t, i, &format!("{vm}/api/v1/write")), replay(t, i, &format!("{prom}/api/v1/write"))])
        .collect();
    let mut sums = Sums::default();
    for (n, child) in agents.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "agent {n}: {stderr}");
        let report: Report = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report.ticks, TICKS, "agent {n}");
        if n % 2 == 0 {
            add(&mut sums, &report);
        }
    }
    let replayed = started.elapsed() - made;
    eprintln!("replayed in {replayed:.1?}");
    assert!(!sums.lost.is_empty(), "the scenarios raise findings");

    let from_vm = check_fleet("VictoriaMetrics", &vm, &sums);
    let from_prom = check_fleet("Prometheus", &prom, &sums);
    tsdb_figures(&vm, &prom, sums.gpus);
    let data_end = start + INTERVAL * (TICKS as u32 - 1);
    dashboard_has_data(&prom, data_end);
    let (code, text, stderr) = run(agent().args([
        "fleet",
        "--prometheus",
        &vm,
        "--since",
        "3h",
        "--by",
        "job",
        "--top",
        "3",
        "--compare-with",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("Top 3 of") && text.contains("main cause") && text.contains("SIMULATED"), "{text}");
    println!("{text}");
    println!(
        "fleet e2e: {AGENTS} agents, {} GPUs, {TICKS} ticks each; traces made in {made:.1?}, replayed into both in {replayed:.1?}, all in {:.1?}",
        sums.gpus,
        started.elapsed()
    );
    println!("VictoriaMetrics: {}", from_vm["period"]["totals"]);
    println!("Prometheus:      {}", from_prom["period"]["totals"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The error for a URL that is not a Prometheus API: a web page answering 200 is not taken for
/// an empty fleet.
#[test]
fn a_url_that_is_no_prometheus_api_is_said_to_be_one() {
    let page = gpumon_mock::test_env::HttpStub::start(|_| {
        gpumon_mock::test_env::HttpReply::with(
            200,
            &["Content-Type: text/html"],
            "<!doctype html><title>Grafana</title>",
        )
    });
    let (code, json, stderr) = fleet(&page.url(), &[]);
    assert_eq!((code, json), (1, None), "{stderr}");
    assert!(stderr.contains("is not a Prometheus query API") && stderr.contains("<!doctype html>"), "{stderr}");
    let (code, _, stderr) = fleet("not a url", &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--prometheus"), "{stderr}");
}
