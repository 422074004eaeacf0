//! A counting global allocator for the allocation guards (tests/alloc_*.rs): it counts the
//! allocations of the *current thread* only (a thread-local counter), so what other threads do
//! (the test harness, a runtime's workers) never shows up. Each test crate that includes this
//! module installs it as its `#[global_allocator]`. With it, what the guards measure alike: a
//! tick's allocations once buffers have grown ([`steady`]), and the encoders' ([`encoders`]).
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use gpumon::core::Snapshot;
use gpumon::sinks::influxdb::LineProtocolEncoder;
use gpumon::sinks::otlp::{OtlpConfig, OtlpSink, Pipeline, Protocol};
use gpumon::sinks::prometheus::{Format, PrometheusSink};
use gpumon::sinks::stdout::{format_snapshot, StdoutFormat};

pub struct Counting;

thread_local! {
    // `const` and `Copy`: no lazy initialisation and no destructor, so the allocator may use it.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot is gone while a thread is torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to `System`; counting touches only a thread-local `Cell`.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations on this thread while `f` runs.
pub fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

/// Runs `tick` over the snapshots twice to warm up (buffers grow to their steady size), then
/// returns the allocations of 3 more rounds, per tick.
pub fn steady(snaps: &[Arc<Snapshot>], mut tick: impl FnMut(&Arc<Snapshot>)) -> f64 {
    for _ in 0..2 {
        snaps.iter().for_each(&mut tick);
    }
    let n = allocations(|| {
        for _ in 0..3 {
            snaps.iter().for_each(&mut tick);
        }
    });
    n as f64 / (3 * snaps.len()) as f64
}

/// Each encoder's steady allocations per tick over `snaps`, with what it is: stdout in both
/// formats, the InfluxDB line protocol, and an OTLP request (direct pipeline).
pub fn encoders(snaps: &[Arc<Snapshot>]) -> Vec<(String, f64)> {
    let mut per_tick = Vec::new();
    for format in [StdoutFormat::Human, StdoutFormat::Json] {
        let mut buf = String::new();
        let n = steady(snaps, |s| {
            buf.clear();
            format_snapshot(&mut buf, s, format).unwrap();
        });
        per_tick.push((format!("stdout {format:?}"), n));
    }

    let encoder = LineProtocolEncoder::default();
    let mut buf = String::new();
    let n = steady(snaps, |s| {
        buf.clear();
        encoder.encode_snapshot(s, &mut buf);
    });
    per_tick.push(("InfluxDB line protocol".to_owned(), n));

    let mut cfg = OtlpConfig::new("http://127.0.0.1:9", Protocol::HttpProtobuf);
    cfg.pipeline = Some(Pipeline::Direct);
    let mut otlp = OtlpSink::from_config(&cfg).unwrap();
    let n = steady(snaps, |s| {
        assert!(otlp.encode_request(s).is_some_and(|b| !b.is_empty()));
    });
    per_tick.push(("OTLP request (direct pipeline)".to_owned(), n));
    per_tick
}

/// A Prometheus scrape's steady allocations over `snaps` (each stored, then rendered as text),
/// and the last exposition.
pub fn scrape(snaps: &[Arc<Snapshot>]) -> (f64, String) {
    let prom = PrometheusSink::builder().build().unwrap();
    let handle = prom.handle();
    let mut buf = String::new();
    let per_scrape = steady(snaps, |s| {
        handle.store(s.clone());
        buf.clear();
        handle.render_to(&mut buf, Format::Text);
    });
    (per_scrape, buf)
}
