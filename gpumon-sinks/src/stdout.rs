//! Snapshots on a terminal or in a pipe: one human line per GPU per tick, or one JSON object per
//! snapshot.
//!
//! Human format (times are UTC; on simulated GPUs every line says `MOCK` after the time, on a
//! replayed trace `REPLAY`):
//! ```text
//! [14:03:07] GPU0 | Util: 40% | Mem: 12345/40960 MB | Temp: 45°C | Power: 78.0W | SM: 1980 MHz
//! [14:03:07] MOCK GPU1 | Util: 92% | Mem: 20480/81559 MB | Temp: 61°C | Power: 612.4W | SM: 1980 MHz
//! [14:03:07] GPU3 | LOST
//! [14:03:08] SAMPLING FAILED: GPU backend unavailable: could not load libnvidia-ml.so.1: …
//! [14:03:07] FINDING raised gpu 0 GPU-8f2… dataloader_starvation (warning): utilisation mean 31 %, min 2 % / max 96 % within the interval. Advice: raise the data loader's num_workers, …
//! [14:05:17] FINDING cleared gpu 0 GPU-8f2… dataloader_starvation after 2m 10s: utilisation mean 88 %, min 80 % / max 95 % within the interval
//! ```
//! A `SAMPLING FAILED` line replaces the GPU lines of a tick whose sample failed (a
//! sampling-failed snapshot, [`gpumon_core::SamplingState`]), with the reason.
//! A `FINDING` line is printed when the diagnosis stage raises or clears a finding (a host-level
//! one says `host` instead of `gpu N UUID`), with its evidence (for a clear: the numbers when it
//! cleared) and, when raised, the advice.
//! A `STEP` line is printed per reported training step ([`gpumon_core::steps`]): the run, the
//! step and its duration, then per GPU the step's mean (and max) utilisation, peak memory and
//! energy:
//! ```text
//! [14:03:07] STEP train rank 0 step 42 in 1.250s | GPU0 util 87% (max 99%) mem 40960 MB energy 512.0 J | GPU1 …
//! ```
//! JSON lines: each line is the [`Snapshot`] serialized with serde — the field names of
//! `gpumon_core`'s data model, timestamps as Unix nanoseconds, absent values as `null`. Parse it
//! back with `serde_json::from_str::<Snapshot>`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::sync::Arc;
//! use gpumon_core::{DeviceInfo, DeviceSample, Sink, Snapshot, SystemInfo};
//! use gpumon_sinks::stdout::{StdoutFormat, StdoutSink};
//!
//! let mut sink = StdoutSink::new(StdoutFormat::Human);
//! let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "NVIDIA H100 80GB HBM3")));
//! gpu.utilization.gpu = Some(0.4);
//! sink.export(Arc::new(Snapshot::new(Arc::new(SystemInfo::default()), vec![gpu]))).await.unwrap();
//! # }
//! ```

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use gpumon_core::{DeviceSample, InlineExport, Sink, SinkError, Snapshot};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Stdout written in place when writing it cannot block (see [`StdoutSink::new`]).
mod direct {
    /// A duplicate of the stdout descriptor, for a regular file or `/dev/null` only.
    #[cfg(unix)]
    pub(super) fn open() -> Option<std::fs::File> {
        use std::os::fd::AsFd;
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let file = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().ok()?);
        let meta = file.metadata().ok()?;
        let null = std::fs::metadata("/dev/null").ok();
        let is_null = meta.file_type().is_char_device() && null.is_some_and(|n| n.rdev() == meta.rdev());
        (meta.file_type().is_file() || is_null).then_some(file)
    }

    #[cfg(not(unix))]
    pub(super) fn open() -> Option<std::fs::File> {
        None
    }
}

/// Where the sink writes.
enum Output {
    /// Stdout as a regular file or `/dev/null`: a `write` that never waits on a reader, made in
    /// place — on the sampling thread ([`Sink::export_inline`]).
    Direct(std::fs::File),
    /// Anything else, through tokio.
    Async(Box<dyn AsyncWrite + Send + Unpin>),
}

gpumon_core::named_enum! {
    /// How the stdout sink prints a snapshot.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    #[non_exhaustive]
    pub enum StdoutFormat as "stdout format" {
        /// One human-readable line per GPU per tick.
        #[default]
        Human = "human",
        /// One JSON object per snapshot, per line.
        Json = "json",
    }
}

