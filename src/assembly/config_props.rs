//! Property tests of the config loader: documents built from the real keys with hostile values,
//! and arbitrary text, parse to a config or to an error naming the key — never a panic. Cases:
//! 64 unless `PROPTEST_CASES` is set.

use proptest::prelude::*;

use super::AgentConfig as FileConfig;

/// `(section, key)` for every key the agent reads (sinks' nested tables included): the key
/// reference, checked against the schema by [`the_key_reference_lists_every_key_of_the_schema`]
/// (with every sink compiled in).
const KEYS: &[(&str, &str)] = &[
    ("agent", "shutdown_timeout"),
    ("agent", "export_timeout"),
    ("agent", "sink_queue"),
    ("agent", "only"),
    ("agent", "disable"),
    ("agent", "enable"),
    ("agent", "devices"),
    ("agent", "sample_timeout"),
    ("agent", "interval"),
    ("agent", "backend"),
    ("mock", "seed"),
    ("mock", "scenario"),
    ("mock", "profile"),
    ("nvml", "wake_suspended"),
    ("nvml", "sysfs_root"),
    ("nvml", "library"),
    ("record", "file"),
    ("replay", "speed"),
    ("replay", "file"),
    ("stdout", "enabled"),
    ("stdout", "format"),
    ("prometheus", "max_headers"),
    ("prometheus", "max_header_bytes"),
    ("prometheus", "connection_timeout"),
    ("prometheus", "header_read_timeout"),
    ("prometheus", "max_connections"),
    ("prometheus", "listen"),
    ("prometheus", "stale_after"),
    ("prometheus", "openmetrics"),
    ("prometheus", "dcgm_lowercase_hostname"),
    ("prometheus", "host_label"),
    ("prometheus", "tenants"),
    ("prometheus", "auth"),
    ("prometheus", "naming"),
    ("prometheus.tls", "key"),
    ("prometheus.tls", "cert"),
    ("pushgateway", "delete_on_shutdown"),
    ("pushgateway", "host_label"),
    ("pushgateway", "timeout"),
    ("pushgateway", "naming"),
    ("pushgateway", "password"),
    ("pushgateway", "username"),
    ("pushgateway", "grouping"),
    ("pushgateway", "job"),
    ("pushgateway", "url"),
    ("pushgateway.tls", "insecure_skip_verify"),
    ("pushgateway.tls", "client_key_file"),
    ("pushgateway.tls", "client_cert_file"),
    ("pushgateway.tls", "ca_file"),
    ("influxdb", "retry_max"),
    ("influxdb", "retry_initial"),
    ("influxdb", "tags"),
    ("influxdb", "measurement"),
    ("influxdb", "spill_dir"),
    ("influxdb", "buffer_max_bytes"),
    ("influxdb", "buffer_max_points"),
    ("influxdb", "timeout"),
    ("influxdb", "batch_interval"),
    ("influxdb", "batch_points"),
    ("influxdb", "gzip"),
    ("influxdb", "token"),
    ("influxdb", "bucket"),
    ("influxdb", "org"),
    ("influxdb", "password"),
    ("influxdb", "username"),
    ("influxdb", "rp"),
    ("influxdb", "db"),
    ("influxdb", "api"),
    ("influxdb", "url"),
    ("influxdb.tls", "insecure_skip_verify"),
    ("influxdb.tls", "client_key_file"),
    ("influxdb.tls", "client_cert_file"),
    ("influxdb.tls", "ca_file"),
    ("remote_write", "retry_max"),
    ("remote_write", "retry_initial"),
    ("remote_write", "buffer_max_bytes"),
    ("remote_write", "buffer_max_samples"),
    ("remote_write", "timeout"),
    ("remote_write", "batch_interval"),
    ("remote_write", "batch_samples"),
    ("remote_write", "headers"),
    ("remote_write", "bearer_token"),
    ("remote_write", "password"),
    ("remote_write", "username"),
    ("remote_write", "external_labels"),
    ("remote_write", "dcgm_lowercase_hostname"),
    ("remote_write", "naming"),
    ("remote_write", "url"),
    ("remote_write.tls", "insecure_skip_verify"),
    ("remote_write.tls", "client_key_file"),
    ("remote_write.tls", "client_cert_file"),
    ("remote_write.tls", "ca_file"),
    ("otlp", "pipeline"),
    ("otlp", "resource_attributes"),
    ("otlp", "service_name"),
    ("otlp", "export_interval"),
    ("otlp", "compression"),
    ("otlp", "timeout"),
    ("otlp", "headers"),
    ("otlp", "protocol"),
    ("otlp", "endpoint"),
    ("otlp.tls", "insecure_skip_verify"),
    ("otlp.tls", "client_key_file"),
    ("otlp.tls", "client_cert_file"),
    ("otlp.tls", "ca_file"),
    ("web", "max_headers"),
    ("web", "max_header_bytes"),
    ("web", "connection_timeout"),
    ("web", "header_read_timeout"),
    ("web", "max_connections"),
    ("web", "listen"),
    ("web", "history"),
    ("web", "client_buffer"),
    ("web", "max_clients"),
    ("web", "tenants"),
    ("web", "auth"),
    ("web.tls", "key"),
    ("web.tls", "cert"),
    ("diagnose", "thresholds"),
    ("diagnose", "disable"),
    ("diagnose", "idle_grace"),
    ("diagnose", "window"),
    ("diagnose", "enabled"),
    ("steps", "idle_timeout"),
    ("steps", "max_runs_per_uid"),
    ("steps", "max_connections_per_uid"),
    ("steps", "max_connections"),
    ("steps", "mode"),
    ("steps", "every_n"),
    ("steps", "socket"),
    ("attribution", "kubelet_refresh"),
    ("attribution", "kubelet_socket"),
    ("attribution", "kubelet"),
    ("attribution", "passwd_file"),
    ("attribution", "proc_root"),
    ("attribution", "enabled"),
];

