//! The remote-write sink against real receivers started by `scripts/backends` (see
//! `scripts/test.sh`): VictoriaMetrics (`/api/v1/write`) and Prometheus 2.42
//! (`--web.enable-remote-write-receiver`). Every test is `#[ignore]`d; `scripts/test.sh` runs them
//! with `--include-ignored`, and a missing server is a failure.
#![cfg(feature = "remote-write")]

use gpumon_mock::test_kit::free_port;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Not as _;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::{SampleRequest, Sampler, Sink, Snapshot, SystemInfo};
use gpumon_mock::test_env::{require_env, wait_for};
use gpumon_sinks::prometheus::{Format, Naming, PrometheusSink};
use gpumon_sinks::remote_write::{RemoteWriteConfig, RemoteWriteSink};
use serde_json::Value as Json;

#[path = "backend_support/mod.rs"]
mod backend_support;
use backend_support::{client, range_samples};

/// A host name unique across test processes: every series of one test carries it.
fn unique_host(test: &str) -> String {
    backend_support::unique(&format!("rw-{test}"))
}

/// An 8-GPU mock snapshot for `host`, taken `ago` before now (millisecond precision, as sent).
fn snapshot(sampler: &gpumon_mock::MockSampler, host: &str, ago: Duration) -> Arc<Snapshot> {
    let mut s = sampler.sample(&SampleRequest::default()).unwrap();
    let mut system = SystemInfo::clone(&s.system);
    system.hostname = host.to_owned();
    s.system = Arc::new(system);
    let ms = (SystemTime::now() - ago).duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    s.taken_at = UNIX_EPOCH + Duration::from_millis(ms);
    Arc::new(s)
}

/// `name{k="v",…}` with sorted labels: a series' identity.
type Key = String;

fn key(name: &str, labels: &BTreeMap<String, String>) -> Key {
    let inner: Vec<String> =
        labels.iter().filter(|(k, _)| *k != "__name__").map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// What the scrape endpoint shows for `snap`: every series and its value.
fn scrape(snap: &Arc<Snapshot>, naming: Naming) -> BTreeMap<Key, f64> {
    let sink = PrometheusSink::builder().naming(naming).build().unwrap();
    let h = sink.handle();
    h.store(snap.clone());
    let text = h.render(Format::Text);
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        // The mock's label values hold no quotes, commas or escapes.
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once("=\"").unwrap();
            let v = v.trim_end_matches('"');
            if !v.is_empty() {
                map.insert(k.to_owned(), v.to_owned());
            }
        }
        out.insert(key(name, &map), value.parse().unwrap());
    }
    out
}

fn host_label(naming: Naming) -> &'static str {
    match naming {
        Naming::Dcgm => "Hostname",
        _ => "host",
    }
}

/// Series → (timestamp ms → value), read back from VictoriaMetrics' raw export.
async fn vm_export(url: &str, host_key: &str, host: &str) -> BTreeMap<Key, Vec<(i64, f64)>> {
    let c = client();
    let _ = c.get(format!("{url}/internal/force_flush")).send().await;
    let mut u = reqwest::Url::parse(&format!("{url}/api/v1/export")).unwrap();
    u.query_pairs_mut().append_pair("match[]", &format!("{{{host_key}={host:?}}}")).append_pair("start", "0");
    let text = c.get(u).send().await.unwrap().text().await.unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let j: Json = serde_json::from_str(line).unwrap();
        let labels: BTreeMap<String, String> =
            j["metric"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect();
        let name = labels["__name__"].clone();
        let ts = j["timestamps"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap());
        let vs = j["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap_or(f64::NAN));
        let mut points: Vec<(i64, f64)> = ts.zip(vs).collect();
        points.sort_by_key(|p| p.0);
        out.insert(key(&name, &labels), points);
    }
    out
}

/// The same from Prometheus' query API (a range selector returns the raw samples).
async fn prom_export(url: &str, host_key: &str, host: &str) -> BTreeMap<Key, Vec<(i64, f64)>> {
    let selector = format!("{{{host_key}={host:?}}}[30m]");
    range_samples(url, &selector)
        .await
        .into_iter()
        .map(|(labels, points)| (key(&labels["__name__"], &labels), points))
        .collect()
}

/// Starts a private Prometheus (remote-write receiver on) and returns its URL and a guard.
struct Backend {
    stop: String,
    instance: String,
    extra: Vec<(String, String)>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = Command::new(&self.stop).env("BACKEND_INSTANCE", &self.instance).envs(self.extra.clone()).status();
    }
}

fn start(script: &str, port_var: &str, instance: &str, extra: &[(&str, &str)]) -> (String, Backend) {
    let port = free_port().to_string();
    backend_script(&format!("start-{script}"), instance, &[&[(port_var, port.as_str())], extra].concat());
    let dir = require_env("GPUMON_TEST_BACKENDS_DIR");
    let guard = Backend { stop: format!("{dir}/stop-{script}.sh"), instance: instance.to_owned(), extra: Vec::new() };
    (format!("http://127.0.0.1:{port}"), guard)
}

