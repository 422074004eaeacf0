//! The diagnosis' findings as they are raised and cleared, kept for Python: every snapshot the
//! agent publishes carries the tick's finding events (`Diagnosis::events`), and a callback that
//! reads the Monitor at its own pace (each trainer log) must see each of them once, not only those
//! of the tick it happens to read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use gpumon::core::{Diagnosis, Snapshot};

/// Events kept until Python takes them; beyond, the oldest are dropped and counted (a Monitor
/// whose findings nobody reads must not grow without bound).
const CAPACITY: usize = 1024;

/// Finding events not yet taken, each as its JSON object (`{"transition": "raised", "finding":
/// {...}, "held_for"?: ...}`, the agent's own serialization).
#[derive(Default)]
pub(super) struct FindingQueue {
    events: Mutex<VecDeque<String>>,
    dropped: AtomicU64,
}

impl FindingQueue {
    /// Keeps the finding events of `snapshot` (none without diagnosis or on most ticks).
    pub(super) fn note(&self, snapshot: &Snapshot) {
        let Some(diagnosis) = snapshot.output::<Diagnosis>() else { return };
        if diagnosis.events.is_empty() {
            return;
        }
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        for event in &diagnosis.events {
            match serde_json::to_string(event) {
                Ok(json) => {
                    if events.len() == CAPACITY {
                        events.pop_front();
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    events.push_back(json);
                }
                Err(e) => tracing::warn!(target: "_gpumon", "a finding event could not be encoded: {e}"),
            }
        }
    }

    /// Snapshots the subscriber skipped (it lagged behind the agent): their events are lost.
    pub(super) fn lagged(&self, skipped: u64) {
        self.dropped.fetch_add(skipped, Ordering::Relaxed);
    }

    /// Every event kept, oldest first, as one JSON array; the queue is left empty.
    pub(super) fn take(&self) -> String {
        let events: Vec<String> = self.events.lock().unwrap_or_else(PoisonError::into_inner).drain(..).collect();
        format!("[{}]", events.join(","))
    }

    /// Events dropped so far (the queue full, or snapshots skipped).
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
