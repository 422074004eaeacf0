//! Unit tests: golden renderings, escaping, negotiation, staleness, config.

use std::collections::HashSet;
use std::time::UNIX_EPOCH;

use gpumon_core::{
    DeviceInfo, DeviceSample, Diagnosis, FailureReason, Family, Finding, FindingCount, FindingKind, MetricId, MigInfo,
    ProcessSample, Severity, Sink, SinkError, SystemInfo, XidCount,
};
use proptest::prelude::*;

use super::render::push_f64;
use super::*;

#[path = "../../tests/prometheus_support/exposition.rs"]
mod exposition;
use exposition::unescape_label_value;

fn system() -> SystemInfo {
    let mut system = SystemInfo::new("node-1", "nvml");
    system.driver_version = Some("570.86.15".into());
    system.cuda_driver_version = Some(12080);
    system
}

/// One GPU with a few values (a name that needs escaping, an xid), one MIG instance, one lost GPU.
fn fixture() -> Snapshot {
    let mut info = DeviceInfo::new(0, "GPU-aaaa", "NVIDIA \"H100\"");
    info.pci_bus_id = Some("00000000:17:00.0".into());
    info.serial = Some("1650".into());
    let mut gpu = DeviceSample::new(Arc::new(info));
    gpu.utilization.gpu = Some(0.5);
    gpu.memory.used = Some(1 << 30);
    gpu.memory.total = Some(80 << 30);
    gpu.temperature.gpu = Some(41.0);
    gpu.power.energy_joules = Some(1234.5);
    gpu.xid_errors.push(XidCount::new(79, 2, UNIX_EPOCH + Duration::from_secs(1_700_000_000)));

    let mut mig_info = DeviceInfo::new(0, "MIG-bbbb", "NVIDIA \"H100\"");
    let mut mig = MigInfo::new("GPU-aaaa", 0, 1, 0);
    mig.profile = Some("1g.10gb".into());
    mig_info.mig = Some(mig);
    let mut mig = DeviceSample::new(Arc::new(mig_info));
    mig.utilization.gpu = Some(0.25);

    let lost = DeviceSample::lost(Arc::new(DeviceInfo::new(1, "GPU-cccc", "NVIDIA H100")));

    let mut snap = Snapshot::new(Arc::new(system()), vec![gpu, mig, lost])
        .with_taken_at(UNIX_EPOCH + Duration::from_secs(1_700_000_100))
        .with_duration(Duration::from_millis(2));
    snap.attach(diagnosis(&[
        (FindingKind::NearOom, Severity::Warning, Some((0, "GPU-aaaa"))),
        (FindingKind::DataloaderStarvation, Severity::Warning, Some((0, "MIG-bbbb"))),
        // Host-level: no device labels.
        (FindingKind::Imbalance, Severity::Info, None),
        // About a GPU the snapshot does not carry (filtered away): not exported.
        (FindingKind::HardwareErrors, Severity::Critical, Some((7, "GPU-filtered"))),
    ]));
    snap
}

/// Steps of two runs: "train" rank 0 (step 42 reported at this tick, figures on every device of
/// `devices`) and "solo" without a rank (step 7, nothing reported), and rejection counts.
pub(crate) fn steps(devices: &[DeviceSample]) -> gpumon_core::steps::Steps {
    use gpumon_core::steps::{DeviceStep, RunSteps, StepRejections, StepReport, Steps};
    let mut report = StepReport::new(42, Duration::from_millis(1500));
    for (i, d) in devices.iter().enumerate() {
        let mut g = DeviceStep::new(d.info.uuid.clone());
        g.utilization_mean = Some(0.5 + i as f64 / 100.0);
        g.utilization_max = Some(0.9);
        g.memory_peak_bytes = Some(2 << 30);
        g.energy_joules = Some(750.0);
        report.devices.push(g);
    }
    let mut train = RunSteps::new("train", Some(0));
    train.last_step = Some(42);
    train.last_duration = Some(report.duration);
    train.last = Some(report.clone());
    train.reported = vec![report];
    let mut solo = RunSteps::new("solo", None);
    solo.last_step = Some(7);
    let mut rejected = StepRejections::default();
    rejected.malformed = 3;
    let mut steps = Steps::default();
    steps.runs = vec![train, solo];
    steps.rejected = Some(rejected);
    steps
}

/// A diagnosis with `active` findings and a raised count per kind (1 each, 3 for imbalance).
/// A finding of `kind` and `severity` on `(index, uuid)`, or on the host.
type Active<'a> = (FindingKind, Severity, Option<(u32, &'a str)>);

pub(crate) fn diagnosis(active: &[Active<'_>]) -> Diagnosis {
    let since = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut d = Diagnosis::default();
    d.active = active
        .iter()
        .map(|&(kind, severity, device)| Finding::new(kind, severity, device, since, "evidence", "advice"))
        .collect();
    d.raised_total = active
        .iter()
        .map(|&(kind, ..)| FindingCount::new(kind, if kind == FindingKind::Imbalance { 3 } else { 1 }))
        .collect();
    d
}

#[path = "../../tests/device_support/mod.rs"]
mod device_support;

/// A device with every value present (the crate's one such test GPU), at tick 0.
fn full_device(index: u32) -> DeviceSample {
    device_support::full_gpu(index, 0)
}

fn render_with(naming: Naming, format: Format, snapshot: Snapshot) -> String {
    let sink = PrometheusSink::builder().naming(naming).build().unwrap();
    sink.handle().store(Arc::new(snapshot));
    sink.handle().render(format)
}

fn check_golden(file: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/prometheus/testdata").join(file);
    if std::env::var_os("GPUMON_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with GPUMON_BLESS=1 to create it)", path.display()));
    if expected != actual {
        panic!(
            "{file} differs from the golden file (GPUMON_BLESS=1 rewrites it after review)\n--- actual ---\n{actual}"
        );
    }
}

/// The fixture in both namings and both formats, each against its golden file.
#[test]
fn goldens_in_every_naming_and_format() {
    for (file, naming, format) in [
        ("native.prom", Naming::Native, Format::Text),
        ("native.om", Naming::Native, Format::OpenMetrics),
        ("dcgm.prom", Naming::Dcgm, Format::Text),
        ("dcgm.om", Naming::Dcgm, Format::OpenMetrics),
    ] {
        check_golden(file, &render_with(naming, format, fixture()));
    }
}

/// Structural checks of a rendering: every sample's family was declared with HELP and TYPE
/// right before its series, no family is declared twice, no series is repeated.
pub(crate) fn check_structure(text: &str, format: Format) {
    let mut declared = HashSet::new();
    let mut series = HashSet::new();
    let (mut family, mut kind) = (String::new(), String::new());
    let mut saw_help = false;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            family = rest.split(' ').next().unwrap().to_owned();
            assert!(declared.insert(family.clone()), "family {family} declared twice");
            saw_help = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            assert_eq!(it.next().unwrap(), family, "TYPE without HELP: {line}");
            kind = it.next().unwrap().to_owned();
            continue;
        }
        if let Some(rest) = line.strip_prefix("# UNIT ") {
            assert_eq!(format, Format::OpenMetrics);
            let (fam, unit) = rest.split_once(' ').unwrap();
            assert_eq!(fam, family);
            assert!(fam.ends_with(&format!("_{unit}")), "{line}");
            continue;
        }
        if line == "# EOF" {
            assert_eq!(format, Format::OpenMetrics);
            assert!(lines.peek().is_none(), "# EOF must be last");
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line}");
        assert!(saw_help, "sample before any HELP: {line}");
        let name = line.split(['{', ' ']).next().unwrap();
        let expected = match (format, kind.as_str()) {
            (Format::OpenMetrics, "counter") => format!("{family}_total"),
            (Format::OpenMetrics, "info") => format!("{family}_info"),
            _ => family.clone(),
        };
        assert_eq!(name, expected, "sample of another family: {line}");
        let key = line.rsplit_once(' ').unwrap().0.to_owned();
        assert!(series.insert(key), "series repeated: {line}");
    }
    if format == Format::OpenMetrics {
        assert!(text.ends_with("# EOF\n"));
    }
}