/// A TOML value of any type, hostile strings and out-of-range numbers made frequent.
fn value() -> impl Strategy<Value = String> {
    let text = prop_oneof![
        any::<String>(),
        prop::sample::select(vec![
            "",
            "0",
            "-1",
            "1m 30s",
            "500ms",
            "1e400s",
            "18446744073709551616",
            "99999999999h",
            "auto",
            "mock",
            "http://",
            "\u{0}",
            "[",
            "🚀",
            "a=b",
            "0.0.0.0:99999",
        ])
        .prop_map(str::to_owned),
    ];
    prop_oneof![
        text.clone().prop_map(|s| toml::Value::String(s).to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| toml::Value::Float(v).to_string()),
        any::<bool>().prop_map(|v| v.to_string()),
        prop::collection::vec(text, 0..3).prop_map(|v| toml::Value::from(v).to_string()),
        Just("{ a = 1 }".to_owned()),
    ]
}

/// `text` parses, or its error is not empty and names `key` — `(section, key)`; in a nested
/// table with a required key (`[web.tls]` needs `cert` and `key`) the error may name the table
/// instead, where the missing sibling is reported.
fn check(text: &str, key: Option<(&str, &str)>) -> Result<(), TestCaseError> {
    match toml::from_str::<FileConfig>(text) {
        Ok(_) => {}
        Err(e) => {
            let e = e.to_string();
            prop_assert!(!e.is_empty());
            if let Some((section, key)) = key {
                let names_table = section.contains('.') && e.contains(&format!("[{section}]"));
                prop_assert!(e.contains(key) || names_table, "the error names `{}`: {}", key, e);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    /// One real key with any value: parsed, or an error that names the key.
    #[test]
    fn any_value_for_a_real_key(which in 0..KEYS.len(), value in value()) {
        let (section, key) = KEYS[which];
        check(&format!("[{section}]\n{key} = {value}\n"), Some((section, key)))?;
    }

    /// Several keys at once, and arbitrary text: parsed or refused, never a panic.
    #[test]
    fn any_document(pairs in prop::collection::vec((0..KEYS.len(), value()), 0..6), junk in any::<String>()) {
        let mut doc = String::new();
        for (which, value) in pairs {
            let (section, key) = KEYS[which];
            doc.push_str(&format!("[{section}]\n{key} = {value}\n"));
        }
        check(&doc, None)?;
        check(&junk, None)?;
        check(&format!("{doc}{junk}"), None)?;
    }
}

/// The keys the schema accepts under `table` ("" for the top level), as serde's
/// `deny_unknown_fields` lists them for an unknown key; `None` when `table` is not a table
/// with named keys.
fn schema_keys(table: &str) -> Option<Vec<String>> {
    let doc = if table.is_empty() { "zz_probe = 1\n".to_owned() } else { format!("[{table}]\nzz_probe = 1\n") };
    let e = toml::from_str::<FileConfig>(&doc).err()?.to_string();
    let list = e.split("unknown field `zz_probe`, expected ").nth(1)?;
    let list = list.lines().next()?;
    Some(list.split('`').skip(1).step_by(2).map(str::to_owned).collect())
}

/// The reference above cannot drift from the schema: every key serde accepts under every table
/// (the sinks' nested tables included) is in [`KEYS`], and every key in [`KEYS`] is accepted.
/// A new config field without its line here fails this test.
#[cfg(all(
    feature = "prometheus",
    feature = "pushgateway",
    feature = "influxdb",
    feature = "remote-write",
    feature = "otlp",
    feature = "web"
))]
#[test]
fn the_key_reference_lists_every_key_of_the_schema() {
    let mut schema = std::collections::BTreeSet::new();
    let mut tables = vec![String::new()];
    while let Some(table) = tables.pop() {
        let Some(keys) = schema_keys(&table) else {
            if let Some((section, key)) = table.rsplit_once('.') {
                schema.insert((section.to_owned(), key.to_owned()));
            }
            continue;
        };
        assert!(!keys.is_empty(), "[{table}] lists its keys");
        for key in keys {
            tables.push(if table.is_empty() { key } else { format!("{table}.{key}") });
        }
    }
    let reference: std::collections::BTreeSet<(String, String)> =
        KEYS.iter().map(|(s, k)| ((*s).to_owned(), (*k).to_owned())).collect();
    let missing: Vec<_> = schema.difference(&reference).collect();
    assert!(missing.is_empty(), "config keys missing from KEYS (the key reference): {missing:?}");
    let unknown: Vec<_> = reference.difference(&schema).collect();
    assert!(unknown.is_empty(), "KEYS names keys the schema does not have: {unknown:?}");
    assert!(schema.len() > 100, "the probe found the schema ({} keys)", schema.len());
}
