use std::io::{Cursor, Write};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::model::{DeviceSample, ProcessSample, Snapshot, SystemInfo, WindowStats};
use crate::sampler::{SampleError, SampleRequest, Sampler};
use crate::sink::SinkError;
use crate::stages::diagnose::finding::Diagnosis;

fn system() -> Arc<SystemInfo> {
    let mut s = SystemInfo::new("node-1", "nvml");
    s.driver_version = Some("570.86.15".into());
    Arc::new(s)
}

fn info(i: u32) -> Arc<DeviceInfo> {
    let mut d = DeviceInfo::new(i, format!("GPU-{i:04}"), "NVIDIA H100 80GB HBM3");
    d.memory_total_bytes = Some(80 << 30);
    Arc::new(d)
}

/// A snapshot with values that must come back bit for bit: odd floats, a window, a process.
fn snapshot(system: &Arc<SystemInfo>, infos: &[Arc<DeviceInfo>], tick: u64) -> Snapshot {
    let devices = infos
        .iter()
        .map(|i| {
            let mut d = DeviceSample::new(i.clone());
            d.utilization.gpu = Some(0.1 + (tick as f64) / 7.0 % 0.9);
            d.power.usage_watts = Some(312.123_456_789_012_3 + tick as f64);
            d.windows.gpu_utilization = WindowStats::from_values([0.01, 0.97, 1.0 / 3.0]);
            let mut p = ProcessSample::new(4242);
            p.memory_used = Some(1 << 33);
            d.processes.push(p);
            d
        })
        .collect();
    Snapshot::new(system.clone(), devices)
        .with_seq(tick)
        .with_taken_at(UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + tick * 1_000_000_000))
        .with_duration(Duration::from_micros(1234 + tick))
}

fn trace(snapshots: &[Snapshot]) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), Some(Duration::from_secs(1)));
    for s in snapshots {
        w.write(s).unwrap();
    }
    w.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> String {
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(bytes), &mut text).unwrap();
    text
}

fn read_all(bytes: Vec<u8>) -> (TraceHeader, Vec<Result<Snapshot, TraceError>>) {
    let reader = TraceReader::new(Cursor::new(bytes)).unwrap();
    let header = reader.header().clone();
    (header, reader.collect())
}

/// A plain-text trace: the header this gpumon writes, then `lines`.
fn plain(lines: &[&str]) -> Vec<u8> {
    let text = gunzip(&trace(&[snapshot(&system(), &[info(0)], 1)]));
    let header = text.lines().next().unwrap();
    let mut out = format!("{header}\n");
    for l in lines {
        out.push_str(l);
        out.push('\n');
    }
    out.into_bytes()
}

#[test]
fn a_trace_reads_back_every_snapshot_as_recorded_without_its_diagnosis() {
    let sys = system();
    let infos = [info(0), info(1)];
    let mut snaps: Vec<Snapshot> = (1..=5).map(|t| snapshot(&sys, &infos, t)).collect();
    snaps[2].attach(Diagnosis::default());
    // A sampling failure and a GPU whose identity changes (MIG re-layout, say) mid-trace.
    snaps.push(Snapshot::sampling_failed(sys.clone(), "driver gone").with_seq(5).with_taken_at(UNIX_EPOCH));
    let mut changed = DeviceInfo::clone(&infos[1]);
    changed.name = "NVIDIA H100 80GB HBM3 (changed)".into();
    let new = info(7);
    snaps.push(snapshot(&sys, &[infos[0].clone(), Arc::new(changed), new], 6));
    let mut other = SystemInfo::clone(&sys);
    other.driver_version = Some("575.1".into());
    snaps.push(snapshot(&Arc::new(other), &infos, 7));

    let bytes = trace(&snaps);
    let (header, read) = read_all(bytes.clone());
    assert_eq!((header.format.as_str(), header.version), (FORMAT, FORMAT_VERSION));
    assert_eq!(header.gpumon_version, GPUMON_VERSION);
    assert_eq!(header.interval, Some(Duration::from_secs(1)));
    assert_eq!(header.backend, "nvml");
    assert_eq!(header.system, *sys);
    assert_eq!(header.devices, vec![DeviceInfo::clone(&infos[0]), DeviceInfo::clone(&infos[1])]);
    let read: Vec<Snapshot> = read.into_iter().map(Result::unwrap).collect();
    for s in &mut snaps {
        s.outputs.remove("diagnosis");
    }
    assert_eq!(read, snaps);
    // Identities are shared between snapshots, as a backend shares them.
    assert!(Arc::ptr_eq(&read[0].devices[0].info, &read[1].devices[0].info));
    assert!(Arc::ptr_eq(&read[0].system, &read[4].system));
    // Lines leave out the identity in force: the UUID stands for a known GPU.
    let text = gunzip(&bytes);
    let line2: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    assert_eq!(line2["devices"][0]["info"], "GPU-0000");
    assert!(line2.get("system").is_none() && line2.get("diagnosis").is_none());
    assert!(!text.lines().nth(3).unwrap().contains("diagnosis"));
}

