//! Drawing a node: its jobs, each run as the way it works says, turned into the mock's phases
//! and the truth per GPU.

use std::sync::Arc;
use std::time::Duration;

use gpumon_core::attribution::Owner;
use gpumon_core::FindingKind;

use super::pipeline::{busy_time, longest_stretches, readable_idle_share, stage_memory, PipelineSpec, Schedule};
use super::ranges as r;
use super::{GpuTruth, JobShape, JobVisibility, Region, SimJob, SimNode, Waited};
use crate::rng::splitmix64;
use crate::timeline::{Phase, Shape};
use crate::{Fault, FleetProfile, Scenario};

/// A small sequential generator (the node's draws happen once, in order).
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = splitmix64(self.0);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, (lo, hi): (f64, f64)) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    fn log_range(&mut self, (lo, hi): (f64, f64)) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }
    fn int(&mut self, (lo, hi): (u32, u32)) -> u32 {
        lo + ((f64::from(hi - lo + 1) * self.unit()) as u32).min(hi - lo)
    }
    fn pick(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut x = self.unit() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len() - 1
    }
}

/// What a job builder hands back: the job, its phases and per rank its truth.
struct Built {
    job: SimJob,
    phases: Vec<Phase>,
    faults: Vec<Fault>,
    truth: Vec<GpuTruth>,
}

/// The job kinds and how often each is drawn.
const KINDS: [(&str, f64); 9] = [
    ("starved", 0.22),
    ("healthy", 0.15),
    ("straggler", 0.08),
    ("pipeline", 0.18),
    ("offload", 0.10),
    ("serving", 0.07),
    ("holding", 0.04),
    ("imbalance", 0.04),
    ("fault", 0.12),
];

pub(super) fn draw_node(seed: u64) -> SimNode {
    let mut g = Rng(splitmix64(seed ^ 0x5151_D00D));
    let model = if g.unit() < 0.7 { "h100" } else { "a100-80gb" };
    let profile = FleetProfile::of_model(model, 8).unwrap_or_default();
    let driver_period_s = g.log_range(r::DRIVER_PERIOD_S);
    let interval_s = (g.log_range(r::INTERVAL_S) * 100.0).round() / 100.0;
    let visibility =
        [JobVisibility::MarksAndOwners, JobVisibility::Owners, JobVisibility::Pids, JobVisibility::Nothing]
            [g.pick(&r::VISIBILITY_WEIGHTS)];
    let mut free: Vec<u32> = (0..8).collect();
    let mut jobs = Vec::new();
    let mut phases = Vec::new();
    let mut faults = Vec::new();
    let mut truth: Vec<GpuTruth> = (0..8).map(idle_truth).collect();
    while !free.is_empty() && (jobs.is_empty() || g.unit() > 0.12) {
        let kind = KINDS[g.pick(&KINDS.map(|(_, w)| w))].0;
        let want = match kind {
            "serving" | "holding" => 1,
            "imbalance" => 2,
            "straggler" => g.int((3, 8)),
            "pipeline" => g.int(r::STAGES),
            _ => g.int(r::GPUS_PER_JOB),
        };
        let n = want.min(free.len() as u32);
        if (kind == "imbalance" && n < 2) || (kind == "straggler" && n < 3) || (kind == "pipeline" && n < 2) {
            break;
        }
        let gpus: Vec<u32> = free.drain(..n as usize).collect();
        let index = jobs.len();
        let mut b = build_job(&mut g, seed, kind, index, gpus, &profile, driver_period_s, interval_s, visibility);
        for mut t in b.truth.drain(..) {
            t.job = Some(index);
            let gpu = t.gpu as usize;
            truth[gpu] = t;
        }
        phases.append(&mut b.phases);
        faults.append(&mut b.faults);
        jobs.push(b.job);
    }
    let mut scenario = Scenario::new(crate::Workload::Idle)
        .with_driver_period(Duration::from_secs_f64(driver_period_s))
        .with_tick_period(Duration::from_secs_f64(interval_s));
    scenario.name = format!("sim-{seed:016x}");
    scenario.phases = phases;
    scenario.faults = faults;
    SimNode { seed, profile, scenario, driver_period_s, interval_s, duration_s: r::DURATION_S, jobs, visibility, truth }
}

