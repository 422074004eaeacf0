//! Property tests of the config loader: documents built from the real keys with hostile values,
//! and arbitrary text, parse to a config or to an error naming the key — never a panic. Cases:
//! 64 unless `PROPTEST_CASES` is set.

use proptest::prelude::*;

use super::AgentConfig as FileConfig;

/// `(section, key)` for every key the agent reads (sinks' nested tables included).
const KEYS: &[(&str, &str)] = &[
    ("agent", "backend"),
    ("agent", "interval"),
    ("agent", "sample_timeout"),
    ("agent", "devices"),
    ("agent", "enable"),
    ("agent", "disable"),
    ("agent", "sink_queue"),
    ("agent", "export_timeout"),
    ("agent", "shutdown_timeout"),
    ("mock", "profile"),
    ("mock", "scenario"),
    ("mock", "seed"),
    ("nvml", "library"),
    ("record", "file"),
    ("replay", "file"),
    ("replay", "speed"),
    ("stdout", "format"),
    ("stdout", "enabled"),
    ("prometheus", "listen"),
    ("prometheus", "stale_after"),
    ("prometheus", "naming"),
    ("pushgateway", "url"),
    ("pushgateway", "timeout"),
    ("influxdb", "url"),
    ("influxdb", "db"),
    ("influxdb", "batch_interval"),
    ("influxdb", "timeout"),
    ("influxdb.tls", "ca_file"),
    ("influxdb.tls", "insecure_skip_verify"),
    ("otlp", "endpoint"),
    ("otlp", "protocol"),
    ("otlp", "timeout"),
    ("otlp", "export_interval"),
    ("otlp", "headers"),
    ("otlp.tls", "client_cert_file"),
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

fn check(text: &str, key: Option<&str>) -> Result<(), TestCaseError> {
    match toml::from_str::<FileConfig>(text) {
        Ok(_) => {}
        Err(e) => {
            let e = e.to_string();
            prop_assert!(!e.is_empty());
            if let Some(key) = key {
                prop_assert!(e.contains(key), "the error names `{}`: {}", key, e);
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
        check(&format!("[{section}]\n{key} = {value}\n"), Some(key))?;
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