#[test]
fn an_empty_file_or_stream_is_refused() {
    for bytes in
        [Vec::new(), flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default()).finish().unwrap()]
    {
        let e = TraceReader::new(Cursor::new(bytes)).unwrap_err();
        assert!(matches!(e, TraceError::Empty), "{e}");
        assert!(e.to_string().contains("empty"), "{e}");
    }
}

#[test]
fn a_writer_that_saw_nothing_leaves_a_header_and_no_snapshots() {
    let bytes = TraceWriter::new(Vec::new(), None).finish().unwrap();
    let (header, read) = read_all(bytes);
    assert!(header.devices.is_empty() && read.is_empty());
}

#[test]
fn a_truncated_trace_yields_what_it_holds_then_names_the_line() {
    let sys = system();
    let snaps: Vec<Snapshot> = (1..=200).map(|t| snapshot(&sys, &[info(0), info(1)], t)).collect();
    let bytes = trace(&snaps);
    for cut in [bytes.len() / 2, bytes.len() - 5, 20] {
        let reader = match TraceReader::new(Cursor::new(bytes[..cut].to_vec())) {
            Ok(r) => r,
            // Cut inside the header: refused on line 1.
            Err(e) => {
                assert_eq!(e.line(), Some(1), "{e}");
                continue;
            }
        };
        let read: Vec<_> = reader.collect();
        let (last, good) = read.split_last().unwrap();
        assert!(good.iter().all(Result::is_ok));
        let e = last.as_ref().unwrap_err();
        assert!(matches!(e, TraceError::Truncated { .. } | TraceError::Corrupt { .. }), "{e}");
        let line = e.line().unwrap();
        assert_eq!(line, good.len() as u64 + 2, "{e}");
        assert!(e.to_string().starts_with(&format!("line {line}:")), "{e}");
    }
}

/// A line with no end (a corrupt or hostile trace) is refused at the limit, not read into memory
/// whole; a line just under it is still read (and then parsed, here refused as bad JSON).
#[test]
fn a_line_longer_than_the_limit_is_refused_before_it_is_read_whole() {
    let limit = usize::try_from(super::read::MAX_LINE_BYTES).unwrap();
    let long = "x".repeat(limit + 10);
    let read: Vec<_> = TraceReader::new(Cursor::new(plain(&[&long]))).unwrap().collect();
    let e = read[0].as_ref().unwrap_err();
    assert!(matches!(e, TraceError::Corrupt { line: 2, .. }) && e.to_string().contains("longer than 16 MiB"), "{e}");
    let under = "x".repeat(limit - 1);
    let read: Vec<_> = TraceReader::new(Cursor::new(plain(&[&under]))).unwrap().collect();
    let e = read[0].as_ref().unwrap_err();
    assert!(!e.to_string().contains("longer than"), "{e}");
}

#[test]
fn a_writer_killed_after_a_flush_leaves_the_flushed_snapshots_readable() {
    let sys = system();
    let mut w = TraceWriter::new(Vec::new(), None);
    for t in 1..=10 {
        w.write(&snapshot(&sys, &[info(0)], t)).unwrap();
    }
    w.flush().unwrap();
    // No `finish`: the gzip stream has no end, as after SIGKILL.
    let bytes = w.get_ref().clone();
    let read: Vec<_> = TraceReader::new(Cursor::new(bytes)).unwrap().collect();
    assert_eq!(read.iter().filter(|r| r.is_ok()).count(), 10);
    let e = read.last().unwrap().as_ref().unwrap_err();
    assert!(matches!(e, TraceError::Truncated { line: 12, .. }), "{e}");
    assert!(e.to_string().contains("line 12") && e.to_string().contains("truncated"), "{e}");
}

