//! InfluxDB line protocol and an HTTP writer for InfluxDB 1.x/2.x and VictoriaMetrics.
//!
//! - feature `influxdb`: the encoder only — [`LineProtocolEncoder`], [`encode_snapshot`] and the
//!   [`escape`] rules. No HTTP, no extra dependencies.
//! - feature `influxdb-http`: [`InfluxSink`], configured by [`InfluxConfig`]: batching, gzip,
//!   retry with backoff, a bounded outage buffer and an optional spill directory.
//!
//! # Schema
//!
//! One **wide line per GPU per snapshot** in the measurement `gpu` (configurable), with one field
//! per metric, plus one line per label value for the labelled families:
//!
//! | measurement | extra tag | fields | lines per GPU and snapshot |
//! |---|---|---|---|
//! | `gpu` | — | every unlabelled metric | 1 |
//! | `gpu` | — (host tags only) | `up` = `0i` | one per snapshot whose sample failed (no driver, say), instead of the GPUs' lines |
//! | `gpu_status` | `family` | `metric_failure` = `1i` (the family could not be read; `xid`: XID events not monitored) | one per failed family |
//! | `gpu_xid` | `xid` (code) | `xid_errors`, `xid_last_seen_timestamp` | one per XID code seen |
//! | `gpu_processes` | `pid` | `process_memory_used`, `process_sm_utilization`, … | one per process (opt-in family) |
//! | `gpu_clock_events` | `reason` | `clock_event_active` (0/1) | one per reason (9) |
//! | `gpu_diagnosis` | `kind`, `severity` | `finding_active` (1 while a finding holds) | one per active finding |
//! | `gpu_diagnosis` | `kind` (host tags only) | `findings_raised` (counter) | one per host and kind raised so far |
//! | `gpu_finding` | `kind`, `severity` | `active` (1i raised / 0i cleared), `evidence`, `advice` (strings), `held_for_seconds` (on clear) | one per finding raised or cleared at this snapshot |
//! | `gpu_steps` | `job`, `rank` | `step_utilization`, `step_utilization_max`, `step_memory_peak`, `step_energy` (last reported step) | one per training run while it is tracked |
//! | `gpu_steps` | `job`, `rank` (host tags only) | `training_step`, `step_duration` | one per training run |
//! | `gpu_steps` | `reason` (host tags only) | `steps_rejected` (counter) | 5, with a steps socket |
//! | `gpu_processes` | `source` (host tags only) | `attribution_failures` (counter) | 1–2, with attribution on |
//! | `gpu_step` | `job`, `rank` | `step` (integer), `duration_seconds`, `utilization_mean`, `utilization_max`, `memory_peak_bytes`, `energy_joules` | one per training step reported at this snapshot (`gpumon_core::steps`) |
//!
//! A run without a rank has no `rank` tag. Derived series (findings, training steps) come from the catalogue like the rest
//! ([`Snapshot::visit_derived`](gpumon_core::Snapshot::visit_derived)): measurement
//! `<measurement>_<Family::name()>`, the device's tags — or, for a point about the host (a
//! host-level finding, the raised counter), only `host` — then the descriptor's
//! [`labels`](gpumon_core::Descriptor::labels) as tags. Finding *events* go to
//! `<measurement>_finding` (the GPU's tags like every line about it — only `host` for a
//! host-level finding — then `kind`, `severity`), so annotations and "what happened when" queries need no state:
//! `SELECT * FROM gpu_finding WHERE time > now() - 1d`. Line breaks in evidence and advice are written as
//! spaces (one point per line).
//!
//! Measurement names of labelled families are `<measurement>_<Family::name()>`; the tag key is
//! the catalogue's [`Descriptor::label`](gpumon_core::Descriptor::label); **field keys are the
//! catalogue's canonical [`Descriptor::name`](gpumon_core::Descriptor::name)** (`utilization`,
//! `memory_used`, `temperature`, `power_usage`, `energy`, …), in base units: ratios in
//! `0.0..=1.0`, bytes, °C, watts, joules, hertz, seconds. Nothing here spells a metric name.
//!
//! Why separate measurements for labelled families rather than an `xid`/`pid`/`reason` tag on
//! `gpu`: the `gpu` series stay exactly one per GPU (its wide line carries ~50 fields in
//! one point), `SHOW FIELD KEYS FROM gpu` lists only per-GPU metrics, and the high-churn `pid` tag
//! cannot blow up the cardinality of the main measurement — it can be dropped or kept on its own
//! (`DROP MEASUREMENT gpu_processes`).
//!
//! **Tags** on every line, keys in sorted order (the order InfluxDB indexes fastest):
//!
//! | tag | value | when |
//! |---|---|---|
//! | `container` | the GPU's owners' container, merged (`(shared)` where they disagree) | attribution on and known |
//! | `gpu` | NVML index (for a MIG instance: its parent's) | always |
//! | `host` | [`SystemInfo::hostname`](gpumon_core::SystemInfo::hostname) | unless empty |
//! | `mig`, `mig_ci`, `mig_gi` | MIG device index, compute and GPU instance ids | MIG instances |
//! | `mig_profile` | e.g. `1g.10gb` | MIG, when known |
//! | `name` | product name | unless empty |
//! | `namespace`, `pod`, `user` | the GPU's owners, merged like `container` | attribution on and known |
//! | `recorded_backend` | what recorded a replayed trace (`mock`: simulated when recorded), beside `backend=replay` | replays ([`SystemInfo::marked_recorded_backend`](gpumon_core::SystemInfo::marked_recorded_backend)) |
//! | `uuid` | `GPU-…` / `MIG-…` | unless empty |
//!
//! A `gpu_processes` line carries its own process's owner tags instead of the GPU's (see
//! `docs/attribution.md`).
//!
//! plus any `tags` from the configuration. Empty tag values are left out (line protocol cannot
//! express them).
//!
//! **Field types.** Integer values ([`Value::Int`](gpumon_core::Value::Int): bytes, counters, the
//! P-state, 0/1 flags such as `up`) are written as signed integers (`42i`) — InfluxDB 1.x has no
//! unsigned type (`u` is a parse error on 1.6), and the rare value above `i64::MAX` saturates.
//! Everything else is a float (shortest round-trip decimal). The catalogue has no boolean values:
//! flags stay `0i`/`1i`, so `mean(up)` is an availability ratio; booleans (`true`/`false`) and
//! string fields are supported by the escaping layer for callers that need them. NaN and
//! infinities are not valid in line protocol and are left out (a line left with no field is not
//! written). Every field keeps one type forever, so no write ever hits a type conflict.
//!
//! **Timestamps** are [`Snapshot::timestamp_nanos`](gpumon_core::Snapshot::timestamp_nanos)
//! (`precision=ns`): every line of one snapshot has the same timestamp.
//!
//! **Escaping** (see [`escape`]): commas, spaces and equals signs are backslash-escaped where line
//! protocol needs it, string fields escape `"` and `\`. InfluxDB 1.x and VictoriaMetrics/InfluxDB
//! 2+ read backslashes in identifiers differently, so a backslash that would precede another
//! backslash, a separator or the end of a tag value is written as `/`; **control characters —
//! newline, carriage return, tab — in tag values, tag keys, field keys and measurement names
//! become a space** (a newline ends a line, and no dialect has an escape for it).
//! [`escape::stored_identifier`] tells what the server will store. Example: a GPU named
//! `"A,B=C \"D\" \\E\nF"` is stored with `name` = `A,B=C "D" \E F`.
//!
//! # Delivery (feature `influxdb-http`)
//!
//! - `export` encodes the snapshot into the open batch and returns at once; it never waits for
//!   the network. A background task seals a batch when it reaches `batch_points` lines or its
//!   first line is `batch_interval` old (an export that comes about `batch_interval` or more after
//!   the previous one is sealed at once: it would be sent alone anyway), and sends batches **one at
//!   a time, in order**, each request's body the batch itself (no copy).
//! - Network errors, timeouts, HTTP 408, 429 and 5xx are retried with exponential backoff and full
//!   jitter (`retry_initial` doubling up to `retry_max`); a `Retry-After` (seconds) is honoured.
//! - HTTP 401, 403 and 404 (bad credentials, database or bucket not found) are not retried at
//!   backoff pace: the data is kept and the writer tries again only every `retry_max` (30 s), so a
//!   misconfiguration costs two requests a minute, not a storm.
//! - Other 4xx (400 `partial write`/`unable to parse`, 413, 422): the batch is refused for good;
//!   it is dropped and counted in [`InfluxStats::lines_rejected`].
//! - While writes fail, `export` returns the failure (with the server's message, e.g.
//!   `POST http://…/write: HTTP 401 Unauthorized: authorization failed (120 lines buffered)`) so it
//!   shows in [`SinkStatus::last_error`](gpumon_core::SinkStatus::last_error); the writer logs each
//!   *distinct* failure once at `warn` (repeats at `debug`) and the recovery once at `info`.
//! - The buffer (open + queued + in-flight batches) is bounded by `buffer_max_points` lines and
//!   `buffer_max_bytes`; when a new snapshot would exceed either, whole batches are dropped,
//!   **oldest first**, and counted in [`InfluxStats::lines_dropped`] and, through the agent's
//!   telemetry, in the sink's [`SinkStatus::dropped`](gpumon_core::SinkStatus::dropped) (in lines).
//! - With `spill_dir`, batches that **could not be written** go to `<seq>-<lines>.lp` files in that
//!   directory (temp file + rename; no fsync: it survives a process restart, not a power cut):
//!   while writes fail, every queued batch is spilled (so a crash mid-outage loses little); while
//!   they succeed nothing touches the disk. `shutdown` — or dropping the sink without it — spills
//!   everything still buffered. A spill file is deleted once its batch is acknowledged (or
//!   dropped). File I/O runs on tokio's blocking pool, never under the lock `export` takes (only
//!   `Drop` and [`InfluxSink::from_config`] do plain blocking I/O). `from_config` queues the files
//!   a previous run left, oldest first, ahead of new data; a file that cannot be read or does not
//!   hold the lines its name says is renamed to `*.bad`, logged and counted in
//!   [`InfluxStats::spill_quarantined`], and the sink starts anyway. The spill holds the same data
//!   as the memory buffer, so the same bounds apply.
//! - `flush` and `shutdown` seal the open batch and wait until everything is acknowledged, or
//!   return the failure of the first attempt that fails meanwhile (the data stays buffered and, with
//!   a spill directory, on disk). The agent bounds both calls with its export timeout. A flush
//!   tries at once even while the writer is in its own backoff, **but not while a wait the server
//!   asked for is running** (a `Retry-After`, or the `retry_max` pause after 401/403/404): then it
//!   sends nothing and returns at once with the last failure and when the next attempt is due
//!   (`… not retried before the next attempt in 27.4s: the server asked to wait (Retry-After) (120
//!   lines buffered)`), so repeated flushes — or a shutdown — cannot hammer a server that said to
//!   back off.
//! - The server's error text is read from at most the first 4 KiB of the response body.
//! - Delivery is at-least-once: a batch whose response was lost is sent again. That is harmless
//!   with InfluxDB, where a point is identified by measurement, tag set and timestamp, so a
//!   repeated point overwrites itself.

