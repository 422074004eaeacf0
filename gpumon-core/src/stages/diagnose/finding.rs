//! Findings: what the diagnosis stage concluded about a GPU (or the host), as data.
//!
//! A [`Finding`] says *why* a GPU is underused or unhealthy — "the data loader starves it",
//! "it is memory-bound" — with the numbers behind it and one sentence of advice. The diagnosis
//! stage ([`crate::diagnose::Diagnoser`]) attaches a [`Diagnosis`] to every snapshot: the findings
//! active at that tick, the ones raised or cleared at that tick, and a running count per kind.
//! [`Diagnosis`] is the diagnosis stage's [`StageOutput`]: its series (`finding_active`,
//! `findings_raised`) and events (a finding raised or cleared) are defined here, and every sink
//! exports them like any other stage's (see [`crate::Snapshot::visit_derived`]).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::metric::{DerivedPoint, MetricId, Value};
use crate::model::Snapshot;
use crate::stages::{Event, EventField, EventValue, StageOutput};

/// The key of the diagnosis stage's output (its JSON field).
pub(crate) const DIAGNOSIS_KEY: &str = "diagnosis";

crate::named_enum! {
    /// The kind of a finding. Each has a stable snake_case name (the `kind` label).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    #[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
    #[non_exhaustive]
    pub enum FindingKind as "finding kind" {
        /// Work is allocated but utilisation collapses to near zero and recovers within each
        /// interval: the GPU waits for its input pipeline.
        DataloaderStarvation = "dataloader_starvation",
        /// SM activity is low while DRAM bandwidth is near its peak: kernels wait on memory.
        MemoryBound = "memory_bound",
        /// This GPU idles while another allocated GPU on the host is busy.
        Imbalance = "imbalance",
        /// Memory is held (a process is attached) but nothing runs.
        IdleAllocated = "idle_allocated",
        /// Clocks are held down because the GPU is too hot.
        ThermalThrottling = "thermal_throttling",
        /// Clocks are held down because the board is at its power limit.
        PowerThrottling = "power_throttling",
        /// Device memory is almost full and not shrinking.
        NearOom = "near_oom",
        /// Host↔device traffic saturates the PCIe link while the GPU waits.
        PcieBound = "pcie_bound",
        /// Uncorrectable ECC errors, XID errors, pending/failed row remapping, or the GPU is lost.
        HardwareErrors = "hardware_errors",
        /// One GPU runs persistently behind a group of busy peers doing the same work.
        Straggler = "straggler",
        /// Clocks are held down from outside (HW slowdown, power brake) on a cool GPU below its
        /// power limit.
        ExternalSlowdown = "external_slowdown",
        /// The GPU cycles between busy and idle like a starved one, but idles in turn with the other
        /// GPUs of its job rather than together: pipeline-parallel bubbles.
        PipelineBubbles = "pipeline_bubbles",
        /// "Cannot tell": the GPU cycles between busy and idle like a starved one or a pipeline
        /// stage, and the data cannot decide which — its readings cannot show whether the GPUs
        /// of its job idle together or in turn (steps or stretches too short for the driver's
        /// sampling), they do neither clearly, or it idles in turn with GPUs nothing says belong
        /// to its job. Names both causes, with both pieces of advice.
        StarvationOrBubbles = "starvation_or_bubbles",
        /// "Cannot tell": the GPU runs persistently behind busy GPUs that read alike and hold
        /// the same memory, like a straggler — but nothing says they share its job (no step
        /// marks, no process owners, no common launcher or process), and a job of its own
        /// beside them, waiting on its own input, reads the same. Names both causes, with both
        /// pieces of advice.
        StragglerOrOwnJob = "straggler_or_own_job",
        /// "Cannot tell": the GPU idles over its window while another GPU is busy, like the idle
        /// half of an uneven split — but no process is read on it and nothing says they share a
        /// job, and a job of its own idling beside another job's busy GPU reads the same. Names
        /// both causes, with both pieces of advice.
        ImbalanceOrOwnJob = "imbalance_or_own_job",
    }
}

