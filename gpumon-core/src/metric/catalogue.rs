//! The catalogue: every metric gpumon exports, described once — its [`Family`], [`Unit`],
//! [`MetricKind`], label, help text, dcgm-exporter and OpenTelemetry names ([`Descriptor`]),
//! indexed by [`MetricId`].
//!
//! One table (`catalogue!`) is the single source of every name, as `shared/STYLE.md` suggests
//! ("Data model: an immutable `Snapshot`, not a registry": "`points()` + `Descriptor` keep all
//! naming in one place. Each sink converts the canonical name"). It depends on nothing else in
//! the crate: the model and the visitor (`visit.rs`) read it, never the other way round.

/// A group of metrics read together. Selecting a family in a [`MetricSet`] makes the backend
/// read it; leaving it out costs nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum Family {
    /// Device up/lost.
    Status,
    /// GPU, memory-controller, encoder, decoder utilisation.
    Utilization,
    /// Framebuffer used/free/total/reserved.
    Memory,
    /// GPU and memory temperature.
    Temperature,
    /// Power draw and enforced limit.
    Power,
    /// Total energy counter.
    Energy,
    /// Graphics, SM, memory, video clocks.
    Clocks,
    /// Fan speed.
    Fan,
    /// P-state.
    PerformanceState,
    /// Clocks-event (throttle) reasons: the bit mask, one series. Each reason's own 0/1 series
    /// are [`Family::ClockEventsByReason`] (opt-in).
    ClockEvents,
    /// PCIe link generation, width and replay counter.
    PcieLink,
    /// PCIe throughput. **Opt-in**: NVML blocks ~20 ms per direction to measure it.
    PcieThroughput,
    /// Aggregate ECC error counters.
    Ecc,
    /// Retired pages.
    RetiredPages,
    /// Remapped rows.
    RemappedRows,
    /// XID error events.
    Xid,
    /// Per-process memory and utilisation. **Opt-in**: one series per process.
    Processes,
    /// Min/max/mean over the interval from the driver's sample buffer.
    HighResolution,
    /// GPM profiling metrics (Hopper+).
    Gpm,
    /// NVLink per GPU: links up, traffic and error counters summed over its links (GPUs with
    /// NVLink; nothing elsewhere). One batched field-values call per GPU per tick. Each link's
    /// own series are [`Family::NvlinkLinks`] (opt-in).
    Nvlink,
    /// Findings of the diagnosis stage ([`crate::diagnose`]). Derived from the other families,
    /// not read from the GPU: selecting it costs the backend nothing.
    Diagnosis,
    /// Training steps ([`crate::steps`]): per-step figures derived from the other families when
    /// a training loop marks its steps. Costs the backend nothing.
    Steps,
    /// NVLink per-link series (`nvlink_link_*{link}`). **Opt-in**: 18 links per H100 make them
    /// two thirds of a host's series (dcgm-exporter also exports them only when asked);
    /// [`Family::Nvlink`] gives the per-GPU totals. Reading either family reads the links (one
    /// batched call per GPU per tick). Declared after the derived families so that their bits
    /// in a [`MetricSet`] stay where they were.
    NvlinkLinks,
    /// Series of a stage outside gpumon's catalogue (an embedder's own,
    /// [`Descriptor::derived`]). Costs the backend nothing.
    Derived,
    /// GPU-time accounts ([`crate::accounts`]): per GPU and owner, monotonic counters of the
    /// GPU-seconds observed, allocated, idle while allocated and lost per cause, and the energy
    /// used — the run report's figures as counters, so that a TSDB sums them over a fleet.
    /// Derived from the other families: costs the backend nothing. Declared last so that the
    /// other families' bits in a [`MetricSet`] stay where they were.
    Accounts,
    /// Clocks-event (throttle) reasons, one 0/1 series per reason (`clock_event_active{reason}`,
    /// 9 per GPU). **Opt-in**: [`Family::ClockEvents`]' bit mask says the same in one series.
    /// Selecting it reads the reasons as [`Family::ClockEvents`] does, and exports the mask with
    /// them. Declared last so that the other families' bits in a [`MetricSet`] stay where they
    /// were.
    ClockEventsByReason,
}

impl Family {
    /// Every family: the sampled families (each beside its kin, e.g. [`Family::ClockEventsByReason`]
    /// after [`Family::ClockEvents`], whatever their declaration order), then the derived ones
    /// ([`Family::Diagnosis`], [`Family::Steps`], [`Family::Derived`], [`Family::Accounts`]).
    pub const ALL: [Family; 26] = [
        Family::Status,
        Family::Utilization,
        Family::Memory,
        Family::Temperature,
        Family::Power,
        Family::Energy,
        Family::Clocks,
        Family::Fan,
        Family::PerformanceState,
        Family::ClockEvents,
        Family::ClockEventsByReason,
        Family::PcieLink,
        Family::PcieThroughput,
        Family::Ecc,
        Family::RetiredPages,
        Family::RemappedRows,
        Family::Xid,
        Family::Processes,
        Family::HighResolution,
        Family::Gpm,
        Family::Nvlink,
        Family::NvlinkLinks,
        Family::Diagnosis,
        Family::Steps,
        Family::Derived,
        Family::Accounts,
    ];

    /// Families off in [`MetricSet::default`]: those that cost the backend noticeably more than
    /// the rest (PCIe throughput, processes, each NVLink link's series), and those whose series
    /// a fleet's TSDB would pay for beyond dcgm-exporter's default counters (issue 45,
    /// `docs/fleet.md` §8): the high-resolution windows, GPM, NVLink totals, PCIe link, ECC,
    /// remapped rows, the P-state and each clocks-event reason's own series. The built-in stages
    /// still read the ones in [`Family::READ_BY_STAGES`]: sampled for them, not exported.
    pub const OPT_IN: [Family; 11] = [
        Family::PcieThroughput,
        Family::Processes,
        Family::NvlinkLinks,
        Family::HighResolution,
        Family::Gpm,
        Family::Nvlink,
        Family::PcieLink,
        Family::Ecc,
        Family::RemappedRows,
        Family::PerformanceState,
        Family::ClockEventsByReason,
    ];

    /// Opt-in families ([`Family::OPT_IN`]) that the built-in stages (diagnosis, steps, the run
    /// report, the accounts) read. An agent running those stages samples them all the same and
    /// hands them to the stages only: their series reach no sink unless selected
    /// ([`AgentBuilder::sample_for_processors`](crate::AgentBuilder::sample_for_processors)).
    pub const READ_BY_STAGES: [Family; 6] =
        [Family::HighResolution, Family::Gpm, Family::Nvlink, Family::PcieLink, Family::Ecc, Family::RemappedRows];