#[test]
fn every_family_has_help_and_type_in_every_format() {
    let mut devices: Vec<DeviceSample> = (0..8).map(full_device).collect();
    // A runtime-suspended GPU carries only `up` and `suspended`.
    devices.push(DeviceSample::suspended(full_device(8).info));
    // A GPU whose XID events are not monitored: no XID series, a `metric_failure` instead.
    let mut unwatched = full_device(9);
    unwatched.xid_errors.clear();
    unwatched.record_failure(Family::Xid, FailureReason::Other("XID events not monitored".into()));
    devices.push(unwatched);
    let mut snap = Snapshot::new(Arc::new(system()), devices);
    snap.attach(diagnosis(&[
        (FindingKind::NearOom, Severity::Warning, Some((2, "GPU-00000002-1111-2222-3333-444455556666"))),
        (FindingKind::Imbalance, Severity::Info, None),
    ]));
    snap.attach(steps(&snap.devices));
    snap.attach(*attributed().output::<gpumon_core::attribution::AttributionSummary>().unwrap());
    // The GPU-time accounts, after the diagnosis: a tick that raised the active findings (which
    // opens their lost series), then this one.
    let mut accounts = gpumon_core::accounts::Accounts::new().0;
    let mut raised = snap.clone();
    let mut with_events = diagnosis(&[]);
    let active = &snap.output::<Diagnosis>().unwrap().active;
    with_events.events = active
        .iter()
        .map(|f| gpumon_core::FindingEvent::new(gpumon_core::Transition::Raised, f.clone(), None))
        .collect();
    raised.attach(with_events);
    gpumon_core::Processor::process(&mut accounts, &mut raised);
    gpumon_core::Processor::process(&mut accounts, &mut snap);
    for naming in [Naming::Native, Naming::Dcgm] {
        for format in [Format::Text, Format::OpenMetrics] {
            let text = render_with(naming, format, snap.clone());
            check_structure(&text, format);
            check_structure(&render_with(naming, format, fixture()), format);
        }
    }
    // Every catalogue metric appears (the full device has every value).
    let text = render_with(Naming::Native, Format::Text, snap.clone());
    for id in MetricId::ALL {
        let name = id.descriptor().prometheus_name();
        assert!(text.contains(&format!("\n{name}{{")), "{name} missing");
    }
    // dcgm naming: every mapped metric under its DCGM name, scaled.
    let text = render_with(Naming::Dcgm, Format::Text, snap);
    for id in MetricId::ALL {
        if let Some(d) = id.descriptor().dcgm {
            assert!(text.contains(&format!("\n{}{{", d.name)), "{} missing", d.name);
        }
    }
    assert!(text.contains("DCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-00000000-1111-2222-3333-444455556666\""));
    assert!(text.contains("DCGM_FI_DEV_FB_USED{gpu=\"7\","));
    let sm = text.lines().find(|l| l.starts_with("DCGM_FI_DEV_SM_CLOCK{")).unwrap();
    assert!(sm.ends_with(" 1980"), "{sm}");
}

#[test]
fn absent_device_is_not_exported_and_lost_device_only_reports_down() {
    let sink = PrometheusSink::builder().build().unwrap();
    let h = sink.handle();
    let devices = vec![full_device(0), full_device(1)];
    h.store(Arc::new(Snapshot::new(Arc::new(system()), devices)));
    let before = h.render(Format::Text);
    let gone = "GPU-00000001-1111-2222-3333-444455556666";
    assert!(before.contains(gone));

    let mut lost = full_device(0);
    lost.state = gpumon_core::DeviceState::Lost;
    h.store(Arc::new(Snapshot::new(Arc::new(system()), vec![lost])));
    let after = h.render(Format::Text);
    assert!(!after.contains(gone), "a device missing from the snapshot must not be exported");
    let device_lines: Vec<_> = after.lines().filter(|l| !l.starts_with('#') && l.contains("uuid=")).collect();
    assert_eq!(
        device_lines,
        ["gpumon_up{gpu=\"0\",uuid=\"GPU-00000000-1111-2222-3333-444455556666\",host=\"node-1\"} 0"]
    );
}

#[test]
fn stale_snapshot_exports_no_device_series() {
    let sink = PrometheusSink::builder().stale_after(Duration::from_secs(60)).build().unwrap();
    let h = sink.handle();
    h.store(Arc::new(fixture())); // taken in 2023
    let text = h.render(Format::Text);
    assert!(!text.contains("uuid="), "{text}");
    // Derived series follow the same rule, host-level ones included.
    assert!(!text.contains("finding"), "{text}");
    assert!(text.contains("gpumon_last_sample_timestamp_seconds"));
    assert!(h.health().unwrap_err().contains("old"));
    h.store(Arc::new(fixture().with_taken_at(SystemTime::now())));
    assert!(h.render(Format::Text).contains("gpumon_utilization_ratio{"));
    assert_eq!(h.health(), Ok(()));
}

/// Findings are exported from the catalogue: device labels (or only the host label), then the
/// descriptor's labels, in both namings and formats.
#[test]
fn findings_carry_device_or_host_labels_and_their_own() {
    let text = render_with(Naming::Native, Format::Text, fixture());
    let lines: Vec<_> = text.lines().filter(|l| l.starts_with("gpumon_finding")).collect();
    assert_eq!(
        lines,
        [
            "gpumon_finding_active{gpu=\"0\",uuid=\"GPU-aaaa\",host=\"node-1\",kind=\"near_oom\",severity=\"warning\"} 1",
            "gpumon_finding_active{gpu=\"0\",uuid=\"MIG-bbbb\",gpu_instance_id=\"1\",mig_profile=\"1g.10gb\",host=\"node-1\",kind=\"dataloader_starvation\",severity=\"warning\"} 1",
            "gpumon_finding_active{host=\"node-1\",kind=\"imbalance\",severity=\"info\"} 1",
            "gpumon_findings_raised_total{host=\"node-1\",kind=\"near_oom\"} 1",
            "gpumon_findings_raised_total{host=\"node-1\",kind=\"dataloader_starvation\"} 1",
            "gpumon_findings_raised_total{host=\"node-1\",kind=\"imbalance\"} 3",
            "gpumon_findings_raised_total{host=\"node-1\",kind=\"hardware_errors\"} 1",
        ]
    );
    // dcgm naming: the dcgm label set, native names (they have no DCGM equivalent).
    let text = render_with(Naming::Dcgm, Format::Text, fixture());
    let active: Vec<_> = text.lines().filter(|l| l.starts_with("gpumon_finding_active{")).collect();
    assert_eq!(active.len(), 3, "{text}");
    assert!(active[0].starts_with("gpumon_finding_active{gpu=\"0\",UUID=\"GPU-aaaa\",pci_bus_id="), "{}", active[0]);
    assert!(active[0].ends_with(",DCGM_FI_DRIVER_VERSION=\"570.86.15\",kind=\"near_oom\",severity=\"warning\"} 1"));
    assert_eq!(active[2], "gpumon_finding_active{Hostname=\"node-1\",kind=\"imbalance\",severity=\"info\"} 1");
    // OpenMetrics: the counter family is declared without `_total`, its samples carry it.
    let om = render_with(Naming::Native, Format::OpenMetrics, fixture());
    assert!(om.contains("# TYPE gpumon_findings_raised counter\ngpumon_findings_raised_total{host=\"node-1\",kind=\"near_oom\"} 1\n"), "{om}");
    assert!(om.contains("# TYPE gpumon_finding_active gauge\n"), "{om}");
    check_structure(&om, Format::OpenMetrics);
    // Without the host label, a host-level point has no label at all.
    let sink = PrometheusSink::builder().host_label(false).build().unwrap();
    sink.handle().store(Arc::new(fixture()));
    let text = sink.handle().render(Format::Text);
    assert!(text.contains("\ngpumon_finding_active{kind=\"imbalance\",severity=\"info\"} 1\n"), "{text}");
    // No diagnosis, no finding families (not even their headers).
    let mut plain = fixture();
    plain.outputs.remove("diagnosis");
    assert!(!render_with(Naming::Native, Format::Text, plain).contains("finding"));
}

