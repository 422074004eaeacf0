//! The InfluxDB sink against real servers started by `scripts/backends` (see `scripts/test.sh`):
//! InfluxDB 1.6 (plain and auth-enabled) and VictoriaMetrics (v2 write API).
//!
//! Every test here is `#[ignore]`d (a plain `cargo test` lists it as ignored); `scripts/test.sh`
//! starts the servers and runs them with `--include-ignored`, and a missing server is a failure.
#![cfg(feature = "influxdb-http")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpumon_core::{
    Agent, AgentHandle, ClockEventReasons, DeviceInfo, DeviceSample, MetricSet, SampleError, SampleRequest, Sampler,
    Sink, SinkError, Snapshot, SystemInfo, XidCount,
};
use gpumon_mock::test_env::{require_env, wait_for};
use gpumon_sinks::influxdb::escape::stored_identifier;
use gpumon_sinks::influxdb::{encode_snapshot, InfluxConfig, InfluxSink, InfluxStatsHandle};
use influxdb_line_protocol::{parse_lines, FieldValue};
use serde_json::Value as Json;

#[path = "backend_support/mod.rs"]
mod backend_support;
use backend_support::{influxql, unique as run_id};

fn influx_url() -> String {
    require_env("GPUMON_TEST_INFLUXDB_URL")
}
fn influx_db() -> String {
    require_env("GPUMON_TEST_INFLUXDB_DB")
}
fn backends_dir() -> PathBuf {
    PathBuf::from(require_env("GPUMON_TEST_BACKENDS_DIR"))
}

/// A sampler producing `names.len()` GPUs with values that change every tick, every family the
/// dashboard uses filled in.
struct TestSampler {
    host: String,
    names: Vec<String>,
    tick: AtomicU64,
}

impl TestSampler {
    fn new(host: &str, names: &[&str]) -> Self {
        Self { host: host.to_owned(), names: names.iter().map(|s| (*s).to_owned()).collect(), tick: AtomicU64::new(0) }
    }
}

impl Sampler for TestSampler {
    fn name(&self) -> &str {
        "test"
    }
    fn sample(&self, _: &SampleRequest) -> Result<Snapshot, SampleError> {
        let t = self.tick.fetch_add(1, Ordering::Relaxed);
        let devices = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut d =
                    DeviceSample::new(Arc::new(DeviceInfo::new(i as u32, format!("GPU-{i:04}-{name}"), name.clone())));
                let x = (t * 7 + i as u64 * 13) % 100;
                d.utilization.gpu = Some(x as f64 / 100.0);
                d.utilization.memory = Some(0.123_456_789 * (i + 1) as f64);
                d.memory.used = Some((1 << 30) + t * 4096);
                d.memory.total = Some(80 << 30);
                d.temperature.gpu = Some(40.0 + x as f64 / 10.0);
                d.power.usage_watts = Some(100.5 + x as f64);
                d.power.limit_watts = Some(700.0);
                d.power.energy_joules = Some(1e6 + t as f64 * 50.0);
                d.clocks.sm = Some(1.98e9);
                d.clocks.memory = Some(2.619e9);
                d.fan_speed = Some(0.3);
                d.performance_state = Some(0);
                d.clock_event_reasons = Some(ClockEventReasons(if t.is_multiple_of(2) {
                    ClockEventReasons::SW_POWER_CAP
                } else {
                    ClockEventReasons::GPU_IDLE
                }));
                d.pcie.link_generation = Some(5);
                d.pcie.link_width = Some(16);
                d.pcie.replays = Some(t / 3);
                d.ecc.corrected = Some(t / 5);
                d.ecc.uncorrected = Some(0);
                d.xid_errors.push(XidCount::new(79, 1 + t / 10, UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
                d
            })
            .collect();
        Ok(Snapshot::new(Arc::new(SystemInfo::new(self.host.clone(), "test")), devices))
    }
}

/// Records what the agent published, to compare with what the server stored.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Arc<Snapshot>>>>);