    /// The stable snake_case name used in config files and flags.
    pub const fn name(self) -> &'static str {
        match self {
            Family::Status => "status",
            Family::Utilization => "utilization",
            Family::Memory => "memory",
            Family::Temperature => "temperature",
            Family::Power => "power",
            Family::Energy => "energy",
            Family::Clocks => "clocks",
            Family::Fan => "fan",
            Family::PerformanceState => "performance_state",
            Family::ClockEvents => "clock_events",
            Family::ClockEventsByReason => "clock_events_by_reason",
            Family::PcieLink => "pcie_link",
            Family::PcieThroughput => "pcie_throughput",
            Family::Ecc => "ecc",
            Family::RetiredPages => "retired_pages",
            Family::RemappedRows => "remapped_rows",
            Family::Xid => "xid",
            Family::Processes => "processes",
            Family::HighResolution => "high_resolution",
            Family::Gpm => "gpm",
            Family::Nvlink => "nvlink",
            Family::NvlinkLinks => "nvlink_links",
            Family::Diagnosis => "diagnosis",
            Family::Steps => "steps",
            Family::Derived => "derived",
            Family::Accounts => "accounts",
        }
    }

    /// Parses a name produced by [`Family::name`].
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which families to sample — a `Copy` bit set in the style of sysinfo's `RefreshKind`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MetricSet(u32);

impl MetricSet {
    /// Every family, including the opt-in ones.
    pub const fn everything() -> Self {
        let mut bits = 0;
        let mut i = 0;
        while i < Family::ALL.len() {
            bits |= Family::ALL[i].bit();
            i += 1;
        }
        Self(bits)
    }

    /// No family at all (device status is still reported).
    pub const fn nothing() -> Self {
        Self(0)
    }

    /// This set plus `family`.
    #[must_use]
    pub const fn with(self, family: Family) -> Self {
        Self(self.0 | family.bit())
    }

    /// This set minus `family`.
    #[must_use]
    pub const fn without(self, family: Family) -> Self {
        Self(self.0 & !family.bit())
    }

    /// Every family of this set and of `other`.
    #[must_use]
    pub const fn union(self, other: MetricSet) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether `family` is selected.
    pub const fn contains(self, family: Family) -> bool {
        self.0 & family.bit() != 0
    }

    /// This set plus the opt-in families the built-in stages read ([`Family::READ_BY_STAGES`]):
    /// what an agent running those stages samples when it exports `self`.
    /// `MetricSet::default().with_stage_inputs()` is what a default agent samples.
    #[must_use]
    pub const fn with_stage_inputs(self) -> Self {
        let mut set = self;
        let mut i = 0;
        while i < Family::READ_BY_STAGES.len() {
            set = set.with(Family::READ_BY_STAGES[i]);
            i += 1;
        }
        set
    }

    /// The selected families.
    pub fn iter(self) -> impl Iterator<Item = Family> {
        Family::ALL.into_iter().filter(move |f| self.contains(*f))
    }
}

impl Default for MetricSet {
    /// Everything except [`Family::OPT_IN`].
    fn default() -> Self {
        Family::OPT_IN.into_iter().fold(Self::everything(), MetricSet::without)
    }
}

impl std::fmt::Debug for MetricSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<Family> for MetricSet {
    fn from_iter<I: IntoIterator<Item = Family>>(iter: I) -> Self {
        iter.into_iter().fold(Self::nothing(), MetricSet::with)
    }
}

/// Whether a metric goes up and down or only up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetricKind {
    /// A value that can go up and down.
    Gauge,
    /// A monotonically increasing total.
    Counter,
}

/// Canonical unit of a metric's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// A fraction in `0.0..=1.0`.
    Ratio,
    /// Bytes.
    Bytes,
    /// Bytes per second.
    BytesPerSecond,
    /// Degrees Celsius.
    Celsius,
    /// Watts.
    Watts,
    /// Joules.
    Joules,
    /// Hertz.
    Hertz,
    /// Seconds (also used for Unix timestamps).
    Seconds,
    /// A dimensionless count or number (errors, pages, lanes, a P-state, a 0/1 flag).
    Count,
}

impl Unit {
    /// The Prometheus base-unit suffix (`bytes`, `celsius`, …), or `None` for plain numbers.
    pub const fn prometheus_suffix(self) -> Option<&'static str> {
        match self {
            Unit::Ratio => Some("ratio"),
            Unit::Bytes => Some("bytes"),
            Unit::BytesPerSecond => Some("bytes_per_second"),
            Unit::Celsius => Some("celsius"),
            Unit::Watts => Some("watts"),
            Unit::Joules => Some("joules"),
            Unit::Hertz => Some("hertz"),
            Unit::Seconds => Some("seconds"),
            Unit::Count => None,
        }
    }

    /// The UCUM unit OpenTelemetry uses.
    pub const fn ucum(self) -> &'static str {
        match self {
            Unit::Ratio => "1",
            Unit::Bytes => "By",
            Unit::BytesPerSecond => "By/s",
            Unit::Celsius => "Cel",
            Unit::Watts => "W",
            Unit::Joules => "J",
            Unit::Hertz => "Hz",
            Unit::Seconds => "s",
            Unit::Count => "1",
        }
    }
}

/// A dcgm-exporter name for a metric, and the factor from gpumon's canonical unit to DCGM's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DcgmName {
    /// DCGM field name, e.g. `DCGM_FI_DEV_GPU_UTIL`.
    pub name: &'static str,
    /// Multiply the canonical value by this (e.g. 100 for ratio → percent, 2⁻²⁰ for bytes → MiB).
    pub scale: f64,
}

/// How a metric appears in OpenTelemetry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OtelName {
    /// Instrument name: a semantic-convention name (`hw.…`) or one under the `gpumon.` extension
    /// namespace for families the conventions lack.
    pub name: &'static str,
    /// One extra attribute the convention requires to tell series apart (e.g.
    /// `hw.gpu.task=encoder`).
    pub attribute: Option<(&'static str, &'static str)>,
    /// Whether the instrument is an UpDownCounter in the conventions (memory usage/limit).
    pub up_down: bool,
    /// A UCUM unit that differs from [`Unit::ucum`] of the canonical unit, where the conventions
    /// ask for an annotation (`{error}`). Use [`Descriptor::otel_unit`].
    pub unit: Option<&'static str>,
}

