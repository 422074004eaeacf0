//! A simulator of how jobs run on a node, separate from diagnosis and its thresholds: it draws
//! jobs from wide ranges ([`ranges`]), runs them through schedules built from how the work is
//! done (lockstep data parallelism with collectives, pipeline schedules, offload copies, request
//! arrivals, faults), and hands the result to the mock as phases — so every reading goes through
//! the driver's sampling model and counters, as every other mock workload's does.
//!
//! Each [`SimNode`] is a pure function of its seed. Besides the [`Scenario`] it gives:
//! - the **truth** per GPU ([`GpuTruth`]): what the GPU waited for, as the simulation ran it —
//!   not a label written next to it — and the finding that names that wait, if any;
//! - the **region** ([`Region`]): whether the data can show that cause at all, from the
//!   shortest busy or idle stretch against the driver's period and whether steps are marked;
//! - what the agent would know about **jobs and peers** ([`SimJob`], [`JobVisibility`]): step
//!   marks with their job and rank, processes with their owners, PIDs — or none of it.
//!
//! `tests/heldout.rs` scores diagnosis on these draws; `docs/diagnosis.md` lists the ranges.

mod draw;
mod pipeline;
pub mod ranges;

use std::sync::Arc;

use gpumon_core::attribution::Owner;
use gpumon_core::{DeviceSample, FindingKind, ProcessSample};

use crate::{FleetProfile, Scenario};

pub use pipeline::{PipelineSpec, PipelineStep, Schedule};

/// What a GPU spent the run waiting for, as the simulation ran it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Waited {
    /// Nothing worth naming (busy, or waits under [`ranges::CAUSE_SHARE`]).
    Nothing,
    /// Input batches (a loader, or requests that have not arrived).
    Input,
    /// The neighbouring stages of its pipeline.
    PipelinePeers,
    /// Host↔device copies (offloaded optimizer state or parameters).
    HostCopies,
    /// Its own slow part while its peers wait for it: this GPU is the straggler.
    ItsOwnSlowPart,
    /// Memory bandwidth (kernels stall on loads).
    Memory,
    /// Clocks held down (heat, the power limit, an external slowdown).
    Clocks,
    /// Nothing runs although memory is held.
    NoWork,
    /// The hardware failed (lost, ECC).
    Hardware,
}

/// Whether the data can show a GPU's cause at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Region {
    /// NVML's readings can show it: its busy and idle stretches are at least a driver period
    /// long, or it is not a matter of stretches (clocks, memory, errors, counters).
    Shown,
    /// The stretches are shorter than the driver's period, so utilisation averages them away,
    /// but the job marks its steps.
    MarksOnly,
    /// Neither: no reading can show it. Counted apart, never as a right answer.
    Hidden,
    /// The wait is within [`ranges::MARGIN`] of [`ranges::CAUSE_SHARE`]: whether it is worth
    /// naming is a matter of degree. Counted apart.
    Marginal,
}

impl Region {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shown => "shown",
            Self::MarksOnly => "marks-only",
            Self::Hidden => "hidden",
            Self::Marginal => "marginal",
        }
    }
}

/// What the agent can learn about which GPUs belong to which job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum JobVisibility {
    /// Training jobs mark their steps (job name, rank); processes carry owners.
    MarksAndOwners,
    /// Processes carry owners (pod, container, user); no marks.
    Owners,
    /// Processes with PIDs only (attribution off).
    Pids,
    /// Nothing: processes are not sampled and nothing is marked.
    Nothing,
}

impl JobVisibility {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::MarksAndOwners => "marks+owners",
            Self::Owners => "owners",
            Self::Pids => "pids",
            Self::Nothing => "nothing",
        }
    }

    /// Whether marking jobs' marks reach the agent.
    pub fn marks(self) -> bool {
        self == Self::MarksAndOwners
    }
}

/// How a simulated job runs.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum JobShape {
    /// Data-parallel ranks in lockstep: each step waits for input, computes, and all-reduces
    /// (ranks that arrive first spin in the collective and read busy).
    DataParallel {
        /// Micro-steps per optimizer step (gradient accumulation).
        accumulation: u32,
    },
    /// Pipeline stages (times `replicas` data-parallel copies).
    Pipeline {
        /// The schedule and its times.
        spec: PipelineSpec,
        /// Data-parallel replicas of the pipeline.
        replicas: u32,
    },
    /// ZeRO/FSDP with optimizer state offloaded to the host: copies over PCIe every step.
    Offload {
        /// Whether the copies overlap the compute (prefetch) rather than stall it.
        overlapped: bool,
    },
    /// An inference server: batches as requests arrive (Poisson).
    Serving {
        /// Mean requests per second.
        rate_per_s: f64,
    },
    /// A process holds memory and runs nothing (a paused notebook).
    Holding,
}

