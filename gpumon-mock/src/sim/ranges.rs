//! The ranges every draw is taken from (docs/diagnosis.md lists them). Wide on purpose: the
//! simulator is not written for the rules' thresholds, and the rules are tuned on one set of
//! seeds and scored on another.

/// A job's busy share when its loader (or its request rate) starves it.
pub const BUSY_SHARE: (f64, f64) = (0.15, 0.85);
/// A step, seconds (log-uniform).
pub const STEP_S: (f64, f64) = (0.2, 6.0);
/// The driver's utilisation sampling period, seconds (log-uniform): NVML says "between 1
/// second and 1/6 second depending on the product".
pub const DRIVER_PERIOD_S: (f64, f64) = (1.0 / 6.0, 1.0);
/// gpumon's sampling interval, seconds (log-uniform, rounded to 10 ms).
pub const INTERVAL_S: (f64, f64) = (0.2, 2.0);
/// Relative jitter of each step's timing.
pub const JITTER: (f64, f64) = (0.0, 0.2);
/// Pipeline stages.
pub const STAGES: (u32, u32) = (2, 8);
/// Micro-batches per pipeline step.
pub const MICRO_BATCHES: (u32, u32) = (4, 32);
/// Spread of pipeline stages' compute times around their mean (±).
pub const STAGE_IMBALANCE: f64 = 0.15;
/// Transfer time between stages, share of a micro-batch's forward time.
pub const TRANSFER_SHARE: (f64, f64) = (0.0, 0.3);
/// GPUs per job.
pub const GPUS_PER_JOB: (u32, u32) = (1, 8);
/// Micro-steps per optimizer step (gradient accumulation), when a job accumulates.
pub const ACCUMULATION: (u32, u32) = (2, 8);
/// The share of a ZeRO-offload step its SMs wait for host copies (not overlapped).
pub const OFFLOAD_WAIT_SHARE: (f64, f64) = (0.1, 0.6);
/// The link's share the copies use while they run.
pub const OFFLOAD_LINK_SHARE: (f64, f64) = (0.6, 0.95);
/// How far a straggling rank is behind: the share of each step its peers wait for it.
pub const STRAGGLER_GAP: (f64, f64) = (0.06, 0.35);
/// An inference batch's service time, seconds.
pub const SERVICE_S: (f64, f64) = (0.02, 0.4);
/// Warm-up and compile before a job's steps, seconds (memory held, nothing runs).
pub const WARMUP_S: (f64, f64) = (0.0, 15.0);
/// Healthy jobs: evaluation every this many seconds …
pub const EVAL_EVERY_S: (f64, f64) = (20.0, 60.0);
/// … lasting this long, at a lower utilisation.
pub const EVAL_S: (f64, f64) = (2.0, 6.0);
/// Checkpoint saves (the GPU idles): every this many seconds …
pub const CHECKPOINT_EVERY_S: (f64, f64) = (40.0, 90.0);
/// … lasting this long.
pub const CHECKPOINT_S: (f64, f64) = (0.5, 3.0);
/// How long a draw runs, simulated seconds (four 30 s windows).
pub const DURATION_S: f64 = 120.0;
/// The wait share from which a wait is a cause worth naming (a tenth of the run for a
/// straggler's gap: the "10 points").
pub const CAUSE_SHARE: f64 = 0.15;
/// A straggler's gap from which it is worth naming.
pub const STRAGGLER_SHARE: f64 = 0.10;
/// Waits this close to the cause share are marginal: counted apart.
pub const MARGIN: f64 = 0.04;
/// Share of draws in which the agent sees marks and owners, owners only, PIDs only, nothing.
pub const VISIBILITY_WEIGHTS: [f64; 4] = [0.35, 0.25, 0.2, 0.2];
