//! What the web view holds: the latest snapshot, a bounded history of chart values, and the live
//! clients with their bounded queues.
//!
//! With tenants, every reader has a scope: `None` (everything) or `Some(i)`, the `i`-th tenant
//! of the configuration. A tenant's snapshot is [scoped](Snapshot::scoped_to) on request; its
//! history holds only the GPUs it held at each tick (recorded per point); its live events are
//! rendered once per tick and tenant and sent only to that tenant's clients.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bytes::Bytes;
use gpumon_core::attribution::TenantSelector;
use gpumon_core::{DeviceInfo, DeviceSample, Snapshot, Telemetry};
use tokio::sync::{mpsc, Notify};

use super::page;
use crate::http::shares::{Holder, Lease, Refused, Shares};

/// The charted values, in this order in every history point (units as the page shows them).
pub(crate) const FIELDS: [(&str, &str); 5] =
    [("util", "%"), ("mem", "GiB"), ("power", "W"), ("temp", "°C"), ("sm_clock", "MHz")];

/// One tick's charted values.
struct Point {
    /// Seconds since the Unix epoch.
    t: f64,
    gpus: Vec<(Arc<DeviceInfo>, [Option<f64>; 5])>,
    /// Which tenants held each GPU at this tick: [`Hub::words`] words per GPU, bit `i % 64` of
    /// word `i / 64` for tenant `i`. Empty without tenants.
    held: Vec<u64>,
}

fn values(d: &DeviceSample) -> [Option<f64>; 5] {
    [
        d.utilization.gpu.map(|r| r * 100.0),
        d.memory.used.map(|b| b as f64 / f64::from(1u32 << 30)),
        d.power.usage_watts,
        d.temperature.gpu,
        d.clocks.sm.map(|hz| hz / 1e6),
    ]
}

/// A live client's end: what `/api/stream` sends.
pub(crate) struct Client {
    pub(crate) rx: mpsc::Receiver<Bytes>,
    pub(crate) close: Arc<Notify>,
    /// Its events are gzip-compressed (the stream starts with the gzip header).
    pub(crate) gzip: bool,
}

struct Sender {
    tx: mpsc::Sender<Bytes>,
    close: Arc<Notify>,
    /// Whose view it streams (`None`: everything).
    scope: Option<usize>,
    /// Its slot among its credential's share; given back when the client is dropped.
    _lease: Lease,
    /// Whether it gets the events gzip-compressed ([`Event::gzip`]).
    gzip: bool,
}

/// One tick's live event for one view: the Server-Sent Event as text and the same as a deflate
/// segment of a gzip stream ([`page::deflate_segment`]), each made once and shared by every
/// client of the view. The segment is made only when a client takes gzip: deflating is most of
/// an event's cost, and curl or a script reading the stream plainly should not pay for it.
#[derive(Clone)]
pub(crate) struct Event {
    plain: Bytes,
    gzip: Arc<OnceLock<Bytes>>,
}

impl Event {
    fn new(plain: Bytes) -> Self {
        Self { plain, gzip: Arc::default() }
    }

    /// The deflate segment, made on first use and shared by every clone.
    fn gzip(&self) -> &Bytes {
        self.gzip.get_or_init(|| page::deflate_segment(&self.plain))
    }

    /// Whether the deflate segment has been made (tests).
    #[cfg(test)]
    fn deflated(&self) -> bool {
        self.gzip.get().is_some()
    }

    fn for_client(&self, gzip: bool) -> Bytes {
        if gzip {
            self.gzip().clone()
        } else {
            self.plain.clone()
        }
    }
}

#[derive(Default)]
struct Inner {
    latest: Option<Arc<Snapshot>>,
    /// The latest event of the unscoped view, as sent to live clients (a new client gets it
    /// first). Tenants' events are never kept here.
    latest_event: Option<Event>,
    history: VecDeque<Point>,
    clients: Vec<Sender>,
}

/// Shared between the sink (writer) and the HTTP handler (readers).
pub(crate) struct Hub {
    pub(crate) name: &'static str,
    /// The live-stream slots (`max_clients`), shared between the admin and the tenants.
    shares: Shares,
    client_buffer: usize,
    history: usize,
    inner: Mutex<Inner>,
    clients: AtomicUsize,
    /// How many of `clients` take gzip: the tick deflates its events, outside the lock, only then.
    gzip_clients: AtomicUsize,
    dropped: AtomicU64,
    telemetry: OnceLock<Telemetry>,
    /// The tenants' selectors, in configuration order.
    tenants: Vec<TenantSelector>,
}

