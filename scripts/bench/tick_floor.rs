//! The floor of a tick on this machine: a program that does nothing but wake on schedule.
//!
//! `tick_floor <interval_ms> <samples> <threads>` sleeps to each tick on a fixed grid (like the
//! agent and the pynvml loop) and writes one short line to stdout per tick. With `threads = 1`
//! the sleeping thread writes (the pynvml loop's shape: one wake per tick); with `threads = 2` it
//! hands the tick to a second thread that writes (the agent's shape: the sampling thread, then
//! the runtime). Its CPU, measured like the others by scripts/bench-peers.sh, is what waking
//! costs here — on a KVM guest mostly the kernel's context switch — before any work is done.
//! Built by bench-peers.sh with plain `rustc -O`; no dependencies.
use std::io::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().expect("numbers")).collect();
    let (interval, samples, threads) = match args[..] {
        [i, n, t] => (Duration::from_millis(i), n, t),
        _ => panic!("usage: tick_floor <interval_ms> <samples> <threads>"),
    };
    let write = |n: u64| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "tick {n}");
    };
    let start = Instant::now();
    let (tx, rx) = mpsc::channel::<u64>();
    let writer = (threads > 1).then(|| std::thread::spawn(move || rx.iter().for_each(write)));
    for n in 0..samples {
        let due = start + interval * n as u32;
        if let Some(left) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        if writer.is_some() {
            tx.send(n).expect("writer alive");
        } else {
            write(n);
        }
    }
    drop(tx);
    if let Some(w) = writer {
        w.join().expect("writer");
    }
    // The sample count, as the other programs report it (bench-peers.sh reads it).
    eprintln!("samples={samples}");
}
