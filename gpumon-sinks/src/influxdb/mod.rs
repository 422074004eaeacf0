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
//! per metric, plus one line per label value for the three labelled families:
//!
//! | measurement | extra tag | fields | lines per GPU and snapshot |
//! |---|---|---|---|
//! | `gpu` | — | every unlabelled metric | 1 |
//! | `gpu_xid` | `xid` (code) | `xid_errors`, `xid_last_seen_timestamp` | one per XID code seen |
//! | `gpu_processes` | `pid` | `process_memory_used`, `process_sm_utilization`, … | one per process (opt-in family) |
//! | `gpu_clock_events` | `reason` | `clock_event_active` (0/1) | one per reason (9) |
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
//! | `gpu` | NVML index (for a MIG instance: its parent's) | always |
//! | `host` | [`SystemInfo::hostname`](gpumon_core::SystemInfo::hostname) | unless empty |
//! | `mig`, `mig_ci`, `mig_gi` | MIG device index, compute and GPU instance ids | MIG instances |
//! | `mig_profile` | e.g. `1g.10gb` | MIG, when known |
//! | `name` | product name | unless empty |
//! | `uuid` | `GPU-…` / `MIG-…` | unless empty |
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
//!   first line is `batch_interval` old, and sends batches **one at a time, in order**.
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
mod buffer;
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
    fn measurement_and_extra_tags_are_configurable() {
        let enc = LineProtocolEncoder::new("nv gpu").with_tag("cluster", "eu,1");
        let mut out = String::new();
        enc.encode_snapshot(&snapshot(), &mut out);
        assert!(out.starts_with(r"nv\ gpu,gpu=3,"), "{out}");
        assert!(out.lines().all(|l| l.contains(r",cluster=eu\,1")), "{out}");
        assert!(out.contains("\nnv\\ gpu_xid,"));
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
}