/// A plain trace cut mid-line (a writer killed, `head -c`): its last line stops without its
/// newline, and is called truncated, as a gzip stream that ends early is; the same bad line with
/// its newline, or followed by more lines, is corrupt. A whole last line without its newline
/// (a hand-edited trace) is still read.
#[test]
fn a_plain_trace_cut_mid_line_is_truncated_and_a_bad_line_before_others_is_corrupt() {
    let good = gunzip(&trace(&[snapshot(&system(), &[info(0)], 1), snapshot(&system(), &[info(0)], 2)]));
    let cut = good.len() - good.lines().last().unwrap().len() / 2;
    let read: Vec<_> = TraceReader::new(Cursor::new(good.as_bytes()[..cut].to_vec())).unwrap().collect();
    assert_eq!(read.len(), 2);
    assert!(read[0].is_ok());
    let e = read[1].as_ref().unwrap_err();
    assert!(matches!(e, TraceError::Truncated { line: 3, .. }), "{e}");
    let text = e.to_string();
    assert!(text.starts_with("line 3: the trace is truncated") && text.contains("without its newline"), "{text}");
    assert!(text.contains("column"), "{text}");

    // The same cut line, then a newline: a bad line, not a cut-off one.
    let read: Vec<_> = TraceReader::new(Cursor::new(format!("{}\n", &good[..cut]).into_bytes())).unwrap().collect();
    assert!(matches!(read[1].as_ref().unwrap_err(), TraceError::Corrupt { line: 3, .. }), "{:?}", read[1]);
    let line2 = good.lines().nth(1).unwrap();
    let half = &line2[..line2.len() / 2];
    let read: Vec<_> = TraceReader::new(Cursor::new(plain(&[half, line2]))).unwrap().collect();
    assert_eq!(read.len(), 1);
    assert!(matches!(read[0].as_ref().unwrap_err(), TraceError::Corrupt { line: 2, .. }), "{:?}", read[0]);

    // Whole, without its final newline: read.
    let read: Vec<_> = TraceReader::new(Cursor::new(good.trim_end().as_bytes().to_vec())).unwrap().collect();
    assert_eq!(read.len(), 2);
    assert!(read.iter().all(Result::is_ok), "{read:?}");
}

/// The header says what the recording agent sampled (families, step marks) when the writer is
/// told; a header that does not say (an older trace) reads `None`, and a family this gpumon does
/// not know (a newer writer's) is left out.
#[test]
fn the_header_says_what_was_sampled_when_the_writer_is_told() {
    use crate::metric::{Family, MetricSet};
    let recorded = MetricSet::default().with(Family::PcieThroughput).without(Family::ClockEvents);
    let mut w = TraceWriter::new(Vec::new(), Some(Duration::from_secs(1)));
    w.set_sampling(recorded, true);
    w.write(&snapshot(&system(), &[info(0)], 1)).unwrap();
    let (header, read) = read_all(w.finish().unwrap());
    assert_eq!(read.len(), 1);
    assert_eq!(header.metric_set(), Some(recorded));
    assert_eq!(header.step_marks, Some(true));
    assert!(header.metrics.as_ref().unwrap().contains(&"pcie_throughput".to_owned()), "{header:?}");

    let (header, _) = read_all(trace(&[snapshot(&system(), &[info(0)], 1)]));
    assert_eq!((header.metric_set(), header.step_marks), (None, None));
    let text = gunzip(&trace(&[snapshot(&system(), &[info(0)], 1)]));
    assert!(!text.lines().next().unwrap().contains("\"metrics\""), "not said when not known");

    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    lines[0]["metrics"] = serde_json::json!(["power", "from_the_future"]);
    let bytes: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
    let (header, _) = read_all(bytes);
    assert_eq!(header.metric_set(), Some(MetricSet::nothing().with(Family::Power)));
}

