//! XID errors: an NVML event set watched on a dedicated blocking thread.
//!
//! `nvmlEventSetWait` blocks, so it gets its own thread. It waits in long slices (the driver's
//! wait sleeps in the kernel, so the thread does not wake between ticks); dropping the watcher
//! does not wait for the slice to end unless it is short (see `Drop`). Each XID is *counted* per device and code, with the
//! time it was last seen — a counter, not dcgm-exporter's sticky last-value gauge.
//!
//! A GPU whose XID events cannot be watched (no event sets, registration refused) must not read
//! as "no XID errors": the watcher keeps why, warns once, and the sampler reports it as a
//! [`MetricFailure`](crate::MetricFailure) of [`Family::Xid`](crate::Family::Xid).

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

/// Why XID events are not watched: for every GPU, or per GPU UUID.
#[derive(Default)]
struct Unwatched {
    all: Option<String>,
    gpus: HashMap<String, String>,
}

/// Watches XID events for every registered GPU.
pub(crate) struct XidWatcher {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<Counts>>,
    unwatched: Arc<Mutex<Unwatched>>,
    register: Sender<u32>,
    thread: Option<JoinHandle<()>>,
    poll: Duration,
}

impl std::fmt::Debug for XidWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XidWatcher").field("running", &self.thread.is_some()).finish()
    }
}

impl XidWatcher {
    /// Starts the thread; it registers GPUs `0..count` and later ones sent with
    /// [`XidWatcher::register`]. Returns once the first registrations are done (or after a few
    /// seconds), so that the first sample already knows which GPUs are not watched. A thread
    /// that cannot be spawned leaves every GPU "not watched".
    pub(crate) fn start(nvml: Arc<Nvml>, poll: Duration) -> XidWatcher {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(Counts::new()));
        let unwatched = Arc::new(Mutex::new(Unwatched::default()));
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new().name("gpumon-nvml-xid".into()).spawn({
            let (stop, counts, unwatched) = (stop.clone(), counts.clone(), unwatched.clone());
            move || watch(&nvml, &stop, &counts, &unwatched, &rx, &ready_tx, poll)
        });
        let thread = match thread {
            Ok(t) => {
                let _ = ready_rx.recv_timeout(Duration::from_secs(5));
                Some(t)
            }
            Err(e) => {
                not_watched_at_all(&unwatched, format!("cannot start the XID watcher thread: {e}"));
                None
            }
        };
        XidWatcher { stop, counts, unwatched, register: tx, thread, poll }
    }

    /// Why XID events of the GPU with this UUID are not watched; `None` while they are.
    pub(crate) fn not_watched(&self, uuid: &str) -> Option<String> {
        let u = self.unwatched.lock().unwrap_or_else(|e| e.into_inner());
        u.all.clone().or_else(|| u.gpus.get(uuid).cloned())
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

/// Longest wait slice that dropping the watcher still waits for: short slices are what tests
/// use, and joining there keeps one test's NVML session from outliving it.
const JOIN_MAX_POLL: Duration = Duration::from_millis(100);

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // `nvmlEventSetWait` cannot be interrupted. Joining a long slice would hold up every
            // exit (`--once` waited ~250 ms here for nothing); the detached thread sees `stop`
            // when its wait ends and drops its reference to the library then.
            if self.poll <= JOIN_MAX_POLL {
                let _ = t.join();
            }
        }
    }
}

/// Marks every GPU "not watched" and warns (once: this happens at most once per watcher).
fn not_watched_at_all(unwatched: &Mutex<Unwatched>, reason: String) {
    tracing::warn!(%reason, "XID errors are not monitored on any GPU");
    unwatched.lock().unwrap_or_else(|e| e.into_inner()).all = Some(reason);
}

/// Registers GPU `index` for XID events with a raw call: nvml-wrapper's `register_events` frees
/// the whole set when one device refuses, which would drop every other registration. A refusal
/// marks the GPU "not watched" (warned once per GPU); a later successful registration (after
/// re-discovery) clears it.
fn register(
    nvml: &Nvml,
    set: &EventSet<'_>,
    index: u32,
    handles: &mut HashMap<usize, String>,
    unwatched: &Mutex<Unwatched>,
) {
    // A GPU that cannot be opened is reported lost by the sampler; nothing to mark here.
    let Ok(device) = nvml.device_by_index(index) else { return };
    let Ok(uuid) = device.uuid() else { return };
    let rc = match nvml_sym(nvml.lib().nvmlDeviceRegisterEvents.as_ref()) {
        // SAFETY: both handles are live: the device from this Nvml, the set owned by the caller.
        Ok(sym) => nvml_try(unsafe { sym(device.handle(), EventTypes::CRITICAL_XID_ERROR.bits(), set.handle()) }),
        Err(e) => Err(e),
    };
    let mut u = unwatched.lock().unwrap_or_else(|e| e.into_inner());
    match rc {
        Ok(()) => {
            // SAFETY: the handle is only used as a map key, never dereferenced here.
            handles.insert(unsafe { device.handle() } as usize, uuid.clone());
            u.gpus.remove(&uuid);
        }
        Err(e) => {
            let reason = format!("XID events not monitored: nvmlDeviceRegisterEvents failed: {e}");
            if u.gpus.insert(uuid.clone(), reason.clone()).is_none() {
                tracing::warn!(gpu = index, %uuid, %reason, "XID errors of this GPU are not monitored");
            }
        }
    }
}

fn watch(
    nvml: &Nvml,
    stop: &AtomicBool,
    counts: &Mutex<Counts>,
    unwatched: &Mutex<Unwatched>,
    rx: &Receiver<u32>,
    ready: &mpsc::SyncSender<()>,
    poll: Duration,
) {
    let set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(e) => {
            not_watched_at_all(unwatched, format!("XID events not monitored: nvmlEventSetCreate failed: {e}"));
            let _ = ready.try_send(());
            return;
        }
    };
    let mut handles = HashMap::new();
    for i in 0..nvml.device_count().unwrap_or(0) {
        register(nvml, &set, i, &mut handles, unwatched);
    }
    let _ = ready.try_send(());
    let poll_ms = u32::try_from(poll.as_millis()).unwrap_or(u32::MAX).max(1);
    while !stop.load(Ordering::Relaxed) {
        while let Ok(i) = rx.try_recv() {
            register(nvml, &set, i, &mut handles, unwatched);
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
