//! The per-tenant PromQL of `docs/tenant-queries.md`, and the dashboard's Tenants row, on a real
//! Prometheus: two agents (native and dcgm names) serve a fleet whose GPUs and processes have
//! owners set by hand, Prometheus scrapes both, and every documented query must return exactly
//! the sums this file expects — no more series, no fewer, no other values.
//!
//! The fleet (one host; memory in GiB; every value a binary fraction, so sums are exact):
//!
//! | GPU | owners (namespace/pod/container) | util | memory | processes: pid owner user memory SM |
//! |---|---|---|---|---|
//! | 0 | team-a/train-0/trainer | 0.5 | 10 | 1001 same alice 8 0.375; 1002 same alice 1 0.125 |
//! | 1 | team-a/train-1/trainer | 0.25 | 20 | 1101 same alice 20 0.25 |
//! | 2 | team-b/infer-0/server | 0.75 | 30 | 2201 same bob 30 0.75 |
//! | 3 | — | 0 | 0 | — |
//! | 4 | team-a/notebook-0/jupyter + team-b/infer-1/server | 1 | 12 | 4101 team-a/notebook-0/jupyter carol 4 0.25; 4201 team-b/infer-1/server bob 8 0.5 |
//!
//! `#[ignore]`d: `scripts/test.sh` runs it (`--include-ignored`, with Prometheus installed).
#![cfg(feature = "prometheus")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumon::core::attribution::Owner;
use gpumon::core::{
    Agent, AgentHandle, DeviceInfo, DeviceSample, ProcessSample, SampleError, SampleRequest, Sampler, Snapshot,
    SystemInfo,
};
use gpumon::sinks::prometheus::{Naming, PrometheusConfig, PrometheusSink};
use gpumon_mock::test_env::require_env;
use gpumon_mock::test_kit::{free_port, KillOnDrop, TempDir};
use serde_json::Value as Json;

const GIB: u64 = 1 << 30;
const HOST: &str = "tenant-node";

fn owner(namespace: &str, pod: &str, container: &str, user: Option<&str>) -> Arc<Owner> {
    let mut o = Owner::default();
    o.namespace = Some(namespace.into());
    o.pod = Some(pod.into());
    o.container = Some(container.into());
    o.user = user.map(Into::into);
    Arc::new(o)
}

/// (pid, owner, memory GiB, SM utilisation).
type Proc = (u32, Arc<Owner>, u64, f64);

fn gpu(index: u32, util: f64, memory_gib: u64, owners: Vec<Arc<Owner>>, procs: Vec<Proc>) -> DeviceSample {
    let info = DeviceInfo::new(index, format!("GPU-{index:08}-0000-0000-0000-000000000000"), "NVIDIA H100 80GB HBM3");
    let mut d = DeviceSample::new(Arc::new(info));
    d.utilization.gpu = Some(util);
    d.memory.used = Some(memory_gib * GIB);
    d.memory.total = Some(80 * GIB);
    d.owners = owners;
    d.processes = procs
        .into_iter()
        .map(|(pid, owner, mem, sm)| {
            let mut p = ProcessSample::new(pid);
            p.name = Some("python3".into());
            p.memory_used = Some(mem * GIB);
            p.sm_utilization = Some(sm);
            p.owner = Some(owner);
            p
        })
        .collect();
    d
}

/// The fleet of the module docs.
fn tenant_snapshot() -> Snapshot {
    let trainer0 = owner("team-a", "train-0", "trainer", None);
    let trainer1 = owner("team-a", "train-1", "trainer", None);
    let server0 = owner("team-b", "infer-0", "server", None);
    let notebook = owner("team-a", "notebook-0", "jupyter", None);
    let server1 = owner("team-b", "infer-1", "server", None);
    // A process's owner adds its Unix user to what the kubelet says about its pod.
    let with_user = |o: &Arc<Owner>, user: &str| {
        let mut o = (**o).clone();
        o.user = Some(user.into());
        Arc::new(o)
    };
    let devices = vec![
        gpu(
            0,
            0.5,
            10,
            vec![trainer0.clone()],
            vec![(1001, with_user(&trainer0, "alice"), 8, 0.375), (1002, with_user(&trainer0, "alice"), 1, 0.125)],
        ),
        gpu(1, 0.25, 20, vec![trainer1.clone()], vec![(1101, with_user(&trainer1, "alice"), 20, 0.25)]),
        gpu(2, 0.75, 30, vec![server0.clone()], vec![(2201, with_user(&server0, "bob"), 30, 0.75)]),
        gpu(3, 0.0, 0, vec![], vec![]),
        gpu(
            4,
            1.0,
            12,
            vec![notebook.clone(), server1.clone()],
            vec![(4101, with_user(&notebook, "carol"), 4, 0.25), (4201, with_user(&server1, "bob"), 8, 0.5)],
        ),
    ];
    Snapshot::new(Arc::new(SystemInfo::new(HOST, "test")), devices)
}