impl FindingKind {
    /// What to do about a finding of this kind, in one sentence: the advice its findings carry
    /// (a raised finding's own [`Finding::advice`] may fit its evidence more closely — a
    /// starving GPU whose idle stretches last seconds is told about evaluation passes first).
    ///
    /// ```
    /// use gpumon_core::FindingKind;
    /// assert!(FindingKind::DataloaderStarvation.advice().contains("num_workers"));
    /// ```
    pub fn advice(self) -> &'static str {
        super::rules::advice(self)
    }

    /// For a "cannot tell" kind, the causes it names — the data could not decide between them,
    /// and any one may be the cause; empty for a kind that names one cause. With no job known,
    /// a GPU behind its busy neighbours may be their straggler or run a job of its own that
    /// waits for its input; one idle beside them, the idle half of an uneven split or a job of
    /// its own idling (waiting for input, or holding memory with nothing to run).
    ///
    /// ```
    /// use gpumon_core::FindingKind;
    /// let named = FindingKind::StragglerOrOwnJob.names_causes();
    /// assert!(named.contains(&FindingKind::Straggler));
    /// assert!(FindingKind::Straggler.names_causes().is_empty());
    /// ```
    pub fn names_causes(self) -> &'static [FindingKind] {
        use FindingKind as K;
        match self {
            K::StarvationOrBubbles => &[K::DataloaderStarvation, K::PipelineBubbles],
            K::StragglerOrOwnJob => &[K::Straggler, K::DataloaderStarvation],
            K::ImbalanceOrOwnJob => &[K::Imbalance, K::DataloaderStarvation, K::IdleAllocated],
            _ => &[],
        }
    }

    /// Whether this kind says "cannot tell" (see [`FindingKind::names_causes`]).
    ///
    /// ```
    /// use gpumon_core::FindingKind;
    /// assert!(FindingKind::StarvationOrBubbles.cannot_tell());
    /// assert!(!FindingKind::PipelineBubbles.cannot_tell());
    /// ```
    pub fn cannot_tell(self) -> bool {
        !self.names_causes().is_empty()
    }
}

crate::named_enum! {
    /// How urgent a finding is. Its name is the `severity` label.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    #[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
    #[non_exhaustive]
    pub enum Severity as "severity" {
        /// Worth knowing; money is not burning fast.
        Info = "info",
        /// Capacity is being wasted or a job is at risk.
        Warning = "warning",
        /// The hardware is failing or a job is about to fail.
        Critical = "critical",
    }
}

/// One diagnosed condition on one GPU (or on the host).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Finding {
    /// What was found.
    pub kind: FindingKind,
    /// How urgent it is.
    pub severity: Severity,
    /// UUID of the GPU it concerns; `None` for a host-level finding.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub uuid: Option<String>,
    /// NVML index of that GPU.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub gpu: Option<u32>,
    /// When the condition started to hold (the first tick of the window that raised it).
    #[cfg_attr(feature = "serde", serde(with = "crate::model::unix_nanos"))]
    pub since: SystemTime,
    /// The numbers that triggered it, in words ("utilisation mean 31 %, min 2 % / max 96 % …").
    /// Formatted when the finding is raised (for a clear event: when it is cleared).
    pub evidence: String,
    /// One sentence on what to do about it.
    pub advice: String,
}

impl Finding {
    /// A finding of `kind` on the GPU `uuid` (index `gpu`), or on the host when `uuid` is `None`.
    pub fn new(
        kind: FindingKind,
        severity: Severity,
        device: Option<(u32, &str)>,
        since: SystemTime,
        evidence: impl Into<String>,
        advice: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            severity,
            uuid: device.map(|(_, u)| u.to_owned()),
            gpu: device.map(|(i, _)| i),
            since,
            evidence: evidence.into(),
            advice: advice.into(),
        }
    }
}