/// One simulated job: its GPUs and what the agent could know of it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SimJob {
    /// Job name (the step marks' `job`).
    pub name: String,
    /// How it runs.
    pub shape: JobShape,
    /// Its GPUs, by physical index; rank `r` drives `gpus[r]`.
    pub gpus: Vec<u32>,
    /// The step (or pattern cycle) length, seconds.
    pub step_s: f64,
    /// When its work starts, after warm-up and compile, simulated seconds.
    pub start_s: f64,
    /// Whether its loop marks steps (the marks reach the agent only under
    /// [`JobVisibility::MarksAndOwners`]).
    pub marks_steps: bool,
    /// The owner its processes carry under attribution (pod, container, user).
    pub owner: Arc<Owner>,
    /// The PID of each rank's process; one for a job whose one process drives all its GPUs
    /// (an uneven `device_map="auto"` placement): rank `r` runs in `pids[r % pids.len()]`.
    pub pids: Vec<u32>,
    /// The PID of the launcher every rank is a child of (`torchrun`, the `run` command).
    pub launcher_pid: u32,
    /// A one-line description (for misses).
    pub description: String,
}

/// The truth of one GPU in a draw.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GpuTruth {
    /// Physical index.
    pub gpu: u32,
    /// Index into [`SimNode::jobs`]; `None` for a GPU nobody uses.
    pub job: Option<usize>,
    /// Rank within its job.
    pub rank: Option<u32>,
    /// What it waited for.
    pub waited: Waited,
    /// The share of the run's steady state it waited (or ran slowed), `0..=1`.
    pub waited_share: f64,
    /// The finding that names the wait; `None`: diagnosis should say nothing.
    pub cause: Option<FindingKind>,
    /// When the cause starts, simulated seconds.
    pub onset_s: f64,
    /// The shortest of its longest busy and longest idle stretch per cycle, seconds (what a
    /// driver period must not exceed for utilisation to show the pattern); `None` when the
    /// cause is not a matter of stretches.
    pub stretch_s: Option<f64>,
    /// Whether the data can show the cause.
    pub region: Region,
}

/// One draw: a node, its jobs, the settings it is sampled at, and the truth.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SimNode {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The GPUs.
    pub profile: FleetProfile,
    /// The phases (and faults) the mock runs; its driver period is the draw's, its tick
    /// period the sampling interval.
    pub scenario: Scenario,
    /// The driver's utilisation sampling period, seconds.
    pub driver_period_s: f64,
    /// gpumon's sampling interval, seconds.
    pub interval_s: f64,
    /// How long the run lasts, simulated seconds.
    pub duration_s: f64,
    /// The jobs.
    pub jobs: Vec<SimJob>,
    /// What the agent can know of them.
    pub visibility: JobVisibility,
    /// Per GPU, by physical index.
    pub truth: Vec<GpuTruth>,
}

impl SimNode {
    /// Draws the node of `seed` from the ranges of [`ranges`].
    pub fn draw(seed: u64) -> Self {
        draw::draw_node(seed)
    }

    /// The job and rank whose step marks GPU `gpu`'s loop would send, when the marks reach
    /// the agent.
    pub fn marking_run(&self, gpu: u32) -> Option<(&str, u32)> {
        if !self.visibility.marks() {
            return None;
        }
        let t = self.truth.get(gpu as usize)?;
        let job = &self.jobs[t.job?];
        job.marks_steps.then(|| (job.name.as_str(), t.rank.unwrap_or(0)))
    }