fn idle_truth(gpu: u32) -> GpuTruth {
    GpuTruth {
        gpu,
        job: None,
        rank: None,
        waited: Waited::Nothing,
        waited_share: 0.0,
        cause: None,
        onset_s: 0.0,
        stretch_s: None,
        region: Region::Shown,
    }
}

/// The truth of a GPU whose cause is a pattern of waits: named when the wait is at least
/// `threshold`, marginal near it, hidden when the readings cannot show it and nothing is marked:
/// its busy or idle stretches are all shorter than the driver's period, or the share of the
/// wait in idle stretches at least that long (`readable`, see [`readable_idle_share`]) is under
/// `threshold` — the rest falls within samples beside busy time and reads as lighter work.
#[allow(clippy::too_many_arguments)]
fn pattern_truth(
    gpu: u32,
    rank: u32,
    waited: Waited,
    share: f64,
    kind: FindingKind,
    threshold: f64,
    stretch: f64,
    readable: f64,
    driver: f64,
    marked: bool,
    onset_s: f64,
) -> GpuTruth {
    let named = share >= threshold;
    let region = if (share - threshold).abs() < r::MARGIN {
        Region::Marginal
    } else if !named || (stretch >= driver && readable >= threshold) {
        Region::Shown
    } else if marked {
        Region::MarksOnly
    } else {
        Region::Hidden
    };
    GpuTruth {
        gpu,
        job: None,
        rank: Some(rank),
        waited: if named { waited } else { Waited::Nothing },
        waited_share: share,
        cause: named.then_some(kind),
        onset_s,
        stretch_s: Some(stretch),
        region,
    }
}

/// The share of the run GPU `gpu`'s pattern `phase` spends outside its busy stretches, as the
/// mock plays it from the node's `seed` (each cycle stretched by the job's jitter): the truth of
/// what it waited for, not the nominal `1 − busy` — a cycle the jitter shortens ends in idle
/// time too (the next input is not there yet).
fn played_wait(phase: &Phase, seed: u64, gpu: u32) -> f64 {
    1.0 - phase.pattern_busy_share(seed, gpu, phase.from_s, r::DURATION_S)
}

/// A busy job's GPU with nothing to name.
fn plain_truth(gpu: u32, rank: u32, onset_s: f64) -> GpuTruth {
    GpuTruth { rank: Some(rank), onset_s, ..idle_truth(gpu) }
}

fn pattern_phase(gpu: u32, start: f64, step_s: f64, pattern: Vec<[f64; 2]>, jitter: f64, key: u64) -> Phase {
    Phase {
        gpus: Some(vec![gpu]),
        from_s: start,
        shape: Shape::Pattern,
        step_s,
        pattern,
        jitter,
        jitter_key: Some(key),
        busy: 0.97,
        idle: 0.0,
        ..Phase::default()
    }
}

/// What every job builder shares: the job's draws and the node's settings.
struct Ctx<'a> {
    kind: &'a str,
    /// The node's seed: the mock plays each cycle's jitter from it ([`played_wait`]).
    seed: u64,
    start: f64,
    step_s: f64,
    jitter: f64,
    memory: f64,
    key: u64,
    marks_steps: bool,
    marked: bool,
    driver: f64,
    interval: f64,
    profile: &'a FleetProfile,
}

/// What the builders add to: phases, faults, truth per rank, and the step's length.
struct Out {
    phases: Vec<Phase>,
    faults: Vec<Fault>,
    truth: Vec<GpuTruth>,
    step_len: f64,
}