/// Runs `scripts/backends/{script}.sh` for the backend `instance` with `env`; panics if it fails.
fn backend_script(script: &str, instance: &str, env: &[(&str, &str)]) {
    let dir = require_env("GPUMON_TEST_BACKENDS_DIR");
    let status =
        Command::new(format!("{dir}/{script}.sh")).env("BACKEND_INSTANCE", instance).envs(env.iter().copied()).status();
    assert!(status.unwrap().success(), "{script}.sh failed");
}

fn config(url: &str, naming: Naming) -> RemoteWriteConfig {
    let mut c = RemoteWriteConfig::new(url);
    c.naming = naming;
    c.retry_initial = Duration::from_millis(50);
    c.retry_max = Duration::from_millis(500);
    c
}

/// Sends three snapshots and checks that every scraped series arrives with the same values at
/// the snapshots' timestamps.
async fn every_series_arrives(write_url: &str, read: ReadBack, naming: Naming) {
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    let host = unique_host(&format!("{naming:?}").to_lowercase());
    let snaps: Vec<_> = (0..3).map(|i| snapshot(&sampler, &host, Duration::from_secs(3 - i))).collect();
    let mut expected: BTreeMap<Key, Vec<(i64, f64)>> = BTreeMap::new();
    for s in &snaps {
        let ts = s.taken_at.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        for (k, v) in scrape(s, naming) {
            expected.entry(k).or_default().push((ts, v));
        }
    }
    let mut sink = RemoteWriteSink::from_config(&config(write_url, naming)).unwrap();
    for s in &snaps {
        sink.export(s.clone()).await.unwrap();
    }
    sink.flush().await.unwrap();
    let total: usize = expected.values().map(Vec::len).sum();
    assert_eq!(sink.stats().samples_written as usize, total);
    let mut got = BTreeMap::new();
    for _ in 0..50 {
        got = read.read(host_label(naming), &host).await;
        if got.values().map(Vec::len).sum::<usize>() >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let missing: Vec<&Key> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "{naming:?}: {} series missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(3)]
    );
    let extra: Vec<&Key> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    assert!(extra.is_empty(), "{naming:?}: unexpected series {:?}", &extra[..extra.len().min(3)]);
    for (k, want) in &expected {
        let have = &got[k];
        let ts = |v: &Vec<(i64, f64)>| v.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(ts(have), ts(want), "{naming:?}: {k}: the snapshots' timestamps");
        for ((_, h), (_, w)) in have.iter().zip(want) {
            // VictoriaMetrics stores a float as a decimal with 12 significant digits
            // (0.463 comes back as 0.46299999999999997); Prometheus stores the f64 as sent.
            let close = h == w || (read.exact().not() && (h - w).abs() <= 1e-11 * w.abs().max(1.0));
            assert!(close, "{naming:?}: {k}: {have:?} != {want:?}");
        }
    }
    assert!(expected.keys().all(|k| k.contains("backend=\"mock\"")), "every series marks simulated data");
}

/// A query API to read samples back.
enum ReadBack {
    Vm(String),
    Prom(String),
}

impl ReadBack {
    async fn read(&self, host_key: &str, host: &str) -> BTreeMap<Key, Vec<(i64, f64)>> {
        match self {
            ReadBack::Vm(url) => vm_export(url, host_key, host).await,
            ReadBack::Prom(url) => prom_export(url, host_key, host).await,
        }
    }

    /// Whether values come back bit for bit.
    fn exact(&self) -> bool {
        matches!(self, ReadBack::Prom(_))
    }
}

#[tokio::test]
#[ignore = "needs scripts/test.sh (VictoriaMetrics)"]
async fn victoria_metrics_gets_every_scraped_series_in_both_namings() {
    let vm = require_env("GPUMON_TEST_VM_URL");
    for naming in [Naming::Native, Naming::Dcgm] {
        every_series_arrives(&format!("{vm}/api/v1/write"), ReadBack::Vm(vm.clone()), naming).await;
    }
}

#[tokio::test]
#[ignore = "needs scripts/test.sh (Prometheus)"]
async fn prometheus_gets_every_scraped_series_in_both_namings() {
    let (url, _guard) = start("prometheus", "PROM_PORT", &unique_host("prom"), &[]);
    for naming in [Naming::Native, Naming::Dcgm] {
        every_series_arrives(&format!("{url}/api/v1/write"), ReadBack::Prom(url.clone()), naming).await;
    }
}