crate::named_enum! {
    /// Whether a finding started or ended.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    #[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
    #[non_exhaustive]
    pub enum Transition as "transition" {
        /// The condition has held for the diagnosis window: the finding is now active.
        Raised = "raised",
        /// The condition has stopped holding for the window: the finding is over.
        Cleared = "cleared",
    }
}

/// A finding raised or cleared at one tick.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FindingEvent {
    /// Raised or cleared.
    pub transition: Transition,
    /// The finding. For a clear, its evidence describes the numbers at the time it cleared.
    pub finding: Finding,
    /// For a clear: how long the finding was active.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub held_for: Option<Duration>,
}

impl FindingEvent {
    /// An event: `finding` was raised, or cleared after being active for `held_for`.
    pub fn new(transition: Transition, finding: Finding, held_for: Option<Duration>) -> Self {
        Self { transition, finding, held_for }
    }
}

/// Findings raised since the diagnosis stage started, for one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FindingCount {
    /// The kind.
    pub kind: FindingKind,
    /// How many were raised (monotonic).
    pub raised: u64,
}

impl FindingCount {
    /// `raised` findings of `kind` so far.
    pub const fn new(kind: FindingKind, raised: u64) -> Self {
        Self { kind, raised }
    }
}

/// What the diagnosis stage attached to one snapshot.
///
/// `active` and `raised_total` are shared between ticks and replaced only when a finding is
/// raised or cleared, so carrying them on every snapshot costs a reference count, not a copy.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Diagnosis {
    /// Findings that hold at this tick.
    pub active: Arc<[Finding]>,
    /// Findings raised or cleared at this tick (usually none).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub events: Vec<FindingEvent>,
    /// Findings raised so far, per kind (kinds never raised are absent).
    pub raised_total: Arc<[FindingCount]>,
    /// Which GPUs diagnosis reads as busy over its window (`None` from a stage that does not
    /// say, e.g. a snapshot recorded before it did).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub busy: Option<Busy>,
}

/// "Busy" as diagnosis means it, per GPU: the mean level — utilisation, else GPM SM activity —
/// over the diagnosis window at or above `level` (`diagnose.thresholds.imbalance_busy`, 60 %),
/// never one reading: a starved GPU swinging between 0 and 95 % each second is not busy. The
/// web view's "busy N of M" is this.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct Busy {
    /// The diagnosis window, seconds.
    pub window_seconds: f64,
    /// The level a GPU's window mean must reach, 0–1.
    pub level: f64,
    /// Each GPU with a level read in its window, in the snapshot's order.
    pub gpus: Arc<[BusyGpu]>,
}

/// One GPU's verdict in [`Busy`].
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct BusyGpu {
    /// The GPU's UUID.
    pub uuid: String,
    /// Whether its mean level over the window reaches [`Busy::level`].
    pub busy: bool,
}

impl BusyGpu {
    /// The verdict `busy` on GPU `uuid`.
    pub fn new(uuid: impl Into<String>, busy: bool) -> Self {
        Self { uuid: uuid.into(), busy }
    }
}

impl Diagnosis {
    /// The active findings on the GPU `uuid`.
    pub fn active_on<'a>(&'a self, uuid: &'a str) -> impl Iterator<Item = &'a Finding> + 'a {
        self.active.iter().filter(move |f| f.uuid.as_deref() == Some(uuid))
    }
}