#[allow(clippy::too_many_arguments)]
fn build_job(
    g: &mut Rng,
    seed: u64,
    kind: &str,
    index: usize,
    gpus: Vec<u32>,
    profile: &FleetProfile,
    driver: f64,
    interval: f64,
    visibility: JobVisibility,
) -> Built {
    let start = g.range(r::WARMUP_S);
    let step_s = g.log_range(r::STEP_S);
    let jitter = g.range(r::JITTER);
    let memory = g.range((0.5, 0.9));
    let key = splitmix64(index as u64 ^ 0xA11);
    let marks_steps = !matches!(kind, "serving" | "holding") && g.unit() < 0.8;
    let marked = marks_steps && visibility.marks();
    let mut owner = Owner::default();
    owner.namespace = Some("ml".into());
    owner.pod = Some(format!("{kind}-{index}"));
    owner.container = Some("main".into());
    owner.uid = Some(1000 + index as u32);
    let launcher_pid = 10_000 + 1000 * index as u32;
    let pids: Vec<u32> = (0..gpus.len() as u32).map(|r| launcher_pid + 1 + r).collect();
    let mut out = Out { phases: Vec::new(), faults: Vec::new(), truth: Vec::new(), step_len: step_s };
    // Warm-up and compile: memory held, nothing runs.
    if start > 0.0 {
        for &gpu in &gpus {
            out.phases.push(Phase {
                gpus: Some(vec![gpu]),
                until_s: Some(start),
                busy: 0.0,
                idle: 0.0,
                memory: memory * 0.8,
                ..Phase::default()
            });
        }
    }
    let c = Ctx { kind, seed, start, step_s, jitter, memory, key, marks_steps, marked, driver, interval, profile };
    let shape = match kind {
        "starved" | "healthy" | "straggler" | "fault" => data_parallel(g, &c, &gpus, &mut out),
        "pipeline" => pipeline(g, &c, &gpus, &mut out),
        "offload" => offload(g, &c, &gpus, &mut out),
        "serving" => serving(g, &c, &gpus, &mut out),
        "holding" => holding(g, &gpus, &mut out),
        _ => imbalance(g, &c, &gpus, &mut out),
    };
    // An uneven placement (`device_map="auto"`) is one program driving both GPUs: one process.
    let pids = if kind == "imbalance" { vec![pids[0]] } else { pids };
    let description =
        format!("{kind} on GPUs {gpus:?}, step {:.2} s, jitter {jitter:.2}, start {start:.1} s", out.step_len);
    Built {
        job: SimJob {
            name: format!("{kind}-{index}"),
            shape,
            gpus,
            step_s: out.step_len,
            start_s: start,
            marks_steps,
            owner: Arc::new(owner),
            pids,
            launcher_pid,
            description,
        },
        phases: out.phases,
        faults: out.faults,
        truth: out.truth,
    }
}

