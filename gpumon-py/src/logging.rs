//! The extension is quiet: nothing goes to stdout or stderr. The agent's log events (tracing)
//! are handed to Python's `logging` under the logger `gpumon`, and panics on gpumon's own threads
//! become log records instead of stderr output.
//!
//! Records are delivered by one thread of their own ("gpumon-log"), never by the thread that
//! logged: a `logging` handler is user code, and run on one of the agent's runtime threads it
//! could call back into the Monitor (`flush()` blocks on that runtime: a panic, and the panic's
//! own log record re-entering the handler aborted the interpreter); run on the caller's thread
//! during `close()` or a Monitor's deallocation it would consume a pending exception or a
//! Ctrl-C's `KeyboardInterrupt` (Python runs signal handlers on the main thread only). The
//! Monitor's blocking calls wait for the records they caused before returning
//! ([`wait_delivered`]), so a record is in the log by the time the call that logged it returns.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Set by the `atexit` hook once every Monitor is closed: from then on the interpreter may be
/// finalizing, and no thread may try to take the GIL for a log record.
static SILENCED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();
/// The delivery thread's queue; unset until [`install`] (or when the thread could not start).
static QUEUE: OnceLock<SyncSender<Delivery>> = OnceLock::new();
/// Records dropped because the queue was full (handlers slower than the agent logs); said in
/// the log with the next record delivered.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Records waiting for delivery, at most: a handler that blocks must not make the agent's
/// memory grow. Far above what the agent logs in a second.
const QUEUE_CAPACITY: usize = 4096;
/// How long a Monitor call waits for the records it caused to be delivered.
const DELIVERY_WAIT: Duration = Duration::from_secs(2);

thread_local! {
    /// True on the delivery thread: a handler that calls the Monitor must not wait for itself.
    static ON_DELIVERY_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Prefix of the names of every thread gpumon starts (tokio workers and blocking threads).
pub const THREAD_NAME: &str = "gpumon-worker";
/// The delivery thread's name (not under [`THREAD_NAME`]: a panic there cannot be logged by
/// the thread that delivers logs, so the default hook reports it).
const DELIVERY_THREAD_NAME: &str = "gpumon-log";

enum Delivery {
    /// `logging.getLogger("gpumon").log(level, text)`.
    Record { level: u8, text: String },
    /// Answered once every record queued before it was delivered.
    Barrier(SyncSender<()>),
}

/// Stops forwarding records to Python (interpreter exit).
pub fn silence() {
    SILENCED.store(true, Ordering::SeqCst);
}

/// Installs the forwarding subscriber, its delivery thread and the panic hook, once per
/// process, when the first `Monitor` is made — not at import: the console scripts
/// (`agent_main`) import the module too, and there the agent logs to stderr after `--log`, as
/// the binary does. A process that has already set a global tracing subscriber (another Rust
/// extension, `agent_main`) keeps its own.
pub fn install() {
    INSTALL.call_once(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_CAPACITY);
        let started = std::thread::Builder::new().name(DELIVERY_THREAD_NAME.to_owned()).spawn(move || deliver(rx));
        if started.is_err() {
            // No thread for the records: the extension stays quiet rather than calling Python
            // from threads where a handler can break the interpreter.
            return;
        }
        let _ = QUEUE.set(tx);
        // gpumon's own crates at info, the libraries under them (hyper, reqwest, opentelemetry)
        // only when something is wrong.
        let targets = Targets::new()
            .with_default(LevelFilter::WARN)
            .with_target("gpumon_core", LevelFilter::INFO)
            .with_target("gpumon_sinks", LevelFilter::INFO)
            .with_target("gpumon_mock", LevelFilter::INFO)
            .with_target("_gpumon", LevelFilter::DEBUG);
        let subscriber = tracing_subscriber::registry().with(PythonLogging.with_filter(targets));
        let _ = tracing::subscriber::set_global_default(subscriber);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = std::thread::current().name().is_some_and(|n| n.starts_with(THREAD_NAME));
            if ours {
                // Caught by the agent (a sink, processor or sampler panicked): a log record, not
                // a message on the training job's stderr. Only queued: no Python code runs here.
                tracing::error!(target: "_gpumon", "panic in a gpumon thread: {info}");
            } else {
                previous(info);
            }
        }));
    });
}

/// Waits (at most [`DELIVERY_WAIT`]) until every record queued so far has been handed to
/// Python. Call it without the GIL: the delivery thread needs it. Returns at once on the
/// delivery thread itself (a handler calling the Monitor), before [`install`] and in a forked
/// child (the delivery thread exists only in the parent; a child delivers no records).
pub fn wait_delivered() {
    if ON_DELIVERY_THREAD.get() || crate::fork::generation() != 0 {
        return;
    }
    let Some(queue) = QUEUE.get() else { return };
    let until = Instant::now() + DELIVERY_WAIT;
    let (done, delivered) = std::sync::mpsc::sync_channel(1);
    let mut barrier = Delivery::Barrier(done);
    loop {
        match queue.try_send(barrier) {
            Ok(()) => break,
            Err(TrySendError::Full(back)) if Instant::now() < until => {
                barrier = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
    let _ = delivered.recv_timeout(until.saturating_duration_since(Instant::now()));
}

/// The delivery thread: hands each record to Python's `logging`, in order.
fn deliver(queue: Receiver<Delivery>) {
    ON_DELIVERY_THREAD.set(true);
    for item in queue {
        match item {
            Delivery::Barrier(done) => {
                say_dropped();
                let _ = done.try_send(());
            }
            Delivery::Record { level, text } => {
                say_dropped();
                to_python(level, text);
            }
        }
    }
}

/// Says how many records a full queue dropped since the last time (never silent loss).
fn say_dropped() {
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        to_python(
            30,
            format!("{dropped} gpumon log records dropped: the handlers of the `gpumon` logger did not keep up"),
        );
    }
}

fn to_python(level: u8, text: String) {
    if SILENCED.load(Ordering::Relaxed) || crate::fork::generation() != 0 {
        return;
    }
    // `try_attach` gives up while the interpreter is finalizing instead of blocking forever.
    let _ = Python::try_attach(|py| {
        let result = py
            .import("logging")
            .and_then(|logging| logging.call_method1("getLogger", ("gpumon",)))
            .and_then(|logger| logger.call_method1("log", (level, text)));
        // A broken logging configuration is not ours to report (quiet: no stderr).
        drop(result);
    });
}

/// A `tracing` layer that queues each event for the delivery thread, which calls
/// `logging.getLogger("gpumon").log(level, message)`.
struct PythonLogging;

impl<S: Subscriber> Layer<S> for PythonLogging {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if SILENCED.load(Ordering::Relaxed) || crate::fork::generation() != 0 {
            return;
        }
        let Some(queue) = QUEUE.get() else { return };
        let mut text = Message::default();
        event.record(&mut text);
        let level = match *event.metadata().level() {
            Level::ERROR => 40,
            Level::WARN => 30,
            Level::INFO => 20,
            _ => 10,
        };
        if let Err(TrySendError::Full(_)) = queue.try_send(Delivery::Record { level, text: text.0 }) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The event's message followed by its fields as `key=value`.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}{}{rest}", if rest.is_empty() { "" } else { " " });
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value}", field.name());
        }
    }
}
