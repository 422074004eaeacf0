//! The extension is quiet: nothing goes to stdout or stderr. The agent's log events (tracing)
//! are handed to Python's `logging` under the logger `gpumon`, and panics on gpumon's own threads
//! become log records instead of stderr output.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Set by the `atexit` hook once every Monitor is closed: from then on the interpreter may be
/// finalizing, and no thread may try to take the GIL for a log record.
static SILENCED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Prefix of the names of every thread gpumon starts (tokio workers and blocking threads).
pub const THREAD_NAME: &str = "gpumon-worker";

/// Stops forwarding records to Python (interpreter exit).
pub fn silence() {
    SILENCED.store(true, Ordering::SeqCst);
}

/// Installs the forwarding subscriber and the panic hook, once per process, when the first
/// `Monitor` is made — not at import: the console scripts (`agent_main`) import the module too,
/// and there the agent logs to stderr after `--log`, as the binary does. A process that has
/// already set a global tracing subscriber (another Rust extension, `agent_main`) keeps its own.
pub fn install() {
    INSTALL.call_once(|| {
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
                // a message on the training job's stderr.
                tracing::error!(target: "_gpumon", "panic in a gpumon thread: {info}");
            } else {
                previous(info);
            }
        }));
    });
}

/// A `tracing` layer that calls `logging.getLogger("gpumon").log(level, message)`.
struct PythonLogging;

impl<S: Subscriber> Layer<S> for PythonLogging {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if SILENCED.load(Ordering::Relaxed) || crate::fork::generation() != 0 {
            return;
        }
        let mut text = Message::default();
        event.record(&mut text);
        let level = match *event.metadata().level() {
            Level::ERROR => 40,
            Level::WARN => 30,
            Level::INFO => 20,
            _ => 10,
        };
        // `try_attach` gives up while the interpreter is finalizing instead of blocking forever.
        let _ = Python::try_attach(|py| {
            let result = py
                .import("logging")
                .and_then(|logging| logging.call_method1("getLogger", ("gpumon",)))
                .and_then(|logger| logger.call_method1("log", (level, text.0)));
            // A broken logging configuration is not ours to report (quiet: no stderr).
            drop(result);
        });
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
