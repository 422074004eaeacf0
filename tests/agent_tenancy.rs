//! Tenants in the agent's config file: `[[prometheus.tenants]]` and `[[web.tenants]]` reach the
//! sinks (a tenant's credential reads its own view, an unknown one gets 401), and a bad tenant
//! is a configuration error naming the key (exit 2). The mock backend's processes have no
//! owners, so a tenant holds nothing here; `tests/tenancy_e2e.rs` runs real processes.
#![cfg(all(feature = "agent", feature = "prometheus", feature = "web"))]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{agent, free_port, run};

struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gpumon-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Kills the agent when the test ends, also on a failed assertion.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config_error(toml: &str) -> String {
    let dir = TempDir::new("tenancy-bad");
    let cfg = dir.file("agent.toml", toml);
    let (code, _, stderr) = run(agent().args(["--once", "--backend", "mock"]).arg("--config").arg(&cfg));
    assert_eq!(code, 2, "{stderr}");
    stderr
}

#[test]
fn a_bad_tenant_is_a_configuration_error_naming_the_key() {
    let port = free_port();
    let e = config_error(&format!(
        "[prometheus]\nlisten = \"127.0.0.1:{port}\"\n\
         [[prometheus.tenants]]\nname = \"a\"\nselector = {{ namespace = \"a\" }}\nbearer = \"same\"\n\
         [[prometheus.tenants]]\nname = \"b\"\nselector = {{ namespace = \"b\" }}\nbearer = \"same\"\n"
    ));
    assert!(e.contains("prometheus.tenants[1].bearer"), "{e}");
    let e = config_error(
        "[[web.tenants]]\nname = \"a\"\nselector = { namespace = \"a\" }\ntoken_file = \"/nonexistent/gpumon-tok\"\n",
    );
    assert!(e.contains("web.tenants[0].token_file"), "{e}");
    let e = config_error("[[web.tenants]]\nname = \"a\"\nselector = { namespace = \"a\" }\n");
    assert!(e.contains("web.tenants[0]") && e.contains("exactly one credential"), "{e}");
    // A selector error comes from parsing the file: the message shows the line and the reason.
    let e = config_error("[[prometheus.tenants]]\nname = \"a\"\nselector = { group = \"gpu\" }\nbearer = \"t\"\n");
    assert!(e.contains("selector") && e.contains("numeric gid"), "{e}");
}

fn get(port: u16, path: &str, credential: Option<&str>) -> String {
    let started = Instant::now();
    loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut s) => {
                let header = credential.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
                write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n").unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).unwrap();
                return out;
            }
            Err(_) if started.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("agent never listened on {port}: {e}"),
        }
    }
}

/// Polls `path` with `credential` until the answer contains `want` (10 s).
fn get_until(port: u16, path: &str, credential: Option<&str>, want: &str) -> String {
    let started = Instant::now();
    loop {
        let r = get(port, path, credential);
        if r.contains(want) {
            return r;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no {want} on {path}:\n{r}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tenants_from_the_config_file_guard_the_scrape_endpoint_and_the_web_view() {
    let (prom, web) = (free_port(), free_port());
    let dir = TempDir::new("tenancy-agent");
    let token_file = dir.file("team-b.token", "tok-b\n");
    let tenants = |section: &str| {
        format!(
            "[[{section}.tenants]]\nname = \"team-a\"\nselector = {{ namespace = \"team-a\" }}\nbearer = \"tok-a\"\n\
             [[{section}.tenants]]\nname = \"team-b\"\nselector = \"user=1002\"\ntoken_file = \"{}\"\n",
            token_file.display()
        )
    };
    let cfg = dir.file(
        "agent.toml",
        &format!(
            "[agent]\nbackend = \"mock\"\ninterval = \"200ms\"\nenable = [\"processes\"]\n\
             [prometheus]\nlisten = \"127.0.0.1:{prom}\"\nauth = {{ bearer = {{ token = \"tok-admin\" }} }}\n{}\
             [web]\nlisten = \"127.0.0.1:{web}\"\nauth = {{ bearer = {{ token = \"tok-admin\" }} }}\n{}",
            tenants("prometheus"),
            tenants("web")
        ),
    );
    let _agent =
        Running(agent().arg("--config").arg(&cfg).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());

    let admin = get_until(prom, "/metrics", Some("tok-admin"), "gpumon_utilization_ratio{");
    assert!(admin.contains("pid=\""), "the mock's processes are there for the admin:\n{admin}");
    for token in ["tok-a", "tok-b"] {
        let r = get(prom, "/metrics", Some(token));
        assert!(r.starts_with("HTTP/1.1 200"), "{token}: {r}");
        // Nobody is known to own the mock's processes: the tenant holds no GPU.
        assert!(!r.contains("uuid=\"") && !r.contains("pid=\""), "{token}: {r}");
        assert!(r.contains("gpumon_last_sample_success"), "{token}: {r}");
    }
    for credential in [None, Some("tok-c")] {
        let r = get(prom, "/metrics", credential);
        assert!(r.starts_with("HTTP/1.1 401"), "{credential:?}: {r}");
    }

    let admin = get_until(web, "/api/snapshot", Some("tok-admin"), "\"devices\":[{");
    assert!(admin.starts_with("HTTP/1.1 200"), "{admin}");
    let r = get(web, "/api/snapshot", Some("tok-b"));
    assert!(r.starts_with("HTTP/1.1 200") && r.contains("\"devices\":[]"), "{r}");
    let r = get(web, "/api/snapshot", Some("tok-c"));
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
}