struct TenantSampler;

impl Sampler for TenantSampler {
    fn name(&self) -> &str {
        "tenants"
    }
    fn sample(&self, _request: &SampleRequest) -> Result<Snapshot, SampleError> {
        Ok(tenant_snapshot())
    }
}

/// A row of a query's expected result: its labels and its value.
type Row = (Vec<(&'static str, &'static str)>, f64);

/// Every query of docs/tenant-queries.md with its exact result on [`tenant_snapshot`].
fn documented_queries() -> Vec<(&'static str, Vec<Row>)> {
    let gib = GIB as f64;
    let ns = |n: &'static str, v: f64| (vec![("namespace", n)], v);
    vec![
        (
            r#"sum by (namespace) (gpumon_utilization_ratio{namespace!=""})"#,
            vec![ns("team-a", 0.75), ns("team-b", 0.75), ns("(shared)", 1.0)],
        ),
        (
            r#"count by (namespace) (gpumon_up{namespace!=""} == 1)"#,
            vec![ns("team-a", 2.0), ns("team-b", 1.0), ns("(shared)", 1.0)],
        ),
        (r#"count(gpumon_up{namespace=""} == 1)"#, vec![(vec![], 1.0)]),
        (
            r#"sum by (namespace) (gpumon_memory_used_bytes{namespace!=""})"#,
            vec![ns("team-a", 30.0 * gib), ns("team-b", 30.0 * gib), ns("(shared)", 12.0 * gib)],
        ),
        (
            r#"sum by (namespace, pod, container) (gpumon_process_memory_used_bytes{container!=""})"#,
            memory_by_container(),
        ),
        (
            r#"sum by (namespace) (gpumon_process_memory_used_bytes{namespace!=""})"#,
            vec![ns("team-a", 33.0 * gib), ns("team-b", 38.0 * gib)],
        ),
        (
            r#"sum by (namespace) (gpumon_process_sm_utilization_ratio{namespace!=""})"#,
            vec![ns("team-a", 1.0), ns("team-b", 1.25)],
        ),
        (
            r#"sum by (user) (gpumon_process_memory_used_bytes{user!=""})"#,
            vec![
                (vec![("user", "alice")], 29.0 * gib),
                (vec![("user", "bob")], 38.0 * gib),
                (vec![("user", "carol")], 4.0 * gib),
            ],
        ),
        (
            r#"24 * sum by (namespace) (avg_over_time(gpumon_utilization_ratio{namespace!=""}[1d]))"#,
            vec![ns("team-a", 18.0), ns("team-b", 18.0), ns("(shared)", 24.0)],
        ),
        (
            r#"sum by (namespace) (DCGM_FI_DEV_GPU_UTIL{namespace!=""}) / 100"#,
            vec![ns("team-a", 0.75), ns("team-b", 0.75), ns("(shared)", 1.0)],
        ),
    ]
}

fn memory_by_container() -> Vec<Row> {
    let gib = GIB as f64;
    let c = |n: &'static str, p: &'static str, ctr: &'static str, v: f64| {
        (vec![("namespace", n), ("pod", p), ("container", ctr)], v * gib)
    };
    vec![
        c("team-a", "train-0", "trainer", 9.0),
        c("team-a", "train-1", "trainer", 20.0),
        c("team-a", "notebook-0", "jupyter", 4.0),
        c("team-b", "infer-0", "server", 30.0),
        c("team-b", "infer-1", "server", 8.0),
    ]
}

/// The dashboard's Tenants row, by panel title.
fn dashboard_panels() -> Vec<(&'static str, Vec<Row>)> {
    vec![
        (
            "GPU use by namespace",
            vec![
                (vec![("namespace", "team-a")], 0.75),
                (vec![("namespace", "team-b")], 0.75),
                (vec![("namespace", "(shared)")], 1.0),
            ],
        ),
        ("Memory by container", memory_by_container()),
    ]
}

/// The ```promql blocks of docs/tenant-queries.md, each joined into one line.
fn promql_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim()) {
            (None, "```promql") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join(" "));
                current = None;
            }
            (Some(lines), l) => lines.push(l),
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "unterminated ```promql block");
    blocks
}