/// Exports a snapshot every 250 ms for `run`, with the receiver (a private VictoriaMetrics,
/// data kept across the restart) down between `down_at` and `down_at + down_for`; returns the
/// sink's stats, the timestamps sent, and the samples stored per series.
async fn outage_run(
    down_at: Duration,
    down_for: Duration,
    run: Duration,
    tweak: impl FnOnce(&mut RemoteWriteConfig),
) -> (gpumon_sinks::remote_write::RemoteWriteStats, Vec<i64>, BTreeMap<Key, Vec<(i64, f64)>>, usize) {
    let instance = unique_host("vm-outage");
    let (url, mut guard) = start("victoria-metrics", "VM_PORT", &instance, &[]);
    let port = url.rsplit(':').next().unwrap().to_owned();
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    let host = unique_host("outage");
    let mut c = config(&format!("{url}/api/v1/write"), Naming::Native);
    c.batch_interval = Duration::from_millis(200);
    tweak(&mut c);
    let mut sink = RemoteWriteSink::from_config(&c).unwrap();
    let started = std::time::Instant::now();
    let (mut sent, mut per_snapshot, mut stopped, mut restarted) = (Vec::new(), 0, false, false);
    while started.elapsed() < run {
        let s = snapshot(&sampler, &host, Duration::ZERO);
        per_snapshot = scrape(&s, Naming::Native).len();
        sent.push(s.taken_at.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64);
        let _ = sink.export(s).await;
        if !stopped && started.elapsed() >= down_at {
            backend_script("stop-victoria-metrics", &instance, &[("KEEP_DATA", "1")]);
            stopped = true;
        }
        if stopped && !restarted && started.elapsed() >= down_at + down_for {
            backend_script("start-victoria-metrics", &instance, &[("VM_PORT", &port), ("KEEP_DATA", "1")]);
            restarted = true;
            guard.extra = Vec::new();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_for(Duration::from_secs(30), "the buffer drains", || sink.stats().samples_buffered == 0).await;
    sink.flush().await.unwrap();
    let stats = sink.stats();
    // What was acknowledged last becomes searchable a moment later.
    let mut stored = BTreeMap::new();
    for _ in 0..50 {
        stored = vm_export(&url, "host", &host).await;
        if stored.values().map(Vec::len).sum::<usize>() as u64 >= stats.samples_written {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (stats, sent, stored, per_snapshot)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (VictoriaMetrics)"]
async fn a_30s_outage_loses_nothing_and_duplicates_nothing() {
    let (stats, sent, stored, per_snapshot) =
        outage_run(Duration::from_secs(5), Duration::from_secs(30), Duration::from_secs(42), |_| {}).await;
    assert!(stats.failed_requests > 0, "the outage was seen: {stats:?}");
    assert_eq!(stats.samples_dropped, 0, "{stats:?}");
    assert_eq!(stored.len(), per_snapshot, "every series stored");
    for (k, points) in &stored {
        let ts: Vec<i64> = points.iter().map(|p| p.0).collect();
        let missing: Vec<i64> = sent.iter().filter(|t| !ts.contains(t)).map(|t| t - sent[0]).collect();
        assert_eq!(ts, sent, "{k}: every sample exactly once, by timestamp; missing (ms after the first) {missing:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (VictoriaMetrics)"]
async fn with_a_small_buffer_the_drops_counted_equal_the_shortfall() {
    let (stats, sent, stored, per_snapshot) =
        outage_run(Duration::from_secs(3), Duration::from_secs(30), Duration::from_secs(38), |c| {
            c.batch_samples = 500;
            c.buffer_max_samples = 20_000; // a fraction of 30 s of an 8-GPU node at 4 Hz
        })
        .await;
    let expected = sent.len() * per_snapshot;
    let got: usize = stored.values().map(Vec::len).sum();
    assert!(stats.samples_dropped > 0, "{stats:?}");
    assert_eq!(stats.samples_dropped as usize, expected - got, "{stats:?}");
    assert_eq!(stats.samples_written as usize, got);
    // Nothing stored twice.
    for points in stored.values() {
        let unique: BTreeSet<i64> = points.iter().map(|p| p.0).collect();
        assert_eq!(unique.len(), points.len());
    }
}

#[tokio::test]
#[ignore = "needs scripts/test.sh (Prometheus)"]
async fn an_out_of_order_sample_gets_a_400_without_a_retry_storm() {
    let (url, _guard) = start("prometheus", "PROM_PORT", &unique_host("prom400"), &[]);
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    let host = unique_host("ooo");
    let mut sink = RemoteWriteSink::from_config(&config(&format!("{url}/api/v1/write"), Naming::Native)).unwrap();
    sink.export(snapshot(&sampler, &host, Duration::from_secs(1))).await.unwrap();
    sink.flush().await.unwrap();
    // Older than what is stored: Prometheus answers 400 (out of order).
    sink.export(snapshot(&sampler, &host, Duration::from_secs(60))).await.unwrap();
    sink.flush().await.unwrap(); // refused and dropped: nothing left to send
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = sink.stats();
    assert_eq!(stats.requests, 2, "no retry of a 400: {stats:?}");
    assert!(stats.samples_rejected > 0, "{stats:?}");
    let e = stats.last_error.unwrap();
    assert!(e.contains("HTTP 400") && e.contains("out of order"), "{e}");
    // The sink goes on: a newer snapshot is accepted.
    let _ = sink.export(snapshot(&sampler, &host, Duration::ZERO)).await;
    sink.flush().await.unwrap();
    assert_eq!(sink.stats().requests, 3);
}