#[test]
fn a_bad_json_line_is_named_and_ends_the_trace() {
    let good = gunzip(&trace(&[snapshot(&system(), &[info(0)], 1)]));
    let line2 = good.lines().nth(1).unwrap();
    let bytes = plain(&[line2, "", r#"{"seq": 2, "taken_at": "#, line2]);
    let read: Vec<_> = TraceReader::new(Cursor::new(bytes)).unwrap().collect();
    assert_eq!(read.len(), 2, "the line after the bad one is not read");
    assert!(read[0].is_ok());
    let e = read[1].as_ref().unwrap_err();
    assert!(matches!(e, TraceError::Corrupt { line: 4, .. }), "{e}");
    let text = e.to_string();
    assert!(text.starts_with("line 4: corrupt record:") && text.contains("column"), "{text}");
    assert!(!text.contains("line 1 column"), "serde's own line number would mislead: {text}");

    for (bad, needle) in [
        (r#"{"seq": 2}"#, "taken_at"),
        ("[1, 2]", "not a JSON object"),
        (r#"{"seq": 1, "taken_at": 5, "devices": [{"info": "GPU-9999"}]}"#, "GPU-9999"),
    ] {
        let read: Vec<_> = TraceReader::new(Cursor::new(plain(&[bad]))).unwrap().collect();
        let e = read[0].as_ref().unwrap_err();
        assert!(matches!(e, TraceError::Corrupt { line: 2, .. }) && e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn another_format_version_is_refused_naming_both_versions() {
    let header = r#"{"format":"gpumon-trace","version":2,"gpumon_version":"9.9.9","future":"field"}"#;
    let e = TraceReader::new(Cursor::new(format!("{header}\n").into_bytes())).unwrap_err();
    assert!(matches!(e, TraceError::Version { found: 2, supported: FORMAT_VERSION, .. }), "{e}");
    let text = e.to_string();
    for needle in ["format version 2", "gpumon 9.9.9", &format!("gpumon {GPUMON_VERSION}"), "reads format version 1"] {
        assert!(text.contains(needle), "`{needle}` not in: {text}");
    }
}

#[test]
fn a_newer_gpumon_of_the_same_format_version_is_read_and_unknown_fields_ignored() {
    let text = gunzip(&trace(&[snapshot(&system(), &[info(0)], 1)]));
    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    lines[0]["gpumon_version"] = "7.0.0".into();
    lines[0]["added_later"] = true.into();
    lines[1]["added_later"] = 3.into();
    let bytes: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
    let (header, read) = read_all(bytes);
    assert_eq!(header.gpumon_version, "7.0.0");
    assert_eq!(read.len(), 1);
    assert!(read[0].is_ok());
}

#[test]
fn what_is_not_a_trace_is_refused_on_line_1() {
    for (text, needle) in [
        ("hello\n", "line 1: not a gpumon trace"),
        ("{\"format\":\"other\",\"version\":1}\n", "`other`"),
        ("{\"version\":1}\n", "no `format`"),
        ("{\"format\":\"gpumon-trace\"}\n", "no format `version`"),
    ] {
        let e = TraceReader::new(Cursor::new(text.as_bytes().to_vec())).unwrap_err();
        assert!(e.to_string().contains(needle), "`{needle}` not in: {e}");
        assert_eq!(e.line(), Some(1));
    }
    let e = TraceReader::new(Cursor::new(b"\x1f\x8b\x08\x00garbage".to_vec())).unwrap_err();
    assert_eq!(e.line(), Some(1), "{e}");
}

#[test]
fn the_replay_sampler_hands_out_the_recorded_snapshots_marked_as_replayed() {
    let sys = system();
    let infos = [info(0), info(1)];
    let snaps = vec![
        snapshot(&sys, &infos, 1),
        Snapshot::sampling_failed(sys.clone(), "driver gone").with_seq(1),
        snapshot(&sys, &infos, 2),
    ];
    let sampler = ReplaySampler::from_reader(TraceReader::new(Cursor::new(trace(&snaps))).unwrap());
    assert!(sampler.keeps_taken_at());
    assert_eq!(sampler.name(), "replay");
    let progress = sampler.progress();
    let request = SampleRequest::default();

    let first = sampler.sample(&request).unwrap();
    assert_eq!((first.taken_at, first.duration, first.seq), (snaps[0].taken_at, snaps[0].duration, 1));
    assert_eq!(first.devices, snaps[0].devices);
    assert_eq!(first.system.backend, "replay");
    assert!(first.system.is_replay() && first.system.marked_backend() == Some("replay"));
    // What recorded it stays said: a replay of the mock is simulated data still.
    assert_eq!(first.system.recorded_backend.as_deref(), Some(sys.backend.as_str()));
    assert_eq!(first.system.is_simulated(), sys.backend == "mock", "{:?}", sys.backend);
    assert_eq!(first.system.driver_version.as_deref(), Some("570.86.15"));
    assert!(!progress.is_finished());

    let failed = sampler.sample(&request).unwrap_err();
    assert!(failed.to_string().contains("driver gone"), "{failed}");
    let last = sampler.sample(&request).unwrap();
    assert!(Arc::ptr_eq(&first.system, &last.system), "one marked SystemInfo, shared");
    assert!(progress.is_finished(), "finished as soon as the last snapshot is handed out");
    assert_eq!(progress.played(), 3);
    assert!(progress.error().is_none());
    let after = sampler.sample(&request).unwrap_err();
    assert!(matches!(after, SampleError::Unavailable { .. }) && after.to_string().contains("ended"), "{after}");
}

#[test]
fn a_replay_stops_at_a_bad_line_and_says_which() {
    let good = gunzip(&trace(&[snapshot(&system(), &[info(0)], 1)]));
    let line2 = good.lines().nth(1).unwrap();
    let sampler = ReplaySampler::from_reader(TraceReader::new(Cursor::new(plain(&[line2, "{oops"]))).unwrap());
    let progress = sampler.progress();
    assert!(sampler.sample(&SampleRequest::default()).is_ok());
    assert!(progress.is_finished(), "the bad line was read ahead");
    assert_eq!(progress.error().unwrap().line(), Some(3));
    for _ in 0..2 {
        let e = sampler.sample(&SampleRequest::default()).unwrap_err();
        assert!(crate::error_chain(&e).contains("line 3"), "{e}");
    }
}

#[test]
fn the_record_sink_writes_a_trace_with_the_agents_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gz");
    let mut sink = RecordSink::create(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        use crate::sink::Sink;
        let sys = system();
        for t in 1..=3 {
            sink.export(Arc::new(snapshot(&sys, &[info(0)], t))).await.unwrap();
        }
        sink.flush().await.unwrap();
        sink.shutdown().await.unwrap();
        sink.shutdown().await.unwrap();
        assert!(matches!(sink.export(Arc::new(snapshot(&sys, &[info(0)], 4))).await, Err(SinkError::AlreadyShutdown)));
    });
    let read: Vec<_> = TraceReader::open(&path).unwrap().map(Result::unwrap).collect();
    assert_eq!(read.iter().map(|s| s.seq).collect::<Vec<_>>(), [1, 2, 3]);
    let e = RecordSink::create(dir.path().join("missing/t.gz")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn replay_speeds_parse_and_pace() {
    let s = |t: &str| t.parse::<ReplaySpeed>();
    assert_eq!(s("MAX"), Ok(ReplaySpeed::Max));
    assert_eq!(s("1"), Ok(ReplaySpeed::Factor(1.0)));
    assert_eq!(s("0.5"), Ok(ReplaySpeed::Factor(0.5)));
    assert_eq!(ReplaySpeed::default().pace(Duration::from_secs(2)), Some(Duration::from_secs(2)));
    assert_eq!(s("0.5").unwrap().pace(Duration::from_secs(1)), Some(Duration::from_secs(2)));
    assert_eq!(ReplaySpeed::Max.pace(Duration::from_secs(1)), None);
    for bad in ["", "fast", "-2", "inf", "NaN", "1e999"] {
        assert!(s(bad).unwrap_err().contains("max"), "{bad}");
    }
    // Positive but absurd: refused with the range (1e-300 made the pace overflow a `Duration`
    // and panic; 1e-18 slept for ever).
    for bad in ["1e-300", "5e-324", "1e-18", "0.0001", "1e7"] {
        assert!(s(bad).unwrap_err().contains("out of range"), "{bad}");
    }
    assert_eq!(s("0.001"), Ok(ReplaySpeed::Factor(0.001)));
    assert_eq!(ReplaySpeed::Factor(1e-300).pace(Duration::from_secs(1)), Some(Duration::MAX));
    assert_eq!(ReplaySpeed::Factor(2.0).to_string(), "2x");
}

#[cfg(feature = "runtime")]
#[tokio::test]
async fn an_agent_replays_a_trace_at_max_speed_with_the_recorded_times() {
    use crate::Agent;
    let sys = system();
    // Tick 6 was lost by the recording (a full queue, say): the replay keeps the gap.
    let snaps: Vec<Snapshot> = (1..=21).filter(|&t| t != 6).map(|t| snapshot(&sys, &[info(0), info(1)], t)).collect();
    let sampler = ReplaySampler::from_reader(TraceReader::new(Cursor::new(trace(&snaps))).unwrap());
    let progress = sampler.progress();
    let handle = Agent::builder(sampler)
        .interval(Duration::from_secs(1))
        .scheduled(false)
        .subscriber_capacity(64)
        .spawn()
        .unwrap();
    let mut rx = handle.subscribe();
    let started = std::time::Instant::now();
    let played = progress.play(&handle, ReplaySpeed::Max, Duration::from_secs(5)).await.unwrap();
    assert_eq!(played, 20);
    assert!(started.elapsed() < Duration::from_secs(10), "20 s of trace, not in real time");
    for want in &snaps {
        let got = rx.recv().await.unwrap();
        assert_eq!((got.seq, got.taken_at, got.duration), (want.seq, want.taken_at, want.duration));
        assert_eq!(got.system.backend, "replay");
    }
    handle.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[test]
fn writing_to_a_failing_writer_is_an_error_not_a_panic() {
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = TraceWriter::new(Full, None);
    let sys = system();
    let mut failed = false;
    for t in 1..=200 {
        failed |= w.write(&snapshot(&sys, &[info(0)], t)).is_err();
    }
    failed |= w.flush().is_err();
    assert!(failed);
}