#[async_trait::async_trait]
impl Sink for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        self.0.lock().unwrap().push(snapshot);
        Ok(())
    }
    async fn shutdown(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

impl Recorder {
    fn snapshots(&self) -> Vec<Arc<Snapshot>> {
        self.0.lock().unwrap().clone()
    }
}

fn config(run: &str) -> InfluxConfig {
    let mut c = InfluxConfig::v1(influx_url(), influx_db());
    c.batch_interval = Duration::from_millis(200);
    c.batch_points = 200;
    c.retry_initial = Duration::from_millis(100);
    c.retry_max = Duration::from_millis(800);
    c.tags.insert("run".into(), run.into());
    c
}

fn start_agent(sampler: TestSampler, sink: InfluxSink) -> (AgentHandle, Recorder, InfluxStatsHandle) {
    let recorder = Recorder::default();
    let stats = sink.stats_handle();
    // Every family exported, the opt-in ones too (each throttle reason's `gpu_clock_events`):
    // every measurement round-trips.
    let handle = Agent::builder(sampler)
        .interval(Duration::from_millis(100))
        .metrics(MetricSet::everything())
        .sink(sink)
        .sink(recorder.clone())
        .spawn()
        .expect("agent");
    (handle, recorder, stats)
}

/// Line protocol of every recorded snapshot, parsed: (measurement, tags, timestamp) → fields.
type Expected = BTreeMap<(String, BTreeMap<String, String>, i64), BTreeMap<String, Json>>;

fn expected(snapshots: &[Arc<Snapshot>], run: &str) -> Expected {
    let mut out = Expected::new();
    let mut text = String::new();
    for s in snapshots {
        encode_snapshot(s, &mut text);
    }
    for line in parse_lines(&text) {
        let line = line.expect("own output parses");
        let mut tags: BTreeMap<String, String> =
            line.series.tag_set.iter().flatten().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        tags.insert("run".into(), run.into());
        let fields = line
            .field_set
            .iter()
            .map(|(k, v)| {
                let j = match v {
                    FieldValue::I64(i) => Json::from(*i),
                    FieldValue::F64(f) => Json::from(*f),
                    other => panic!("unexpected field {other:?}"),
                };
                (k.to_string(), j)
            })
            .collect();
        let key = (line.series.measurement.to_string(), tags, line.timestamp.unwrap());
        assert!(out.insert(key, fields).is_none(), "duplicate line in own encoding");
    }
    out
}

/// Every stored row of this run: same key shape as [`Expected`].
async fn stored(url: &str, db: &str, run: &str, measurements: &BTreeSet<String>) -> Expected {
    let mut out = Expected::new();
    for m in measurements {
        // Tag keys of the measurement, to tell tags from fields in the result columns.
        let tag_keys: BTreeSet<String> = influxql(url, db, None, &format!("SHOW TAG KEYS FROM \"{m}\"")).await
            ["results"][0]["series"][0]["values"]
            .as_array()
            .map(|v| v.iter().map(|r| r[0].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        let body = influxql(url, db, None, &format!("SELECT * FROM \"{m}\" WHERE \"run\" = '{run}'")).await;
        let Some(series) = body["results"][0]["series"].as_array() else { continue };
        for s in series {
            let columns: Vec<&str> = s["columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
            for row in s["values"].as_array().unwrap() {
                let mut tags = BTreeMap::new();
                let mut fields = BTreeMap::new();
                let mut ts = 0;
                for (c, v) in columns.iter().zip(row.as_array().unwrap()) {
                    if *c == "time" {
                        ts = v.as_i64().unwrap();
                    } else if v.is_null() {
                    } else if tag_keys.contains(*c) {
                        tags.insert((*c).to_owned(), v.as_str().unwrap().to_owned());
                    } else {
                        fields.insert((*c).to_owned(), v.clone());
                    }
                }
                assert!(out.insert((m.clone(), tags, ts), fields).is_none());
            }
        }
    }
    out
}

fn measurements(e: &Expected) -> BTreeSet<String> {
    e.keys().map(|(m, _, _)| m.clone()).collect()
}

/// Compares values numerically (JSON from InfluxDB may print `1` for a float `1.0`).
fn assert_same(expected: &Expected, stored: &Expected) {
    let missing: Vec<_> = expected.keys().filter(|k| !stored.contains_key(*k)).take(3).collect();
    let extra: Vec<_> = stored.keys().filter(|k| !expected.contains_key(*k)).take(3).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "expected {} points, stored {}; missing e.g. {missing:?}; unexpected e.g. {extra:?}",
        expected.len(),
        stored.len()
    );
    for (k, want) in expected {
        let got = &stored[k];
        assert_eq!(want.len(), got.len(), "fields of {k:?}: {want:?} vs {got:?}");
        for (f, w) in want {
            // serde_json's default float parser may be 1 ulp off; InfluxDB stores the exact value.
            let (w, g) = (w.as_f64().unwrap(), got[f].as_f64().unwrap());
            assert!((w - g).abs() <= 4.0 * f64::EPSILON * w.abs().max(1e-300), "{f} of {k:?}: {w} vs {g}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (InfluxDB)"]
async fn agent_writes_every_sampled_point_to_influxdb_v1() {
    let run = run_id("v1");
    let mut cfg = config(&run);
    // gzip is the default (every other test here sends it): this one writes plain bodies.
    cfg.gzip = false;
    let sink = InfluxSink::from_config(&cfg).unwrap();
    let (handle, recorder, stats) =
        start_agent(TestSampler::new("itest-node", &["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]), sink);
    wait_for(Duration::from_secs(20), "12 snapshots", || recorder.snapshots().len() >= 12).await;
    handle.shutdown(Duration::from_secs(10)).await.expect("clean shutdown");

    let snapshots = recorder.snapshots();
    let want = expected(&snapshots, &run);
    let s = stats.stats();
    assert_eq!(s.lines_written as usize, want.len(), "{s:?}");
    assert_eq!((s.lines_dropped, s.lines_rejected, s.lines_buffered), (0, 0, 0));
    assert_eq!(measurements(&want), ["gpu", "gpu_clock_events", "gpu_xid"].map(String::from).into());
    let got = stored(&influx_url(), &influx_db(), &run, &measurements(&want)).await;
    assert_same(&want, &got);

    // And one InfluxQL aggregate over the main measurement, per GPU.
    let q =
        format!("SELECT count(\"utilization\"), sum(\"memory_used\") FROM gpu WHERE run = '{run}' GROUP BY \"gpu\"");
    let body = influxql(&influx_url(), &influx_db(), None, &q).await;
    for s in body["results"][0]["series"].as_array().unwrap() {
        let gpu: usize = s["tags"]["gpu"].as_str().unwrap().parse().unwrap();
        let count = s["values"][0][1].as_u64().unwrap();
        let sum = s["values"][0][2].as_f64().unwrap();
        assert_eq!(count as usize, snapshots.len());
        let want_sum: f64 = snapshots.iter().map(|s| s.devices[gpu].memory.used.unwrap() as f64).sum();
        assert_eq!(sum, want_sum);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (VictoriaMetrics)"]
async fn v2_write_api_against_victoria_metrics() {
    let vm = require_env("GPUMON_TEST_VM_URL");
    let run = run_id("v2");
    let mut cfg = InfluxConfig::v2(vm.clone(), "gpumon-org", "gpumon-bucket", "not-checked-by-vm");
    cfg.batch_interval = Duration::from_millis(200);
    cfg.tags.insert("run".into(), run.clone());
    let sink = InfluxSink::from_config(&cfg).unwrap();
    let (handle, recorder, stats) = start_agent(TestSampler::new("itest-vm", &["A100", "A100"]), sink);
    wait_for(Duration::from_secs(20), "8 snapshots", || recorder.snapshots().len() >= 8).await;
    handle.shutdown(Duration::from_secs(10)).await.expect("clean shutdown");
    let snapshots = recorder.snapshots();
    assert_eq!(stats.stats().lines_written as usize, expected(&snapshots, &run).len());

    // VictoriaMetrics stores `<measurement>_<field>` with the tags as labels, millisecond time.
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    let client = reqwest::Client::new();
    let mut samples = BTreeMap::new();
    for _ in 0..30 {
        client.get(format!("{vm}/internal/force_flush")).send().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut url = reqwest::Url::parse(&format!("{vm}/api/v1/export")).unwrap();
        url.query_pairs_mut().append_pair("match[]", &format!("{{__name__=\"gpu_utilization\",run=\"{run}\"}}"));
        let text = client.get(url).send().await.unwrap().text().await.unwrap();
        samples.clear();
        for line in text.lines() {
            let j: Json = serde_json::from_str(line).unwrap();
            let uuid = j["metric"]["uuid"].as_str().unwrap().to_owned();
            for (t, v) in j["timestamps"].as_array().unwrap().iter().zip(j["values"].as_array().unwrap()) {
                samples.insert((uuid.clone(), t.as_i64().unwrap()), v.as_f64().unwrap());
            }
        }
        if samples.len() >= snapshots.len() * 2 {
            break;
        }
    }
    let want: BTreeMap<(String, i64), f64> = snapshots
        .iter()
        .flat_map(|s| {
            let ms = (s.timestamp_nanos() / 1_000_000) as i64;
            s.devices.iter().map(move |d| ((d.info.uuid.clone(), ms), d.utilization.gpu.unwrap()))
        })
        .collect();
    assert_eq!(samples, want);
}

/// Runs a private InfluxDB for the outage test (stopping the shared one would break the others).
struct PrivateInflux {
    instance: String,
    port: u16,
}

impl PrivateInflux {
    fn script(&self, name: &str, keep: bool) {
        let status = std::process::Command::new(backends_dir().join(name))
            .env("BACKEND_INSTANCE", &self.instance)
            .env("INFLUX_PORT", self.port.to_string())
            .env("INFLUX_RPC_PORT", (self.port + 2).to_string())
            .env("INFLUX_DB", "gpumon")
            .env("KEEP_DATA", if keep { "1" } else { "0" })
            .status()
            .unwrap_or_else(|e| panic!("running {name}: {e}"));
        assert!(status.success(), "{name} failed");
    }
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateInflux {
    fn drop(&mut self) {
        self.script("stop-influxdb.sh", false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (InfluxDB binaries and scripts/backends)"]
async fn outage_loses_nothing_and_counts_drops() {
    let server = PrivateInflux { instance: format!("outage{}", std::process::id()), port: 18196 };
    server.script("start-influxdb.sh", false);

    // Agent A: spills to disk, and is restarted in the middle of the outage.
    let spill = std::env::temp_dir().join(format!("gpumon-influx-spill-{}", run_id("spill")));
    let run_a = run_id("outage-spill");
    let mut cfg_a = config(&run_a);
    cfg_a.url = server.url();
    cfg_a.spill_dir = Some(spill.clone());
    // Agent B: a buffer smaller than the outage, one line per snapshot (no labelled families).
    let run_b = run_id("outage-drop");
    let mut cfg_b = config(&run_b);
    cfg_b.url = server.url();
    cfg_b.batch_points = 2;
    cfg_b.buffer_max_points = 6;

    let (a1, rec_a1, stats_a1) =
        start_agent(TestSampler::new("itest-outage-a", &["H100"]), InfluxSink::from_config(&cfg_a).unwrap());
    let sampler_b = TestSampler::new("itest-outage-b", &["H100"]);
    let recorder_b = Recorder::default();
    let sink_b = InfluxSink::from_config(&cfg_b).unwrap();
    let stats_b = sink_b.stats_handle();
    let b = Agent::builder(OnlyUp(sampler_b))
        .interval(Duration::from_millis(100))
        .sink(sink_b)
        .sink(recorder_b.clone())
        .spawn()
        .unwrap();

    wait_for(Duration::from_secs(20), "both agents writing before the outage", || {
        stats_a1.stats().lines_written > 0 && stats_b.stats().lines_written > 0
    })
    .await;
    server.script("stop-influxdb.sh", true);
    // Status shows the failure while it lasts.
    let influx_error = || {
        let status = a1.stats().sinks.into_iter().find(|s| s.name == "influxdb").unwrap();
        status.last_error.unwrap_or_default()
    };
    wait_for(Duration::from_secs(20), "the outage in agent A's sink status", || {
        let err = influx_error();
        err.contains("lines buffered") && err.contains("POST")
    })
    .await;
    // Restart agent A during the outage: what it could not send goes to the spill directory.
    let shut = a1.shutdown(Duration::from_secs(5)).await;
    assert!(shut.is_err(), "shutdown during an outage must report the unsent data");
    let left = stats_a1.stats().lines_buffered;
    assert!(left > 0);
    let sink_a2 = InfluxSink::from_config(&cfg_a).unwrap();
    assert_eq!(sink_a2.stats().lines_replayed, left, "spilled lines are replayed");
    let (a2, rec_a2, stats_a2) = start_agent(TestSampler::new("itest-outage-a", &["H100"]), sink_a2);
    wait_for(Duration::from_secs(20), "agent A sampling again and B's buffer overflowing in the outage", || {
        rec_a2.snapshots().len() >= 5 && stats_b.stats().lines_dropped > 0
    })
    .await;
    server.script("start-influxdb.sh", true);
    let b_written = stats_b.stats().lines_written;
    wait_for(Duration::from_secs(30), "both sinks writing again after the server came back", || {
        stats_a2.stats().lines_written > 0 && stats_b.stats().lines_written > b_written
    })
    .await;
    a2.shutdown(Duration::from_secs(10)).await.expect("A drains after recovery");
    b.shutdown(Duration::from_secs(10)).await.expect("B drains after recovery");

    // A: every sampled point exactly once, across the agent restart.
    let mut snaps_a = rec_a1.snapshots();
    snaps_a.extend(rec_a2.snapshots());
    let want_a = expected(&snaps_a, &run_a);
    let got_a = stored(&server.url(), "gpumon", &run_a, &measurements(&want_a)).await;
    assert_same(&want_a, &got_a);
    assert_eq!(stats_a2.stats().lines_dropped, 0);
    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "spill files are deleted once written");
    std::fs::remove_dir_all(&spill).unwrap();

    // B: the shortfall is exactly the drop count, and the oldest points were the ones dropped.
    let want_b = expected(&recorder_b.snapshots(), &run_b);
    let got_b = stored(&server.url(), "gpumon", &run_b, &measurements(&want_b)).await;
    let s = stats_b.stats();
    assert!(s.lines_dropped > 0, "the outage must overflow B's buffer: {s:?}");
    assert!(got_b.keys().all(|k| want_b.contains_key(k)), "only sampled points are stored");
    // Every missing point was counted as dropped. The converse holds up to one in-flight batch:
    // a write the server persisted while it was being stopped (the client saw the connection
    // close, not a response) is counted as unsent, and may later be dropped from the full
    // buffer although it is stored — HTTP gives at-least-once, never a certain "not written".
    let shortfall = want_b.len() - got_b.len();
    let dropped = s.lines_dropped as usize;
    assert!(shortfall <= dropped, "every missing point is a counted drop: shortfall {shortfall}, {s:?}");
    assert!(dropped - shortfall <= cfg_b.batch_points, "shortfall {shortfall} vs drops {dropped}: {s:?}");
    assert!(s.lines_written as usize <= got_b.len());
    let missing: Vec<i64> = want_b.keys().filter(|k| !got_b.contains_key(*k)).map(|k| k.2).collect();
    let stored_after_gap: Vec<i64> = got_b.keys().map(|k| k.2).filter(|t| *t > missing[0]).collect();
    let last_missing = *missing.last().unwrap();
    assert!(
        stored_after_gap.iter().filter(|t| **t < last_missing).count() <= 6,
        "drops are of the oldest buffered data: a single gap, not scattered"
    );
}

/// Wraps a sampler and keeps only `up` (one line per GPU and snapshot).
struct OnlyUp(TestSampler);

impl Sampler for OnlyUp {
    fn name(&self) -> &str {
        "only-up"
    }
    fn sample(&self, r: &SampleRequest) -> Result<Snapshot, SampleError> {
        let s = self.0.sample(r)?;
        let devices = s.devices.iter().map(|d| DeviceSample::new(d.info.clone())).collect();
        Ok(Snapshot::new(s.system.clone(), devices))
    }
}

/// A TCP proxy that counts HTTP write requests passing through it.
async fn counting_proxy(upstream: String) -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else { return };
            let upstream = upstream.clone();
            let c = c.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { return };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    c.fetch_add(buf[..n].windows(11).filter(|w| w == b"POST /write").count(), Ordering::Relaxed);
                    if sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (auth-enabled InfluxDB)"]
async fn wrong_password_is_reported_without_a_retry_storm() {
    let auth_url = require_env("GPUMON_TEST_INFLUXDB_AUTH_URL");
    let user = require_env("GPUMON_TEST_INFLUXDB_AUTH_USER");
    let password = require_env("GPUMON_TEST_INFLUXDB_AUTH_PASSWORD");
    let upstream = auth_url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let (proxy, requests) = counting_proxy(upstream).await;

    let run = run_id("auth");
    let mut cfg = config(&run);
    cfg.url = proxy;
    cfg.username = Some(user.clone());
    cfg.password = Some("definitely-wrong".into());
    cfg.retry_max = Duration::from_secs(30);
    let (handle, _rec, stats) =
        start_agent(TestSampler::new("itest-auth", &["H100"]), InfluxSink::from_config(&cfg).unwrap());
    let influx_error = || {
        let status = handle.stats().sinks.into_iter().find(|s| s.name == "influxdb").unwrap();
        status.last_error.unwrap_or_default()
    };
    wait_for(Duration::from_secs(10), "the 401 in the sink status", || influx_error().contains("401")).await;
    // An observation window, not synchronisation: the point is how few requests it holds.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let err = influx_error();
    assert!(err.contains("401") && err.contains("authorization failed"), "clear error in status: {err}");
    assert!(err.starts_with("permanent failure"), "{err}");
    let sent = requests.load(Ordering::Relaxed);
    // ~30 snapshots, 15 batch intervals: one attempt, then a pause of retry_max.
    assert!((1..=2).contains(&sent), "{sent} write requests in 3 s");
    assert_eq!(stats.stats().requests as usize, sent);
    assert!(stats.stats().lines_buffered > 0, "data is kept, not discarded");
    let _ = handle.shutdown(Duration::from_secs(2)).await;

    // The right password works through the same path.
    let run = run_id("auth-ok");
    let mut cfg = config(&run);
    cfg.url = auth_url.clone();
    cfg.username = Some(user.clone());
    cfg.password = Some(password.clone().into());
    let (handle, rec, _) =
        start_agent(TestSampler::new("itest-auth", &["H100"]), InfluxSink::from_config(&cfg).unwrap());
    wait_for(Duration::from_secs(10), "3 snapshots", || rec.snapshots().len() >= 3).await;
    handle.shutdown(Duration::from_secs(5)).await.expect("authorised writes succeed");
    let q = format!("SELECT count(\"up\") FROM gpu WHERE run = '{run}'");
    let body = influxql(&auth_url, &influx_db(), Some((&user, &password)), &q).await;
    assert_eq!(body["results"][0]["series"][0]["values"][0][1].as_u64().unwrap() as usize, rec.snapshots().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (InfluxDB)"]
async fn hostile_names_are_accepted_and_read_back() {
    let names = [
        "NVIDIA H100, \"80GB\" = fast",
        "back\\slash \\\\double trailing\\",
        "new\nline\r\ttab",
        "ünïcødé 🚀 名前",
        "#hash=1,2 3",
        "'single' quotes",
    ];
    let run = run_id("hostile");
    let host = "host ,=\"\\ x\n";
    let sink = InfluxSink::from_config(&config(&run)).unwrap();
    let (handle, recorder, stats) = start_agent(TestSampler::new(host, &names), sink);
    wait_for(Duration::from_secs(10), "3 snapshots", || recorder.snapshots().len() >= 3).await;
    handle.shutdown(Duration::from_secs(5)).await.expect("clean shutdown");
    let s = stats.stats();
    assert_eq!((s.lines_rejected, s.failed_requests), (0, 0), "{s:?}");

    let q = format!("SHOW TAG VALUES FROM gpu WITH KEY IN (\"name\", \"host\", \"uuid\") WHERE run = '{run}'");
    let body = influxql(&influx_url(), &influx_db(), None, &q).await;
    let got: BTreeSet<(String, String)> = body["results"][0]["series"][0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_str().unwrap().to_owned()))
        .collect();
    let mut want = BTreeSet::new();
    want.insert(("host".to_owned(), stored_identifier(host).into_owned()));
    for (i, n) in names.iter().enumerate() {
        want.insert(("name".to_owned(), stored_identifier(n).into_owned()));
        want.insert(("uuid".to_owned(), stored_identifier(&format!("GPU-{i:04}-{n}")).into_owned()));
    }
    assert_eq!(got, want);
    assert!(
        got.contains(&("name".to_owned(), "NVIDIA H100, \"80GB\" = fast".to_owned())),
        "no change where none is needed"
    );
    // And every point, value for value.
    let want = expected(&recorder.snapshots(), &run);
    assert_same(&want, &stored(&influx_url(), &influx_db(), &run, &measurements(&want)).await);
}

/// Dashboard panels over gpumon's diagnosis findings (measurement `gpu_finding`). The test
/// sampler's agent runs no diagnosis, so these queries must run but may return nothing; an
/// end-to-end test with a finding-producing scenario checks them with data.
const FINDINGS_PANELS: &[&str] = &["Findings (raised and cleared)"];

/// Dashboard panels over training steps (measurement `gpu_step`). The test sampler's agent runs
/// no step tracker, so these queries must run but may return nothing.
const STEPS_PANELS: &[&str] = &["Step duration", "Utilisation per step", "Energy per step", "Steps"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (InfluxDB)"]
async fn every_dashboard_query_returns_data() {
    let run = run_id("dash");
    let host = format!("itest-dash-{}", std::process::id());
    let sink = InfluxSink::from_config(&config(&run)).unwrap();
    let (handle, rec, _) = start_agent(TestSampler::new(&host, &["H100", "H100"]), sink);
    // 25 snapshots at 100 ms span 2.4 s, so at least two whole one-second buckets hold data: the
    // rate panels (`non_negative_derivative(…) GROUP BY time(1s)`) need two. Ten snapshots
    // fell into a single bucket whenever the agent started in the first tenth of a second.
    wait_for(Duration::from_secs(20), "25 snapshots", || rec.snapshots().len() >= 25).await;
    handle.shutdown(Duration::from_secs(5)).await.expect("clean shutdown");

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../dashboards/influxdb.json");
    let dash: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let subst = |q: &str| {
        q.replace("$timeFilter", "time > now() - 10m")
            .replace("$__interval", "1s")
            .replace("${host:regex}", &host)
            .replace("$host", &host)
            .replace("${gpu:regex}", ".*")
            .replace("$gpu", ".*")
    };
    // Template variables: the data-source picker (an InfluxDB one), then queries that all return
    // values.
    let (sources, vars): (Vec<&Json>, Vec<&Json>) =
        dash["templating"]["list"].as_array().unwrap().iter().partition(|v| v["type"] == "datasource");
    assert_eq!(sources.len(), 1, "one data-source variable");
    assert_eq!((sources[0]["name"].as_str(), sources[0]["query"].as_str()), (Some("datasource"), Some("influxdb")));
    assert_eq!(vars.len(), 2, "the dashboard's query variables (host, gpu)");
    for var in vars {
        assert_eq!(var["type"], "query", "variable {}", var["name"]);
        {
            let q = subst(var["query"].as_str().unwrap());
            let body = influxql(&influx_url(), &influx_db(), None, &q).await;
            assert!(body["results"][0]["series"].is_array(), "variable {} returned nothing: {q}", var["name"]);
        }
    }
    let mut checked = 0;
    let panels = dash["panels"].as_array().unwrap();
    for name in FINDINGS_PANELS.iter().chain(STEPS_PANELS) {
        assert!(
            panels.iter().any(|p| p["title"] == *name),
            "FINDINGS/STEPS_PANELS name `{name}`, not in the dashboard"
        );
    }
    for panel in panels {
        let Some(targets) = panel["targets"].as_array() else { continue };
        for t in targets {
            assert_eq!(t["rawQuery"], true, "panel {} must use raw InfluxQL", panel["title"]);
            let q = subst(t["query"].as_str().unwrap());
            // `influxql` panics when InfluxDB rejects the query, so every panel is checked for that.
            let body = influxql(&influx_url(), &influx_db(), None, &q).await;
            if panel["title"]
                .as_str()
                .is_some_and(|title| FINDINGS_PANELS.contains(&title) || STEPS_PANELS.contains(&title))
            {
                continue;
            }
            let series = body["results"][0]["series"].as_array();
            let points: usize = series.map_or(0, |s| {
                s.iter()
                    .map(|s| {
                        s["values"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter(|r| r.as_array().unwrap()[1..].iter().any(|v| !v.is_null()))
                            .count()
                    })
                    .sum()
            });
            assert!(points > 0, "panel {} returned no data: {q}", panel["title"]);
            checked += 1;
        }
    }
    // Every target of every panel was queried; all but the findings and steps panels' returned data.
    let targets: usize = panels.iter().filter_map(|p| p["targets"].as_array()).map(Vec::len).sum();
    assert_eq!((checked, targets), (14, 19), "every dashboard query is checked");
    // Annotation queries (the findings overlay): InfluxDB accepts them.
    let mut annotation_queries = 0;
    for a in dash["annotations"]["list"].as_array().unwrap() {
        if let Some(q) = a["query"].as_str() {
            influxql(&influx_url(), &influx_db(), None, &subst(q)).await;
            annotation_queries += 1;
        }
    }
    assert_eq!(annotation_queries, 2, "the findings annotations (raised, cleared)");
}

/// A finding raised and cleared by the real diagnosis stage is stored in `gpu_finding`, one
/// point per event, and the active finding in `gpu_diagnosis`, both read back with InfluxQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (InfluxDB)"]
async fn findings_are_stored_as_events_and_series() {
    use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
    use gpumon_core::{FindingKind, Processor, ProcessorContext, Transition};
    let run = run_id("findings");
    let mut sink = InfluxSink::from_config(&config(&run)).unwrap();
    let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).unwrap();
    diagnoser.attach(&ProcessorContext::new(Duration::from_secs(1)));
    let system = Arc::new(SystemInfo::new("itest-node", "test"));
    let info = Arc::new(DeviceInfo::new(0, "GPU-findings-0", "NVIDIA H100 80GB HBM3"));
    let base = SystemTime::now() - Duration::from_secs(3600);
    let (mut events, mut active_ticks) = (Vec::new(), 0);
    for tick in 0..120u64 {
        let mut d = DeviceSample::new(info.clone());
        d.utilization.gpu = Some(0.9);
        d.memory.total = Some(80 << 30);
        // 97 % used for 40 ticks (raises near_oom), then half (clears it).
        d.memory.used = Some(if tick < 40 { (80 << 30) / 100 * 97 } else { 40 << 30 });
        let mut snap =
            Snapshot::new(system.clone(), vec![d]).with_seq(tick + 1).with_taken_at(base + Duration::from_secs(tick));
        diagnoser.process(&mut snap);
        let diagnosis = snap.output::<gpumon_core::Diagnosis>().expect("diagnosis attached");
        events.extend(diagnosis.events.iter().map(|e| (snap.timestamp_nanos(), e.clone())));
        active_ticks += diagnosis.active.iter().filter(|f| f.kind == FindingKind::NearOom).count();
        sink.export(Arc::new(snap)).await.unwrap();
    }
    sink.shutdown().await.expect("every batch written");
    let kinds: Vec<_> = events.iter().map(|(_, e)| (e.finding.kind, e.transition)).collect();
    assert_eq!(kinds, [(FindingKind::NearOom, Transition::Raised), (FindingKind::NearOom, Transition::Cleared)]);

    let q = format!("SELECT * FROM gpu_finding WHERE run = '{run}' ORDER BY time");
    let body = influxql(&influx_url(), &influx_db(), None, &q).await;
    let series = &body["results"][0]["series"][0];
    let columns: Vec<&str> = series["columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let rows = series["values"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{body}");
    let col = |row: &Json, name: &str| row[columns.iter().position(|c| *c == name).unwrap()].clone();
    for (row, (ts, event)) in rows.iter().zip(&events) {
        assert_eq!(col(row, "time").as_i64().unwrap(), *ts as i64);
        assert_eq!(col(row, "kind"), "near_oom");
        assert_eq!(col(row, "severity"), event.finding.severity.name());
        assert_eq!(col(row, "uuid"), "GPU-findings-0");
        assert_eq!(col(row, "gpu"), "0");
        assert_eq!(col(row, "host"), "itest-node");
        assert_eq!(col(row, "evidence"), event.finding.evidence.as_str());
        assert_eq!(col(row, "advice"), event.finding.advice.as_str());
        let raised = event.transition == Transition::Raised;
        assert_eq!(col(row, "active").as_i64().unwrap(), i64::from(raised));
        match event.held_for {
            Some(held) if !raised => assert_eq!(col(row, "held_for_seconds").as_f64().unwrap(), held.as_secs_f64()),
            _ => assert!(col(row, "held_for_seconds").is_null()),
        }
    }
    // The derived series: one finding_active point per tick the finding held.
    let q =
        format!("SELECT count(\"finding_active\") FROM gpu_diagnosis WHERE run = '{run}' AND \"kind\" = 'near_oom'");
    let body = influxql(&influx_url(), &influx_db(), None, &q).await;
    assert_eq!(body["results"][0]["series"][0]["values"][0][1].as_u64().unwrap() as usize, active_ticks);
    assert!(active_ticks > 0);
}