/// Data-parallel ranks in lockstep: input wait, compute (per micro-step), all-reduce.
fn data_parallel(g: &mut Rng, c: &Ctx<'_>, gpus: &[u32], out: &mut Out) -> JobShape {
    let accumulation = if g.unit() < 0.3 { g.int(r::ACCUMULATION) } else { 1 };
    let busy = if c.kind == "starved" { g.range(r::BUSY_SHARE) } else { g.range((0.9, 0.99)) };
    let allreduce = g.range((0.02, 0.08)) * busy * c.step_s;
    let compute = busy * c.step_s - allreduce;
    let wait = c.step_s - busy * c.step_s;
    let micro = c.step_s / f64::from(accumulation);
    let mut pattern = Vec::new();
    for k in 0..accumulation {
        let o = f64::from(k) * micro * (compute + wait) / c.step_s;
        pattern.push([o + wait / f64::from(accumulation), o + (wait + compute) / f64::from(accumulation)]);
    }
    pattern.push([compute + wait, c.step_s]);
    merge(&mut pattern);
    let straggler = (c.kind == "straggler").then(|| (g.int((0, gpus.len() as u32 - 1)), g.range(r::STRAGGLER_GAP)));
    for (rank, &gpu) in gpus.iter().enumerate() {
        let rank = rank as u32;
        let mut p = pattern.clone();
        if let Some((slow, gap)) = straggler.filter(|(s, _)| *s == rank) {
            // Its own input is late: it idles `gap` of each step while its peers spin in
            // the all-reduce waiting for it (they read busy).
            let late = wait / f64::from(accumulation) + gap * c.step_s;
            p = vec![[late.min(c.step_s * 0.95), c.step_s]];
            let (b, i) = longest_stretches(&p, c.step_s);
            out.truth.push(pattern_truth(
                gpu,
                slow,
                Waited::ItsOwnSlowPart,
                gap,
                FindingKind::Straggler,
                r::STRAGGLER_SHARE,
                b.min(i),
                // Named on its level against its peers', which shows however its wait is cut.
                gap,
                c.driver,
                c.marked,
                c.start,
            ));
        } else if straggler.is_some() {
            p = vec![[wait / f64::from(accumulation), c.step_s]];
            out.truth.push(plain_truth(gpu, rank, c.start));
        }
        let mut phase = pattern_phase(gpu, c.start, c.step_s, p, c.jitter, c.key);
        if straggler.is_none() {
            let (b, i) = longest_stretches(&phase.pattern, c.step_s);
            out.truth.push(pattern_truth(
                gpu,
                rank,
                Waited::Input,
                played_wait(&phase, c.seed, gpu),
                FindingKind::DataloaderStarvation,
                r::CAUSE_SHARE,
                b.min(i),
                readable_idle_share(&phase.pattern, c.step_s, c.driver),
                c.driver,
                c.marked,
                c.start,
            ));
        }
        phase.memory = c.memory;
        phase.memory_controller = Some(g.range((0.3, 0.55)));
        phase.steps = c.marks_steps;
        out.phases.push(phase);
    }
    if c.kind == "healthy" || c.kind == "fault" {
        host_pauses(g, gpus, c.start, c.memory, &mut out.phases);
    }
    if c.kind == "fault" {
        apply_fault(g, gpus, c.start, c.interval, c.profile, &mut out.phases, &mut out.faults, &mut out.truth);
    }
    JobShape::DataParallel { accumulation }
}

/// Pipeline stages under a drawn schedule.
fn pipeline(g: &mut Rng, c: &Ctx<'_>, gpus: &[u32], out: &mut Out) -> JobShape {
    let stages = gpus.len();
    let micro_batches = g.int(r::MICRO_BATCHES);
    let schedule = [Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved { chunks: 2 }][g.pick(&[1.0, 1.0, 1.0])];
    let f = c.step_s / ((f64::from(micro_batches) + stages as f64 - 1.0) * 3.0);
    let spec = PipelineSpec {
        schedule,
        forward_s: (0..stages).map(|_| f * (1.0 + r::STAGE_IMBALANCE * (2.0 * g.unit() - 1.0))).collect(),
        backward_ratio: 2.0,
        micro_batches,
        transfer_s: f * g.range(r::TRANSFER_SHARE),
        optimizer_s: c.step_s * g.range((0.02, 0.08)),
    };
    let step = spec.step();
    out.step_len = step.step_s;
    // Stages hold different memory (their layers, the micro-batches in flight on them).
    let memory = stage_memory(&spec, c.memory);
    for (rank, &gpu) in gpus.iter().enumerate() {
        let busy = &step.busy[rank];
        let mut phase = pattern_phase(gpu, c.start, step.step_s, busy.clone(), c.jitter, c.key);
        let (b, i) = longest_stretches(busy, step.step_s);
        out.truth.push(pattern_truth(
            gpu,
            rank as u32,
            Waited::PipelinePeers,
            played_wait(&phase, c.seed, gpu),
            FindingKind::PipelineBubbles,
            r::CAUSE_SHARE,
            b.min(i),
            readable_idle_share(busy, step.step_s, c.driver),
            c.driver,
            c.marked,
            c.start,
        ));
        phase.memory = memory[rank];
        phase.memory_controller = Some(g.range((0.3, 0.55)));
        phase.steps = c.marks_steps;
        out.phases.push(phase);
    }
    JobShape::Pipeline { spec, replicas: 1 }
}

