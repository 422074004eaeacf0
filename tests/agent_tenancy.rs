//! Tenants in the agent's config file: `[[prometheus.tenants]]` and `[[web.tenants]]` reach the
//! sinks (a tenant's credential reads its own view, an unknown one gets 401), and a bad tenant
//! is a configuration error naming the key (exit 2). The mock backend's processes have no
//! owners, so a tenant holds nothing here; `tests/tenancy_e2e.rs` runs real processes.
#![cfg(all(feature = "agent", feature = "prometheus", feature = "web"))]

use std::time::Duration;

mod common;
use common::{agent, agent_process, run};
use gpumon_mock::test_kit::{free_port, Credential, Scrape, TempDir};

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

/// `GET path` with `credential`, the whole answer (retried while nothing listens, 10 s).
fn get(port: u16, path: &str, credential: Option<&str>) -> String {
    let scrape = Scrape::port(port).path(path).credential(credential.map(Credential::bearer));
    scrape.until("the agent to listen", |_| true).raw
}

/// Polls `path` with `credential` until the answer contains `want` (10 s).
fn get_until(port: u16, path: &str, credential: Option<&str>, want: &str) -> String {
    let scrape =
        Scrape::port(port).path(path).credential(credential.map(Credential::bearer)).every(Duration::from_millis(100));
    scrape.until(&format!("{want} on {path}"), |r| r.raw.contains(want)).raw
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
    let _agent = agent_process().arg("--config").arg(&cfg).spawn();

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