impl StageOutput for Diagnosis {
    fn key(&self) -> &'static str {
        DIAGNOSIS_KEY
    }

    /// Each active finding ([`MetricId::FindingActive`], value 1) and each kind's count of
    /// findings raised ([`MetricId::FindingsRaised`]). A finding about a GPU the snapshot does
    /// not carry (filtered away) is skipped, so a device filter hides findings too.
    fn visit_series<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(DerivedPoint<'a>)) {
        for finding in self.active.iter() {
            let Some(device) = finding_device(snapshot, finding) else { continue };
            let labels = [finding.kind.name(), finding.severity.name()];
            f(DerivedPoint::new(MetricId::FindingActive.descriptor(), Value::Int(1), device, &labels));
        }
        for count in self.raised_total.iter() {
            let descriptor = MetricId::FindingsRaised.descriptor();
            f(DerivedPoint::new(descriptor, Value::Int(count.raised), None, &[count.kind.name()]));
        }
    }

    /// One `finding` event per finding raised or cleared at this tick: tags `kind`, `severity`;
    /// fields `active` (1 raised, 0 cleared), `advice`, `evidence` and, on a clear,
    /// `held_for_seconds`. Events about a GPU the snapshot does not carry are skipped.
    fn visit_events<'a>(&'a self, snapshot: &'a Snapshot, f: &mut dyn FnMut(&Event<'_>)) {
        for event in &self.events {
            let finding = &event.finding;
            let Some(device) = finding_device(snapshot, finding) else { continue };
            let raised = event.transition == Transition::Raised;
            let held = event.held_for.filter(|_| !raised).map(|d| d.as_secs_f64());
            let fields: [EventField<'_>; 4] = [
                ("active", EventValue::Int(i64::from(raised))),
                ("advice", EventValue::Str(&finding.advice)),
                ("evidence", EventValue::Str(&finding.evidence)),
                ("held_for_seconds", EventValue::Float(held.unwrap_or(0.0))),
            ];
            let text = |out: &mut String| write_finding_line(out, event);
            f(&Event {
                name: "finding",
                at: snapshot.taken_at,
                device,
                tags: &[("kind", finding.kind.name()), ("severity", finding.severity.name())],
                fields: &fields[..if held.is_some() { 4 } else { 3 }],
                rows: &crate::model::no_rows,
                text: &text,
            });
        }
    }

    /// The findings about the view's devices whose text names no GPU outside the view; no
    /// host-level findings and no raised counts (they count every tenant's GPUs).
    fn scoped(&self, view: &Snapshot) -> Option<Arc<dyn StageOutput>> {
        Some(Arc::new(scope_diagnosis(self, view)))
    }

    #[cfg(feature = "serde")]
    fn as_serialize(&self) -> Option<&dyn erased_serde::Serialize> {
        Some(self)
    }
}

/// Findings about the view's devices whose text names no GPU outside the view; no host-level
/// findings and no raised counts (they count every tenant's GPUs). The diagnosis stage's own
/// rule for tenant views ([`StageOutput::scoped`]): a stage decides what of its output a tenant
/// may read ([`crate::attribution::tenant`] builds the view).
fn scope_diagnosis(diagnosis: &Diagnosis, view: &Snapshot) -> Diagnosis {
    let kept: HashSet<&str> = view.devices.iter().map(|d| d.info.uuid.as_str()).collect();
    // A kept MIG instance shows its parent's UUID anyway (`parent_uuid`); text may name it.
    let mut nameable = kept.clone();
    nameable.extend(view.mig_parents());
    let visible = |f: &Finding| {
        f.uuid.as_deref().is_some_and(|u| kept.contains(u))
            && names_only(&f.evidence, &nameable)
            && names_only(&f.advice, &nameable)
    };
    // Every field named: one added to `Diagnosis` later must be decided on here.
    Diagnosis {
        active: diagnosis.active.iter().filter(|f| visible(f)).cloned().collect::<Vec<_>>().into(),
        events: diagnosis.events.iter().filter(|e| visible(&e.finding)).cloned().collect(),
        raised_total: Arc::from([]),
        // The view's own GPUs' verdicts only.
        busy: diagnosis.busy.as_ref().map(|b| Busy {
            gpus: b.gpus.iter().filter(|g| kept.contains(g.uuid.as_str())).cloned().collect::<Vec<_>>().into(),
            ..b.clone()
        }),
    }
}