/// ZeRO/FSDP offload: the SMs wait while copies run on the link (unless overlapped).
fn offload(g: &mut Rng, c: &Ctx<'_>, gpus: &[u32], out: &mut Out) -> JobShape {
    let overlapped = g.unit() < 0.3;
    let wait = if overlapped { 0.0 } else { g.range(r::OFFLOAD_WAIT_SHARE) };
    let link = g.range(r::OFFLOAD_LINK_SHARE);
    for (rank, &gpu) in gpus.iter().enumerate() {
        let pattern = vec![[0.0, c.step_s * (1.0 - wait).max(0.02)]];
        let mut phase = pattern_phase(gpu, c.start, c.step_s, pattern.clone(), c.jitter, c.key);
        phase.memory = c.memory;
        phase.steps = c.marks_steps;
        phase.pcie_rx_idle = Some(link);
        phase.pcie_rx = if overlapped { link * g.range((0.6, 0.9)) } else { g.range((0.02, 0.1)) };
        let waited = if overlapped { 0.0 } else { played_wait(&phase, c.seed, gpu) };
        out.phases.push(phase);
        let (b, i) = longest_stretches(&pattern, c.step_s);
        let mut t = pattern_truth(
            gpu,
            rank as u32,
            Waited::HostCopies,
            waited,
            FindingKind::PcieBound,
            r::CAUSE_SHARE,
            b.min(i),
            readable_idle_share(&pattern, c.step_s, c.driver),
            c.driver,
            c.marked,
            c.start,
        );
        // The link's counter is read at an instant: the copies show whatever the period.
        if t.region == Region::Hidden || t.region == Region::MarksOnly {
            t.region = Region::Shown;
        }
        out.truth.push(t);
    }
    JobShape::Offload { overlapped }
}

/// An inference server: Poisson arrivals, batches queue while the GPU is busy.
fn serving(g: &mut Rng, c: &Ctx<'_>, gpus: &[u32], out: &mut Out) -> JobShape {
    let busy = g.range(r::BUSY_SHARE);
    let service = g.log_range(r::SERVICE_S);
    let rate = busy / service;
    // Poisson arrivals over the run; a request that finds the GPU busy queues.
    let mut pattern: Vec<[f64; 2]> = Vec::new();
    let (mut t, mut free_at) = (0.0, 0.0f64);
    let span = r::DURATION_S;
    loop {
        t += -(1.0 - g.unit()).ln() / rate;
        let begin = t.max(free_at);
        if begin + service > span {
            break;
        }
        free_at = begin + service;
        pattern.push([begin, free_at]);
    }
    merge(&mut pattern);
    let actual = busy_time(&pattern) / span;
    let gaps = pattern.len().max(1) as f64;
    let mean_busy = busy_time(&pattern) / gaps;
    let mean_idle = (span - busy_time(&pattern)) / gaps;
    let gpu = gpus[0];
    let readable = readable_idle_share(&pattern, span, c.driver);
    let mut phase = pattern_phase(gpu, 0.0, span, pattern, 0.0, c.key);
    phase.memory = c.memory;
    out.phases.push(phase);
    out.truth.push(pattern_truth(
        gpu,
        0,
        Waited::Input,
        1.0 - actual,
        FindingKind::DataloaderStarvation,
        r::CAUSE_SHARE,
        mean_busy.min(mean_idle),
        readable,
        c.driver,
        false,
        0.0,
    ));
    out.step_len = span;
    JobShape::Serving { rate_per_s: rate }
}

