//! A stage of your own: thermal headroom per GPU, and an event when a GPU crosses the limit.
//!
//! Everything a stage adds is described here and nowhere else: its series (a `static`
//! [`Descriptor`]), its output on each snapshot (a [`StageOutput`]: the series' points, the
//! events, what a tenant may see, its JSON). Every sink — stdout, Prometheus, the Pushgateway,
//! remote write, InfluxDB, OTLP, the web view — exports it without a line changed in
//! `gpumon-sinks` (`gpumon-sinks/tests/custom_stage*.rs` check each). A stage needs only
//! `gpumon-core` (and serde, to be written in JSON).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use gpumon_core::stages::{no_rows, Event, EventField, EventValue, StageOutput};
use gpumon_core::{DerivedPoint, Descriptor, Family, MetricKind, Processor, Scope, Snapshot, Unit, Value};

/// `gpumon_thermal_headroom_celsius{gpu, uuid, …}` (Prometheus), field `thermal_headroom` in
/// `gpu_derived` (InfluxDB), `acme.gpu.thermal.headroom` (OpenTelemetry).
pub static HEADROOM: Descriptor = Descriptor::derived(
    "thermal_headroom",
    Family::Derived,
    Unit::Celsius,
    MetricKind::Gauge,
    "Degrees below the site's temperature limit (negative: over it).",
    Scope::Device,
    &[],
    "acme.gpu.thermal.headroom",
);

/// The stage: compares each GPU's temperature with `limit_c` at every tick.
#[derive(Debug)]
pub struct ThermalHeadroom {
    limit_c: f64,
    /// Whether each GPU (by UUID) was over the limit at the last tick.
    hot: HashMap<String, bool>,
}

impl ThermalHeadroom {
    /// A stage with the site's limit, °C.
    pub fn new(limit_c: f64) -> Self {
        Self { limit_c, hot: HashMap::new() }
    }
}

/// What the stage attaches to one snapshot.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct Headroom {
    /// The limit, °C.
    pub limit_c: f64,
    /// Per GPU with a temperature reading.
    pub gpus: Vec<GpuHeadroom>,
    /// GPUs that crossed the limit at this tick, either way.
    pub crossings: Vec<Crossing>,
}

/// One GPU's headroom.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GpuHeadroom {
    /// The GPU's UUID.
    pub uuid: String,
    /// `limit − temperature`, °C.
    pub headroom_c: f64,
}

/// A GPU that crossed the limit.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct Crossing {
    /// The GPU's UUID and index.
    pub uuid: String,
    /// The GPU's index.
    pub gpu: u32,
    /// Over the limit now (`false`: back under it).
    pub hot: bool,
    /// Its temperature, °C.
    pub temperature_c: f64,
}

impl Processor for ThermalHeadroom {
    fn name(&self) -> &str {
        "thermal-headroom"
    }

    fn process(&mut self, snapshot: &mut Snapshot) {
        let mut output = Headroom { limit_c: self.limit_c, gpus: Vec::new(), crossings: Vec::new() };
        for d in &snapshot.devices {
            let Some(t) = d.temperature.gpu else { continue };
            let uuid = d.info.uuid.clone();
            let hot = t > self.limit_c;
            let was = self.hot.insert(uuid.clone(), hot).unwrap_or(false);
            if hot != was {
                output.crossings.push(Crossing { uuid: uuid.clone(), gpu: d.info.index, hot, temperature_c: t });
            }
            output.gpus.push(GpuHeadroom { uuid, headroom_c: self.limit_c - t });
        }
        snapshot.attach(output);
    }
}

impl StageOutput for Headroom {
    fn key(&self) -> &'static str {
        "thermal_headroom"
    }

    fn visit_series<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(DerivedPoint<'a>)) {
        for gpu in &self.gpus {
            if let Some(i) = snapshot.position(&gpu.uuid) {
                f(DerivedPoint::new(&HEADROOM, Value::Float(gpu.headroom_c), Some(i), &[]));
            }
        }
    }

    fn visit_events<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(&Event<'_>)) {
        for c in &self.crossings {
            let Some(i) = snapshot.position(&c.uuid) else { continue };
            let state = if c.hot { "hot" } else { "cool" };
            let fields: [EventField<'_>; 2] = [
                ("temperature_celsius", EventValue::Float(c.temperature_c)),
                ("limit_celsius", EventValue::Float(self.limit_c)),
            ];
            let text = |out: &mut String| {
                let _ = write!(
                    out,
                    "THERMAL gpu {} {} {state}: {:.1} °C, limit {:.1} °C",
                    c.gpu, c.uuid, c.temperature_c, self.limit_c
                );
            };
            f(&Event {
                name: "thermal",
                at: snapshot.taken_at,
                device: Some(i),
                tags: &[("state", state)],
                fields: &fields,
                rows: &no_rows,
                text: &text,
            });
        }
    }

    /// A tenant sees the headroom of its own GPUs (the view holds only those).
    fn scoped(&self, view: &Snapshot) -> Option<Arc<dyn StageOutput>> {
        let mine = |uuid: &str| view.position(uuid).is_some();
        Some(Arc::new(Headroom {
            limit_c: self.limit_c,
            gpus: self.gpus.iter().filter(|g| mine(&g.uuid)).cloned().collect(),
            crossings: Vec::new(),
        }))
    }

    fn as_serialize(&self) -> Option<&dyn gpumon_core::stages::erased_serde::Serialize> {
        Some(self)
    }
}
