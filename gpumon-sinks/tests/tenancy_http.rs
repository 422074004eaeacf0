//! Tenant-scoped reading over real loopback sockets: the scrape endpoint (Prometheus text and
//! OpenMetrics, native and dcgm names) and the web view (snapshot, history, live stream, page),
//! each with two tenants whose processes hold different GPUs, a GPU they share, a GPU nobody is
//! known to own, the admin credential, and unknown or missing credentials. Needs no external
//! server.
#![cfg(feature = "prometheus-http")]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use gpumon_core::attribution::{Owner, SharedOwner, TenantSelector};
use gpumon_core::{
    DeviceInfo, DeviceSample, Diagnosis, Finding, FindingCount, FindingKind, ProcessSample, Severity, Snapshot,
    SystemInfo,
};
use gpumon_sinks::prometheus::{Auth, Naming, PrometheusSink, TenantConfig};

#[path = "http_support/mod.rs"]
mod http_support;
use http_support::Reply;

const ADMIN: &str = "tok-admin";
const TOKEN_A: &str = "tok-team-a";
const BOB: (&str, &str) = ("bob", "pw-bob");

/// What team-a may see, and what must never reach it: team-b's and nobody's names and GPUs, the
/// host-level finding's text and team-b's run (`FOREIGN_PIDS_A` are checked as `pid` labels and
/// fields, since bare numbers also occur in timestamps). Team-b's lists are the mirror image.
const A_GPUS: [&str; 2] = ["GPU-aaaa", "GPU-cccc"];
const B_GPUS: [&str; 2] = ["GPU-bbbb", "GPU-cccc"];
const NOT_FOR_A: [&str; 9] =
    ["GPU-bbbb", "GPU-dddd", "team-b", "trainer-b", "bob", "python-b", "python-x", "job-of-b", "host-wide"];
const NOT_FOR_B: [&str; 9] =
    ["GPU-aaaa", "GPU-dddd", "team-a", "trainer-a", "alice", "python-a", "python-x", "job-of-b", "host-wide"];
const FOREIGN_PIDS_A: [u32; 3] = [4201, 4202, 4301];
const FOREIGN_PIDS_B: [u32; 4] = [4101, 4102, 4103, 4301];

fn sel(s: &str) -> TenantSelector {
    s.parse().unwrap()
}

fn owner(ns: &str, pod: &str, user: &str, uid: u32) -> SharedOwner {
    let mut o = Owner::default();
    o.namespace = Some(ns.into());
    o.pod = Some(pod.into());
    o.container = Some("main".into());
    o.user = Some(user.into());
    o.uid = Some(uid);
    o.gid = Some(uid);
    Arc::new(o)
}

fn process(pid: u32, name: &str, owner: Option<&SharedOwner>) -> ProcessSample {
    let mut p = ProcessSample::new(pid);
    p.name = Some(name.into());
    p.memory_used = Some(2 << 30);
    p.sm_utilization = Some(0.3);
    p.owner = owner.cloned();
    p
}

fn gpu(index: u32, uuid: &str, processes: Vec<ProcessSample>) -> DeviceSample {
    let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(index, uuid, "NVIDIA H100 80GB HBM3")));
    d.utilization.gpu = Some(0.25 * f64::from(index + 1));
    d.memory.used = Some(8 << 30);
    d.memory.total = Some(80 << 30);
    d.power.usage_watts = Some(300.0);
    d.temperature.gpu = Some(60.0);
    d.clocks.sm = Some(1.5e9);
    for p in &processes {
        if let Some(o) = &p.owner {
            if !d.owners.contains(o) {
                d.owners.push(o.clone());
            }
        }
    }
    d.processes = processes;
    d
}