fn repo_file(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_documented_query_has_an_expected_result_here() {
    let documented = promql_blocks(&repo_file("docs/tenant-queries.md"));
    let expected: Vec<String> = documented_queries().into_iter().map(|(q, _)| q.to_owned()).collect();
    assert_eq!(documented, expected, "docs/tenant-queries.md and this test must list the same queries, in order");
    let dashboard: Json = serde_json::from_str(&repo_file("dashboards/prometheus-native.json")).unwrap();
    for (title, _) in dashboard_panels() {
        assert_eq!(panel_exprs(&dashboard, title).len(), 1, "dashboard panel `{title}`: one query");
    }
}

/// The expressions of the dashboard panel titled `title`.
fn panel_exprs(dashboard: &Json, title: &str) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["title"] == title)
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect()
}

struct Served {
    agent: AgentHandle,
    addr: std::net::SocketAddr,
}

fn serve(naming: Naming) -> Served {
    let mut config = PrometheusConfig::default();
    config.listen = Some("127.0.0.1:0".parse().unwrap());
    config.naming = naming;
    let sink = PrometheusSink::from_config(&config).unwrap();
    let addr = sink.local_addr().unwrap();
    let agent = Agent::builder(TenantSampler).interval(Duration::from_millis(250)).sink(sink).spawn().unwrap();
    Served { agent, addr }
}

async fn query(http: &reqwest::Client, base: &str, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let url = reqwest::Url::parse_with_params(&format!("{base}/api/v1/query"), &[("query", q)]).unwrap();
    let body = http.get(url).send().await.unwrap().text().await.unwrap();
    let v: Json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: {e}: {body}"));
    assert_eq!(v["status"], "success", "Prometheus rejected {q}: {body}");
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            (labels, r["value"][1].as_str().unwrap().parse().unwrap())
        })
        .collect()
}

/// `got` is exactly `want`: the same label sets, each with the same value.
fn assert_rows(what: &str, got: &[(BTreeMap<String, String>, f64)], want: &[Row]) {
    let got: BTreeMap<BTreeSet<(String, String)>, f64> =
        got.iter().map(|(l, v)| (l.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), *v)).collect();
    let want: BTreeMap<BTreeSet<(String, String)>, f64> =
        want.iter().map(|(l, v)| (l.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), *v)).collect();
    assert_eq!(got, want, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs scripts/test.sh (Prometheus)"]
async fn documented_tenant_queries_return_the_expected_sums() {
    let prometheus = require_env("GPUMON_TEST_PROMETHEUS_BIN");
    let native = serve(Naming::Native);
    let dcgm = serve(Naming::Dcgm);

    // Two jobs; the dcgm target keeps only its DCGM_* families, because the per-process families
    // keep their native names in dcgm naming and would otherwise be counted twice.
    let temp = TempDir::new("tenant-promql");
    let dir = temp.path();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
         - job_name: native\n    static_configs:\n      - targets: ['{}']\n  \
         - job_name: dcgm\n    static_configs:\n      - targets: ['{}']\n    \
         metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: 'DCGM_.*'\n        action: keep\n",
        native.addr, dcgm.addr
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let prometheus_process = KillOnDrop(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {prometheus}: {e}")),
    );
    #[cfg(feature = "tls")]
    gpumon::sinks::tls::install_crypto_provider();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let base = format!("http://127.0.0.1:{port}");

    // Both targets scraped, with the owned series in (the first scrape comes 5-6 s after ready).
    let started = Instant::now();
    loop {
        let ready = http.get(format!("{base}/-/ready")).send().await.is_ok_and(|r| r.status() == 200);
        if ready
            && query(&http, &base, "up == 1").await.len() == 2
            && !query(&http, &base, r#"gpumon_process_memory_used_bytes{namespace!=""}"#).await.is_empty()
            && !query(&http, &base, r#"DCGM_FI_DEV_GPU_UTIL{namespace!=""}"#).await.is_empty()
        {
            break;
        }
        let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
        assert!(started.elapsed() < Duration::from_secs(45), "targets not scraped with owner labels in 45 s:\n{log}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    for (q, want) in documented_queries() {
        assert_rows(q, &query(&http, &base, q).await, &want);
    }
    let dashboard: Json = serde_json::from_str(&repo_file("dashboards/prometheus-native.json")).unwrap();
    for (title, want) in dashboard_panels() {
        let exprs = panel_exprs(&dashboard, title);
        assert_eq!(exprs.len(), 1, "dashboard panel `{title}`");
        let q = exprs[0].replace("$host", ".*").replace("$gpu", ".*");
        assert_rows(&format!("dashboard panel `{title}`: {q}"), &query(&http, &base, &q).await, &want);
    }

    native.agent.shutdown(Duration::from_secs(5)).await.unwrap();
    dcgm.agent.shutdown(Duration::from_secs(5)).await.unwrap();
    drop((prometheus_process, temp));
}