/// Writes snapshots to stdout (or any async writer).
pub struct StdoutSink {
    format: StdoutFormat,
    output: Output,
    /// Reused between exports so a steady state allocates nothing for formatting.
    buffer: String,
    shut_down: bool,
}

impl std::fmt::Debug for StdoutSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdoutSink").field("format", &self.format).field("shut_down", &self.shut_down).finish()
    }
}

impl StdoutSink {
    /// A sink printing to the process's stdout.
    ///
    /// When stdout is a regular file or `/dev/null` — a write that cannot wait on a reader — it
    /// is written directly, one `write` per snapshot, on the agent's sampling thread
    /// ([`Sink::exports_inline`]): a tick wakes no other thread for it. Otherwise (a terminal, a
    /// pipe, a socket, which a stalled reader can block) through `tokio::io::stdout()`, on the
    /// sink's own task, which hands every write to the blocking pool.
    pub fn new(format: StdoutFormat) -> Self {
        match direct::open() {
            Some(file) => Self::with_output(format, Output::Direct(file)),
            None => Self::with_writer(format, tokio::io::stdout()),
        }
    }

    /// A sink printing to `file`, written in place on the sampling thread as stdout is when it
    /// is a regular file. Give it a regular file or `/dev/null` only: a pipe or a terminal, which
    /// a reader can stall, would stall sampling with it (use [`StdoutSink::with_writer`]).
    pub fn with_file(format: StdoutFormat, file: std::fs::File) -> Self {
        Self::with_output(format, Output::Direct(file))
    }

    /// A sink printing to `writer`.
    pub fn with_writer(format: StdoutFormat, writer: impl AsyncWrite + Send + Unpin + 'static) -> Self {
        Self::with_output(format, Output::Async(Box::new(writer)))
    }

    fn with_output(format: StdoutFormat, output: Output) -> Self {
        Self { format, output, buffer: String::with_capacity(1024), shut_down: false }
    }

    /// The format in use.
    pub fn format(&self) -> StdoutFormat {
        self.format
    }
}

/// Formats `snapshot` into the sink's reused `buffer`, unless the sink is shut down.
fn format_checked(
    buffer: &mut String,
    format: StdoutFormat,
    shut_down: bool,
    snapshot: &Snapshot,
) -> Result<(), SinkError> {
    if shut_down {
        return Err(SinkError::AlreadyShutdown);
    }
    buffer.clear();
    format_snapshot(buffer, snapshot, format).map_err(|e| SinkError::Permanent(e.into()))
}

/// Formats one device as a human line (without the trailing newline).
pub fn format_human_line(out: &mut String, snapshot: &Snapshot, device: &DeviceSample) {
    push_clock(out, snapshot);
    let _ = write!(out, " GPU{}", device.info.index);
    if let Some(mig) = &device.info.mig {
        let _ = write!(out, "/MIG{}", mig.mig_index);
    }
    if !device.is_up() {
        out.push_str(" | LOST");
        return;
    }
    out.push_str(" | Util: ");
    match device.utilization.gpu {
        Some(u) => {
            push_fixed(out, u * 100.0, 0);
            out.push('%');
        }
        None => out.push_str("n/a"),
    }
    const MB: u64 = 1024 * 1024;
    out.push_str(" | Mem: ");
    match (device.memory.used, device.memory.total.or(device.info.memory_total_bytes)) {
        (Some(used), Some(total)) => {
            let _ = write!(out, "{}/{} MB", used / MB, total / MB);
        }
        (Some(used), None) => {
            let _ = write!(out, "{} MB", used / MB);
        }
        _ => out.push_str("n/a"),
    }
    out.push_str(" | Temp: ");
    match device.temperature.gpu {
        Some(t) => {
            push_fixed(out, t, 0);
            out.push_str("°C");
        }
        None => out.push_str("n/a"),
    }
    out.push_str(" | Power: ");
    match device.power.usage_watts {
        Some(p) => {
            push_fixed(out, p, 1);
            out.push('W');
        }
        None => out.push_str("n/a"),
    }
    if let Some(sm) = device.clocks.sm {
        out.push_str(" | SM: ");
        push_fixed(out, sm / 1e6, 0);
        out.push_str(" MHz");
    }
    if let Some(reasons) = device.clock_event_reasons.filter(|r| r.is_throttled()) {
        out.push_str(" | Throttled: ");
        for (i, name) in reasons.active_names().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(name);
        }
    }
    // Who holds it (attribution on): the pod, else the container; then the user.
    let owners = device.owner_labels();
    match (owners.namespace, owners.pod, owners.container) {
        (Some(ns), Some(pod), _) => {
            let _ = write!(out, " | Pod: {ns}/{pod}");
        }
        (None, Some(pod), _) => {
            let _ = write!(out, " | Pod: {pod}");
        }
        (Some(ns), None, _) => {
            let _ = write!(out, " | Namespace: {ns}");
        }
        (None, None, Some(container)) => {
            let _ = write!(out, " | Container: {container}");
        }
        (None, None, None) => {}
    }
    if let Some(user) = owners.user {
        let _ = write!(out, " | User: {user}");
    }
    if !device.errors.is_empty() {
        let _ = write!(out, " | {} metric error(s)", device.errors.len());
    }
}

