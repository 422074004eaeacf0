//! The run report: "run my job under gpumon and tell me what went wrong".
//!
//! [`RunReport`] is a [`Processor`](crate::Processor) that accumulates, per GPU, what a user wants to know after a
//! run — utilisation (mean, p5, p95), peak memory, mean power, energy used, the GPU-time spent
//! idle while memory was allocated — and every finding the diagnosis stage raised, with how long
//! it held. Add it **after** the [`Diagnoser`](crate::diagnose::Diagnoser) (processors run in
//! the order they were added, and the report reads the diagnosis events of each tick), keep the
//! [`ReportHandle`], and call [`ReportHandle::report`] when the run ends.
//!
//! The report opens with an [`Overview`] of the whole run — GPUs, wall time, GPU-time idle
//! while allocated, the main cause with the GPU-time it cost, the time lost per cause, the
//! driver's measured sampling period and the settings under which rules cannot work — then one
//! [`GpuReport`] per GPU.
//!
//! What is measured, exactly ("interval" below is the time a tick covers: the sampling
//! interval, or the time since the previous tick when that is shorter — the sample taken at exit
//! covers only the part of an interval the run lasted; the first tick opens the run and covers
//! no time, so a run's GPU-time is its wall time × GPUs when no tick came late):
//! - **Utilisation** is the diagnosis "level": the driver's high-resolution mean over the
//!   interval when the sample carries one, else the instantaneous `utilization.gpu`. Percentiles
//!   come from a fixed histogram of 1 001 bins (0.1 % wide, nearest rank), allocated once per
//!   GPU, so accumulating allocates nothing per tick.
//! - **Energy** is the sum of the increases of the driver's energy counter between consecutive
//!   ticks; without that counter (or with fewer than two readings), power × interval summed
//!   over the ticks. [`GpuReport::energy_source`] says which.
//! - **Allocated** ticks are those on which memory used is at least `allocated_memory_ratio`
//!   (10 %) of the total, or a process is on the GPU — the diagnosis' own test, with its
//!   thresholds (see [`RunReport::with_thresholds`]) — and a utilisation level is known.
//! - **Idle while allocated** is GPU-time: on each allocated tick, `(1 − level) × interval`.
//!   A GPU busy 38 % of an interval and idle the rest counts 62 % of that interval, however
//!   short its idle stretches; a whole idle tick counts (nearly) the whole interval.
//!   [`GpuReport::idle_allocated_ticks`] still counts the ticks at or below `idle_level` (5 %).
//! - **Findings**: each raise is one entry; its held time runs from the tick that raised it to
//!   the tick that cleared it, or — still active — to the last tick seen. Each interval after
//!   the raising tick, up to and including the clearing one, is charged to the finding.
//! - **Time lost** ([`FindingReport::lost_gpu_seconds`], summed per kind in
//!   [`Overview::causes`]) is what each charged interval cost, by kind of cause:
//!   - utilisation causes (`dataloader_starvation`, `pipeline_bubbles`, `idle_allocated`,
//!     `imbalance`, `pcie_bound`): the idle GPU-time, `(1 − level) × interval`;
//!   - `straggler`: its own idle GPU-time, plus its peers' wait for it — each other allocated
//!     GPU's idle time beyond the straggler's own (what all ranks idle for alike, the loader or
//!     the host, is not the straggler's); GPUs of another owner (attribution on) are not peers;
//!   - `memory_bound`: the idle SM time, `(1 − SM activity) × interval` (GPM's SM activity, else
//!     the level, as the rule reads it);
//!   - slowdowns (`thermal_throttling`, `power_throttling`, `external_slowdown`): busy time ×
//!     clock reduction, `level × (1 − SM clock / max SM clock) × interval` (nothing without the
//!     clocks);
//!   - `hardware_errors`: the whole interval while the GPU is lost (nothing while it runs);
//!   - `near_oom`: nothing — a risk, not a loss.
//!
//!   Causes can hold at once on one GPU (a straggler that is also hot), so the per-cause
//!   figures do not add up to the idle total. The **main cause** is the kind that lost the most
//!   GPU-time (when none lost any, the one held longest).
//! - **Driver sampling period**: the driver samples utilisation at its own period (NVML: 1/6 s
//!   to 1 s by product) and each tick's high-resolution window holds the samples taken since
//!   the last tick. The period is the GPU-time from each GPU's first window on, divided by the
//!   driver samples those windows held.
//! - **Limitations** are [`limitations`](crate::diagnose::limitations) of the settings given
//!   with [`RunReport::with_diagnosis`], with the device count seen, the measured period, and
//!   step marks when steps were seen (a replay's trace carries the recorded steps).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, UNIX_EPOCH};
//! use gpumon_core::report::RunReport;
//! use gpumon_core::{DeviceInfo, DeviceSample, Processor, ProcessorContext, Snapshot, SystemInfo};
//!
//! let (mut report, handle) = RunReport::new();
//! report.attach(&ProcessorContext::new(Duration::from_secs(1)));
//! let info = Arc::new(DeviceInfo::new(0, "GPU-0", "NVIDIA H100 80GB HBM3"));
//! let system = Arc::new(SystemInfo::new("node-1", "example"));
//! for (tick, util) in [0.2, 0.4, 0.6].into_iter().enumerate() {
//!     let mut gpu = DeviceSample::new(info.clone());
//!     gpu.utilization.gpu = Some(util);
//!     gpu.power.usage_watts = Some(300.0);
//!     let mut s = Snapshot::new(system.clone(), vec![gpu])
//!         .with_seq(tick as u64 + 1)
//!         .with_taken_at(UNIX_EPOCH + Duration::from_secs(tick as u64));
//!     report.process(&mut s);
//! }
//! let r = handle.report();
//! assert_eq!(r.gpus[0].samples, 3);
//! // No counter: 300 W over the 2 s the ticks cover (the first opens the run).
//! assert_eq!(r.gpus[0].energy_joules, Some(600.0));
//! println!("{r}"); // the human summary
//! ```

mod accumulate;
mod model;
mod processor;
mod render;
mod step_figures;

pub(crate) use accumulate::{idle_while_allocated, is_allocated, lost, peers_wait, slot, KINDS};
pub use model::*;
pub use processor::{ReportHandle, RunReport};
pub(crate) use render::backend_note;
pub use render::VerboseReport;

pub mod compare;

#[cfg(test)]
mod tests;
