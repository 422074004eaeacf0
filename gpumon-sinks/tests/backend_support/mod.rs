//! Shared by the tests against real backends (`#[path]`-included, not a test crate): names
//! unique to one test's data, the HTTP client that reads the backends back, and InfluxQL.
#![allow(dead_code)] // each includer uses its own subset

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value as Json;

/// `{prefix}-{pid}-{nanos}-{n}`: unique across test processes and reruns (a host, a run tag).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A plain client for reading the backends back (with the crypto provider that `tls` needs).
pub fn client() -> reqwest::Client {
    #[cfg(feature = "tls")]
    gpumon_sinks::tls::install_crypto_provider();
    reqwest::Client::new()
}

/// The answer to the InfluxQL query `q` on `db` (epoch nanoseconds), with Basic `auth` if given;
/// panics when InfluxDB is unreachable or the query fails.
pub async fn influxql(url: &str, db: &str, auth: Option<(&str, &str)>, q: &str) -> Json {
    let mut u = reqwest::Url::parse(&format!("{url}/query")).unwrap();
    u.query_pairs_mut().append_pair("db", db).append_pair("epoch", "ns").append_pair("q", q);
    let mut req = client().get(u);
    if let Some((user, pw)) = auth {
        req = req.basic_auth(user, Some(pw));
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("InfluxDB at {url} unreachable: {e}"));
    let status = resp.status();
    let body: Json = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert!(status.is_success(), "query {q} failed: {status} {body}");
    if let Some(err) = body["results"][0].get("error") {
        panic!("query {q} failed: {err}");
    }
    body
}

/// `promtool check metrics` on the exposition `text`: whether it passed, and what it said
/// (stdout, then stderr).
pub fn promtool_check_metrics(promtool: &str, text: &str) -> (bool, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {promtool}: {e}"));
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), report)
}

/// The raw samples of the range selector `selector` from a Prometheus query API (Prometheus' or
/// VictoriaMetrics'): per series, its labels (`__name__` among them) and its (ms, value) points.
pub async fn range_samples(url: &str, selector: &str) -> Vec<(BTreeMap<String, String>, Vec<(i64, f64)>)> {
    let mut u = reqwest::Url::parse(&format!("{url}/api/v1/query")).unwrap();
    u.query_pairs_mut().append_pair("query", selector);
    let j: Json = serde_json::from_str(&client().get(u).send().await.unwrap().text().await.unwrap()).unwrap();
    assert_eq!(j["status"], "success", "{selector}: {j}");
    j["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let labels =
                r["metric"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()));
            let points = r["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| ((p[0].as_f64().unwrap() * 1000.0).round() as i64, p[1].as_str().unwrap().parse().unwrap()))
                .collect();
            (labels.collect(), points)
        })
        .collect()
}
