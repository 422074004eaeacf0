//! XID errors: an NVML event set watched on a dedicated blocking thread.
//!
//! `nvmlEventSetWait` blocks, so it gets its own thread; it waits in short slices so that
//! dropping the watcher stops it promptly. Each XID is *counted* per device and code, with the
//! time it was last seen — a counter, not dcgm-exporter's sticky last-value gauge.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, EventSet, Nvml};

use crate::model::XidCount;

type Counts = HashMap<String, BTreeMap<u64, (u64, SystemTime)>>;

/// Watches XID events for every registered GPU.
pub(crate) struct XidWatcher {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<Counts>>,
    register: Sender<u32>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for XidWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XidWatcher").field("running", &self.thread.is_some()).finish()
    }
}

impl XidWatcher {
    /// Starts the thread; it registers GPUs `0..count` and later ones sent with
    /// [`XidWatcher::register`]. `None` when the thread cannot be spawned.
    pub(crate) fn start(nvml: Arc<Nvml>, poll: Duration) -> Option<XidWatcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(Counts::new()));
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gpumon-nvml-xid".into())
            .spawn({
                let (stop, counts) = (stop.clone(), counts.clone());
                move || watch(&nvml, &stop, &counts, &rx, poll)
            })
            .ok()?;
        Some(XidWatcher { stop, counts, register: tx, thread: Some(thread) })
    }

    /// Asks the thread to (re-)register GPU `index` (after it was re-discovered).
    pub(crate) fn register(&self, index: u32) {
        let _ = self.register.send(index);
    }

    /// Counts for the GPU with this UUID, by code.
    pub(crate) fn counts(&self, uuid: &str) -> Vec<XidCount> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .get(uuid)
            .map(|m| m.iter().map(|(code, (n, t))| XidCount::new(*code, *n, *t)).collect())
            .unwrap_or_default()
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Registers GPU `index` for XID events with a raw call: nvml-wrapper's `register_events` frees
/// the whole set when one device refuses, which would drop every other registration.
fn register(nvml: &Nvml, set: &EventSet<'_>, index: u32, handles: &mut HashMap<usize, String>) {
    let Ok(device) = nvml.device_by_index(index) else { return };
    let uuid = device.uuid().unwrap_or_default();
    let Ok(sym) = nvml_sym(nvml.lib().nvmlDeviceRegisterEvents.as_ref()) else { return };
    // SAFETY: both handles are live: the device from this Nvml, the set owned by the caller.
    let rc = unsafe { sym(device.handle(), EventTypes::CRITICAL_XID_ERROR.bits(), set.handle()) };
    match nvml_try(rc) {
        // SAFETY: the handle is only used as a map key, never dereferenced here.
        Ok(()) => {
            handles.insert(unsafe { device.handle() } as usize, uuid);
        }
        Err(e) => tracing::debug!(gpu = index, error = %e, "cannot watch XID events"),
    }
}

fn watch(nvml: &Nvml, stop: &AtomicBool, counts: &Mutex<Counts>, rx: &Receiver<u32>, poll: Duration) {
    let Ok(set) = nvml.create_event_set() else {
        tracing::debug!("NVML event sets unavailable; XID errors will not be counted");
        return;
    };
    let mut handles = HashMap::new();
    for i in 0..nvml.device_count().unwrap_or(0) {
        register(nvml, &set, i, &mut handles);
    }
    let poll_ms = u32::try_from(poll.as_millis()).unwrap_or(u32::MAX).max(1);
    while !stop.load(Ordering::Relaxed) {
        while let Ok(i) = rx.try_recv() {
            register(nvml, &set, i, &mut handles);
        }
        match set.wait(poll_ms) {
            Ok(ev) => {
                if let Some(XidError::Value(code)) = ev.event_data {
                    let uuid = uuid_of(&ev.device, &handles);
                    let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
                    let e = c.entry(uuid).or_default().entry(code).or_insert((0, SystemTime::now()));
                    e.0 += 1;
                    e.1 = SystemTime::now();
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::debug!(error = %e, "nvmlEventSetWait failed");
                std::thread::sleep(poll.min(Duration::from_millis(100)));
            }
        }
    }
}

fn uuid_of(device: &Device<'_>, handles: &HashMap<usize, String>) -> String {
    // SAFETY: used as a map key only.
    let h = unsafe { device.handle() } as usize;
    handles.get(&h).cloned().or_else(|| device.uuid().ok()).unwrap_or_default()
}