/// Appends `x` with `decimals` (0–3) decimals, exactly as `format!("{x:.decimals$}")` would,
/// without its cost: the standard formatter expands the binary value exactly (and for many
/// values falls back to big-number arithmetic), which made these few numbers the human line's
/// largest cost. The fast path scales and rounds the value in floating point, and is taken only
/// when the result cannot differ: a finite value of sane size not within a hair of a rounding
/// tie; anything else goes to the standard formatter.
fn push_fixed(out: &mut String, x: f64, decimals: u32) {
    const SCALE: [f64; 4] = [1.0, 10.0, 100.0, 1000.0];
    let Some(&scale) = SCALE.get(decimals as usize) else {
        let _ = write!(out, "{x:.prec$}", prec = decimals as usize);
        return;
    };
    let scaled = x.abs() * scale;
    let fraction = scaled - scaled.floor();
    // The scaling may be off by half a unit in the last place: stay clear of ties by more.
    let margin = (4.0 * f64::EPSILON * scaled).max(1e-9);
    if !scaled.is_finite() || scaled >= 1e15 || (fraction - 0.5).abs() <= margin {
        let _ = write!(out, "{x:.prec$}", prec = decimals as usize);
        return;
    }
    // Below 1e15 the rounded value is an exact integer in both f64 and u64.
    let units = scaled.round() as u64;
    if x.is_sign_negative() {
        out.push('-');
    }
    let divisor = 10u64.pow(decimals);
    let _ = write!(out, "{}", units / divisor);
    if decimals > 0 {
        let _ = write!(out, ".{:0width$}", units % divisor, width = decimals as usize);
    }
}

/// `[hh:mm:ss]` of the snapshot, UTC, then `MOCK` or `REPLAY` when the data is simulated or
/// played back ([`SystemInfo::marked_backend`](gpumon_core::SystemInfo::marked_backend)): every
/// human line starts here, so none of them passes for a live reading of real GPUs.
fn push_clock(out: &mut String, snapshot: &Snapshot) {
    let secs = snapshot.taken_at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let _ = write!(out, "[{h:02}:{m:02}:{s:02}]");
    if let Some(backend) = snapshot.system.marked_backend() {
        out.push(' ');
        out.extend(backend.chars().map(|c| c.to_ascii_uppercase()));
    }
    // A replay says what recorded it: `REPLAY of MOCK` is simulated data played back.
    if let Some(recorded) = snapshot.system.marked_recorded_backend() {
        out.push_str(" of ");
        out.extend(recorded.chars().map(|c| c.to_ascii_uppercase()));
    }
}