/// What a series describes: one device, the whole host, or a job running on it.
///
/// Device-scoped series carry the device's labels (`gpu`, `uuid`, …); host-scoped ones only the
/// host label; job-scoped ones the host label plus the job's own labels (named in
/// [`Descriptor::labels`]). A derived point of a device-scoped metric may still concern the whole
/// host (a host-level finding): it then carries no device labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// One GPU (or MIG instance).
    Device,
    /// The whole host.
    Host,
    /// A job (a training run) on the host.
    Job,
}

/// Most labels a derived series carries besides the device and host labels.
pub const MAX_DERIVED_LABELS: usize = 4;

/// Everything a sink needs to know to name and describe one metric.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Descriptor {
    /// The catalogue metric; `None` for a series a stage outside the catalogue defines
    /// ([`Descriptor::derived`]).
    pub id: Option<MetricId>,
    /// Canonical name: lowercase, `_`-separated, without unit suffix (`memory_used`).
    pub name: &'static str,
    /// The family that selects it.
    pub family: Family,
    /// Unit of the value.
    pub unit: Unit,
    /// Gauge or counter.
    pub kind: MetricKind,
    /// One-line description.
    pub help: &'static str,
    /// Name of the extra label this metric carries per point (`xid`, `pid`, `reason`, `family`).
    pub label: Option<&'static str>,
    /// The dcgm-exporter equivalent, if dcgm-exporter has one.
    pub dcgm: Option<DcgmName>,
    /// The OpenTelemetry instrument.
    pub otel: OtelName,
    /// What a series of this metric describes.
    pub scope: Scope,
    /// Names of the labels a *derived* point carries in
    /// [`DerivedPoint::labels`](super::DerivedPoint::labels), in order (at most
    /// [`MAX_DERIVED_LABELS`]). Empty for sampled metrics, which use [`Descriptor::label`].
    pub labels: &'static [&'static str],
}

impl Descriptor {
    /// The descriptor of a derived series a stage of your own adds (see
    /// [`crate::stages::StageOutput`]): sinks name, type and describe it from this exactly as
    /// they do gpumon's own series. `name` is the canonical name (lowercase, `_`-separated,
    /// without unit suffix; Prometheus gets `gpumon_<name>_<unit>`), `labels` the names of the
    /// extra labels its points carry (at most [`MAX_DERIVED_LABELS`]), `otel` the OpenTelemetry
    /// instrument name. A `static` of it is what points refer to.
    ///
    /// ```
    /// use gpumon_core::{Descriptor, Family, MetricKind, Scope, Unit};
    ///
    /// static QUEUE: Descriptor = Descriptor::derived(
    ///     "loader_queue_depth", Family::Derived, Unit::Count, MetricKind::Gauge,
    ///     "Batches waiting in the data loader's queue.", Scope::Job, &["job"], "acme.loader.queue_depth",
    /// );
    /// assert_eq!(QUEUE.prometheus_name(), "gpumon_loader_queue_depth");
    /// assert_eq!(QUEUE.id, None);
    /// ```
    #[allow(clippy::too_many_arguments)] // the table row of one series, named field by field in the docs
    pub const fn derived(
        name: &'static str,
        family: Family,
        unit: Unit,
        kind: MetricKind,
        help: &'static str,
        scope: Scope,
        labels: &'static [&'static str],
        otel: &'static str,
    ) -> Descriptor {
        assert!(labels.len() <= MAX_DERIVED_LABELS, "a derived series carries at most MAX_DERIVED_LABELS labels");
        Descriptor {
            id: None,
            name,
            family,
            unit,
            kind,
            help,
            label: None,
            dcgm: None,
            otel: OtelName { name: otel, attribute: None, up_down: false, unit: None },
            scope,
            labels,
        }
    }

    /// The OpenTelemetry (UCUM) unit: the convention's annotation where it has one, else the
    /// canonical unit's.
    pub fn otel_unit(&self) -> &'static str {
        match self.otel.unit {
            Some(u) => u,
            None => self.unit.ucum(),
        }
    }

    /// The native Prometheus name: `gpumon_` + name + unit suffix (+ `_total` for counters).
    /// Allocates; sinks that render often should cache it (see [`MetricId::ALL`]).
    pub fn prometheus_name(&self) -> String {
        let mut s = String::with_capacity(48);
        s.push_str("gpumon_");
        s.push_str(self.name);
        if let Some(suffix) = self.unit.prometheus_suffix() {
            if !self.name.ends_with(suffix) {
                s.push('_');
                s.push_str(suffix);
            }
        }
        if self.kind == MetricKind::Counter {
            s.push_str("_total");
        }
        s
    }
}

macro_rules! catalogue {
    ($( $(#[$doc:meta])* $id:ident {
        $name:literal, $family:ident, $unit:ident, $kind:ident, $help:literal,
        label: $label:expr, dcgm: $dcgm:expr, otel: $otel:expr
        $(, scope: $scope:ident, labels: $labels:expr)? $(,)?
    } )*) => {
        /// Every metric gpumon knows. See [`MetricId::descriptor`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum MetricId { $( $(#[$doc])* $id, )* }

        impl MetricId {
            /// Every metric, in catalogue order.
            pub const ALL: &'static [MetricId] = &[ $( MetricId::$id, )* ];

            /// The metric's descriptor: the one place its names, unit and help come from.
            pub const fn descriptor(self) -> &'static Descriptor {
                &CATALOGUE[self as usize]
            }
        }

        /// The descriptor table, indexed by `MetricId as usize`.
        static CATALOGUE: &[Descriptor] = &[ $( Descriptor {
            id: Some(MetricId::$id),
            name: $name,
            family: Family::$family,
            unit: Unit::$unit,
            kind: MetricKind::$kind,
            help: $help,
            label: $label,
            dcgm: $dcgm,
            otel: $otel,
            scope: catalogue!(@scope $($scope)?),
            labels: catalogue!(@labels $($labels)?),
        }, )* ];
    };
    (@scope) => { Scope::Device };
    (@scope $scope:ident) => { Scope::$scope };
    (@labels) => { &[] };
    (@labels $labels:expr) => { $labels };
}

const fn dcgm(name: &'static str, scale: f64) -> Option<DcgmName> {
    Some(DcgmName { name, scale })
}
const fn hw(name: &'static str) -> OtelName {
    OtelName { name, attribute: None, up_down: false, unit: None }
}
const fn hw_attr(name: &'static str, key: &'static str, value: &'static str) -> OtelName {
    OtelName { name, attribute: Some((key, value)), up_down: false, unit: None }
}
const fn errors(name: &'static str, attribute: Option<(&'static str, &'static str)>) -> OtelName {
    OtelName { name, attribute, up_down: false, unit: Some("{error}") }
}
const fn hw_updown(name: &'static str) -> OtelName {
    OtelName { name, attribute: None, up_down: true, unit: None }
}
const PCT: f64 = 100.0;
const MIB: f64 = 1.0 / 1_048_576.0;
const MHZ: f64 = 1e-6;