impl Hub {
    pub(crate) fn new(max_clients: usize, client_buffer: usize, history: usize, tenants: Vec<TenantSelector>) -> Self {
        Self {
            name: "web",
            shares: Shares::new(max_clients, tenants.len()),
            client_buffer,
            history,
            inner: Mutex::default(),
            clients: AtomicUsize::new(0),
            gzip_clients: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            telemetry: OnceLock::new(),
            tenants,
        }
    }

    /// Publishes how many clients there are, and how many take gzip, for the next tick's look
    /// without the lock.
    fn count_clients(&self, inner: &Inner) {
        self.gzip_clients.store(inner.clients.iter().filter(|c| c.gzip).count(), Ordering::Release);
        self.clients.store(inner.clients.len(), Ordering::Release);
    }

    /// Bitset words per GPU in [`Point::held`].
    fn words(&self) -> usize {
        self.tenants.len().div_ceil(64)
    }

    /// `snapshot` as `scope` may see it; `held`, when the caller has it, is every tenant's
    /// [`TenantSelector::held_devices`] of `snapshot`, in configuration order.
    fn view(&self, snapshot: &Arc<Snapshot>, scope: Option<usize>, held: Option<&[Vec<bool>]>) -> Arc<Snapshot> {
        match scope {
            None => snapshot.clone(),
            Some(i) => Arc::new(match (self.tenants.get(i), held.and_then(|h| h.get(i))) {
                (Some(tenant), Some(held)) => snapshot.scoped_to_held(tenant, held),
                (Some(tenant), None) => snapshot.scoped_to(tenant),
                // Not a tenant of this hub (cannot happen: scopes come from the same
                // configuration); show nothing rather than everything.
                (None, _) => Snapshot::new(snapshot.system.clone(), Vec::new()).with_taken_at(snapshot.taken_at),
            }),
        }
    }