/// A process holds memory and runs nothing (a paused notebook).
fn holding(g: &mut Rng, gpus: &[u32], out: &mut Out) -> JobShape {
    let gpu = gpus[0];
    out.phases.push(Phase {
        gpus: Some(vec![gpu]),
        busy: 0.0,
        idle: 0.0,
        memory: g.range((0.2, 0.6)),
        ..Phase::default()
    });
    out.truth.push(GpuTruth {
        waited: Waited::NoWork,
        waited_share: 1.0,
        cause: Some(FindingKind::IdleAllocated),
        ..plain_truth(gpu, 0, 0.0)
    });
    JobShape::Holding
}

/// A model placed unevenly on two GPUs (`device_map="auto"`): one computes, the other holds
/// its share of the weights and waits.
fn imbalance(g: &mut Rng, c: &Ctx<'_>, gpus: &[u32], out: &mut Out) -> JobShape {
    // "imbalance": a model placed unevenly on two GPUs (`device_map="auto"`): one
    // computes, the other holds its share of the weights and waits.
    let (busy_gpu, idle_gpu) = (gpus[0], gpus[1]);
    out.phases.push(Phase {
        gpus: Some(vec![busy_gpu]),
        from_s: c.start,
        busy: g.range((0.9, 0.99)),
        memory: c.memory,
        ..Phase::default()
    });
    out.phases.push(Phase {
        gpus: Some(vec![idle_gpu]),
        from_s: c.start,
        busy: g.range((0.02, 0.15)),
        memory: c.memory * 0.5,
        ..Phase::default()
    });
    out.truth.push(plain_truth(busy_gpu, 0, c.start));
    out.truth.push(GpuTruth {
        waited: Waited::PipelinePeers,
        waited_share: 0.9,
        cause: Some(FindingKind::Imbalance),
        ..plain_truth(idle_gpu, 1, c.start)
    });
    JobShape::DataParallel { accumulation: 1 }
}

/// Merges touching stretches in place (they are in order).
fn merge(p: &mut Vec<[f64; 2]>) {
    let mut out: Vec<[f64; 2]> = Vec::with_capacity(p.len());
    for &[a, b] in p.iter() {
        match out.last_mut() {
            Some(last) if a <= last[1] + 1e-9 => last[1] = last[1].max(b),
            _ if b > a => out.push([a, b]),
            _ => {}
        }
    }
    *p = out;
}

/// Evaluation passes (on the GPU, at a lower utilisation) and checkpoint saves (idle) of a
/// healthy job: short, so not a cause (under a tenth of the run).
fn host_pauses(g: &mut Rng, gpus: &[u32], start: f64, memory: f64, phases: &mut Vec<Phase>) {
    let eval_every = g.range(r::EVAL_EVERY_S);
    let eval = g.range(r::EVAL_S).min(eval_every * 0.1);
    let ckpt_every = g.range(r::CHECKPOINT_EVERY_S);
    let ckpt = g.range(r::CHECKPOINT_S);
    let eval_busy = g.range((0.6, 0.85));
    let mut t = start + eval_every;
    while t < r::DURATION_S {
        phases.push(Phase {
            gpus: Some(gpus.to_vec()),
            from_s: t,
            until_s: Some(t + eval),
            busy: eval_busy,
            memory,
            ..Phase::default()
        });
        t += eval_every;
    }
    let mut t = start + ckpt_every;
    while t < r::DURATION_S {
        phases.push(Phase {
            gpus: Some(gpus.to_vec()),
            from_s: t,
            until_s: Some(t + ckpt),
            busy: 0.0,
            idle: 0.0,
            memory,
            ..Phase::default()
        });
        t += ckpt_every;
    }
}