/// GPU-aaaa: alice's (team-a) process 4101. GPU-bbbb: bob's (team-b) process 4201. GPU-cccc:
/// shared, 4102 (alice) and 4202 (bob). GPU-dddd: process 4301, owner unknown. With findings on
/// every GPU (one on GPU-aaaa naming GPU-bbbb), a host-level one, and a run of team-b.
/// `alice_on_bbbb`: at this tick GPU-bbbb runs alice's 4103 instead of bob's 4201.
fn snapshot(seq: u64, alice_on_bbbb: bool) -> Arc<Snapshot> {
    let a = owner("team-a", "trainer-a", "alice", 1001);
    let b = owner("team-b", "trainer-b", "bob", 1002);
    let mut bbbb = vec![process(4201, "python-b", Some(&b))];
    if alice_on_bbbb {
        bbbb = vec![process(4103, "python-a", Some(&a))];
    }
    let devices = vec![
        gpu(0, "GPU-aaaa", vec![process(4101, "python-a", Some(&a))]),
        gpu(1, "GPU-bbbb", bbbb),
        gpu(2, "GPU-cccc", vec![process(4102, "python-a", Some(&a)), process(4202, "python-b", Some(&b))]),
        gpu(3, "GPU-dddd", vec![process(4301, "python-x", None)]),
    ];
    let mut s = Snapshot::new(Arc::new(SystemInfo::new("node-1", "nvml")), devices)
        .with_seq(seq)
        .with_taken_at(SystemTime::now());
    let since = SystemTime::now();
    let f = |kind, device: Option<(u32, &str)>, evidence: &str| {
        Finding::new(kind, Severity::Warning, device, since, evidence, "advice")
    };
    let mut d = Diagnosis::default();
    d.active = vec![
        f(FindingKind::NearOom, Some((0, "GPU-aaaa")), "memory 97 % used"),
        f(FindingKind::NearOom, Some((1, "GPU-bbbb")), "memory 98 % used"),
        f(FindingKind::IdleAllocated, Some((3, "GPU-dddd")), "1 process attached"),
        f(FindingKind::Imbalance, Some((0, "GPU-aaaa")), "utilisation 2 % while GPU 1 (GPU-bbbb) runs at 90 %"),
        f(FindingKind::HardwareErrors, None, "host-wide trouble"),
    ]
    .into();
    d.raised_total = vec![FindingCount::new(FindingKind::NearOom, 5)].into();
    s.attach(d);
    let mut steps = gpumon_core::steps::Steps::default();
    let mut run = gpumon_core::steps::RunSteps::new("job-of-b", Some(0));
    run.last_step = Some(3);
    steps.runs.push(run);
    s.attach(steps);
    Arc::new(s)
}