    /// The live event of `snapshot` for `scope`; `held` as for [`Hub::view`].
    fn event_for(&self, snapshot: &Arc<Snapshot>, scope: Option<usize>, held: Option<&[Vec<bool>]>) -> Event {
        let t = snapshot.timestamp_nanos() as f64 / 1e9;
        Event::new(event(&self.view(snapshot, scope, held), t))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_telemetry(&self, telemetry: Telemetry) {
        let _ = self.telemetry.set(telemetry);
    }

    pub(crate) fn live_clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    pub(crate) fn dropped_clients(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The latest snapshot as `scope` may see it.
    pub(crate) fn latest_for(&self, scope: Option<usize>) -> Option<Arc<Snapshot>> {
        let latest = self.inner().latest.clone()?;
        Some(self.view(&latest, scope, None))
    }

    /// Takes a snapshot in: history point, latest, and one event to every live client (rendered
    /// once per scope that has clients). Never waits: a client whose queue is full is
    /// disconnected and counted.
    pub(crate) fn publish(&self, snapshot: Arc<Snapshot>) {
        let t = snapshot.timestamp_nanos() as f64 / 1e9;
        // Which GPUs each tenant holds: once per tick, for the history and for every view.
        let held_now: Vec<Vec<bool>> = self.tenants.iter().map(|tenant| tenant.held_devices(&snapshot)).collect();
        // Serialise outside the lock, and only for the views someone listens to.
        let mut events: Vec<(Option<usize>, Event)> = Vec::new();
        if self.clients.load(Ordering::Acquire) > 0 {
            let mut scopes: Vec<Option<usize>> = if self.tenants.is_empty() {
                vec![None]
            } else {
                self.inner().clients.iter().map(|c| c.scope).collect()
            };
            scopes.sort_unstable();
            scopes.dedup();
            events = scopes.into_iter().map(|s| (s, self.event_for(&snapshot, s, Some(&held_now)))).collect();
        }
        if self.gzip_clients.load(Ordering::Acquire) > 0 {
            // Deflate outside the lock too (a client that takes gzip and arrives later deflates
            // its first event itself).
            for (_, event) in &events {
                event.gzip();
            }
        }
        let words = self.words();
        let mut inner = self.inner();
        // Clients that subscribed since the look above must not miss this tick.
        for scope in inner.clients.iter().map(|c| c.scope) {
            if !events.iter().any(|(s, _)| *s == scope) {
                events.push((scope, self.event_for(&snapshot, scope, Some(&held_now))));
            }
        }
        // Reuse the oldest point's vectors once the ring is full: no allocation per tick.
        let (mut gpus, mut held) = if inner.history.len() >= self.history {
            inner.history.pop_front().map(|p| (p.gpus, p.held)).unwrap_or_default()
        } else {
            (Vec::with_capacity(snapshot.devices.len()), Vec::new())
        };
        gpus.clear();
        gpus.extend(snapshot.devices.iter().map(|d| (d.info.clone(), values(d))));
        held.clear();
        held.resize(snapshot.devices.len() * words, 0);
        for (tenant, devices) in held_now.iter().enumerate() {
            for (gpu, _) in devices.iter().enumerate().filter(|(_, &h)| h) {
                held[gpu * words + tenant / 64] |= 1 << (tenant % 64);
            }
        }
        inner.history.push_back(Point { t, gpus, held });
        inner.latest = Some(snapshot);
        inner.latest_event = events.iter().find(|(s, _)| s.is_none()).map(|(_, e)| e.clone());
        if events.is_empty() {
            return;
        }
        let mut dropped = 0u64;
        inner.clients.retain(|c| {
            let Some((_, event)) = events.iter().find(|(s, _)| *s == c.scope) else { return true };
            match c.tx.try_send(event.for_client(c.gzip)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Too slow: close its connection now, so neither its queue nor the socket's
                    // buffers hold memory any longer. Its EventSource reconnects when it can.
                    c.close.notify_one();
                    dropped += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        self.count_clients(&inner);
        drop(inner);
        if dropped > 0 {
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
            if let Some(t) = self.telemetry.get() {
                t.record_dropped(self.name, dropped);
            }
            tracing::warn!(clients = dropped, "web view: live client too slow, disconnected");
        }
    }

    /// A new live client of `scope`'s view, or why not: `max_clients` are connected, or the
    /// scope's credential holds its share of them ([`Shares`]).
    pub(crate) fn subscribe_as(&self, scope: Option<usize>) -> Result<Client, Refused> {
        self.subscribe_with(scope, false)
    }

    /// [`Hub::subscribe_as`], the events gzip-compressed when `gzip` (the stream then starts
    /// with the gzip header; see [`page`]).
    pub(crate) fn subscribe_with(&self, scope: Option<usize>, gzip: bool) -> Result<Client, Refused> {
        let mut inner = self.inner();
        // Clients that went away give their slots back first.
        inner.clients.retain(|c| !c.tx.is_closed());
        let lease = match self.shares.take(Holder::of(scope)) {
            Ok(lease) => lease,
            Err(refused) => {
                self.count_clients(&inner);
                return Err(refused);
            }
        };
        // Room for the two greeting messages on top of the client's own buffer.
        let (tx, rx) = mpsc::channel(self.client_buffer + 2);
        let close = Arc::new(Notify::new());
        let retry = b"retry: 2000\n\n";
        let _ = tx.try_send(if gzip {
            let mut first = page::GZIP_HEADER.to_vec();
            first.extend_from_slice(&page::deflate_segment(retry));
            Bytes::from(first)
        } else {
            Bytes::from_static(retry)
        });
        let first = match (scope, &inner.latest_event, &inner.latest) {
            (None, Some(e), _) => Some(e.clone()),
            (_, _, Some(s)) => Some(self.event_for(s, scope, None)),
            (_, _, None) => None,
        };
        if let Some(first) = first {
            let _ = tx.try_send(first.for_client(gzip));
        }
        inner.clients.push(Sender { tx, close: close.clone(), scope, gzip, _lease: lease });
        self.count_clients(&inner);
        Ok(Client { rx, close, gzip })
    }

    /// `/api/history`: the points of the last `seconds` (before the latest point), JSON; for a
    /// tenant, each point holds only the GPUs the tenant held at that tick.
    pub(crate) fn history_json_for(&self, seconds: f64, scope: Option<usize>) -> String {
        let words = self.words();
        let held_by = |p: &Point, gpu: usize| match scope {
            None => true,
            Some(i) => p.held.get(gpu * words + i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0),
        };
        let inner = self.inner();
        let newest = inner.history.back().map_or(0.0, |p| p.t);
        let mut out = String::with_capacity(256 + inner.history.len() * 64);
        out.push_str("{\"fields\":[");
        for (i, (name, unit)) in FIELDS.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(out, "{sep}{{\"name\":\"{name}\",\"unit\":\"{unit}\"}}");
        }
        out.push_str("],\"points\":[");
        let mut first = true;
        for p in inner.history.iter().filter(|p| p.t >= newest - seconds) {
            if !first {
                out.push(',');
            }
            first = false;
            let gpus = p.gpus.iter().enumerate().filter(|(g, _)| held_by(p, *g));
            write_point(&mut out, p.t, gpus.map(|(_, (i, v))| (i.uuid.as_str(), v)));
        }
        out.push_str("]}");
        out
    }
}

fn write_point<'a>(out: &mut String, t: f64, gpus: impl Iterator<Item = (&'a str, &'a [Option<f64>; 5])>) {
    let _ = write!(out, "{{\"t\":{t:.3},\"gpus\":{{");
    for (i, (uuid, v)) in gpus.enumerate() {
        if i > 0 {
            out.push(',');
        }
        // UUIDs come from the driver (or a mock profile): escape them like any other string.
        out.push_str(&serde_json::to_string(uuid).unwrap_or_else(|_| "\"\"".to_owned()));
        out.push_str(":[");
        for (j, x) in v.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            match x {
                Some(x) if x.is_finite() => {
                    let _ = write!(out, "{}", (x * 1000.0).round() / 1000.0);
                }
                _ => out.push_str("null"),
            }
        }
        out.push(']');
    }
    out.push_str("}}");
}

/// One Server-Sent Event: `{"point":…,"snapshot":…}` on a single `data:` line (JSON has no raw
/// newlines); the snapshot as the page draws it ([`page::PageSnapshot`]).
fn event(snapshot: &Snapshot, t: f64) -> Bytes {
    let mut out = String::with_capacity(8 * 1024);
    out.push_str("event: snapshot\ndata: {\"point\":");
    let vals: Vec<[Option<f64>; 5]> = snapshot.devices.iter().map(values).collect();
    write_point(&mut out, t, snapshot.devices.iter().map(|d| d.info.uuid.as_str()).zip(vals.iter()));
    out.push_str(",\"snapshot\":");
    match serde_json::to_string(&page::PageSnapshot(snapshot)) {
        Ok(json) => out.push_str(&json),
        Err(e) => {
            tracing::warn!(error = %e, "web view: cannot serialise a snapshot");
            out.push_str("null");
        }
    }
    out.push_str("}\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use gpumon_core::SystemInfo;

    use super::*;

    fn snapshot(seq: u64) -> Arc<Snapshot> {
        let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-0000", "Test GPU")));
        d.utilization.gpu = Some(0.5);
        Arc::new(Snapshot::new(Arc::new(SystemInfo::new("node-1", "mock")), vec![d]).with_seq(seq))
    }

    fn latest_deflated(hub: &Hub) -> bool {
        hub.inner().latest_event.as_ref().expect("an event for the live client").deflated()
    }

    #[test]
    fn events_are_deflated_only_when_a_client_takes_gzip() {
        let hub = Hub::new(8, 4, 10, Vec::new());
        let mut plain = hub.subscribe_with(None, false).unwrap();
        hub.publish(snapshot(1));
        assert!(!latest_deflated(&hub), "no client takes gzip: nothing deflated");
        // A gzip client arriving now gets the latest event deflated, and every later one is
        // deflated on the tick (before the lock), once for every gzip client.
        let mut gzip = hub.subscribe_with(None, true).unwrap();
        assert!(latest_deflated(&hub));
        hub.publish(snapshot(2));
        assert!(latest_deflated(&hub));
        let plain_events: Vec<Bytes> = std::iter::from_fn(|| plain.rx.try_recv().ok()).collect();
        let gzip_events: Vec<Bytes> = std::iter::from_fn(|| gzip.rx.try_recv().ok()).collect();
        // retry, tick 1, tick 2 — and the gzip client: its header and retry, tick 1, tick 2.
        assert_eq!((plain_events.len(), gzip_events.len()), (3, 3));
        assert!(std::str::from_utf8(&plain_events[2]).unwrap().contains("data:"));
        assert!(gzip_events[0].starts_with(&page::GZIP_HEADER));
        assert_ne!(gzip_events[2], plain_events[2]);
        // The plain client leaving stops nothing; the gzip client leaving stops the deflating.
        drop(gzip);
        hub.publish(snapshot(3));
        assert!(latest_deflated(&hub), "counted until the tick notices the closed client");
        hub.publish(snapshot(4));
        assert!(!latest_deflated(&hub));
    }
}