/// Formats a whole snapshot in `format` into `out`, newline-terminated.
///
/// # Errors
/// Only if JSON serialization fails, which the data model cannot cause (non-finite floats are
/// written as `null`).
pub fn format_snapshot(out: &mut String, snapshot: &Snapshot, format: StdoutFormat) -> Result<(), serde_json::Error> {
    match format {
        StdoutFormat::Human => {
            if let Some(reason) = snapshot.sampling_failure() {
                push_clock(out, snapshot);
                out.push_str(" SAMPLING FAILED: ");
                // One line per tick, whatever the backend's message holds.
                out.extend(reason.chars().map(|c| if c.is_control() { ' ' } else { c }));
                out.push('\n');
            }
            for device in &snapshot.devices {
                format_human_line(out, snapshot, device);
                out.push('\n');
            }
            // Each stage's events, in its own words (a finding raised, a step reported).
            snapshot.visit_events(|event| {
                push_clock(out, snapshot);
                out.push(' ');
                (event.text)(out);
                out.push('\n');
            });
        }
        StdoutFormat::Json => {
            // Serialize straight into `out` (no intermediate String per snapshot): take its bytes,
            // append, and hand them back. serde_json writes only valid UTF-8, so the check below
            // never fails; on a serialization error `out` is restored to what it held before.
            let start = out.len();
            let mut bytes = std::mem::take(out).into_bytes();
            let result = serde_json::to_writer(&mut bytes, snapshot);
            if result.is_err() {
                bytes.truncate(start);
            }
            *out = String::from_utf8(bytes).unwrap_or_else(|e| {
                let mut bytes = e.into_bytes();
                bytes.truncate(start);
                String::from_utf8(bytes).unwrap_or_default()
            });
            result?;
            out.push('\n');
        }
    }
    Ok(())
}

#[async_trait::async_trait]
impl Sink for StdoutSink {
    fn name(&self) -> &str {
        "stdout"
    }

    async fn export(&mut self, snapshot: Arc<Snapshot>) -> Result<(), SinkError> {
        let Self { format, output, buffer, shut_down } = self;
        format_checked(buffer, *format, *shut_down, &snapshot)?;
        match output {
            Output::Direct(file) => std::io::Write::write_all(file, buffer.as_bytes()),
            Output::Async(writer) => writer.write_all(buffer.as_bytes()).await,
        }
        .map_err(|e| SinkError::Transient(e.into()))
    }

    fn exports_inline(&self) -> bool {
        matches!(self.output, Output::Direct(_))
    }

    fn export_inline(&mut self, snapshot: &Arc<Snapshot>) -> Result<InlineExport, SinkError> {
        let Self { format, output, buffer, shut_down } = self;
        let Output::Direct(file) = output else {
            return Err(SinkError::permanent("stdout is not a file: it is written on the sink's task"));
        };
        format_checked(buffer, *format, *shut_down, snapshot)?;
        std::io::Write::write_all(file, buffer.as_bytes()).map_err(|e| SinkError::Transient(e.into()))?;
        Ok(InlineExport::Done)
    }

    async fn flush(&mut self) -> Result<(), SinkError> {
        match &mut self.output {
            // Written at once, nothing buffered.
            Output::Direct(_) => Ok(()),
            Output::Async(writer) => writer.flush().await.map_err(|e| SinkError::Transient(e.into())),
        }
    }

