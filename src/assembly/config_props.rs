//! Property tests of the config loader: documents built from the real keys with hostile values,
//! and arbitrary text, parse to a config or to an error naming the key — never a panic. Cases:
//! 64 unless `PROPTEST_CASES` is set.

use proptest::prelude::*;

use super::AgentConfig as FileConfig;

/// `(section, key)` for every key the agent reads outside the sinks' sections; each sink's keys
/// (its nested tables included) are its descriptor's (`crate::assembly::sinks`). Together,
/// [`keys`], they are the key reference, checked against the schema by
/// [`the_key_reference_lists_every_key_of_the_schema`] (with every sink compiled in).
const OWN_KEYS: &[(&str, &str)] = &[
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

/// The key reference: [`OWN_KEYS`] and every listed sink's keys.
fn keys() -> Vec<(&'static str, &'static str)> {
    let sinks = crate::assembly::sinks::ALL.iter().flat_map(|d| d.keys.iter().copied());
    OWN_KEYS.iter().copied().chain(sinks).collect()
}

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
    fn any_value_for_a_real_key(which in 0..keys().len(), value in value()) {
        let (section, key) = keys()[which];
        check(&format!("[{section}]\n{key} = {value}\n"), Some((section, key)))?;
    }

    /// Several keys at once, and arbitrary text: parsed or refused, never a panic.
    #[test]
    fn any_document(pairs in prop::collection::vec((0..keys().len(), value()), 0..6), junk in any::<String>()) {
        let keys = keys();
        let mut doc = String::new();
        for (which, value) in pairs {
            let (section, key) = keys[which];
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
/// (the sinks' nested tables included) is in [`keys`], and every key in [`keys`] is accepted.
/// A new config field without its line here (or in its sink's descriptor) fails this test.
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
        keys().iter().map(|(s, k)| ((*s).to_owned(), (*k).to_owned())).collect();
    let missing: Vec<_> = schema.difference(&reference).collect();
    assert!(missing.is_empty(), "config keys missing from KEYS (the key reference): {missing:?}");
    let unknown: Vec<_> = reference.difference(&schema).collect();
    assert!(unknown.is_empty(), "KEYS names keys the schema does not have: {unknown:?}");
    assert!(schema.len() > 100, "the probe found the schema ({} keys)", schema.len());
}

/// Each listed sink's keys are its own: under its section only, and not in [`OWN_KEYS`]; and
/// every section of the key reference is a listed sink's or one of the agent's own (a sink
/// added without its descriptor has no section here, and the schema test above says so).
#[test]
fn the_sinks_keys_come_from_the_registry() {
    use crate::assembly::sinks::ALL;
    for sink in ALL {
        assert!(!sink.keys.is_empty(), "{} lists its keys", sink.key);
        for (table, key) in sink.keys {
            let section = table.split('.').next().unwrap_or(table);
            assert_eq!(section, sink.key, "{table}.{key} is in {}'s descriptor", sink.key);
        }
        assert!(
            OWN_KEYS.iter().all(|(table, _)| table.split('.').next() != Some(sink.key)),
            "[{}] keys are listed in its descriptor only",
            sink.key
        );
    }
    let own = ["agent", "mock", "nvml", "record", "replay", "stdout", "diagnose", "steps", "attribution"];
    for (table, key) in keys() {
        let section = table.split('.').next().unwrap_or(table);
        assert!(
            own.contains(&section) || ALL.iter().any(|s| s.key == section),
            "{table}.{key}: [{section}] is neither the agent's own nor a listed sink's"
        );
    }
}