/// One of the faults gpumon knows, on one GPU or every GPU of a healthy job.
#[allow(clippy::too_many_arguments)]
fn apply_fault(
    g: &mut Rng,
    gpus: &[u32],
    start: f64,
    interval: f64,
    profile: &FleetProfile,
    phases: &mut Vec<Phase>,
    faults: &mut Vec<Fault>,
    truth: &mut [GpuTruth],
) {
    let which = g.pick(&[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    let onset = start + g.range((0.0, 30.0));
    let all = which == 3 || which == 4 || g.unit() < 0.5;
    let hit: Vec<usize> =
        if all { (0..gpus.len()).collect() } else { vec![g.int((0, gpus.len() as u32 - 1)) as usize] };
    let model = &profile.gpus[0].model;
    let (kind, waited) = match which {
        0 => (FindingKind::ThermalThrottling, Waited::Clocks),
        1 => (FindingKind::PowerThrottling, Waited::Clocks),
        2 => (FindingKind::ExternalSlowdown, Waited::Clocks),
        3 => (FindingKind::NearOom, Waited::Nothing),
        4 => (FindingKind::MemoryBound, Waited::Memory),
        5 => (FindingKind::HardwareErrors, Waited::Hardware),
        _ => (FindingKind::HardwareErrors, Waited::Hardware),
    };
    let (slow, shut, idle_t) =
        (model.temperature_slowdown_celsius, model.temperature_shutdown_celsius, model.temperature_idle_celsius);
    for &i in &hit {
        let gpu = gpus[i];
        let base =
            phases.iter().rev().find(|p| p.gpus.as_deref() == Some(&[gpu][..]) && p.shape == Shape::Pattern).cloned();
        let mut p = base.unwrap_or_default();
        // Keep the steps in phase with the peers': the pattern's origin stays at `start`.
        p.offset_s = start - onset;
        p.from_s = onset;
        match which {
            0 => {
                p.temperature_c = Some(g.range((slow + 1.0, shut - 2.0)));
                p.reasons = vec!["hw_slowdown".into(), "hw_thermal_slowdown".into(), "sw_thermal_slowdown".into()];
                p.sm_clock = g.range((0.5, 0.75));
                p.power = g.range((0.65, 0.8));
            }
            1 => {
                // At the cap the firmware holds the draw at the limit: the GPU runs flat out.
                p.shape = Shape::Steady;
                p.busy = g.range((0.97, 0.99));
                p.power = 1.0;
                p.reasons = vec!["sw_power_cap".into()];
                p.sm_clock = g.range((0.65, 0.85));
            }
            2 => {
                p.reasons = vec![if g.unit() < 0.5 { "hw_slowdown" } else { "hw_power_brake_slowdown" }.into()];
                p.temperature_c = Some(idle_t + g.range((15.0, 30.0)));
                p.power = g.range((0.45, 0.7));
                p.sm_clock = g.range((0.45, 0.85));
            }
            3 => {
                p.memory = g.range((0.955, 0.97));
                p.memory_end = Some(g.range((0.98, 0.995)));
                p.until_s = Some(r::DURATION_S + 1.0);
            }
            4 => {
                p.shape = Shape::Steady;
                p.busy = g.range((0.25, 0.45));
                p.memory_controller = Some(g.range((0.75, 0.9)));
                p.dram = Some(g.range((0.75, 0.9)));
                p.sm_activity = Some(g.range((0.15, 0.3)));
            }
            5 => p.lost = true,
            _ => {
                let at_tick = (onset / interval).ceil() as u64;
                faults.push(Fault::EccBurst { device: gpu, at_tick, xid: 48, count: 2 });
            }
        }
        if which != 6 {
            phases.push(p);
        }
        truth[i] = GpuTruth {
            waited,
            waited_share: 1.0,
            cause: Some(kind),
            onset_s: onset,
            stretch_s: None,
            region: Region::Shown,
            ..truth[i].clone()
        };
    }
}