    async fn shutdown(&mut self) -> Result<(), SinkError> {
        if std::mem::replace(&mut self.shut_down, true) {
            return Ok(());
        }
        match &mut self.output {
            Output::Direct(_) => Ok(()),
            Output::Async(writer) => writer.flush().await.map_err(|e| SinkError::Transient(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumon_core::{ClockEventReasons, DeviceInfo, MigInfo, SystemInfo};
    use std::time::Duration;

    fn fixed(x: f64, decimals: u32) -> String {
        let mut out = String::new();
        push_fixed(&mut out, x, decimals);
        out
    }

    #[test]
    fn fixed_point_matches_the_standard_formatter_on_awkward_values() {
        let awkward = [
            0.0,
            -0.0,
            0.25,
            0.35,
            0.5,
            1.5,
            2.5,
            -2.5,
            0.05,
            0.15,
            99.95,
            99.5,
            312.45,
            1e-9,
            -1e-9,
            1e14,
            1e15,
            1e20,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            40.4,
            78.04,
            1410.0,
        ];
        for x in awkward {
            for d in 0..=4 {
                assert_eq!(fixed(x, d), format!("{x:.prec$}", prec = d as usize), "{x:e} with {d} decimals");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn fixed_point_matches_the_standard_formatter(x in proptest::num::f64::ANY, d in 0u32..=3) {
            proptest::prop_assert_eq!(fixed(x, d), format!("{x:.prec$}", prec = d as usize));
        }

        #[test]
        fn fixed_point_matches_on_gpu_sized_values(x in -1.0e6f64..1.0e6, d in 0u32..=3) {
            proptest::prop_assert_eq!(fixed(x, d), format!("{x:.prec$}", prec = d as usize));
        }
    }

    fn snapshot() -> Snapshot {
        let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-a", "NVIDIA A100-SXM4-40GB")));
        gpu.utilization.gpu = Some(0.404);
        gpu.memory.used = Some(12345 * 1024 * 1024);
        gpu.memory.total = Some(40960 * 1024 * 1024);
        gpu.temperature.gpu = Some(45.0);
        gpu.power.usage_watts = Some(78.04);
        gpu.clocks.sm = Some(1_410_000_000.0);
        gpu.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::HW_THERMAL_SLOWDOWN));
        let mut info = DeviceInfo::new(1, "MIG-b", "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
        info.mig = Some(MigInfo::new("GPU-b", 2, 7, 0));
        let mig = DeviceSample::new(Arc::new(info));
        let lost = DeviceSample::lost(Arc::new(DeviceInfo::new(3, "GPU-d", "X")));
        Snapshot::new(Arc::new(SystemInfo::new("h", "nvml")), vec![gpu, mig, lost])
            .with_taken_at(UNIX_EPOCH + Duration::from_secs(14 * 3600 + 3 * 60 + 7))
    }

    /// Every kind of human line (GPU, LOST, FINDING, STEP, SAMPLING FAILED) of `backend`.
    fn every_human_line(backend: &str) -> Vec<String> {
        every_human_line_of(Arc::new(SystemInfo::new("h", backend)))
    }

    /// [`every_human_line`] of data from `system`.
    fn every_human_line_of(system: Arc<SystemInfo>) -> Vec<String> {
        use gpumon_core::steps::{RunSteps, StepReport, Steps};
        let mut snap = with_findings();
        snap.system = system;
        let mut run = RunSteps::new("train", Some(0));
        run.reported.push(StepReport::new(42, Duration::from_millis(1250)));
        let mut steps = Steps::default();
        steps.runs = vec![run];
        snap.attach(steps);
        let failed = Snapshot::sampling_failed(snap.system.clone(), "no driver");
        let mut out = String::new();
        format_snapshot(&mut out, &snap, StdoutFormat::Human).unwrap();
        format_snapshot(&mut out, &failed, StdoutFormat::Human).unwrap();
        out.lines().map(str::to_owned).collect()
    }

    #[test]
    fn every_human_line_of_simulated_or_replayed_data_says_so() {
        let real = every_human_line("nvml");
        assert_eq!(real.len(), 7, "{real:#?}");
        for (backend, mark) in [("mock", "MOCK"), ("replay", "REPLAY")] {
            let lines = every_human_line(backend);
            assert_eq!(lines.len(), real.len(), "{lines:#?}");
            for (line, real) in lines.iter().zip(&real) {
                // Right after the time; the mark is all that differs from the line of real GPUs.
                assert!(line.contains(&format!("] {mark} ")), "{backend}: {line}");
                assert_eq!(line.replacen(&format!("] {mark} "), "] ", 1), *real, "{backend}: {line}");
            }
        }
        assert!(real.iter().all(|l| !l.contains("MOCK") && !l.contains("REPLAY")), "{real:#?}");
    }

    #[test]
    fn every_human_line_of_a_replay_of_the_mock_says_simulated_when_recorded() {
        let real = every_human_line("nvml");
        let mut system = SystemInfo::new("h", "replay");
        system.recorded_backend = Some("mock".into());
        let lines = every_human_line_of(Arc::new(system));
        assert_eq!(lines.len(), real.len(), "{lines:#?}");
        for (line, real) in lines.iter().zip(&real) {
            assert!(line.contains("] REPLAY of MOCK "), "{line}");
            assert_eq!(line.replacen("] REPLAY of MOCK ", "] ", 1), *real, "{line}");
        }
        let mut out = String::new();
        let mut snap = snapshot();
        let mut system = SystemInfo::new("h", "replay");
        system.recorded_backend = Some("mock".into());
        snap.system = Arc::new(system);
        format_snapshot(&mut out, &snap, StdoutFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            (v["system"]["backend"].as_str(), v["system"]["recorded_backend"].as_str()),
            (Some("replay"), Some("mock"))
        );
    }

    #[test]
    fn human_lines_match_the_documented_shape() {
        let mut out = String::new();
        format_snapshot(&mut out, &snapshot(), StdoutFormat::Human).unwrap();
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(
            lines[0],
            "[14:03:07] GPU0 | Util: 40% | Mem: 12345/40960 MB | Temp: 45°C | Power: 78.0W | SM: 1410 MHz | Throttled: hw_thermal_slowdown"
        );
        assert_eq!(lines[1], "[14:03:07] GPU1/MIG2 | Util: n/a | Mem: n/a | Temp: n/a | Power: n/a");
        assert_eq!(lines[2], "[14:03:07] GPU3 | LOST");
    }

    #[test]
    fn a_failed_sample_prints_one_line_saying_why_and_round_trips_in_json() {
        let failed =
            Snapshot::sampling_failed(Arc::new(SystemInfo::new("h", "nvml")), "GPU backend unavailable:\nno driver")
                .with_taken_at(UNIX_EPOCH + Duration::from_secs(14 * 3600 + 3 * 60 + 8));
        let mut out = String::new();
        format_snapshot(&mut out, &failed, StdoutFormat::Human).unwrap();
        assert_eq!(out, "[14:03:08] SAMPLING FAILED: GPU backend unavailable: no driver\n");
        out.clear();
        format_snapshot(&mut out, &failed, StdoutFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["sampling"]["failed"]["reason"], "GPU backend unavailable:\nno driver", "{out}");
        assert_eq!(v["devices"].as_array().map(Vec::len), Some(0));
        assert_eq!(serde_json::from_str::<Snapshot>(out.trim_end()).unwrap(), failed);
        // Sampled data says nothing about sampling: the key is absent.
        out.clear();
        format_snapshot(&mut out, &snapshot(), StdoutFormat::Json).unwrap();
        assert!(!out.contains("\"sampling\""), "{out}");
    }

    #[test]
    fn human_lines_name_the_pod_or_container_and_the_user() {
        use gpumon_core::attribution::Owner;
        let mut snap = snapshot();
        let mut pod = Owner::default();
        pod.namespace = Some("team-a".into());
        pod.pod = Some("train-0".into());
        let mut alice = Owner::default();
        alice.user = Some("alice".into());
        alice.container = Some("0123456789ab".into());
        snap.devices[0].owners = vec![Arc::new(pod), Arc::new(alice.clone())];
        snap.devices[1].owners = vec![Arc::new(alice)];
        let mut out = String::new();
        format_snapshot(&mut out, &snap, StdoutFormat::Human).unwrap();
        let lines: Vec<_> = out.lines().collect();
        assert!(lines[0].ends_with(" | Throttled: hw_thermal_slowdown | Pod: team-a/train-0 | User: alice"), "{out}");
        assert!(lines[1].ends_with(" | Power: n/a | Container: 0123456789ab | User: alice"), "{out}");
        // JSON carries the owners themselves.
        out.clear();
        format_snapshot(&mut out, &snap, StdoutFormat::Json).unwrap();
        assert!(
            out.contains(
                r#""owners":[{"namespace":"team-a","pod":"train-0"},{"container":"0123456789ab","user":"alice"}]"#
            ),
            "{out}"
        );
    }

    /// `snap` as the JSON format prints it, after checking that it is one line and that it
    /// parses back to `snap`.
    fn json_round_trip(snap: &Snapshot) -> serde_json::Value {
        let mut out = String::new();
        format_snapshot(&mut out, snap, StdoutFormat::Json).unwrap();
        assert_eq!(out.lines().count(), 1, "one line, whatever the strings in it hold: {out}");
        let back: Snapshot = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(&back, snap);
        serde_json::from_str(&out).unwrap()
    }

    #[test]
    fn json_round_trips_to_the_same_snapshot() {
        let v = json_round_trip(&snapshot());
        assert_eq!(v["devices"][0]["info"]["uuid"], "GPU-a");
        assert_eq!(v["devices"][2]["state"], "lost");
        assert_eq!(v["taken_at"], 50_587_000_000_000u64);
    }

    fn with_findings() -> Snapshot {
        use gpumon_core::{Diagnosis, Finding, FindingCount, FindingEvent, FindingKind, Severity, Transition};
        let since = UNIX_EPOCH + Duration::from_secs(14 * 3600);
        let starving = Finding::new(
            FindingKind::DataloaderStarvation,
            Severity::Warning,
            Some((0, "GPU-a")),
            since,
            "utilisation mean 31 %, min 2 % / max 96 % within the interval",
            "Raise the data loader's num_workers.",
        );
        let mut cleared = Finding::new(
            FindingKind::Imbalance,
            Severity::Info,
            None,
            since,
            "GPU 0 at 90 %, GPU 1 at 85 %.",
            "Shard evenly.",
        );
        cleared.evidence.push_str(" \"quoted\"\nsecond line\n");
        let mut d = Diagnosis::default();
        d.active = Arc::from(vec![starving.clone()]);
        d.events = vec![
            FindingEvent::new(Transition::Raised, starving, None),
            FindingEvent::new(Transition::Cleared, cleared, Some(Duration::from_secs(130))),
        ];
        d.raised_total = Arc::from(vec![
            FindingCount::new(FindingKind::DataloaderStarvation, 1),
            FindingCount::new(FindingKind::Imbalance, 4),
        ]);
        let mut snap = snapshot();
        snap.attach(d);
        snap
    }

    #[test]
    fn human_prints_one_line_per_raise_and_clear() {
        let mut out = String::new();
        format_snapshot(&mut out, &with_findings(), StdoutFormat::Human).unwrap();
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 3 + 2, "{out}");
        assert_eq!(
            lines[3],
            "[14:03:07] FINDING raised gpu 0 GPU-a dataloader_starvation (warning): utilisation mean 31 %, min 2 % / max 96 % within the interval. Advice: Raise the data loader's num_workers."
        );
        assert_eq!(lines[4], "[14:03:07] FINDING cleared host imbalance after 2m 10s: GPU 0 at 90 %, GPU 1 at 85 %. \"quoted\" second line");
        // Active findings without an event print nothing more (only transitions are news).
        let mut snap = with_findings();
        let mut quiet = snap.output::<gpumon_core::Diagnosis>().unwrap().clone();
        quiet.events.clear();
        snap.attach(quiet);
        out.clear();
        format_snapshot(&mut out, &snap, StdoutFormat::Human).unwrap();
        assert_eq!(out.lines().count(), 3);
    }

    #[test]
    fn human_prints_one_line_per_reported_step() {
        use gpumon_core::steps::{DeviceStep, RunSteps, StepReport, Steps};
        let mut snap = snapshot();
        let mut run = RunSteps::new("train", Some(0));
        let mut r = StepReport::new(42, Duration::from_millis(1250));
        let mut g = DeviceStep::new("GPU-a");
        g.utilization_mean = Some(0.874);
        g.utilization_max = Some(0.99);
        g.memory_peak_bytes = Some(40960 * 1024 * 1024);
        g.energy_joules = Some(512.04);
        r.devices.push(g);
        r.devices.push(DeviceStep::new("GPU-filtered"));
        run.reported.push(r);
        let mut steps = Steps::default();
        steps.runs = vec![run, RunSteps::new("idle", None)];
        snap.attach(steps);
        let mut out = String::new();
        format_snapshot(&mut out, &snap, StdoutFormat::Human).unwrap();
        let lines: Vec<_> = out.lines().collect();
        assert_eq!(lines.len(), 3 + 1, "{out}");
        assert_eq!(
            lines[3],
            "[14:03:07] STEP train rank 0 step 42 in 1.250s | GPU0 util 87% (max 99%) mem 40960 MB energy 512.0 J"
        );
    }

    #[test]
    fn json_round_trips_a_snapshot_with_findings() {
        // One line even with a newline in the evidence.
        let v = json_round_trip(&with_findings());
        let d = &v["diagnosis"];
        assert_eq!(d["active"][0]["kind"], "dataloader_starvation");
        assert_eq!(d["active"][0]["uuid"], "GPU-a");
        assert_eq!(d["events"][1]["transition"], "cleared");
        assert_eq!(d["raised_total"][1]["raised"], 4);
    }

    #[tokio::test]
    async fn writes_to_the_writer_and_refuses_after_shutdown() {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let mut sink = StdoutSink::with_writer(StdoutFormat::Human, client);
        sink.export(Arc::new(snapshot())).await.unwrap();
        sink.shutdown().await.unwrap();
        sink.shutdown().await.unwrap();
        assert!(matches!(sink.export(Arc::new(snapshot())).await, Err(SinkError::AlreadyShutdown)));
        drop(sink);
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut server, &mut text).await.unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.starts_with("[14:03:07] GPU0 | Util: 40%"));
    }

    #[test]
    fn format_parses() {
        assert_eq!("json".parse::<StdoutFormat>(), Ok(StdoutFormat::Json));
        assert!("xml".parse::<StdoutFormat>().unwrap_err().contains("xml"));
    }
}