catalogue! {
    /// 1 while the device answers, 0 when it is lost.
    DeviceUp { "up", Status, Count, Gauge, "Whether the GPU answered this tick (1) or is lost (0).",
        label: None, dcgm: None,
        // semconv `hw.status` (UpDownCounter, 1 for the current state): this is the `hw.state=ok`
        // series; the OTLP sink adds its complement `hw.state=failed`.
        otel: OtelName { name: "hw.status", attribute: Some(("hw.state", "ok")), up_down: true, unit: None } }

    /// Fraction of time a kernel was running.
    GpuUtilization { "utilization", Utilization, Ratio, Gauge, "Fraction of time one or more kernels were running on the GPU.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_GPU_UTIL", PCT), otel: hw_attr("hw.gpu.utilization", "hw.gpu.task", "general") }
    /// Fraction of time the memory controller was busy.
    MemoryUtilization { "memory_controller_utilization", Utilization, Ratio, Gauge, "Fraction of time the memory controller was reading or writing device memory.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", PCT), otel: hw("gpumon.gpu.memory_controller.utilization") }
    /// Encoder utilisation.
    EncoderUtilization { "encoder_utilization", Utilization, Ratio, Gauge, "Fraction of time the video encoder was busy.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_ENC_UTIL", PCT), otel: hw_attr("hw.gpu.utilization", "hw.gpu.task", "encoder") }
    /// Decoder utilisation.
    DecoderUtilization { "decoder_utilization", Utilization, Ratio, Gauge, "Fraction of time the video decoder was busy.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_DEC_UTIL", PCT), otel: hw_attr("hw.gpu.utilization", "hw.gpu.task", "decoder") }

    /// Memory allocated.
    MemoryUsed { "memory_used", Memory, Bytes, Gauge, "Device memory allocated by processes.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_FB_USED", MIB), otel: hw_updown("hw.gpu.memory.usage") }
    /// Memory free.
    MemoryFree { "memory_free", Memory, Bytes, Gauge, "Device memory available.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_FB_FREE", MIB), otel: hw_updown("gpumon.gpu.memory.free") }
    /// Memory installed.
    MemoryTotal { "memory_total", Memory, Bytes, Gauge, "Device memory installed.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_FB_TOTAL", MIB), otel: hw_updown("hw.gpu.memory.limit") }
    /// Memory reserved by the driver.
    MemoryReserved { "memory_reserved", Memory, Bytes, Gauge, "Device memory reserved by the driver and firmware.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_FB_RESERVED", MIB), otel: hw_updown("gpumon.gpu.memory.reserved") }
    /// used / total.
    MemoryUsedRatio { "memory_used_ratio", Memory, Ratio, Gauge, "Fraction of device memory allocated (used / total).",
        label: None, dcgm: None, otel: hw("hw.gpu.memory.utilization") }

    /// GPU die temperature.
    GpuTemperature { "temperature", Temperature, Celsius, Gauge, "GPU die temperature.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_GPU_TEMP", 1.0), otel: hw_attr("hw.temperature", "hw.sensor_location", "gpu") }
    /// Memory temperature.
    MemoryTemperature { "memory_temperature", Temperature, Celsius, Gauge, "Device memory (HBM) temperature.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_MEMORY_TEMP", 1.0), otel: hw_attr("hw.temperature", "hw.sensor_location", "memory") }

    /// Power draw.
    PowerUsage { "power_usage", Power, Watts, Gauge, "Power drawn by the board.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_POWER_USAGE", 1.0), otel: hw("hw.power") }
    /// Enforced power limit.
    PowerLimit { "power_limit", Power, Watts, Gauge, "Power limit the driver enforces.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1.0), otel: hw("gpumon.gpu.power.limit") }
    /// Energy since driver load.
    EnergyConsumed { "energy", Energy, Joules, Counter, "Energy consumed since the driver was loaded.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0), otel: hw("hw.energy") }

    /// Graphics clock.
    ClockGraphics { "clock_graphics", Clocks, Hertz, Gauge, "Graphics clock.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_GRAPHICS_CLOCK", MHZ), otel: hw_attr("gpumon.gpu.clock", "gpumon.clock", "graphics") }
    /// SM clock.
    ClockSm { "clock_sm", Clocks, Hertz, Gauge, "Streaming-multiprocessor clock.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_SM_CLOCK", MHZ), otel: hw_attr("gpumon.gpu.clock", "gpumon.clock", "sm") }
    /// Memory clock.
    ClockMemory { "clock_memory", Clocks, Hertz, Gauge, "Memory clock.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_MEM_CLOCK", MHZ), otel: hw_attr("gpumon.gpu.clock", "gpumon.clock", "memory") }
    /// Video clock.
    ClockVideo { "clock_video", Clocks, Hertz, Gauge, "Video engine clock.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_VIDEO_CLOCK", MHZ), otel: hw_attr("gpumon.gpu.clock", "gpumon.clock", "video") }

    /// Fan speed.
    FanSpeed { "fan_speed", Fan, Ratio, Gauge, "Fan speed relative to its maximum.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_FAN_SPEED", PCT), otel: hw("gpumon.gpu.fan.speed_ratio") }
    /// P-state.
    PerformanceState { "performance_state", PerformanceState, Count, Gauge, "Performance state (0 = P0, fastest, to 15).",
        label: None, dcgm: dcgm("DCGM_FI_DEV_PSTATE", 1.0), otel: hw("gpumon.gpu.performance_state") }
    /// The raw clocks-event reasons bit mask.
    ClockEventReasonsMask { "clock_event_reasons", ClockEvents, Count, Gauge, "Bit mask of NVML clocks-event (throttle) reasons.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1.0), otel: hw("gpumon.gpu.clock_event.reasons") }
    /// One 0/1 series per reason.
    ClockEventActive { "clock_event_active", ClockEventsByReason, Count, Gauge, "1 while the named clocks-event (throttle) reason holds clocks down.",
        label: Some("reason"), dcgm: None, otel: hw("gpumon.gpu.clock_event.active") }

    /// PCIe generation.
    PcieLinkGeneration { "pcie_link_generation", PcieLink, Count, Gauge, "Current PCIe link generation.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_PCIE_LINK_GEN", 1.0), otel: hw("gpumon.gpu.pcie.link.generation") }
    /// PCIe width.
    PcieLinkWidth { "pcie_link_width", PcieLink, Count, Gauge, "Current PCIe link width (lanes).",
        label: None, dcgm: dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH", 1.0), otel: hw("gpumon.gpu.pcie.link.width") }
    /// PCIe replays.
    PcieReplays { "pcie_replays", PcieLink, Count, Counter, "PCIe replay events.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0), otel: hw("gpumon.gpu.pcie.replays") }
    /// PCIe transmit.
    PcieTxThroughput { "pcie_transmit", PcieThroughput, BytesPerSecond, Gauge, "PCIe transmit throughput.",
        label: None, dcgm: dcgm("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0), otel: hw_attr("gpumon.gpu.pcie.throughput", "network.io.direction", "transmit") }
    /// PCIe receive.
    PcieRxThroughput { "pcie_receive", PcieThroughput, BytesPerSecond, Gauge, "PCIe receive throughput.",
        label: None, dcgm: dcgm("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0), otel: hw_attr("gpumon.gpu.pcie.throughput", "network.io.direction", "receive") }

    /// Corrected ECC errors.
    EccCorrected { "ecc_corrected_errors", Ecc, Count, Counter, "Corrected (single-bit) ECC errors over the GPU's life.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0), otel: errors("hw.errors", Some(("error.type", "corrected"))) }
    /// Uncorrected ECC errors.
    EccUncorrected { "ecc_uncorrected_errors", Ecc, Count, Counter, "Uncorrected (double-bit) ECC errors over the GPU's life.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0), otel: errors("hw.errors", Some(("error.type", "uncorrected"))) }
    /// Pages retired, single-bit.
    RetiredPagesSingleBit { "retired_pages_single_bit", RetiredPages, Count, Gauge, "Pages retired for single-bit ECC errors.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_RETIRED_SBE", 1.0), otel: hw_attr("gpumon.gpu.retired_pages", "gpumon.cause", "single_bit") }
    /// Pages retired, double-bit.
    RetiredPagesDoubleBit { "retired_pages_double_bit", RetiredPages, Count, Gauge, "Pages retired for double-bit ECC errors.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_RETIRED_DBE", 1.0), otel: hw_attr("gpumon.gpu.retired_pages", "gpumon.cause", "double_bit") }
    /// Pages pending retirement.
    RetiredPagesPending { "retired_pages_pending", RetiredPages, Count, Gauge, "1 if pages are waiting to be retired.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_RETIRED_PENDING", 1.0), otel: hw("gpumon.gpu.retired_pages.pending") }
    /// Rows remapped, correctable.
    RemappedRowsCorrectable { "remapped_rows_correctable", RemappedRows, Count, Gauge, "Rows remapped for correctable errors.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0), otel: hw_attr("gpumon.gpu.remapped_rows", "error.type", "corrected") }
    /// Rows remapped, uncorrectable.
    RemappedRowsUncorrectable { "remapped_rows_uncorrectable", RemappedRows, Count, Gauge, "Rows remapped for uncorrectable errors.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0), otel: hw_attr("gpumon.gpu.remapped_rows", "error.type", "uncorrected") }
    /// Remap pending.
    RemappedRowsPending { "remapped_rows_pending", RemappedRows, Count, Gauge, "1 if a row remapping is pending (GPU reset needed).",
        label: None, dcgm: dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0), otel: hw("gpumon.gpu.remapped_rows.pending") }
    /// Remap failed.
    RemappedRowsFailure { "remapped_rows_failure", RemappedRows, Count, Gauge, "1 if a row remapping failed.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0), otel: hw("gpumon.gpu.remapped_rows.failure") }

    /// XID events per code.
    XidErrors { "xid_errors", Xid, Count, Counter, "XID error events since the agent started, by XID code.",
        label: Some("xid"), dcgm: dcgm("DCGM_EXP_XID_ERRORS_COUNT", 1.0), otel: errors("gpumon.gpu.xid.errors", None) }
    /// When each XID code was last seen.
    XidLastSeen { "xid_last_seen_timestamp", Xid, Seconds, Gauge, "Unix time the XID code was last seen.",
        label: Some("xid"), dcgm: None, otel: hw("gpumon.gpu.xid.last_seen") }

    /// Per-process memory.
    ProcessMemoryUsed { "process_memory_used", Processes, Bytes, Gauge, "Device memory used by the process.",
        label: Some("pid"), dcgm: None, otel: hw("gpumon.gpu.process.memory.usage") }
    /// Per-process SM utilisation.
    ProcessSmUtilization { "process_sm_utilization", Processes, Ratio, Gauge, "SM utilisation attributed to the process.",
        label: Some("pid"), dcgm: None, otel: hw_attr("gpumon.gpu.process.utilization", "hw.gpu.task", "general") }
    /// Per-process memory-controller utilisation.
    ProcessMemoryUtilization { "process_memory_controller_utilization", Processes, Ratio, Gauge, "Memory-controller utilisation attributed to the process.",
        label: Some("pid"), dcgm: None, otel: hw_attr("gpumon.gpu.process.utilization", "hw.gpu.task", "memory") }
    /// Per-process encoder utilisation.
    ProcessEncoderUtilization { "process_encoder_utilization", Processes, Ratio, Gauge, "Encoder utilisation attributed to the process.",
        label: Some("pid"), dcgm: None, otel: hw_attr("gpumon.gpu.process.utilization", "hw.gpu.task", "encoder") }
    /// Per-process decoder utilisation.
    ProcessDecoderUtilization { "process_decoder_utilization", Processes, Ratio, Gauge, "Decoder utilisation attributed to the process.",
        label: Some("pid"), dcgm: None, otel: hw_attr("gpumon.gpu.process.utilization", "hw.gpu.task", "decoder") }

    /// GPU utilisation, min over the interval.
    GpuUtilizationMin { "utilization_min", HighResolution, Ratio, Gauge, "Lowest GPU utilisation the driver sampled during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.utilization.window", "gpumon.stat", "min") }
    /// GPU utilisation, max over the interval.
    GpuUtilizationMax { "utilization_max", HighResolution, Ratio, Gauge, "Highest GPU utilisation the driver sampled during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.utilization.window", "gpumon.stat", "max") }
    /// GPU utilisation, mean over the interval.
    GpuUtilizationMean { "utilization_mean", HighResolution, Ratio, Gauge, "Mean GPU utilisation over the driver's samples during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.utilization.window", "gpumon.stat", "mean") }
    /// Memory-controller utilisation, min.
    MemoryUtilizationMin { "memory_controller_utilization_min", HighResolution, Ratio, Gauge, "Lowest memory-controller utilisation during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.memory_controller.utilization.window", "gpumon.stat", "min") }
    /// Memory-controller utilisation, max.
    MemoryUtilizationMax { "memory_controller_utilization_max", HighResolution, Ratio, Gauge, "Highest memory-controller utilisation during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.memory_controller.utilization.window", "gpumon.stat", "max") }
    /// Memory-controller utilisation, mean.
    MemoryUtilizationMean { "memory_controller_utilization_mean", HighResolution, Ratio, Gauge, "Mean memory-controller utilisation during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.memory_controller.utilization.window", "gpumon.stat", "mean") }
    /// Power, min.
    PowerUsageMin { "power_usage_min", HighResolution, Watts, Gauge, "Lowest power draw during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.power.window", "gpumon.stat", "min") }
    /// Power, max.
    PowerUsageMax { "power_usage_max", HighResolution, Watts, Gauge, "Highest power draw during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.power.window", "gpumon.stat", "max") }
    /// Power, mean.
    PowerUsageMean { "power_usage_mean", HighResolution, Watts, Gauge, "Mean power draw during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.power.window", "gpumon.stat", "mean") }
    /// SM clock, min.
    ClockSmMin { "clock_sm_min", HighResolution, Hertz, Gauge, "Lowest SM clock during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.clock.sm.window", "gpumon.stat", "min") }
    /// SM clock, max.
    ClockSmMax { "clock_sm_max", HighResolution, Hertz, Gauge, "Highest SM clock during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.clock.sm.window", "gpumon.stat", "max") }
    /// Memory clock, min.
    ClockMemoryMin { "clock_memory_min", HighResolution, Hertz, Gauge, "Lowest memory clock during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.clock.memory.window", "gpumon.stat", "min") }
    /// Memory clock, max.
    ClockMemoryMax { "clock_memory_max", HighResolution, Hertz, Gauge, "Highest memory clock during the interval.",
        label: None, dcgm: None, otel: hw_attr("gpumon.gpu.clock.memory.window", "gpumon.stat", "max") }

    /// GPM graphics activity.
    GpmGraphicsActivity { "graphics_activity", Gpm, Ratio, Gauge, "Fraction of time the graphics engine was active (GPM).",
        label: None, dcgm: dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0), otel: hw("gpumon.gpu.graphics.activity") }
    /// GPM SM activity.
    GpmSmActivity { "sm_activity", Gpm, Ratio, Gauge, "Fraction of SMs with a warp resident, time-averaged (GPM).",
        label: None, dcgm: dcgm("DCGM_FI_PROF_SM_ACTIVE", 1.0), otel: hw("gpumon.gpu.sm.activity") }
    /// GPM SM occupancy.
    GpmSmOccupancy { "sm_occupancy", Gpm, Ratio, Gauge, "Warps resident relative to the maximum (GPM).",
        label: None, dcgm: dcgm("DCGM_FI_PROF_SM_OCCUPANCY", 1.0), otel: hw("gpumon.gpu.sm.occupancy") }
    /// GPM tensor activity.
    GpmTensorActivity { "tensor_activity", Gpm, Ratio, Gauge, "Fraction of time any tensor pipe was active (GPM).",
        label: None, dcgm: dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0), otel: hw("gpumon.gpu.tensor.activity") }
    /// GPM DRAM bandwidth.
    GpmDramBandwidth { "dram_bandwidth_utilization", Gpm, Ratio, Gauge, "DRAM bandwidth used relative to peak (GPM).",
        label: None, dcgm: dcgm("DCGM_FI_PROF_DRAM_ACTIVE", 1.0), otel: hw("gpumon.gpu.dram.bandwidth.utilization") }

    /// 1 while the GPU is runtime-suspended (asleep, not woken to be measured).
    DeviceSuspended { "suspended", Status, Count, Gauge, "1 while the GPU is runtime-suspended and was left asleep (no other values this tick); absent otherwise.",
        label: None, dcgm: None, otel: hw("gpumon.gpu.suspended") }
    /// 1 while a family of the GPU cannot be read (e.g. its XID events are not monitored).
    MetricFailure { "metric_failure", Status, Count, Gauge, "1 while a metric family of the GPU could not be read this tick, by family (xid: XID events are not monitored, so no XID errors is not proof of none); absent otherwise.",
        label: Some("family"), dcgm: None, otel: hw("gpumon.gpu.metric_failure") }

    /// Per link: 1 up, 0 down.
    NvlinkLinkUp { "nvlink_link_up", NvlinkLinks, Count, Gauge, "1 while the NVLink link is up, 0 when it is down.",
        label: Some("link"), dcgm: None, otel: hw("gpumon.gpu.nvlink.link.up") }
    /// Per link: NVLink version.
    NvlinkLinkVersion { "nvlink_link_version", NvlinkLinks, Count, Gauge, "NVLink version of the link.",
        label: Some("link"), dcgm: None, otel: hw("gpumon.gpu.nvlink.link.version") }
    /// Per link: bytes transmitted.
    NvlinkLinkTx { "nvlink_link_transmit", NvlinkLinks, Bytes, Counter, "Data bytes transmitted over the NVLink link.",
        label: Some("link"), dcgm: None, otel: hw_attr("gpumon.gpu.nvlink.link.io", "network.io.direction", "transmit") }
    /// Per link: bytes received.
    NvlinkLinkRx { "nvlink_link_receive", NvlinkLinks, Bytes, Counter, "Data bytes received over the NVLink link.",
        label: Some("link"), dcgm: None, otel: hw_attr("gpumon.gpu.nvlink.link.io", "network.io.direction", "receive") }
    /// Per link: CRC errors.
    NvlinkLinkCrcErrors { "nvlink_link_crc_errors", NvlinkLinks, Count, Counter, "CRC errors on the NVLink link.",
        label: Some("link"), dcgm: None, otel: errors("gpumon.gpu.nvlink.link.errors", Some(("error.type", "crc"))) }
    /// Per link: replay errors.
    NvlinkLinkReplayErrors { "nvlink_link_replay_errors", NvlinkLinks, Count, Counter, "Replay errors on the NVLink link.",
        label: Some("link"), dcgm: None, otel: errors("gpumon.gpu.nvlink.link.errors", Some(("error.type", "replay"))) }
    /// Per link: recovery errors.
    NvlinkLinkRecoveryErrors { "nvlink_link_recovery_errors", NvlinkLinks, Count, Counter, "Recovery errors (link retrains) on the NVLink link.",
        label: Some("link"), dcgm: None, otel: errors("gpumon.gpu.nvlink.link.errors", Some(("error.type", "recovery"))) }
    /// Per GPU: links up.
    NvlinkLinksUp { "nvlink_links_up", Nvlink, Count, Gauge, "NVLink links of the GPU that are up.",
        label: None, dcgm: None, otel: hw("gpumon.gpu.nvlink.links_up") }
    /// Per GPU: bytes transmitted over all links.
    NvlinkTx { "nvlink_transmit", Nvlink, Bytes, Counter, "Data bytes transmitted over all NVLink links of the GPU.",
        label: None, dcgm: dcgm("DCGM_FI_PROF_NVLINK_TX_BYTES", 1.0), otel: hw_attr("hw.gpu.io", "network.io.direction", "transmit") }
    /// Per GPU: bytes received over all links.
    NvlinkRx { "nvlink_receive", Nvlink, Bytes, Counter, "Data bytes received over all NVLink links of the GPU.",
        label: None, dcgm: dcgm("DCGM_FI_PROF_NVLINK_RX_BYTES", 1.0), otel: hw_attr("hw.gpu.io", "network.io.direction", "receive") }
    /// Per GPU: CRC errors over all links.
    NvlinkCrcErrors { "nvlink_crc_errors", Nvlink, Count, Counter, "CRC errors over all NVLink links of the GPU.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1.0), otel: errors("gpumon.gpu.nvlink.errors", Some(("error.type", "crc"))) }
    /// Per GPU: replay errors over all links.
    NvlinkReplayErrors { "nvlink_replay_errors", Nvlink, Count, Counter, "Replay errors over all NVLink links of the GPU.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 1.0), otel: errors("gpumon.gpu.nvlink.errors", Some(("error.type", "replay"))) }
    /// Per GPU: recovery errors over all links.
    NvlinkRecoveryErrors { "nvlink_recovery_errors", Nvlink, Count, Counter, "Recovery errors over all NVLink links of the GPU.",
        label: None, dcgm: dcgm("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 1.0), otel: errors("gpumon.gpu.nvlink.errors", Some(("error.type", "recovery"))) }

    // Derived series (see `Snapshot::visit_derived`). They have no dcgm-exporter name, so they
    // keep their native names in dcgm naming mode.

    /// 1 while a finding of the diagnosis stage holds (absent otherwise).
    FindingActive { "finding_active", Diagnosis, Count, Gauge, "1 while gpumon's diagnosis finds this condition on the GPU (or, without gpu/uuid labels, on the host).",
        label: None, dcgm: None, otel: hw("gpumon.finding.active"),
        scope: Device, labels: &["kind", "severity"] }
    /// Findings raised since the agent started, per kind.
    FindingsRaised { "findings_raised", Diagnosis, Count, Counter, "Findings raised by gpumon's diagnosis since the agent started.",
        label: None, dcgm: None, otel: hw("gpumon.findings.raised"),
        scope: Host, labels: &["kind"] }

    /// The last completed step of a training run ([`crate::steps`]).
    TrainingStep { "training_step", Steps, Count, Gauge, "Last completed step of the training run.",
        label: None, dcgm: None, otel: hw("gpumon.training.step"),
        scope: Job, labels: &["job", "rank"] }
    /// How long the training run's last step took.
    StepDuration { "step_duration", Steps, Seconds, Gauge, "Duration of the training run's last completed step.",
        label: None, dcgm: None, otel: hw("gpumon.step.duration"),
        scope: Job, labels: &["job", "rank"] }
    /// Mean GPU utilisation over the last reported step.
    StepUtilization { "step_utilization", Steps, Ratio, Gauge, "Mean GPU utilisation over the training run's last reported step.",
        label: None, dcgm: None, otel: hw("gpumon.step.utilization"),
        scope: Device, labels: &["job", "rank"] }
    /// Highest GPU utilisation over the last reported step.
    StepUtilizationMax { "step_utilization_max", Steps, Ratio, Gauge, "Highest GPU utilisation over the training run's last reported step.",
        label: None, dcgm: None, otel: hw("gpumon.step.utilization.max"),
        scope: Device, labels: &["job", "rank"] }
    /// Peak framebuffer memory used over the last reported step.
    StepMemoryPeak { "step_memory_peak", Steps, Bytes, Gauge, "Peak framebuffer memory used over the training run's last reported step.",
        label: None, dcgm: None, otel: hw("gpumon.step.memory.peak"),
        scope: Device, labels: &["job", "rank"] }
    /// Step marks from other processes dropped by the steps socket, per reason.
    StepsRejected { "steps_rejected", Steps, Count, Counter, "Training-step marks the steps socket dropped (malformed, oversized, refused, not_owner; connections over the limit).",
        label: None, dcgm: None, otel: hw("gpumon.steps.rejected"),
        scope: Host, labels: &["reason"] }
    /// Energy the GPU used over the last reported step.
    StepEnergy { "step_energy", Steps, Joules, Gauge, "Energy the GPU used over the training run's last reported step.",
        label: None, dcgm: None, otel: hw("gpumon.step.energy"),
        scope: Device, labels: &["job", "rank"] }

    /// Failures of the attribution sources ([`crate::attribution`]), per source.
    AttributionFailures { "attribution_failures", Processes, Count, Counter, "Failures of gpumon's attribution sources since the agent started: processes whose /proc entries could not be read (source=proc), failed kubelet pod-resources calls (source=kubelet).",
        label: None, dcgm: None, otel: hw("gpumon.attribution.failures"),
        scope: Host, labels: &["source"] }

    /// GPU-time observed, per GPU and owner ([`crate::accounts`]).
    AccountObserved { "account_observed", Accounts, Seconds, Counter, "GPU-time observed on the GPU while this owner (namespace, pod, container, user, job) held it, since the agent started: each tick up counts the time since the previous tick, at most an interval.",
        label: None, dcgm: None, otel: hw("gpumon.account.observed"),
        scope: Device, labels: &["job"] }
    /// GPU-time allocated, per GPU and owner.
    AccountAllocated { "account_allocated", Accounts, Seconds, Counter, "GPU-time the GPU was allocated (memory used at least 10 % of the total by default, or a process on it) while this owner held it, since the agent started.",
        label: None, dcgm: None, otel: hw("gpumon.account.allocated"),
        scope: Device, labels: &["job"] }
    /// Idle GPU-time while allocated, per GPU and owner.
    AccountIdleAllocated { "account_idle_allocated", Accounts, Seconds, Counter, "GPU-time idle while allocated, (1 - utilisation) x interval summed over the allocated ticks (idle time within intervals counts), while this owner held the GPU, since the agent started.",
        label: None, dcgm: None, otel: hw("gpumon.account.idle_allocated"),
        scope: Device, labels: &["job"] }
    /// GPU-time lost per cause, per GPU and owner.
    AccountLost { "account_lost", Accounts, Seconds, Counter, "GPU-time lost to a cause the diagnosis found (the run report's definition per cause; causes can hold at once, so they overlap), while this owner held the GPU, since the agent started.",
        label: None, dcgm: None, otel: hw("gpumon.account.lost"),
        scope: Device, labels: &["cause", "job"] }
    /// Energy used, per GPU and owner.
    AccountEnergy { "account_energy", Accounts, Joules, Counter, "Energy the GPU used while this owner held it, since the agent started (the driver's energy counter, else power x interval).",
        label: None, dcgm: None, otel: hw("gpumon.account.energy"),
        scope: Device, labels: &["job"] }
}

impl MetricId {
    /// Shorthand for `self.descriptor().family`.
    pub const fn family(self) -> Family {
        self.descriptor().family
    }
}

/// Values a sink derives from a descriptor once per process (a metric's full name, its help
/// line escaped), looked up per point without allocating.
///
/// Catalogue metrics are computed together on first use; a stage's own series
/// ([`Descriptor::derived`]) on first sight, then kept for the life of the process: there are as
/// many as the program has `static` descriptors, so the memory is bounded. Series are told
/// apart by name.
///
/// ```
/// use gpumon_core::{MetricId, PerDescriptor};
///
/// static NAMES: PerDescriptor<String> = PerDescriptor::new(|d| d.prometheus_name());
/// assert_eq!(NAMES.get(MetricId::PowerUsage.descriptor()), "gpumon_power_usage_watts");
/// ```
pub struct PerDescriptor<T: 'static> {
    make: fn(&'static Descriptor) -> T,
    catalogue: std::sync::OnceLock<Vec<T>>,
    derived: std::sync::Mutex<Vec<(&'static str, &'static T)>>,
}

impl<T: Send + Sync + 'static> PerDescriptor<T> {
    /// A cache that computes a descriptor's value with `make`.
    pub const fn new(make: fn(&'static Descriptor) -> T) -> Self {
        Self { make, catalogue: std::sync::OnceLock::new(), derived: std::sync::Mutex::new(Vec::new()) }
    }

    /// The value for `descriptor`, computed on first use.
    pub fn get(&'static self, descriptor: &'static Descriptor) -> &'static T {
        if let Some(id) = descriptor.id {
            let all =
                self.catalogue.get_or_init(|| MetricId::ALL.iter().map(|id| (self.make)(id.descriptor())).collect());
            return &all[id as usize];
        }
        let mut derived = crate::lock(&self.derived);
        if let Some((_, value)) = derived.iter().find(|(name, _)| *name == descriptor.name) {
            return value;
        }
        // Kept for the life of the process: one per `static` descriptor the program defines.
        let value: &'static T = Box::leak(Box::new((self.make)(descriptor)));
        derived.push((descriptor.name, value));
        value
    }
}

impl<T> std::fmt::Debug for PerDescriptor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerDescriptor").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn catalogue_is_indexed_by_id() {
        for (i, id) in MetricId::ALL.iter().enumerate() {
            assert_eq!(*id as usize, i);
            assert_eq!(id.descriptor().id, Some(*id));
        }
    }

    #[test]
    fn prometheus_names_are_unique_and_follow_conventions() {
        let mut seen = HashSet::new();
        for id in MetricId::ALL {
            let d = id.descriptor();
            let name = d.prometheus_name();
            assert!(seen.insert(name.clone()), "duplicate name {name}");
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{name}");
            assert_eq!(d.kind == MetricKind::Counter, name.ends_with("_total"), "{name}");
            if let Some(suffix) = d.unit.prometheus_suffix() {
                assert!(name.trim_end_matches("_total").ends_with(suffix), "{name}");
            }
            assert!(!d.help.is_empty());
        }
        assert_eq!(MetricId::EnergyConsumed.descriptor().prometheus_name(), "gpumon_energy_joules_total");
        assert_eq!(MetricId::MemoryUsedRatio.descriptor().prometheus_name(), "gpumon_memory_used_ratio");
    }

    #[test]
    fn canonical_names_are_unique() {
        let mut seen = HashSet::new();
        for id in MetricId::ALL {
            assert!(seen.insert(id.descriptor().name), "duplicate canonical name {}", id.descriptor().name);
        }
    }

    #[test]
    fn dcgm_names_are_unique() {
        let mut seen = HashSet::new();
        for id in MetricId::ALL {
            if let Some(d) = id.descriptor().dcgm {
                assert!(seen.insert(d.name), "duplicate dcgm name {}", d.name);
                assert!(d.name.starts_with("DCGM_"));
            }
        }
    }

    #[test]
    fn otel_name_and_attribute_pairs_are_unique() {
        let mut seen = HashSet::new();
        for id in MetricId::ALL {
            let d = id.descriptor();
            let key = (d.otel.name, d.otel.attribute);
            // Labelled families are told apart by their label, not by the attribute.
            if d.label.is_none() {
                assert!(seen.insert(key), "duplicate otel mapping {key:?}");
            }
            assert!(d.otel.name.starts_with("hw.") || d.otel.name.starts_with("gpumon."));
        }
    }

    #[test]
    fn family_bits_stay_where_they_were_and_stage_inputs_are_opt_in() {
        // A `MetricSet` bit is `Family as u32`: new families go last.
        let bits = [Family::Status, Family::Nvlink, Family::NvlinkLinks, Family::Accounts, Family::ClockEventsByReason]
            .map(|f| f as u32);
        assert_eq!(bits, [0, 19, 22, 24, 25]);
        let all: MetricSet = Family::ALL.into_iter().collect();
        assert_eq!(all, MetricSet::everything());
        assert_eq!(all.iter().count(), Family::ALL.len(), "ALL names each family once");
        let sampled = MetricSet::default().with_stage_inputs();
        for f in Family::READ_BY_STAGES {
            assert!(Family::OPT_IN.contains(&f) && sampled.contains(f), "{f}");
        }
        assert_eq!(sampled.iter().count(), MetricSet::default().iter().count() + Family::READ_BY_STAGES.len());
    }

    #[test]
    fn metric_set_default_excludes_opt_in() {
        let d = MetricSet::default();
        for f in Family::OPT_IN {
            assert!(!d.contains(f));
            assert!(MetricSet::everything().contains(f));
        }
        assert!(d.contains(Family::Utilization));
        let s: MetricSet = [Family::Memory, Family::Power].into_iter().collect();
        assert_eq!(s.iter().collect::<Vec<_>>(), [Family::Memory, Family::Power]);
        for f in Family::ALL {
            assert_eq!(Family::from_name(f.name()), Some(f));
        }
    }
}
