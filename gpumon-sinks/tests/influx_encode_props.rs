//! Property tests: whatever the strings, the encoder's output parses with an independent
//! line-protocol parser (`influxdb-line-protocol`, the InfluxDB IOx parser) to exactly the values
//! that went in — identifiers as `escape::stored_identifier` documents them, string fields
//! byte for byte.
#![cfg(feature = "influxdb")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use gpumon_core::{DeviceInfo, DeviceSample, MigInfo, Snapshot, SystemInfo, Value};
use gpumon_sinks::influxdb::escape::{
    stored_identifier, write_field_key, write_measurement, write_string_field, write_tag,
};
use gpumon_sinks::influxdb::LineProtocolEncoder;
use influxdb_line_protocol::{parse_lines, FieldValue};
use proptest::prelude::*;

/// Any string, with the troublesome characters made frequent.
fn hostile() -> impl Strategy<Value = String> {
    let special = prop::sample::select(vec![
        ",", " ", "=", "\"", "\\", "\n", "\r", "\t", "\0", "#", "'", "é", "🚀", "\u{85}", "\u{2028}", "a", "Z", "0",
    ]);
    prop_oneof![prop::collection::vec(special, 0..12).prop_map(|v| v.concat()), any::<String>(), "[ -~]{0,16}",]
}

fn tags_of(line: &influxdb_line_protocol::ParsedLine<'_>) -> BTreeMap<String, String> {
    line.series.tag_set.iter().flatten().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn snapshot_tags_round_trip(host in hostile(), name in hostile(), uuid in hostile(), profile in hostile(),
                                key in hostile(), value in hostile(), util in any::<f64>(), mem in any::<u64>(),
                                ts in 0u64..=i64::MAX as u64) {
        let mut info = DeviceInfo::new(7, uuid.clone(), name.clone());
        let mut mig = MigInfo::new("GPU-p", 1, 2, 3);
        mig.profile = Some(profile.clone());
        info.mig = Some(mig);
        let mut d = DeviceSample::new(Arc::new(info));
        d.utilization.gpu = Some(util);
        d.memory.used = Some(mem);
        let snapshot = Snapshot::new(Arc::new(SystemInfo::new(host.clone(), "prop")), vec![d])
            .with_taken_at(UNIX_EPOCH + Duration::from_nanos(ts));
        let extra_ok = !key.is_empty() && !value.is_empty()
            && !["gpu", "host", "mig", "mig_ci", "mig_gi", "mig_profile", "name", "uuid"].contains(&&*stored_identifier(&key));
        let mut encoder = LineProtocolEncoder::default();
        if extra_ok {
            encoder = encoder.with_tag(&key, &value);
        }
        let mut out = String::new();
        let encoded = encoder.encode_snapshot(&snapshot, &mut out);

        let lines: Vec<_> = parse_lines(&out).collect::<Result<_, _>>().map_err(|e| TestCaseError::fail(format!("{e}: {out:?}")))?;
        prop_assert_eq!(lines.len(), encoded.lines);
        prop_assert_eq!(lines.len(), 1);
        let line = &lines[0];
        prop_assert_eq!(line.series.measurement.to_string(), "gpu");
        prop_assert_eq!(line.timestamp, Some(ts as i64));

        let mut expected = BTreeMap::new();
        expected.insert("gpu".to_owned(), "7".to_owned());
        expected.insert("mig".to_owned(), "1".to_owned());
        expected.insert("mig_ci".to_owned(), "3".to_owned());
        expected.insert("mig_gi".to_owned(), "2".to_owned());
        for (k, v) in [("host", &host), ("name", &name), ("uuid", &uuid), ("mig_profile", &profile)] {
            if !v.is_empty() {
                expected.insert(k.to_owned(), stored_identifier(v).into_owned());
            }
        }
        if extra_ok {
            expected.insert(stored_identifier(&key).into_owned(), stored_identifier(&value).into_owned());
        }
        prop_assert_eq!(tags_of(line), expected, "{:?}", out);

        // Fields: exactly the catalogue's names and the values sampled (NaN/inf left out).
        let fields: BTreeMap<String, FieldValue<'_>> =
            line.field_set.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let mut want = 0;
        snapshot.devices[0].visit_points(|p| {
            let key = p.id.descriptor().name;
            match p.value {
                Value::Float(v) if !v.is_finite() => assert!(!fields.contains_key(key)),
                Value::Float(v) => {
                    want += 1;
                    assert_eq!(fields.get(key), Some(&FieldValue::F64(v)), "{key} in {out:?}");
                }
                Value::Int(v) => {
                    want += 1;
                    assert_eq!(fields.get(key), Some(&FieldValue::I64(i64::try_from(v).unwrap_or(i64::MAX))), "{key}");
                }
            }
        });
        prop_assert_eq!(fields.len(), want);
    }

    #[test]
    fn every_position_round_trips(measurement in hostile(), tag_key in hostile(), tag_value in hostile(),
                                  field_key in hostile(), text in hostile(), flag in any::<bool>()) {
        let stored_measurement = stored_identifier(&measurement).into_owned();
        prop_assume!(!measurement.is_empty() && !stored_measurement.starts_with('#'));
        prop_assume!(!tag_key.is_empty() && !tag_value.is_empty() && !field_key.is_empty());
        let stored_field = stored_identifier(&field_key).into_owned();
        prop_assume!(stored_field != "b");

        let mut out = String::new();
        write_measurement(&mut out, &measurement);
        out.push(',');
        write_tag(&mut out, &tag_key);
        out.push('=');
        write_tag(&mut out, &tag_value);
        out.push(' ');
        write_field_key(&mut out, &field_key);
        out.push('=');
        write_string_field(&mut out, &text);
        out.push_str(if flag { ",b=true" } else { ",b=false" });
        out.push_str(" 1\n");

        let lines: Vec<_> = parse_lines(&out).collect::<Result<_, _>>().map_err(|e| TestCaseError::fail(format!("{e}: {out:?}")))?;
        prop_assert_eq!(lines.len(), 1, "{:?}", out);
        let line = &lines[0];
        prop_assert_eq!(line.series.measurement.to_string(), stored_measurement);
        let tags = tags_of(line);
        prop_assert_eq!(tags.get(&*stored_identifier(&tag_key)).map(String::as_str), Some(&*stored_identifier(&tag_value)));
        let fields: BTreeMap<String, String> = line.field_set.iter().map(|(k, v)| (k.to_string(), match v {
            FieldValue::String(s) => s.to_string(),
            FieldValue::Boolean(b) => b.to_string(),
            other => format!("{other:?}"),
        })).collect();
        prop_assert_eq!(fields.get(&stored_field), Some(&text), "{:?}", out);
        prop_assert_eq!(fields.get("b"), Some(&flag.to_string()));
    }
}