pub mod escape;

mod encode;
pub use encode::{encode_snapshot, Encoded, LineProtocolEncoder, DEFAULT_MEASUREMENT};

#[cfg(feature = "influxdb-http")]
mod config;
#[cfg(feature = "influxdb-http")]
mod sink;

#[cfg(feature = "influxdb-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "influxdb-http")))]
pub use crate::duration::parse_duration;
#[cfg(feature = "influxdb-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "influxdb-http")))]
pub use config::{ApiVersion, InfluxConfig};
#[cfg(feature = "influxdb-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "influxdb-http")))]
pub use sink::{InfluxSink, InfluxStats, InfluxStatsHandle};

#[cfg(test)]
mod tests {
    use super::*;
    use gpumon_core::{
        ClockEventReasons, DeviceInfo, DeviceSample, MigInfo, ProcessSample, Snapshot, SystemInfo, XidCount,
    };
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    fn snapshot() -> Snapshot {
        let mut info = DeviceInfo::new(3, "MIG-abc", "NVIDIA A100, \"80GB\"");
        let mut mig = MigInfo::new("GPU-parent", 1, 2, 0);
        mig.profile = Some("1g.10gb".into());
        info.mig = Some(mig);
        let mut d = DeviceSample::new(Arc::new(info));
        d.utilization.gpu = Some(0.5);
        d.memory.used = Some(1 << 30);
        d.memory.total = Some(4 << 30);
        d.power.usage_watts = Some(f64::NAN);
        d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
        d.xid_errors.push(XidCount::new(79, 2, UNIX_EPOCH + Duration::from_secs(5)));
        let mut p = ProcessSample::new(4242);
        p.memory_used = Some(1000);
        p.sm_utilization = Some(0.25);
        d.processes.push(p);
        Snapshot::new(Arc::new(SystemInfo::new("node 1", "test")), vec![d])
            .with_taken_at(UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789))
    }

    #[test]
    fn encodes_the_documented_schema() {
        let mut out = String::new();
        let n = encode_snapshot(&snapshot(), &mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(n.lines, lines.len());
        assert_eq!(lines.len(), 1 + 9 + 1 + 1, "{out}");
        let tags = r#"gpu=3,host=node\ 1,mig=1,mig_ci=0,mig_gi=2,mig_profile=1g.10gb,name=NVIDIA\ A100\,\ "80GB",uuid=MIG-abc"#;
        assert_eq!(
            lines[0],
            format!(
                "gpu,{tags} up=1i,utilization=0.5,memory_used=1073741824i,memory_total=4294967296i,memory_used_ratio=0.25,clock_event_reasons=4i 1700000000123456789"
            )
        );
        assert_eq!(
            lines[1],
            format!("gpu_clock_events,{tags},reason=gpu_idle clock_event_active=0i 1700000000123456789")
        );
        assert!(
            lines[3].starts_with("gpu_clock_events,") && lines[3].contains("reason=sw_power_cap clock_event_active=1i")
        );
        assert_eq!(
            lines[10],
            format!("gpu_xid,{tags},xid=79 xid_errors=2i,xid_last_seen_timestamp=5 1700000000123456789")
        );
        assert_eq!(
            lines[11],
            format!("gpu_processes,{tags},pid=4242 process_memory_used=1000i,process_sm_utilization=0.25 1700000000123456789")
        );
        assert_eq!(n.fields, 6 + 9 + 2 + 2);
    }

    #[test]
    fn owner_tags_sort_in_and_processes_carry_their_own() {
        use gpumon_core::attribution::Owner;
        let mut snap = snapshot();
        let mut pod = Owner::default();
        pod.namespace = Some("team a".into());
        pod.pod = Some("train-0".into());
        pod.container = Some("trainer".into());
        let mut proc_owner = Owner::default();
        proc_owner.user = Some("alice".into());
        proc_owner.container = Some("0123456789ab".into());
        let d = &mut snap.devices[0];
        d.processes[0].owner = Some(Arc::new(proc_owner));
        d.owners = vec![Arc::new(pod), d.processes[0].owner.clone().unwrap()];
        let mut summary = gpumon_core::attribution::AttributionSummary::default();
        summary.proc_read_failures = 4;
        snap.attach(summary);
        let mut out = String::new();
        encode_snapshot(&snap, &mut out);
        let lines: Vec<&str> = out.lines().collect();
        let mig = r#"mig=1,mig_ci=0,mig_gi=2,mig_profile=1g.10gb,name=NVIDIA\ A100\,\ "80GB""#;
        assert!(
            lines[0].starts_with(&format!(
                r"gpu,container=(shared),gpu=3,host=node\ 1,{mig},namespace=team\ a,pod=train-0,user=alice,uuid=MIG-abc up=1i,"
            )),
            "{out}"
        );
        // Every other labelled line carries the device's tags, owners included.
        let device_tags = format!(
            r",container=(shared),gpu=3,host=node\ 1,{mig},namespace=team\ a,pod=train-0,user=alice,uuid=MIG-abc,"
        );
        for measurement in ["gpu_clock_events", "gpu_xid"] {
            let labelled: Vec<_> = lines.iter().filter(|l| l.starts_with(&format!("{measurement},"))).collect();
            assert!(!labelled.is_empty(), "no {measurement} line in {out}");
            for line in labelled {
                assert!(line.starts_with(&format!("{measurement}{device_tags}")), "{line}");
            }
        }
        let process = lines.iter().find(|l| l.starts_with("gpu_processes,")).unwrap();
        assert_eq!(
            *process,
            format!(
                r"gpu_processes,container=0123456789ab,gpu=3,host=node\ 1,{mig},user=alice,uuid=MIG-abc,pid=4242 process_memory_used=1000i,process_sm_utilization=0.25 1700000000123456789"
            )
        );
        assert!(
            lines.contains(&r"gpu_processes,host=node\ 1,source=proc attribution_failures=4i 1700000000123456789"),
            "{out}"
        );
        // Without attribution, no owner tag at all.
        out.clear();
        encode_snapshot(&snapshot(), &mut out);
        for key in ["container=", "namespace=", "pod=", "user=", "source="] {
            assert!(!out.contains(key), "{key} in {out}");
        }
    }

    #[test]
    fn measurement_and_extra_tags_are_configurable() {
        let enc = LineProtocolEncoder::new("nv gpu").with_tag("cluster", "eu,1");
        let mut out = String::new();
        enc.encode_snapshot(&snapshot(), &mut out);
        assert!(out.starts_with(r"nv\ gpu,gpu=3,"), "{out}");
        assert!(out.lines().all(|l| l.contains(r",cluster=eu\,1")), "{out}");
        assert!(out.contains("\nnv\\ gpu_xid,"));
    }

    fn with_findings() -> Snapshot {
        use gpumon_core::{Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, Severity, Transition};
        let since = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let oom = Finding::new(
            FindingKind::NearOom,
            Severity::Warning,
            Some((3, "MIG-abc")),
            since,
            "memory 97 % used \"rising\"\nC:\\",
            "Reduce the batch size.",
        );
        let imbalance = Finding::new(FindingKind::Imbalance, Severity::Info, None, since, "GPU 0 idle", "Shard.");
        let filtered =
            Finding::new(FindingKind::HardwareErrors, Severity::Critical, Some((9, "GPU-gone")), since, "x", "y");
        let mut d = Diagnosis::default();
        d.active = Arc::from(vec![oom.clone(), filtered.clone()]);
        d.events = vec![
            FindingEvent::new(Transition::Raised, oom, None),
            FindingEvent::new(Transition::Cleared, imbalance, Some(Duration::from_millis(130_500))),
            FindingEvent::new(Transition::Raised, filtered, None),
        ];
        d.raised_total = Arc::from(vec![FindingCount::new(FindingKind::NearOom, 2)]);
        let mut snap = snapshot();
        snap.attach(d);
        snap
    }

    #[test]
    fn findings_are_written_as_derived_series_and_events() {
        let mut out = String::new();
        let n = encode_snapshot(&with_findings(), &mut out);
        let lines: Vec<&str> = out.lines().collect();
        // 12 device points, 2 derived, 2 events, one per line even though one event's evidence
        // holds a newline (the buffer counts points by newlines).
        assert_eq!(n.lines, 12 + 2 + 2);
        assert_eq!(lines.len(), n.lines, "{out}");
        let tags = r#"gpu=3,host=node\ 1,mig=1,mig_ci=0,mig_gi=2,mig_profile=1g.10gb,name=NVIDIA\ A100\,\ "80GB",uuid=MIG-abc"#;
        let ts = "1700000000123456789";
        // Derived series, from the catalogue: device tags or the host alone, then their labels.
        assert_eq!(lines[12], format!("gpu_diagnosis,{tags},kind=near_oom,severity=warning finding_active=1i {ts}"));
        assert_eq!(lines[13], format!(r"gpu_diagnosis,host=node\ 1,kind=near_oom findings_raised=2i {ts}"));
        // Events: one point per raise and clear; the filtered GPU's is skipped.
        assert_eq!(
            lines[14],
            format!(
                r#"gpu_finding,{tags},kind=near_oom,severity=warning active=1i,advice="Reduce the batch size.",evidence="memory 97 % used \"rising\" C:\\" {ts}"#
            )
        );
        let clear = out.split('\n').find(|l| l.starts_with("gpu_finding,host=")).unwrap();
        assert_eq!(
            clear,
            format!(
                r#"gpu_finding,host=node\ 1,kind=imbalance,severity=info active=0i,advice="Shard.",evidence="GPU 0 idle",held_for_seconds=130.5 {ts}"#
            )
        );
        assert_eq!(n.fields, 6 + 9 + 2 + 2 + 2 + 3 + 4);
        // A configured measurement renames both, extra tags land on both.
        let enc = LineProtocolEncoder::new("nv").with_tag("cluster", "eu");
        out.clear();
        enc.encode_snapshot(&with_findings(), &mut out);
        assert!(out.contains("\nnv_diagnosis,host=node\\ 1,cluster=eu,kind=near_oom findings_raised=2i "), "{out}");
        assert!(out.contains("\nnv_finding,host=node\\ 1,cluster=eu,kind=imbalance,severity=info active=0i"), "{out}");
        assert_eq!(LineProtocolEncoder::event_measurement_name("nv", "finding"), "nv_finding");
    }

    #[test]
    fn reported_steps_are_one_gpu_step_point_each() {
        use gpumon_core::steps::{DeviceStep, RunSteps, StepReport, Steps};
        let mut snap = snapshot();
        let mut run = RunSteps::new("train", Some(1));
        for (step, util) in [(41, 0.5), (42, 0.75)] {
            let mut r = StepReport::new(step, Duration::from_millis(250));
            let mut g = DeviceStep::new("MIG-abc");
            g.utilization_mean = Some(util);
            g.memory_peak_bytes = Some(1024);
            r.devices.push(g);
            // A GPU the snapshot does not carry: skipped.
            r.devices.push(DeviceStep::new("GPU-gone"));
            run.reported.push(r);
        }
        run.last_step = Some(42);
        let solo = RunSteps::new("solo", None);
        let mut steps = Steps::default();
        steps.runs = vec![run, solo];
        snap.attach(steps);
        let mut out = String::new();
        LineProtocolEncoder::default().encode_events(&snap, &mut out);
        let lines: Vec<&str> = out.lines().collect();
        let tags = r#"gpu=3,host=node\ 1,mig=1,mig_ci=0,mig_gi=2,mig_profile=1g.10gb,name=NVIDIA\ A100\,\ "80GB",uuid=MIG-abc"#;
        assert_eq!(
            lines,
            vec![
                // Two steps at one tick: a nanosecond apart so that neither overwrites the other.
                format!("gpu_step,{tags},job=train,rank=1 step=41i,duration_seconds=0.25,utilization_mean=0.5,memory_peak_bytes=1024i 1700000000123456788"),
                format!("gpu_step,{tags},job=train,rank=1 step=42i,duration_seconds=0.25,utilization_mean=0.75,memory_peak_bytes=1024i 1700000000123456789"),
            ]
        );
        // The derived series go to gpu_steps; a run without a rank has no rank tag.
        out.clear();
        encode_snapshot(&snap, &mut out);
        assert!(out.contains("\ngpu_steps,host=node\\ 1,job=train,rank=1 training_step=42i "), "{out}");
        assert_eq!(LineProtocolEncoder::event_measurement_name("nv", "step"), "nv_step");
    }

    #[test]
    fn simulated_and_replayed_data_is_tagged_on_every_line_and_real_data_is_not() {
        for mark in ["mock", "replay"] {
            let mut mock = snapshot();
            mock.system = Arc::new(SystemInfo::new("node 1", mark));
            let mut out = String::new();
            let n = encode_snapshot(&mock, &mut out);
            assert_eq!(n.lines, 12, "{out}");
            for line in out.lines() {
                let (measurement, rest) = line.split_once(',').expect("tags");
                assert!(rest.starts_with(&format!("backend={mark},gpu=3,")), "{measurement}: {line}");
                // Parsed by an independent line-protocol parser: one `backend` tag, the mark.
                let parsed = influxdb_line_protocol::parse_lines(line).next().unwrap().unwrap();
                let backend: Vec<_> = parsed.series.tag_set.iter().flatten().filter(|(k, _)| *k == "backend").collect();
                assert_eq!(backend.len(), 1, "{line}");
                assert_eq!(backend[0].1.to_string(), mark);
            }
        }
        let mut real = snapshot();
        real.system = Arc::new(SystemInfo::new("node 1", "nvml"));
        let mut out = String::new();
        encode_snapshot(&real, &mut out);
        assert!(!out.contains("backend"), "{out}");
    }

    #[test]
    fn a_replay_of_the_mock_is_tagged_replayed_and_recorded_on_the_mock_on_every_line() {
        let mut replay = snapshot();
        let mut system = SystemInfo::new("node 1", "replay");
        system.recorded_backend = Some("mock".into());
        replay.system = Arc::new(system);
        let mut out = String::new();
        let n = encode_snapshot(&replay, &mut out);
        assert_eq!(n.lines, 12, "{out}");
        for line in out.lines() {
            let parsed = influxdb_line_protocol::parse_lines(line).next().unwrap().unwrap();
            let tag = |key: &str| -> Vec<String> {
                parsed.series.tag_set.iter().flatten().filter(|(k, _)| *k == key).map(|(_, v)| v.to_string()).collect()
            };
            assert_eq!(tag("backend"), ["replay"], "{line}");
            assert_eq!(tag("recorded_backend"), ["mock"], "{line}");
            // The device's tags stay in sorted order (a series' own labels, such as `reason`,
            // follow them, as for live data).
            let keys: Vec<String> = parsed.series.tag_set.iter().flatten().map(|(k, _)| k.to_string()).collect();
            let device_tags = &keys[..keys.iter().position(|k| k == "uuid").map_or(keys.len(), |i| i + 1)];
            assert!(device_tags.windows(2).all(|w| w[0] < w[1]), "tag keys stay sorted: {line}");
        }
        // A replay whose recording backend is unknown says only that it is a replay.
        replay.system = Arc::new(SystemInfo::new("node 1", "replay"));
        out.clear();
        encode_snapshot(&replay, &mut out);
        assert!(!out.contains("recorded_backend"), "{out}");
    }

    #[test]
    fn lost_device_writes_only_up() {
        let d = DeviceSample::lost(Arc::new(DeviceInfo::new(0, "GPU-x", "X")));
        let s = Snapshot::new(Arc::new(SystemInfo::new("h", "t")), vec![d])
            .with_taken_at(UNIX_EPOCH + Duration::from_secs(1));
        let mut out = String::new();
        encode_snapshot(&s, &mut out);
        assert_eq!(out, "gpu,gpu=0,host=h,name=X,uuid=GPU-x up=0i 1000000000\n");
    }

    #[test]
    fn a_failed_sample_writes_up_0_for_the_host_and_nothing_per_device() {
        let at = UNIX_EPOCH + Duration::from_secs(1);
        let failed = Snapshot::sampling_failed(Arc::new(SystemInfo::new("node 1", "nvml")), "NVML unavailable")
            .with_taken_at(at);
        let mut out = String::new();
        let n = encode_snapshot(&failed, &mut out);
        assert_eq!(out, "gpu,host=node\\ 1 up=0i 1000000000\n");
        assert_eq!((n.lines, n.fields), (1, 1));
        // Simulated data stays marked, even when it fails.
        let mock = Snapshot::sampling_failed(Arc::new(SystemInfo::new("h", "mock")), "x").with_taken_at(at);
        let mut out = String::new();
        encode_snapshot(&mock, &mut out);
        assert_eq!(out, "gpu,backend=mock,host=h up=0i 1000000000\n");
    }

    #[test]
    fn a_family_that_cannot_be_read_is_written_once_as_metric_failure() {
        use gpumon_core::{FailureReason, Family};
        let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(1, "GPU-y", "Y")));
        d.record_failure(Family::Xid, FailureReason::Other("XID events not monitored".into()));
        d.record_failure(Family::Ecc, FailureReason::NoPermission);
        d.record_failure(Family::Ecc, FailureReason::Timeout);
        let s = Snapshot::new(Arc::new(SystemInfo::new("h", "nvml")), vec![d])
            .with_taken_at(UNIX_EPOCH + Duration::from_secs(1));
        let mut out = String::new();
        encode_snapshot(&s, &mut out);
        let tags = "gpu=1,host=h,name=Y,uuid=GPU-y";
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                format!("gpu,{tags} up=1i 1000000000"),
                format!("gpu_status,{tags},family=xid metric_failure=1i 1000000000"),
                format!("gpu_status,{tags},family=ecc metric_failure=1i 1000000000"),
            ]
        );
    }
}