    /// Dresses sampled devices with what the agent would know of their jobs: each job's
    /// processes (its ranks' PIDs) with their owners under attribution, PIDs alone without it,
    /// no processes when processes are not sampled. The mock's own processes stand in until
    /// then: their memory and utilisation are kept.
    pub fn dress(&self, devices: &mut [DeviceSample]) {
        for d in devices.iter_mut() {
            let Some(truth) = self.truth.get(d.info.index as usize) else { continue };
            if self.visibility == JobVisibility::Nothing {
                d.processes.clear();
                continue;
            }
            let Some(job) = truth.job.map(|j| &self.jobs[j]) else { continue };
            let memory: u64 = d.processes.iter().filter_map(|p| p.memory_used).sum();
            let template = d.processes.first().cloned();
            let mut p = template.unwrap_or_else(|| ProcessSample::new(0));
            p.pid = job.pids[truth.rank.unwrap_or(0) as usize % job.pids.len()];
            p.name =
                Some(if matches!(job.shape, JobShape::Serving { .. }) { "tritonserver" } else { "python3" }.into());
            if memory > 0 {
                p.memory_used = Some(memory);
            }
            p.owner = (self.visibility != JobVisibility::Pids).then(|| job.owner.clone());
            // Its launcher (`torchrun` for a job's ranks, the shell for a job of one process),
            // which attribution reads from `/proc/<pid>/stat` with the owner.
            p.parent_pid = (self.visibility != JobVisibility::Pids).then_some(job.launcher_pid);
            d.processes = if d.memory.used.is_some_and(|u| u > 0) { vec![p] } else { Vec::new() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MockFleet;
    use gpumon_core::{DeviceFilter, Family, MetricSet};

    #[test]
    fn a_draw_is_a_function_of_its_seed() {
        let (a, b) = (SimNode::draw(7), SimNode::draw(7));
        assert_eq!(a.truth, b.truth);
        assert_eq!(a.scenario, b.scenario);
        assert_ne!(SimNode::draw(8).scenario, a.scenario);
    }

    #[test]
    fn draws_stay_within_the_documented_ranges_and_build() {
        let mut causes = std::collections::BTreeSet::new();
        for seed in 0..300 {
            let n = SimNode::draw(seed);
            assert!((ranges::DRIVER_PERIOD_S.0 - 1e-9..=ranges::DRIVER_PERIOD_S.1).contains(&n.driver_period_s));
            assert!((ranges::INTERVAL_S.0 - 0.005..=ranges::INTERVAL_S.1 + 0.005).contains(&n.interval_s));
            assert_eq!(n.truth.len(), 8);
            for j in &n.jobs {
                assert!((1..=8).contains(&j.gpus.len()), "{}", j.description);
            }
            for (i, p) in n.scenario.phases.iter().enumerate() {
                p.validate(i).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            }
            MockFleet::new(&n.profile, &n.scenario, n.seed).unwrap();
            causes.extend(n.truth.iter().filter_map(|t| t.cause));
        }
        // Every kind gpumon knows is drawn somewhere in 300 nodes.
        assert_eq!(causes.len(), 12, "{causes:?}");
    }

    #[test]
    fn offload_copies_read_on_the_link_while_the_sms_wait() {
        // A node whose first job is a non-overlapped offload job.
        let node = (0..2000)
            .map(SimNode::draw)
            .find(|n| {
                matches!(n.jobs[0].shape, JobShape::Offload { overlapped: false }) && n.truth[0].waited_share > 0.3
            })
            .expect("an offload draw");
        let fleet = MockFleet::new(&node.profile, &node.scenario, node.seed).unwrap();
        let metrics = MetricSet::default().with_stage_inputs().with(Family::PcieThroughput);
        let (mut idle_rx, mut busy_rx) = (Vec::new(), Vec::new());
        for tick in (node.jobs[0].start_s / node.interval_s) as u64 + 2..400 {
            let d = &fleet.sample(tick, metrics, &DeviceFilter::all())[0];
            let rx = d.pcie.rx_bytes_per_second.unwrap();
            if d.utilization.gpu.unwrap() < 0.5 {
                idle_rx.push(rx)
            } else {
                busy_rx.push(rx)
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        assert!(!idle_rx.is_empty() && mean(&idle_rx) > 0.0, "{node:?}");
        // The link is busy while the GPU waits, and far less while it computes.
        let link_peak = idle_rx.iter().copied().fold(0.0, f64::max);
        assert!(link_peak > 3.0 * mean(&busy_rx).max(1.0), "idle {idle_rx:?} busy {busy_rx:?}");
    }

    #[test]
    fn dress_carries_the_jobs_pids_and_owners_as_visibility_allows() {
        let node = (0..200).map(SimNode::draw).find(|n| n.visibility == JobVisibility::Owners).unwrap();
        let fleet = MockFleet::new(&node.profile, &node.scenario, node.seed).unwrap();
        let mut devices = fleet.sample(100, MetricSet::default().with(Family::Processes), &DeviceFilter::all());
        node.dress(&mut devices);
        for t in node.truth.iter().filter(|t| t.job.is_some()) {
            let job = &node.jobs[t.job.unwrap()];
            let d = &devices[t.gpu as usize];
            if let Some(p) = d.processes.first() {
                assert_eq!(p.pid, job.pids[t.rank.unwrap() as usize % job.pids.len()]);
                assert_eq!(p.owner.as_deref(), Some(&*job.owner));
                assert_eq!(p.parent_pid, Some(job.launcher_pid));
            }
        }
    }
}