/// Whether every word of `text` that looks like a GPU or MIG UUID (contains `GPU-` or `MIG-`)
/// is one of `nameable`. Errs on the side of hiding: an unusual word that merely contains
/// `GPU-` hides the finding, never another tenant's GPU.
fn names_only(text: &str, nameable: &HashSet<&str>) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '/'))
        .filter(|w| w.contains("GPU-") || w.contains("MIG-"))
        .all(|w| nameable.contains(w))
}

/// Where a finding's points go: `Some(Some(index))` for a GPU the snapshot carries,
/// `Some(None)` for a host-level finding, `None` for a GPU filtered away.
fn finding_device(snapshot: &Snapshot, finding: &Finding) -> Option<Option<usize>> {
    match &finding.uuid {
        Some(uuid) => snapshot.position(uuid).map(Some),
        None => Some(None),
    }
}

/// One finding event as a human line:
/// `FINDING raised gpu 0 GPU-… kind (severity): evidence. Advice: advice` or
/// `FINDING cleared gpu 0 GPU-… kind after 2m 10s: evidence`.
pub(crate) fn write_finding_line(out: &mut String, event: &FindingEvent) {
    use crate::stages::text::{push_duration, push_one_line, sentence};
    let f = &event.finding;
    let _ = write!(out, "FINDING {} ", event.transition.name());
    // The UUID comes from the driver (or a mock profile): kept to one line like the evidence.
    match (f.gpu, f.uuid.as_deref()) {
        (Some(gpu), Some(uuid)) => {
            let _ = write!(out, "gpu {gpu} ");
            push_one_line(out, uuid);
            out.push(' ');
        }
        (None, Some(uuid)) => {
            out.push_str("gpu ");
            push_one_line(out, uuid);
            out.push(' ');
        }
        _ => out.push_str("host "),
    }
    out.push_str(f.kind.name());
    match event.transition {
        Transition::Cleared => {
            if let Some(held) = event.held_for {
                out.push_str(" after ");
                push_duration(out, held);
            }
            out.push_str(": ");
            push_one_line(out, sentence(&f.evidence));
        }
        _ => {
            let _ = write!(out, " ({}): ", f.severity);
            push_one_line(out, sentence(&f.evidence));
            if !f.advice.is_empty() {
                out.push_str(". Advice: ");
                push_one_line(out, f.advice.trim_end());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip_and_are_snake_case() {
        for k in FindingKind::ALL {
            assert_eq!(FindingKind::from_name(k.name()), Some(k));
            assert!(k.name().bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{k}");
        }
        assert_eq!(FindingKind::from_name("dataloader-starvation"), None);
    }

    #[test]
    fn cannot_tell_kinds_name_two_causes_or_more_each_a_kind_of_its_own() {
        use FindingKind as K;
        let doubtful: Vec<FindingKind> = FindingKind::ALL.into_iter().filter(|k| k.cannot_tell()).collect();
        assert_eq!(doubtful, [K::StarvationOrBubbles, K::StragglerOrOwnJob, K::ImbalanceOrOwnJob]);
        for k in doubtful {
            assert!(k.name().contains("_or_"), "{k}");
            assert!(k.names_causes().len() >= 2, "{k}");
            assert!(k.names_causes().iter().all(|c| !c.cannot_tell()), "{k}");
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_uses_the_stable_names() {
        let json = serde_json::to_string(&FindingKind::NearOom).unwrap();
        assert_eq!(json, "\"near_oom\"");
        let s: Severity = serde_json::from_str("\"critical\"").unwrap();
        assert_eq!(s, Severity::Critical);
    }

    #[test]
    fn uuid_words_are_found_wherever_they_are() {
        let nameable: HashSet<&str> = ["GPU-1", "MIG-GPU-1/1/0"].into_iter().collect();
        assert!(names_only("no uuid here", &nameable));
        assert!(names_only("(GPU-1) and MIG-GPU-1/1/0.", &nameable));
        assert!(!names_only("GPU 2 (GPU-2) runs", &nameable));
        assert!(!names_only("MIG-GPU-2/1/0", &nameable));
        assert!(!names_only("multi-GPU-job", &nameable), "in doubt, hide");
    }
}