fn tenants() -> Vec<TenantConfig> {
    vec![
        TenantConfig::bearer("team-a", TOKEN_A, sel("namespace=team-a")),
        TenantConfig::basic("bob", BOB.0, BOB.1, sel("user=bob")),
    ]
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// One request on a fresh connection, read to the end: the test sees exactly what is sent.
async fn request(addr: SocketAddr, path: &str, headers: &[String]) -> Reply<String> {
    http_support::request(addr, "GET", path, headers).await.into_text()
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

fn auth(value: String) -> String {
    format!("Authorization: {value}")
}

const OPENMETRICS: &str = "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";

/// The GPU of every series line of an exposition (by `uuid_label`), and the series lines that
/// have none (self-metrics, host-level series).
fn series_gpus(body: &str, uuid_label: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut gpus = BTreeSet::new();
    let mut other = Vec::new();
    let needle = format!("{uuid_label}=\"");
    for line in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        match line.find(&needle) {
            Some(i) => {
                let rest = &line[i + needle.len()..];
                gpus.insert(rest[..rest.find('"').unwrap()].to_owned());
            }
            None => other.push(line.to_owned()),
        }
    }
    (gpus, other)
}

fn assert_nothing_of(body: &str, forbidden: &[&str], pids: &[u32], who: &str) {
    for token in forbidden {
        assert!(!body.contains(token), "{who}'s view names `{token}`:\n{body}");
    }
    for pid in pids {
        for form in [format!("pid=\"{pid}\""), format!("\"pid\":{pid}")] {
            assert!(!body.contains(&form), "{who}'s view has {form}:\n{body}");
        }
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scrape_credential_sees_exactly_its_gpus_in_every_series_and_format() {
    let mut builder = PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0)).with_auth(Auth::bearer(ADMIN));
    for t in tenants() {
        builder = builder.with_tenant(t);
    }
    let sink = builder.build().unwrap();
    let addr = sink.local_addr().unwrap();
    sink.handle().store(snapshot(1, false));

    let a_cred = bearer(TOKEN_A);
    let b_cred = auth(basic(BOB.0, BOB.1));
    // Interleaved, twice, on the same endpoint: no reader is ever served another's rendering.
    for _round in 0..2 {
        for accept in [None, Some(OPENMETRICS)] {
            let with = |cred: &String| -> Vec<String> {
                let mut h = vec![cred.clone()];
                h.extend(accept.map(str::to_owned));
                h
            };
            for (cred, gpus, forbidden, foreign, pids, who) in [
                (&a_cred, A_GPUS, NOT_FOR_A, &FOREIGN_PIDS_A[..], ["pid=\"4101\"", "pid=\"4102\""], "team-a"),
                (&b_cred, B_GPUS, NOT_FOR_B, &FOREIGN_PIDS_B[..], ["pid=\"4201\"", "pid=\"4202\""], "bob"),
            ] {
                let r = request(addr, "/metrics", &with(cred)).await;
                assert_eq!(r.status, 200, "{who}: {}", r.body);
                assert_eq!(r.body.ends_with("# EOF\n"), accept.is_some(), "{who}");
                let (seen, other) = series_gpus(&r.body, "uuid");
                assert_eq!(seen, set(&gpus), "{who}: GPUs of the series");
                for pid in pids {
                    assert!(r.body.contains(pid), "{who}: own process {pid} missing:\n{}", r.body);
                }
                // Every device family has both of the tenant's GPUs, and nothing else.
                let util: Vec<&str> = r.body.lines().filter(|l| l.starts_with("gpumon_utilization_ratio{")).collect();
                assert_eq!(util.len(), 2, "{who}: {util:?}");
                // The series without a GPU are the agent's own (no host-level finding, no run).
                assert!(other.iter().all(|l| l.starts_with("gpumon_last_sample_")), "{who}: {other:?}");
                assert_nothing_of(&r.body, &forbidden, foreign, who);
            }
            // The admin still reads everything.
            let r = request(addr, "/metrics", &with(&bearer(ADMIN))).await;
            assert_eq!(r.status, 200);
            let (seen, _) = series_gpus(&r.body, "uuid");
            assert_eq!(seen, set(&["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]));
            for token in ["pid=\"4101\"", "pid=\"4201\"", "pid=\"4301\"", "job-of-b", "kind=\"hardware_errors\""] {
                assert!(r.body.contains(token), "admin: {token} missing:\n{}", r.body);
            }
        }
    }

    // The findings a tenant gets: its own GPUs', without the one that names the other's GPU.
    let r = request(addr, "/metrics", std::slice::from_ref(&a_cred)).await;
    let findings: Vec<&str> = r.body.lines().filter(|l| l.starts_with("gpumon_finding_active{")).collect();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert!(findings[0].contains("uuid=\"GPU-aaaa\"") && findings[0].contains("near_oom"), "{findings:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcgm_names_are_scoped_the_same() {
    let mut builder = PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0)).naming(Naming::Dcgm);
    for t in tenants() {
        builder = builder.with_tenant(t);
    }
    let sink = builder.build().unwrap();
    let addr = sink.local_addr().unwrap();
    sink.handle().store(snapshot(1, false));
    let r = request(addr, "/metrics", &[bearer(TOKEN_A)]).await;
    assert_eq!(r.status, 200);
    let (seen, _) = series_gpus(&r.body, "UUID");
    assert_eq!(seen, set(&A_GPUS));
    assert!(r.body.contains("DCGM_FI_DEV_GPU_UTIL{"), "{}", r.body);
    assert_nothing_of(&r.body, &NOT_FOR_A, &FOREIGN_PIDS_A, "team-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_or_missing_credentials_get_401_and_probes_stay_open() {
    // Tenants without an admin credential: nobody reads anonymously.
    let mut builder = PrometheusSink::builder().with_http_listener(([127, 0, 0, 1], 0));
    for t in tenants() {
        builder = builder.with_tenant(t);
    }
    let sink = builder.build().unwrap();
    let addr = sink.local_addr().unwrap();
    sink.handle().store(snapshot(1, false));
    let denied = [
        vec![],
        vec![bearer("tok-unknown")],
        vec![bearer(&format!("{TOKEN_A}x"))],
        vec![auth(basic(BOB.0, "wrong"))],
        vec![auth(basic("alice", BOB.1))],
        vec![format!("Authorization: Basic {TOKEN_A}")],
        vec![format!("Authorization: {TOKEN_A}")],
    ];
    for headers in denied {
        let r = request(addr, "/metrics", &headers).await;
        assert_eq!(r.status, 401, "{headers:?}: {}", r.body);
        assert_eq!(
            r.headers("www-authenticate"),
            ["Basic realm=\"gpumon\", charset=\"UTF-8\"", "Bearer realm=\"gpumon\""],
            "{headers:?}"
        );
        assert_eq!(r.body, "unauthorized\n");
    }
    for probe in ["/health", "/live"] {
        assert_eq!(request(addr, probe, &[]).await.status, 200, "{probe}");
    }
    assert_eq!(request(addr, "/metrics", &[bearer(TOKEN_A)]).await.status, 200);
}

#[test]
fn bad_tenant_config_is_a_build_error_naming_the_key() {
    let e = PrometheusSink::builder()
        .with_http_listener(([127, 0, 0, 1], 0))
        .with_tenant(TenantConfig::bearer("a", "same", sel("namespace=a")))
        .with_tenant(TenantConfig::bearer("b", "same", sel("namespace=b")))
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("prometheus.tenants[1].bearer"), "{e}");
    let e = PrometheusSink::builder()
        .with_tenant(TenantConfig::bearer("a", "t", sel("namespace=a")))
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("prometheus.tenants") && e.contains("with_http_listener"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// The web view

#[cfg(feature = "web")]
mod web {
    use gpumon_sinks::web::{WebConfig, WebSink};
    use serde_json::Value;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    use super::http_support::read_until;
    use super::*;

    fn sink() -> WebSink {
        let mut config = WebConfig::default();
        config.listen = Some("127.0.0.1:0".parse().unwrap());
        config.auth = Some(Auth::bearer(ADMIN));
        config.tenants = tenants();
        WebSink::from_config(&config).unwrap()
    }

    fn uuids(snapshot: &Value) -> Vec<String> {
        snapshot["devices"].as_array().unwrap().iter().map(|d| d["info"]["uuid"].as_str().unwrap().to_owned()).collect()
    }

    fn pids(snapshot: &Value) -> BTreeSet<u64> {
        snapshot["devices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| d["processes"].as_array().unwrap().iter().map(|p| p["pid"].as_u64().unwrap()))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn snapshot_and_history_are_the_tenants_own() {
        let sink = sink();
        let h = sink.handle();
        let addr = sink.local_addr().unwrap();
        // Tick 1: alice also runs on GPU-bbbb; tick 2: GPU-bbbb is bob's.
        h.publish(snapshot(1, true));
        h.publish(snapshot(2, false));

        let a = [bearer(TOKEN_A)];
        let b = [auth(basic(BOB.0, BOB.1))];
        let r = request(addr, "/api/snapshot", &a).await;
        assert_eq!(r.status, 200);
        let snap: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(uuids(&snap), A_GPUS);
        assert_eq!(pids(&snap), [4101, 4102].into());
        // Owner records are there, and only a's.
        assert!(r.body.contains("\"namespace\":\"team-a\""), "{}", r.body);
        assert_nothing_of(&r.body, &NOT_FOR_A, &FOREIGN_PIDS_A, "team-a");
        assert!(snap.get("steps").is_none());

        let r = request(addr, "/api/snapshot", &b).await;
        let snap: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(uuids(&snap), B_GPUS);
        assert_eq!(pids(&snap), [4201, 4202].into());
        assert_nothing_of(&r.body, &NOT_FOR_B, &FOREIGN_PIDS_B, "bob");

        let r = request(addr, "/api/snapshot", &[bearer(ADMIN)]).await;
        let snap: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(uuids(&snap).len(), 4);

        // History: at each tick, the GPUs the tenant held then.
        let history = |body: &str| -> Vec<Vec<String>> {
            let v: Value = serde_json::from_str(body).unwrap();
            v["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["gpus"].as_object().unwrap().keys().cloned().collect())
                .collect()
        };
        let r = request(addr, "/api/history?seconds=1000000", &a).await;
        assert_eq!(r.status, 200);
        assert_eq!(history(&r.body), [vec!["GPU-aaaa", "GPU-bbbb", "GPU-cccc"], vec!["GPU-aaaa", "GPU-cccc"]]);
        let r = request(addr, "/api/history?seconds=1000000", &b).await;
        assert_eq!(history(&r.body), [vec!["GPU-cccc"], vec!["GPU-bbbb", "GPU-cccc"]]);
        let r = request(addr, "/api/history?seconds=1000000", &[bearer(ADMIN)]).await;
        assert!(history(&r.body).iter().all(|p| p.len() == 4));

        // The page itself is served to a tenant (it carries no data of its own).
        let r = request(addr, "/", &b).await;
        assert_eq!(r.status, 200);
        assert!(r.body.contains("<html"), "{}", r.body);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_web_path_wants_a_known_credential() {
        let sink = sink();
        let addr = sink.local_addr().unwrap();
        sink.handle().publish(snapshot(1, false));
        for path in ["/", "/app.js", "/api/snapshot", "/api/history", "/api/stream"] {
            for headers in [vec![], vec![bearer("nope")], vec![auth(basic(BOB.0, "nope"))]] {
                let r = request(addr, path, &headers).await;
                assert_eq!(r.status, 401, "{path} {headers:?}");
                assert_eq!(r.headers("www-authenticate").len(), 2, "{path}");
                assert!(!r.body.contains("GPU-"), "{path}");
            }
        }
    }

    /// Opens `/api/stream` with `credential` and returns the connection.
    async fn stream(addr: SocketAddr, credential: &str) -> TcpStream {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET /api/stream HTTP/1.1\r\nHost: {addr}\r\n{credential}\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        s
    }

    /// The snapshots of the events seen so far.
    fn events(seen: &str) -> Vec<Value> {
        seen.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str::<Value>(d).unwrap()["snapshot"].clone())
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live_streams_carry_each_readers_own_view() {
        let sink = sink();
        let h = sink.handle();
        let addr = sink.local_addr().unwrap();
        h.publish(snapshot(1, false));
        let readers = [
            (bearer(TOKEN_A), Some((A_GPUS, &NOT_FOR_A[..], &FOREIGN_PIDS_A[..])), "team-a"),
            (auth(basic(BOB.0, BOB.1)), Some((B_GPUS, &NOT_FOR_B[..], &FOREIGN_PIDS_B[..])), "bob"),
            (bearer(ADMIN), None, "admin"),
        ];
        let mut conns = Vec::new();
        for (cred, _, who) in &readers {
            let mut s = stream(addr, cred).await;
            let mut seen = String::new();
            read_until(&mut s, &mut seen, "\"seq\":1,").await;
            assert!(seen.starts_with("HTTP/1.1 200"), "{who}: {seen}");
            conns.push((s, seen));
        }
        // Two more ticks, each rendered per reader.
        for seq in 2..=3 {
            h.publish(snapshot(seq, false));
            for (s, seen) in &mut conns {
                read_until(s, seen, &format!("\"seq\":{seq},")).await;
            }
        }
        for ((_, seen), (_, expect, who)) in conns.iter().zip(&readers) {
            let snaps = events(seen);
            assert_eq!(snaps.len(), 3, "{who}");
            for snap in &snaps {
                match expect {
                    Some((gpus, ..)) => assert_eq!(uuids(snap), gpus, "{who}"),
                    None => assert_eq!(uuids(snap).len(), 4, "{who}"),
                }
            }
            if let Some((_, forbidden, pids)) = expect {
                assert_nothing_of(seen, forbidden, pids, who);
            }
        }
        assert_eq!(h.live_clients(), 3);
    }

    /// Opens up to `tries` live streams with `credential`: the open ones, and the `503` answers'
    /// bodies.
    async fn open_streams(addr: SocketAddr, credential: &str, tries: usize) -> (Vec<TcpStream>, Vec<String>) {
        let (mut open, mut refused) = (Vec::new(), Vec::new());
        for _ in 0..tries {
            let mut s = stream(addr, credential).await;
            let mut seen = String::new();
            read_until(&mut s, &mut seen, "\r\n\r\n").await;
            if seen.starts_with("HTTP/1.1 200") {
                open.push(s);
            } else {
                assert!(seen.starts_with("HTTP/1.1 503"), "{seen}");
                read_until(&mut s, &mut seen, "clients").await;
                refused.push(seen);
            }
        }
        (open, refused)
    }

    /// The case: alice (team-a) opens as many live streams as the view allows (128 by
    /// default); bob and the admin still get theirs. Shares: a quarter of the slots is the
    /// admin's, each of the two tenants holds half of the rest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenant_cannot_take_every_live_stream() {
        let sink = sink();
        let h = sink.handle();
        let addr = sink.local_addr().unwrap();
        h.publish(snapshot(1, false));
        let max = WebConfig::default().max_clients;
        let (alice, refused) = open_streams(addr, &bearer(TOKEN_A), max).await;
        let share = (max - max / 4) / 2;
        assert_eq!(alice.len(), share, "alice holds her share");
        assert!(refused.iter().all(|r| r.contains("for this credential")), "{}", refused[0]);

        let (bob, _) = open_streams(addr, &auth(basic(BOB.0, BOB.1)), max).await;
        assert_eq!(bob.len(), share, "bob gets his share while alice holds hers");
        let (admin, refused) = open_streams(addr, &bearer(ADMIN), max).await;
        assert_eq!(admin.len(), max - 2 * share, "the admin gets the rest");
        assert!(refused[0].contains("too many live clients ("), "{}", refused[0]);
        assert_eq!(h.live_clients(), max);

        // Every open stream is live: the next tick reaches each.
        h.publish(snapshot(2, false));
        for mut s in alice.into_iter().chain(bob).chain(admin).step_by(16) {
            let mut seen = String::new();
            read_until(&mut s, &mut seen, "\"seq\":2,").await;
        }
    }
}