/// Findings produced by the real diagnosis stage reach the exposition.
#[test]
fn findings_from_the_diagnoser_are_rendered() {
    use gpumon_core::diagnose::{DiagnoseConfig, Diagnoser};
    use gpumon_core::{Processor, ProcessorContext};
    let mut diagnoser = Diagnoser::new(DiagnoseConfig::default()).unwrap();
    diagnoser.attach(&ProcessorContext::new(Duration::from_secs(1)));
    let mut snap = None;
    for tick in 0..diagnoser.raise_after_ticks() as u64 {
        let mut d = full_device(0);
        d.memory.used = Some(d.memory.total.unwrap() / 100 * 97);
        let mut s = Snapshot::new(Arc::new(system()), vec![d])
            .with_seq(tick + 1)
            .with_taken_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000 + tick));
        diagnoser.process(&mut s);
        snap = Some(s);
    }
    let text = render_with(Naming::Native, Format::Text, snap.unwrap());
    let uuid = "GPU-00000000-1111-2222-3333-444455556666";
    let want = format!("gpumon_finding_active{{gpu=\"0\",uuid=\"{uuid}\",host=\"node-1\",kind=\"near_oom\",severity=");
    assert!(text.lines().any(|l| l.starts_with(&want) && l.ends_with("} 1")), "{text}");
    assert!(text.contains("\ngpumon_findings_raised_total{host=\"node-1\",kind=\"near_oom\"} 1\n"), "{text}");
}

#[test]
fn default_stale_after_rule() {
    assert_eq!(default_stale_after(Duration::from_millis(100)), Duration::from_secs(5));
    assert_eq!(default_stale_after(Duration::from_secs(1)), Duration::from_secs(5));
    assert_eq!(default_stale_after(Duration::from_secs(2)), Duration::from_secs(6));
    assert_eq!(default_stale_after(Duration::from_secs(10)), Duration::from_secs(30));
}

/// Without `stale_after`, the agent's interval decides: an old snapshot (sampling stalled) is
/// not served, `/health` says why, and the self-metrics stay.
#[tokio::test]
async fn stale_after_defaults_to_the_agents_interval() {
    let sink = PrometheusSink::builder().build().unwrap();
    let h = sink.handle();
    let explicit = PrometheusSink::builder().stale_after(Duration::from_secs(120)).build().unwrap();
    let h_explicit = explicit.handle();
    let sampler = gpumon_mock::MockSampler::from_profile_name("h100x8").unwrap();
    let agent = gpumon_core::Agent::builder(sampler)
        .interval(Duration::from_secs(2)) // stale after 6 s
        .scheduled(false)
        .sink(sink)
        .spawn()
        .unwrap();
    h_explicit.set_telemetry(agent.telemetry());
    agent.flush(Duration::from_secs(5)).await.unwrap(); // one successful sample, exported
    assert!(h.render(Format::Text).contains("gpumon_utilization_ratio{"));
    assert_eq!(h.health(), Ok(()));

    // The last sample succeeded, but nothing new arrived for a minute.
    for (age, stale) in [(60, true), (7, true), (4, false)] {
        let old = fixture().with_taken_at(SystemTime::now() - Duration::from_secs(age));
        h.store(Arc::new(old.clone()));
        h_explicit.store(Arc::new(old));
        let text = h.render(Format::Text);
        assert_eq!(!text.contains("uuid="), stale, "age {age}s: {text}");
        assert_eq!(h.health().is_err(), stale, "age {age}s: {:?}", h.health());
        for self_metric in ["gpumon_last_sample_success{host=\"node-1\"} 1\n", "gpumon_samples_total{"] {
            assert!(text.contains(self_metric), "{self_metric} in {text}");
        }
        let om = h.render(Format::OpenMetrics);
        check_structure(&om, Format::OpenMetrics);
        // An explicit stale_after wins over the derived one.
        assert!(h_explicit.render(Format::Text).contains("uuid="), "age {age}s");
        assert_eq!(h_explicit.health(), Ok(()));
    }
    h.store(Arc::new(fixture().with_taken_at(SystemTime::now() - Duration::from_secs(60))));
    let reason = h.health().unwrap_err();
    assert!(reason.contains("60.") && reason.contains("old") && reason.contains("2s sampling interval"), "{reason}");
    // Fresh data is served again at once.
    h.store(Arc::new(fixture().with_taken_at(SystemTime::now())));
    assert!(h.render(Format::Text).contains("gpumon_utilization_ratio{"));
    assert_eq!(h.health(), Ok(()));
    agent.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[test]
fn self_metrics_from_telemetry() {
    let sink = PrometheusSink::builder().build().unwrap();
    let h = sink.handle();
    assert_eq!(h.health(), Err("no snapshot yet".into()));
    h.set_telemetry(Telemetry::default());
    let text = h.render(Format::Text);
    for name in ["gpumon_last_sample_success 0", "gpumon_samples_total 0", "gpumon_sample_failures_total 0"] {
        assert!(text.contains(&format!("{name}\n")), "{name} in {text}");
    }
    assert_eq!(h.health(), Err("no sample taken yet".into()));
    let om = h.render(Format::OpenMetrics);
    assert!(om.contains("# TYPE gpumon_samples counter\ngpumon_samples_total 0\n"), "{om}");
    check_structure(&om, Format::OpenMetrics);
}

#[test]
fn host_label_can_move_to_info() {
    let sink = PrometheusSink::builder().host_label(false).build().unwrap();
    sink.handle().store(Arc::new(fixture()));
    let text = sink.handle().render(Format::Text);
    assert!(text.contains("gpumon_up{gpu=\"1\",uuid=\"GPU-cccc\"} 0\n"), "{text}");
    let info = text.lines().find(|l| l.starts_with("gpumon_gpu_info{")).unwrap();
    assert!(info.ends_with(",host=\"node-1\"} 1"), "{info}");
}

#[test]
fn accept_negotiation() {
    // What Prometheus 2.42 sends.
    let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
    assert_eq!(Format::from_accept(None), Format::Text);
    assert_eq!(Format::from_accept(Some("text/plain")), Format::Text);
    assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
    assert_eq!(Format::from_accept(Some("application/openmetrics-text")), Format::OpenMetrics);
    assert_eq!(Format::from_accept(Some("application/openmetrics-text; version=2.0.0")), Format::Text);
    assert_eq!(Format::from_accept(Some("application/openmetrics-text;q=0.2,text/plain;q=0.5")), Format::Text);
    assert_eq!(Format::from_accept(Some("application/openmetrics-text;q=0")), Format::Text);
    assert_eq!(Format::from_accept(Some("garbage;;;=,,")), Format::Text);
    let sink = PrometheusSink::builder().openmetrics(false).build().unwrap();
    assert_eq!(sink.handle().negotiate(Some(prom)), Format::Text);
}

#[test]
fn numbers_are_valid_in_both_formats() {
    let cases = [
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (-3.0, "-3"),
        (0.5, "0.5"),
        (1234.5, "1234.5"),
        (1e-7, "1e-7"),
        (2.5e20, "2.5e20"),
        (f64::NAN, "NaN"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (1_700_000_000.25, "1700000000.25"),
    ];
    for (v, want) in cases {
        let mut s = String::new();
        push_f64(&mut s, v);
        assert_eq!(s, want, "{v}");
    }
}

#[test]
fn escaping_known_cases() {
    let mut s = String::new();
    escape_label_value(&mut s, "a\\b\"c\nd\té€");
    assert_eq!(s, "a\\\\b\\\"c\\nd\té€");
}

/// Pulls the value of label `key` out of a rendered series line, undoing the escaping the way
/// a Prometheus parser does.
fn parse_label(line: &str, key: &str) -> Option<String> {
    let body = line.split_once('{')?.1;
    let mut rest = body;
    loop {
        let (k, after) = rest.split_once("=\"")?;
        // Find the closing quote: the first `"` not preceded by an odd number of backslashes.
        let bytes = after.as_bytes();
        let mut i = 0;
        let end = loop {
            match bytes.get(i)? {
                b'\\' => i += 2,
                b'"' => break i,
                _ => i += 1,
            }
        };
        if k == key {
            return unescape_label_value(&after[..end]);
        }
        rest = after[end + 1..].trim_start_matches(',');
        if rest.starts_with('}') {
            return None;
        }
    }
}

proptest! {
    #[test]
    fn any_label_value_round_trips(value in any::<String>()) {
        let mut escaped = String::new();
        escape_label_value(&mut escaped, &value);
        prop_assert!(!escaped.contains('\n'));
        prop_assert_eq!(unescape_label_value(&escaped), Some(value));
    }

    #[test]
    fn any_gpu_and_process_name_round_trips_through_a_rendering(
        name in any::<String>(),
        host in "\\PC*",
        profile in any::<String>(),
    ) {
        let mut system = system();
        system.hostname = host.clone();
        let mut info = DeviceInfo::new(3, "GPU-x", name.clone());
        let mut mig = MigInfo::new("GPU-y", 0, 2, 0);
        mig.profile = Some(profile.clone());
        info.mig = Some(mig);
        let mut d = DeviceSample::new(Arc::new(info));
        d.utilization.gpu = Some(0.5);
        let snap = Snapshot::new(Arc::new(system), vec![d]);
        for naming in [Naming::Native, Naming::Dcgm] {
            for format in [Format::Text, Format::OpenMetrics] {
                let text = render_with(naming, format, snap.clone());
                let info = text.lines().find(|l| l.starts_with("gpumon_gpu_info{")).unwrap();
                let (name_key, host_key, profile_key) = match naming {
                    Naming::Native => ("name", "host", "mig_profile"),
                    _ => ("modelName", "Hostname", "GPU_I_PROFILE"),
                };
                prop_assert_eq!(parse_label(info, name_key), Some(name.clone()));
                prop_assert_eq!(parse_label(info, host_key), Some(host.clone()));
                prop_assert_eq!(parse_label(info, profile_key), Some(profile.clone()));
                // Nothing leaked out of the label: every line is still a comment or a sample.
                for line in text.lines() {
                    prop_assert!(line.starts_with('#') || line.starts_with("gpumon_") || line.starts_with("DCGM_"), "{}", line);
                }
            }
        }
    }
}

#[test]
fn config_defaults_and_unknown_keys() {
    let c: PrometheusConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c, PrometheusConfig::default());
    assert_eq!(c.max_connections, 64);
    let c: PrometheusConfig = serde_json::from_str(
        r#"{"listen":"0.0.0.0:9400","naming":"dcgm","auth":{"bearer":{"token":"t"}},
            "header_read_timeout":"2s","stale_after":30,"tls":{"cert":"/c.pem","key":"/k.pem"}}"#,
    )
    .unwrap();
    assert_eq!(c.naming, Naming::Dcgm);
    assert_eq!(c.auth, Some(Auth::bearer("t")));
    assert_eq!(c.header_read_timeout, Duration::from_secs(2));
    assert_eq!(c.stale_after, Some(Duration::from_secs(30)));
    let c: PrometheusConfig = serde_json::from_str(r#"{"auth":{"basic":{"username":"u","password":"p"}}}"#).unwrap();
    assert_eq!(c.auth, Some(Auth::basic("u", "p")));
    let err = serde_json::from_str::<PrometheusConfig>(r#"{"max_conections":3}"#).unwrap_err().to_string();
    assert!(err.contains("unknown field"), "{err}");
    assert!(serde_json::from_str::<PrometheusConfig>(r#"{"naming":"dcgm-exporter"}"#).is_err());
    assert!(serde_json::from_str::<PrometheusConfig>(r#"{"auth":{"bearer":{"token":"t","x":1}}}"#).is_err());
}

#[test]
fn builder_rejects_unworkable_settings() {
    let e = |b: PrometheusSinkBuilder| b.build().unwrap_err().to_string();
    assert!(e(PrometheusSink::builder().max_connections(0)).contains("`prometheus.max_connections`"));
    assert!(e(PrometheusSink::builder().max_header_bytes(100)).contains("8192"));
    assert!(e(PrometheusSink::builder().max_header_bytes(100)).contains("`prometheus.max_header_bytes`"));
    assert!(
        e(PrometheusSink::builder().header_read_timeout(Duration::ZERO)).contains("`prometheus.header_read_timeout`")
    );
    assert!(e(PrometheusSink::builder().stale_after(Duration::ZERO)).contains("`prometheus.stale_after`"));
    assert!(e(PrometheusSink::builder().with_auth(Auth::bearer(""))).contains("`prometheus.auth.bearer.token`"));
    assert!(e(PrometheusSink::builder().with_auth(Auth::bearer(""))).contains("empty"));
    assert!(e(PrometheusSink::builder().with_auth(Auth::bearer("t"))).contains("with_http_listener"));
    assert!(e(PrometheusSink::builder().with_auth(Auth::basic("a:b", "p"))).contains("`:`"));
}

#[cfg(feature = "prometheus-http")]
#[test]
fn port_in_use_is_a_build_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let cfg = PrometheusConfig { listen: Some(addr), ..PrometheusConfig::default() };
    let err = PrometheusSink::from_config(&cfg).unwrap_err().to_string();
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

/// TLS settings are checked when the sink is built: the files (feature `prometheus-tls`), or,
/// in a build without it, the missing feature is named.
#[cfg(feature = "prometheus-http")]
#[test]
fn tls_settings_are_checked_at_build() {
    let cfg = PrometheusConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        tls: Some(TlsConfig { cert: "/nonexistent/cert.pem".into(), key: "/nonexistent/key.pem".into() }),
        ..PrometheusConfig::default()
    };
    let err = PrometheusSink::from_config(&cfg).unwrap_err().to_string();
    let expected = if cfg!(feature = "prometheus-tls") {
        "cannot read TLS certificate /nonexistent/cert.pem"
    } else {
        "prometheus-tls"
    };
    assert!(err.contains(expected), "{err}");
}

#[tokio::test]
async fn export_after_shutdown_fails() {
    let mut sink = PrometheusSink::builder().build().unwrap();
    sink.export(Arc::new(fixture())).await.unwrap();
    sink.shutdown().await.unwrap();
    sink.shutdown().await.unwrap();
    assert!(matches!(sink.export(Arc::new(fixture())).await, Err(SinkError::AlreadyShutdown)));
}

/// The dcgm mapping table in docs/prometheus.md, generated from the catalogue.
fn dcgm_table() -> String {
    let mut t = String::from(
        "| native name | type | DCGM name | DCGM value = native × | extra label |\n|---|---|---|---|---|\n",
    );
    for id in MetricId::ALL {
        let d = id.descriptor();
        let kind = match d.kind {
            gpumon_core::MetricKind::Counter => "counter",
            _ => "gauge",
        };
        let (dcgm, scale) = match d.dcgm {
            Some(x) => {
                let s = x.scale;
                let scale = if s == 1.0 {
                    "1".to_owned()
                } else if s == 100.0 {
                    "100 (ratio → %)".to_owned()
                } else if s == 1.0 / 1_048_576.0 {
                    "2⁻²⁰ (bytes → MiB)".to_owned()
                } else if s == 1e-6 {
                    "10⁻⁶ (Hz → MHz)".to_owned()
                } else if s == 1000.0 {
                    "1000 (J → mJ)".to_owned()
                } else {
                    format!("{s}")
                };
                (format!("`{}`", x.name), scale)
            }
            None => ("— (native name kept)".to_owned(), String::new()),
        };
        let label = d.label.into_iter().chain(d.labels.iter().copied()).map(|l| format!("`{l}`")).collect::<Vec<_>>();
        let label = label.join(", ");
        t.push_str(&format!("| `{}` | {kind} | {dcgm} | {scale} | {label} |\n", d.prometheus_name()));
    }
    t
}

#[test]
fn docs_dcgm_table_is_current() {
    const BEGIN: &str = "<!-- BEGIN dcgm-mapping (generated by gpumon-sinks prometheus::tests::docs_dcgm_table_is_current; GPUMON_BLESS=1 regenerates) -->\n";
    const END: &str = "<!-- END dcgm-mapping -->";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/prometheus.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("BEGIN marker in docs/prometheus.md") + BEGIN.len();
    let end = doc.find(END).expect("END marker in docs/prometheus.md");
    let table = dcgm_table();
    if doc[start..end] != table {
        if std::env::var_os("GPUMON_BLESS").is_some() {
            std::fs::write(&path, format!("{}{table}{}", &doc[..start], &doc[end..])).unwrap();
        } else {
            panic!("docs/prometheus.md's dcgm table is stale; rerun with GPUMON_BLESS=1. Expected:\n{table}");
        }
    }
}

#[test]
fn training_steps_are_exported_from_the_catalogue_with_no_rank_label_when_there_is_none() {
    let mut snap = fixture();
    snap.attach(steps(&snap.devices[..1]));
    let text = render_with(Naming::Native, Format::Text, snap.clone());
    let lines = series(&text);
    assert!(lines.contains(&"gpumon_training_step{host=\"node-1\",job=\"train\",rank=\"0\"} 42"), "{text}");
    assert!(lines.contains(&"gpumon_training_step{host=\"node-1\",job=\"solo\"} 7"), "{text}");
    assert!(lines.contains(&"gpumon_step_duration_seconds{host=\"node-1\",job=\"train\",rank=\"0\"} 1.5"), "{text}");
    let util: Vec<_> = lines.iter().filter(|l| l.starts_with("gpumon_step_utilization_ratio{")).collect();
    assert_eq!(util.len(), 1, "{text}");
    assert!(
        util[0].contains("uuid=\"GPU-aaaa\"")
            && util[0].contains("job=\"train\",rank=\"0\"")
            && util[0].ends_with(" 0.5")
    );
    assert!(lines.iter().any(|l| l.starts_with("gpumon_step_energy_joules{") && l.ends_with(" 750")));
    assert!(lines.iter().any(|l| l.starts_with("gpumon_step_memory_peak_bytes{") && l.ends_with(" 2147483648")));
    assert!(lines.contains(&"gpumon_steps_rejected_total{host=\"node-1\",reason=\"malformed\"} 3"), "{text}");
    assert!(lines.contains(&"gpumon_steps_rejected_total{host=\"node-1\",reason=\"oversized\"} 0"), "{text}");
    // dcgm naming keeps the native names of derived series.
    let text = render_with(Naming::Dcgm, Format::Text, snap);
    assert!(text.contains("\ngpumon_training_step{"), "{text}");
}

/// Every sample line of `text` (no comments).
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn simulated_and_replayed_data_is_marked_on_every_series_in_both_namings() {
    for (backend, naming) in
        [("mock", Naming::Native), ("mock", Naming::Dcgm), ("replay", Naming::Native), ("replay", Naming::Dcgm)]
    {
        let mut mock = fixture();
        let mut simulated = system();
        simulated.backend = backend.into();
        mock.system = Arc::new(simulated);
        for format in [Format::Text, Format::OpenMetrics] {
            let sink = PrometheusSink::builder().naming(naming).build().unwrap();
            sink.handle().set_telemetry(Telemetry::default());
            sink.handle().store(Arc::new(mock.clone()));
            let text = sink.handle().render(format);
            check_structure(&text, format);
            let lines = series(&text);
            // The same series as for real data, only marked.
            let real = PrometheusSink::builder().naming(naming).build().unwrap();
            real.handle().set_telemetry(Telemetry::default());
            real.handle().store(Arc::new(fixture()));
            assert_eq!(lines.len(), series(&real.handle().render(format)).len(), "{text}");
            for line in lines {
                let labels = line.split_once('{').map(|(_, rest)| rest).unwrap_or_else(|| panic!("no labels: {line}"));
                assert_eq!(
                    labels.matches(&format!("backend=\"{backend}\"")).count(),
                    1,
                    "{naming:?} {format:?}: {line}"
                );
            }
        }
    }
    // Real data is unchanged: `backend` only on the info series.
    let text = render_with(Naming::Native, Format::Text, fixture());
    let with_backend: Vec<_> = series(&text).into_iter().filter(|l| l.contains("backend=")).collect();
    assert_eq!(with_backend.len(), 2, "{text}");
    assert!(with_backend.iter().all(|l| l.starts_with("gpumon_gpu_info{") && l.contains("backend=\"nvml\"")));
}

#[test]
fn a_replay_of_the_mock_says_so_on_every_series_in_both_namings() {
    for naming in [Naming::Native, Naming::Dcgm] {
        let mut replay = fixture();
        let mut system = system();
        system.backend = "replay".into();
        system.recorded_backend = Some("mock".into());
        replay.system = Arc::new(system);
        for format in [Format::Text, Format::OpenMetrics] {
            let text = render_with(naming, format, replay.clone());
            check_structure(&text, format);
            for line in series(&text) {
                let labels = line.split_once('{').map(|(_, rest)| rest).unwrap_or_else(|| panic!("no labels: {line}"));
                assert_eq!(labels.matches("recorded_backend=\"mock\"").count(), 1, "{naming:?} {format:?}: {line}");
                assert_eq!(
                    labels.matches(",backend=\"replay\"").count()
                        + usize::from(labels.starts_with("backend=\"replay\"")),
                    1,
                    "{line}"
                );
            }
        }
    }
    // Live data never says it was recorded.
    let mut live = fixture();
    let mut system = system();
    system.recorded_backend = Some("mock".into());
    live.system = Arc::new(system);
    assert!(!render_with(Naming::Native, Format::Text, live).contains("recorded_backend"));
}

/// A backend that never loads, like NVML on a node whose driver did not load.
struct NoDriver;

impl gpumon_core::Sampler for NoDriver {
    fn name(&self) -> &str {
        "nvml"
    }

    fn sample(&self, _: &gpumon_core::SampleRequest) -> Result<Snapshot, gpumon_core::SampleError> {
        Err(gpumon_core::SampleError::unavailable("libnvidia-ml.so.1: cannot open shared object file"))
    }
}

#[tokio::test]
async fn a_failing_backend_exports_gpumon_up_0_and_no_device_series() {
    let sink = PrometheusSink::builder().build().unwrap();
    let h = sink.handle();
    let agent = gpumon_core::Agent::builder(NoDriver).scheduled(false).hostname("node-9").sink(sink).spawn().unwrap();
    // Before the first sample nothing is known: no `gpumon_up` at all.
    assert!(!h.render(Format::Text).contains("gpumon_up"));
    assert!(agent.flush(Duration::from_secs(5)).await.is_err());
    // The sink got the tick's sampling-failed snapshot: the host, and why.
    let stored = h.snapshot().expect("the failed tick reached the sink");
    assert!(stored.sampling_failure().is_some_and(|r| r.contains("libnvidia-ml.so.1")), "{stored:?}");
    assert_eq!((stored.system.hostname.as_str(), stored.system.backend.as_str()), ("node-9", "nvml"));
    for format in [Format::Text, Format::OpenMetrics] {
        let text = h.render(format);
        check_structure(&text, format);
        let lines = series(&text);
        let up: Vec<_> = lines.iter().filter(|l| l.starts_with("gpumon_up")).collect();
        assert_eq!(up, [&"gpumon_up{host=\"node-9\"} 0"], "{text}");
        assert!(lines.contains(&"gpumon_last_sample_success{host=\"node-9\"} 0"), "{text}");
        assert!(!text.contains("uuid=") && !text.contains("gpu=\""), "device series: {text}");
    }
    assert!(h.health().is_err());
    agent.shutdown(Duration::from_secs(5)).await.unwrap();

    // Without an agent's telemetry (an embedder storing snapshots, remote write's encoder) the
    // snapshot alone says it: same line, and `/health` fails with the reason.
    let h = PrometheusSink::builder().build().unwrap().handle();
    h.store(Arc::new(Snapshot::sampling_failed(Arc::new(system()), "no driver")));
    let text = h.render(Format::Text);
    assert_eq!(
        series(&text).iter().filter(|l| l.starts_with("gpumon_up")).collect::<Vec<_>>(),
        [&"gpumon_up{host=\"node-1\"} 0"]
    );
    assert_eq!(h.health(), Err("last sample failed: no driver".to_owned()));

    // With (still fresh) device series from before the failure, the line joins their family.
    let sink = PrometheusSink::builder().stale_after(Duration::from_secs(3600)).build().unwrap();
    let h = sink.handle();
    let agent = gpumon_core::Agent::builder(NoDriver).scheduled(false).sink(sink).spawn().unwrap();
    assert!(agent.flush(Duration::from_secs(5)).await.is_err());
    h.store(Arc::new(fixture().with_taken_at(SystemTime::now())));
    for format in [Format::Text, Format::OpenMetrics] {
        let text = h.render(format);
        check_structure(&text, format);
        let up: Vec<_> = series(&text).into_iter().filter(|l| l.starts_with("gpumon_up")).collect();
        assert_eq!(up.len(), 4, "{text}"); // GPU, MIG instance, lost GPU, and the backend
        assert_eq!(up[3], "gpumon_up{host=\"node-1\"} 0", "{text}");
    }
    agent.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// One GPU whose XID events cannot be watched, as the NVML backend reports it.
struct XidUnwatched;

impl gpumon_core::Sampler for XidUnwatched {
    fn name(&self) -> &str {
        "nvml"
    }

    fn sample(&self, _: &gpumon_core::SampleRequest) -> Result<Snapshot, gpumon_core::SampleError> {
        let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-aaaa", "NVIDIA H100")));
        gpu.utilization.gpu = Some(0.5);
        let reason = "XID events not monitored: nvmlDeviceRegisterEvents failed: Not Supported";
        gpu.record_failure(Family::Xid, FailureReason::Other(reason.into()));
        gpu.record_failure(Family::Xid, FailureReason::Other(reason.into()));
        Ok(Snapshot::new(Arc::new(SystemInfo::new("node-1", "nvml")), vec![gpu]))
    }
}

#[tokio::test]
async fn a_gpu_whose_xids_are_not_watched_exports_metric_failure_and_a_self_metric() {
    for (naming, device) in [
        (Naming::Native, r#"gpu="0",uuid="GPU-aaaa",host="node-1""#),
        (Naming::Dcgm, r#"gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1""#),
    ] {
        let sink = PrometheusSink::builder().naming(naming).build().unwrap();
        let h = sink.handle();
        let agent = gpumon_core::Agent::builder(XidUnwatched).scheduled(false).sink(sink).spawn().unwrap();
        agent.flush(Duration::from_secs(5)).await.unwrap();
        assert_eq!(agent.stats().metric_failures, 1, "one GPU, one family");
        for format in [Format::Text, Format::OpenMetrics] {
            let text = h.render(format);
            check_structure(&text, format);
            let lines = series(&text);
            let failures: Vec<_> = lines.iter().filter(|l| l.starts_with("gpumon_metric_failure")).collect();
            assert_eq!(failures, [&format!("gpumon_metric_failure{{{device},family=\"xid\"}} 1")], "{text}");
            let host = if naming == Naming::Native { "host" } else { "Hostname" };
            assert!(
                lines.contains(&format!("gpumon_last_sample_metric_failures{{{host}=\"node-1\"}} 1").as_str()),
                "{text}"
            );
        }
        agent.shutdown(Duration::from_secs(5)).await.unwrap();
    }
}

/// A GPU allocated to a pod, running a process of alice in a Docker container, one of root, and
/// one whose owner is unknown; a second GPU nobody is known to hold.
pub(crate) fn attributed() -> Snapshot {
    use gpumon_core::attribution::Owner;
    let owner = |f: &dyn Fn(&mut Owner)| {
        let mut o = Owner::default();
        f(&mut o);
        Arc::new(o)
    };
    let pod = owner(&|o| {
        o.namespace = Some("team-a".into());
        o.pod = Some("train-0".into());
        o.container = Some("trainer".into());
    });
    let alice = owner(&|o| {
        o.container = Some("0123456789ab".into());
        o.user = Some("alice".into());
    });
    let root = owner(&|o| o.user = Some("root".into()));
    let mut info = DeviceInfo::new(0, "GPU-aaaa", "NVIDIA H100");
    info.pci_bus_id = Some("00000000:17:00.0".into());
    let mut gpu = DeviceSample::new(Arc::new(info));
    gpu.utilization.gpu = Some(0.5);
    for (pid, owner) in [(10, Some(alice.clone())), (11, Some(root.clone())), (12, None)] {
        let mut p = ProcessSample::new(pid);
        p.memory_used = Some(1 << 30);
        p.owner = owner;
        gpu.processes.push(p);
    }
    gpu.owners = vec![pod, alice, root];
    let mut idle = DeviceSample::new(Arc::new(DeviceInfo::new(1, "GPU-bbbb", "NVIDIA H100")));
    idle.utilization.gpu = Some(0.0);
    let mut snap = Snapshot::new(Arc::new(system()), vec![gpu, idle]);
    let mut summary = gpumon_core::attribution::AttributionSummary::default();
    summary.proc_read_failures = 2;
    summary.kubelet_failures = Some(1);
    snap.attach(summary);
    snap
}

#[test]
fn owner_labels_are_on_every_device_series_and_processes_carry_their_own() {
    for format in [Format::Text, Format::OpenMetrics] {
        let text = render_with(Naming::Native, format, attributed());
        check_structure(&text, format);
        let lines = series(&text);
        let has = |line: &str| assert!(lines.contains(&line), "missing {line}\n{text}");
        let device = r#"gpu="0",uuid="GPU-aaaa",host="node-1""#;
        // alice's Docker container is not the pod's container: the GPU's container is shared.
        let owners = r#"namespace="team-a",pod="train-0",container="(shared)",user="(shared)""#;
        has(&format!("gpumon_utilization_ratio{{{device},{owners}}} 0.5"));
        has(&format!("gpumon_process_memory_used_bytes{{{device},container=\"0123456789ab\",user=\"alice\",pid=\"10\"}} 1073741824"));
        has(&format!("gpumon_process_memory_used_bytes{{{device},user=\"root\",pid=\"11\"}} 1073741824"));
        has(&format!("gpumon_process_memory_used_bytes{{{device},pid=\"12\"}} 1073741824"));
        // The info series and the other GPU: no owners, no empty labels.
        assert!(lines.iter().any(|l| l.starts_with(&format!("gpumon_gpu_info{{{device},{owners},name="))), "{text}");
        has(r#"gpumon_utilization_ratio{gpu="1",uuid="GPU-bbbb",host="node-1"} 0"#);
        assert!(!text.contains("=\"\""), "{text}");
        // The failures of each source, about the host.
        has(r#"gpumon_attribution_failures_total{host="node-1",source="proc"} 2"#);
        has(r#"gpumon_attribution_failures_total{host="node-1",source="kubelet"} 1"#);
    }
}

/// The GPU-time accounts carry the GPU's owner labels, as every device series does.
#[test]
fn accounts_carry_the_owner_labels() {
    let mut snap = attributed();
    gpumon_core::Processor::process(&mut gpumon_core::accounts::Accounts::new().0, &mut snap);
    let text = render_with(Naming::Native, Format::Text, snap);
    let lines = series(&text);
    let device = r#"gpu="0",uuid="GPU-aaaa",host="node-1""#;
    let owners = r#"namespace="team-a",pod="train-0",container="(shared)",user="(shared)""#;
    for name in ["observed", "allocated", "idle_allocated"] {
        let line = format!("gpumon_account_{name}_seconds_total{{{device},{owners}}} 0");
        assert!(lines.contains(&line.as_str()), "missing {line}\n{text}");
    }
    assert!(text.contains("# TYPE gpumon_account_observed_seconds_total counter"), "{text}");
}

#[test]
fn dcgm_naming_uses_dcgm_exporters_pod_labels_and_no_user() {
    let text = render_with(Naming::Dcgm, Format::Text, attributed());
    let lines = series(&text);
    let line = r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:17:00.0",device="nvidia0",modelName="NVIDIA H100",Hostname="node-1",DCGM_FI_DRIVER_VERSION="570.86.15",namespace="team-a",pod="train-0",container="(shared)"} 50"#;
    assert!(lines.contains(&line), "{text}");
    assert!(!text.contains("user="), "{text}");
    assert!(
        lines.iter().any(|l| l.starts_with("gpumon_process_memory_used_bytes{")
            && l.ends_with(
                r#"Hostname="node-1",DCGM_FI_DRIVER_VERSION="570.86.15",container="0123456789ab",pid="10"} 1073741824"#
            )),
        "{text}"
    );
}

#[cfg(feature = "remote-write")]
#[test]
fn owner_label_values_are_escaped_and_read_back_by_remote_write() {
    use gpumon_core::attribution::Owner;
    let mut snap = attributed();
    let mut odd = Owner::default();
    odd.namespace = Some("we\"ird\\ns\n".into());
    snap.devices[1].owners = vec![Arc::new(odd)];
    let text = render_with(Naming::Native, Format::Text, snap.clone());
    assert!(text.contains(r#"host="node-1",namespace="we\"ird\\ns\n"} 0"#), "{text}");
    let mut out = Vec::new();
    crate::remote_write::encode::Encoder::new(RenderOptions::default(), []).encode(&snap, None, &mut out);
    let req = <crate::remote_write::encode::WriteRequest as prost::Message>::decode(out.as_slice()).unwrap();
    let namespaces: Vec<_> = req
        .timeseries
        .iter()
        .filter(|t| t.label("__name__") == Some("gpumon_utilization_ratio"))
        .map(|t| t.label("namespace"))
        .collect();
    assert_eq!(namespaces, [Some("team-a"), Some("we\"ird\\ns\n")]);
}

// ---------------------------------------------------------------------------------------------
// The series layer against the exposition. The text is the scrape's contract (the goldens pin
// it); these check that the walk, and remote write's encoder on top of it, yield exactly the
// series a scrape's text parses into. The parser is the one remote write used in production
// before the series layer (render, then parse back); it stays here as the oracle only.

/// One series as data: name, labels (unescaped, sorted by name, empty values left out, as
/// remote write sends them), value.
type Parsed = (String, Vec<(String, String)>, f64);

/// Every sample line of a 0.0.4 exposition, parsed.
fn parse_exposition(text: &str) -> Vec<Parsed> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_sample_line(l).unwrap_or_else(|| panic!("unparsable sample line: {l}")))
        .collect()
}

/// One sample line as data (see [`exposition::parse_sample_line`]).
fn parse_sample_line(line: &str) -> Option<Parsed> {
    let mut labels = Vec::new();
    let (name, value) = exposition::parse_sample_line(line, &mut labels)?;
    let labels = labels.into_iter().map(|(k, v)| (k.to_owned(), v.into_owned())).collect();
    Some((name.to_owned(), normalized(labels), value))
}

fn normalized(mut labels: Vec<(String, String)>) -> Vec<(String, String)> {
    labels.retain(|(_, v)| !v.is_empty());
    labels.sort_by(|a, b| a.0.cmp(&b.0));
    labels
}

#[test]
fn the_oracle_parses_escapes_and_special_values() {
    let (name, labels, v) = parse_sample_line(r#"m{a="x\"y",b="p\\q\nr",c=""} -Inf"#).unwrap();
    assert_eq!((name.as_str(), v), ("m", f64::NEG_INFINITY));
    let want = [("a", "x\"y"), ("b", "p\\q\nr")].map(|(k, v)| (k.to_owned(), v.to_owned()));
    assert_eq!(labels, want, "unescaped, the empty value left out");
    assert_eq!(parse_sample_line("bare 1.5e-7"), Some(("bare".to_owned(), Vec::new(), 1.5e-7)));
    assert!(parse_sample_line(r#"m{a="unterminated} 1"#).is_none());
    assert!(parse_sample_line("m 1 1700000000000").is_none(), "no timestamps expected");
}

/// The series of `snapshot` as the walk yields them (labels expanded through [`Walk::labels`]).
///
/// [`Walk::labels`]: super::series::Walk::labels
fn walked(snapshot: Option<&Snapshot>, telemetry: Option<&Telemetry>, opts: &RenderOptions) -> Vec<Parsed> {
    use super::series::{walk, Family, Series, Visitor, Walk};
    struct Collect(Vec<Parsed>, usize);
    impl Visitor for Collect {
        fn family(&mut self, _: Family) {
            self.1 += 1;
        }
        fn series(&mut self, walk: &Walk<'_>, s: &Series<'_>) {
            let mut labels = Vec::new();
            walk.labels(s, |(k, v)| {
                let mut digits = itoa::Buffer::new();
                let (a, b) = v.parts(&mut digits);
                labels.push((k.to_owned(), format!("{a}{b}")));
            });
            self.0.push((s.name.to_owned(), normalized(labels), s.value.as_f64()));
        }
    }
    let mut c = Collect(Vec::new(), 0);
    walk(snapshot, telemetry, opts, &mut c);
    assert!(c.0.is_empty() || c.1 > 0, "series before any family");
    c.0
}

/// Snapshots that exercise every kind of series: MIG, a lost GPU, findings (device and host),
/// steps, owners and processes, attribution failures, every mock family, a MIG mock fleet,
/// escapes, simulated data, and a failed sample.
fn series_cases() -> Vec<(&'static str, Snapshot)> {
    use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler};
    let mut with_steps = fixture();
    with_steps.attach(steps(&with_steps.devices[..2]));
    let all_families = |profile: &str| {
        let sampler = gpumon_mock::MockSampler::from_profile_name(profile).unwrap();
        sampler.sample(&SampleRequest::new(MetricSet::everything(), DeviceFilter::all())).unwrap()
    };
    let mut info = DeviceInfo::new(0, "GPU-a", "A \"quoted\" \\ name\nwith newline");
    info.serial = Some("s\\n".into());
    let mut odd_system = SystemInfo::new("h\"ost\n", "mock");
    odd_system.driver_version = Some("5\\7".into());
    let odd = Snapshot::new(Arc::new(odd_system), vec![DeviceSample::new(Arc::new(info))]);
    let mut mock = fixture();
    let mut simulated = system();
    simulated.backend = "mock".into();
    mock.system = Arc::new(simulated);
    vec![
        ("fixture (MIG, lost GPU, findings)", fixture()),
        ("steps", with_steps),
        ("owners, processes, attribution", attributed()),
        ("mock h100x8, every family", all_families("h100x8")),
        ("mock a100x8-mig", all_families("a100x8-mig")),
        ("escapes", odd),
        ("simulated fixture", mock),
        ("sampling failed", Snapshot::sampling_failed(Arc::new(system()), "no driver")),
    ]
}

fn series_options() -> Vec<RenderOptions> {
    let dcgm = RenderOptions { naming: Naming::Dcgm, ..RenderOptions::default() };
    vec![
        RenderOptions::default(),
        RenderOptions { host_label: false, ..RenderOptions::default() },
        dcgm.clone(),
        RenderOptions { dcgm_lowercase_hostname: true, ..dcgm.clone() },
        RenderOptions { host_label: false, ..dcgm },
    ]
}

/// Telemetry: none (an embedder), a fresh agent's (no sample yet), and a failing agent's with a
/// sink (`up 0` joins the devices' family; per-sink series).
async fn series_telemetry() -> Vec<Option<Telemetry>> {
    let sink = PrometheusSink::builder().build().unwrap();
    let h = sink.handle();
    let agent = gpumon_core::Agent::builder(NoDriver).scheduled(false).sink(sink).spawn().unwrap();
    assert!(agent.flush(Duration::from_secs(5)).await.is_err());
    let failing = h.shared.telemetry.load_full().map(|t| (*t).clone()).expect("the agent attached telemetry");
    agent.shutdown(Duration::from_secs(5)).await.unwrap();
    assert!(failing.stats().sample_failures > 0 && !failing.stats().sinks.is_empty());
    vec![None, Some(Telemetry::default()), Some(failing)]
}

#[track_caller]
fn assert_same_series(want: &[Parsed], got: &[Parsed], what: &str) {
    let same = |a: &Parsed, b: &Parsed| a.0 == b.0 && a.1 == b.1 && (a.2 == b.2 || a.2.is_nan() && b.2.is_nan());
    if let Some(i) = (0..want.len().max(got.len())).find(|&i| match (want.get(i), got.get(i)) {
        (Some(a), Some(b)) => !same(a, b),
        _ => true,
    }) {
        panic!(
            "{what}: series {i} of {} (exposition) / {} (series layer) differ:\n  exposition: {:?}\n  got:        {:?}",
            want.len(),
            got.len(),
            want.get(i),
            got.get(i)
        );
    }
}

/// Every series case with every option set and telemetry, rendered as exposition text and
/// parsed: `f(what, snapshot, telemetry, options, parsed)`, `what` naming the combination.
fn for_each_exposition(
    telemetry: &[Option<Telemetry>],
    mut f: impl FnMut(&str, &Snapshot, Option<&Telemetry>, &RenderOptions, Vec<Parsed>),
) {
    for (case, snap) in series_cases() {
        for opts in series_options() {
            for tel in telemetry {
                let mut text = String::new();
                render::render(&mut text, Some(&snap), tel.as_ref(), &opts, Format::Text);
                let what = format!("{case}, {opts:?}, telemetry {}", tel.is_some());
                f(&what, &snap, tel.as_ref(), &opts, parse_exposition(&text));
            }
        }
    }
}

#[tokio::test]
async fn the_walk_yields_exactly_the_series_of_the_exposition() {
    let telemetry = series_telemetry().await;
    let mut checked = 0;
    for_each_exposition(&telemetry, |what, snap, tel, opts, want| {
        assert_same_series(&want, &walked(Some(snap), tel, opts), what);
        checked += want.len();
    });
    // No snapshot yet, and a stale one: self-metrics only.
    let stale = RenderOptions { stale_after: Some(Duration::from_secs(1)), ..RenderOptions::default() };
    for (snap, opts) in [(None, RenderOptions::default()), (Some(fixture()), stale)] {
        for tel in &telemetry {
            let mut text = String::new();
            render::render(&mut text, snap.as_ref(), tel.as_ref(), &opts, Format::Text);
            assert!(!text.contains("gpumon_utilization_ratio"), "{text}");
            assert_same_series(&parse_exposition(&text), &walked(snap.as_ref(), tel.as_ref(), &opts), "no devices");
        }
    }
    assert!(checked > 10_000, "only {checked} series compared");
}

/// What remote write sends is what a scrape shows: for every case, naming and telemetry the
/// decoded `WriteRequest` holds exactly the series the exposition text parses into, in order.
#[cfg(feature = "remote-write")]
#[tokio::test]
async fn remote_write_encodes_exactly_the_series_a_scrape_parses_into() {
    use crate::remote_write::encode::{Encoder, WriteRequest};
    let telemetry = series_telemetry().await;
    let mut checked = 0;
    for_each_exposition(&telemetry, |what, snap, tel, opts, want| {
        // External labels join every series that lacks them (the series' own wins):
        // some that no series has, one a device series has, one only the host's have.
        let external = [("cluster", "eu-1"), ("uuid", "other"), ("pod", "other"), ("Hostname", "other")];
        let with_external: Vec<Parsed> = want
            .iter()
            .map(|(name, labels, v)| {
                let mut labels = labels.clone();
                for (k, ev) in external {
                    if !labels.iter().any(|(have, _)| have == k) {
                        labels.push((k.to_owned(), ev.to_owned()));
                    }
                }
                (name.clone(), normalized(labels), *v)
            })
            .collect();
        for (external, want) in [(&[][..], &want), (&external[..], &with_external)] {
            let pairs = external.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
            let mut out = Vec::new();
            let n = Encoder::new(opts.clone(), pairs).encode(snap, tel, &mut out);
            let req = <WriteRequest as prost::Message>::decode(out.as_slice()).unwrap();
            assert_eq!(req.timeseries.len(), n);
            let got: Vec<Parsed> = req
                .timeseries
                .iter()
                .map(|t| {
                    let name = t.label("__name__").expect("__name__");
                    let labels: Vec<_> = t
                        .labels
                        .iter()
                        .filter(|l| l.name != "__name__")
                        .map(|l| (l.name.clone(), l.value.clone()))
                        .collect();
                    // On the wire, sorted byte-wise with `__name__` among them.
                    let names: Vec<&str> = t.labels.iter().map(|l| l.name.as_str()).collect();
                    assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
                    (name.to_owned(), labels, t.samples[0].value)
                })
                .collect();
            assert_same_series(want, &got, &format!("{what}, external {}", external.len()));
            checked += n;
        }
    });
    assert!(checked > 10_000, "only {checked} series compared");
}
