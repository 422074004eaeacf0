//! Pipeline-parallel schedules — GPipe, 1F1B and interleaved 1F1B — built from the stages'
//! compute times, the micro-batch count and the transfer time between stages.
//!
//! Each stage runs its operations (a forward or a backward of one micro-batch on one model
//! chunk) in the order its schedule gives, each as soon as the stage is free and its input has
//! arrived: the activations of the stage before (forward) or the gradients of the stage after
//! (backward), one transfer time later. What comes out is when each stage computes within a
//! step; the rest of the step it waits — the bubbles, the staircase at the step's boundaries.

/// Which order the stages run their micro-batches in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Schedule {
    /// Every forward, then every backward (Huang et al., 2019).
    GPipe,
    /// One forward, one backward after a warm-up of forwards (PipeDream-Flush, Megatron).
    OneFOneB,
    /// 1F1B over `chunks` model chunks per stage (Megatron's virtual stages): smaller bubbles
    /// for more transfers.
    Interleaved {
        /// Model chunks per stage (2 or more).
        chunks: u32,
    },
}

impl Schedule {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::GPipe => "gpipe",
            Self::OneFOneB => "1f1b",
            Self::Interleaved { .. } => "interleaved-1f1b",
        }
    }
}

/// One pipeline: its stages' times per micro-batch, seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineSpec {
    /// The order of operations.
    pub schedule: Schedule,
    /// Forward time of one micro-batch on each stage (the whole stage, all its chunks).
    pub forward_s: Vec<f64>,
    /// Backward time over forward time (about 2).
    pub backward_ratio: f64,
    /// Micro-batches per step.
    pub micro_batches: u32,
    /// Time to send activations or gradients to the next stage.
    pub transfer_s: f64,
    /// The optimizer step and data-parallel all-reduce that end every step, run on every stage
    /// once its last backward is done.
    pub optimizer_s: f64,
}

/// What one step of a pipeline looks like on each stage.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineStep {
    /// The step's length, seconds (every stage waits for the last to finish).
    pub step_s: f64,
    /// Per stage, its busy stretches `[start, end]` within the step, merged and in order.
    pub busy: Vec<Vec<[f64; 2]>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Op {
    forward: bool,
    chunk: u32,
    micro: u32,
}

impl PipelineSpec {
    fn stages(&self) -> usize {
        self.forward_s.len()
    }

    fn chunks(&self) -> u32 {
        match self.schedule {
            Schedule::Interleaved { chunks } => chunks.max(1),
            _ => 1,
        }
    }

    /// The order stage `s` runs its operations in.
    fn order(&self, s: usize) -> Vec<Op> {
        let (p, m, v) = (self.stages() as u32, self.micro_batches, self.chunks());
        let s = s as u32;
        match self.schedule {
            Schedule::GPipe => {
                let f = (0..m).map(|micro| Op { forward: true, chunk: 0, micro });
                f.chain((0..m).map(|micro| Op { forward: false, chunk: 0, micro })).collect()
            }
            Schedule::OneFOneB => {
                let warm = (p - s - 1).min(m);
                let mut out: Vec<Op> = (0..warm).map(|micro| Op { forward: true, chunk: 0, micro }).collect();
                let (mut f, mut b) = (warm, 0);
                while b < m {
                    if f < m {
                        out.push(Op { forward: true, chunk: 0, micro: f });
                        f += 1;
                    }
                    out.push(Op { forward: false, chunk: 0, micro: b });
                    b += 1;
                }
                out
            }
            Schedule::Interleaved { .. } => {
                // Megatron's order: micro-batches in groups of `p`, each group through every
                // chunk; backwards the same with the chunks reversed.
                let total = m * v;
                let fwd = |k: u32| {
                    let group = k / (p * v);
                    let chunk = (k % (p * v)) / p;
                    Op { forward: true, chunk, micro: group * p + k % p }
                };
                let bwd = |k: u32| Op { forward: false, chunk: v - 1 - fwd(k).chunk, ..fwd(k) };
                let warm = ((p - s - 1) * 2 + (v - 1) * p).min(total);
                let mut out: Vec<Op> = (0..warm).map(fwd).collect();
                let (mut f, mut b) = (warm, 0);
                while b < total {
                    if f < total {
                        out.push(fwd(f));
                        f += 1;
                    }
                    out.push(bwd(b));
                    b += 1;
                }
                out
            }
        }
    }

    /// The stage and model chunk an operation's input comes from: the previous virtual
    /// stage's forward, or the next one's backward (the last runs its backward after its own
    /// forward).
    fn dependency(&self, s: usize, op: Op) -> (usize, Op) {
        let p = self.stages();
        let virt = op.chunk as usize * p + s;
        let last = self.chunks() as usize * p - 1;
        if op.forward {
            if virt == 0 {
                return (usize::MAX, op);
            }
            let prev = virt - 1;
            (prev % p, Op { chunk: (prev / p) as u32, ..op })
        } else if virt == last {
            (s, Op { forward: true, ..op })
        } else {
            let next = virt + 1;
            (next % p, Op { chunk: (next / p) as u32, ..op })
        }
    }

    /// The share of its memory each stage holds, for a job holding `mean` on average (see
    /// [`stage_memory`]): its own, unlike data-parallel replicas'.
    pub fn stage_memory(&self, mean: f64) -> Vec<f64> {
        stage_memory(self, mean)
    }

    /// Runs one step. Micro-batch counts that an interleaved schedule cannot divide among
    /// its stages are rounded up to a multiple of the stage count.
    pub fn step(&self) -> PipelineStep {
        let p = self.stages();
        let mut spec = self.clone();
        if matches!(spec.schedule, Schedule::Interleaved { .. }) && !spec.micro_batches.is_multiple_of(p as u32) {
            spec.micro_batches = spec.micro_batches.div_ceil(p as u32) * p as u32;
        }
        let orders: Vec<Vec<Op>> = (0..p).map(|s| spec.order(s)).collect();
        let mut next = vec![0usize; p];
        let mut free = vec![0.0f64; p];
        let mut done: std::collections::HashMap<(usize, Op), f64> = std::collections::HashMap::new();
        let mut busy: Vec<Vec<[f64; 2]>> = vec![Vec::new(); p];
        let chunks = f64::from(spec.chunks());
        loop {
            let mut progressed = false;
            for s in 0..p {
                while let Some(&op) = orders[s].get(next[s]) {
                    let (from, dep) = spec.dependency(s, op);
                    let ready = if from == usize::MAX {
                        Some(0.0)
                    } else {
                        done.get(&(from, dep)).map(|&end| if from == s { end } else { end + spec.transfer_s })
                    };
                    let Some(ready) = ready else { break };
                    let start = free[s].max(ready);
                    let mut len = spec.forward_s[s] / chunks;
                    if !op.forward {
                        len *= spec.backward_ratio;
                    }
                    done.insert((s, op), start + len);
                    push_merged(&mut busy[s], start, start + len);
                    free[s] = start + len;
                    next[s] += 1;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        debug_assert!((0..p).all(|s| next[s] == orders[s].len()), "a schedule deadlocked");
        // The step ends for everyone when the last stage's optimizer step is done.
        let end = free.iter().copied().fold(0.0, f64::max) + spec.optimizer_s;
        for (s, b) in busy.iter_mut().enumerate() {
            push_merged(b, free[s], free[s] + spec.optimizer_s);
        }
        PipelineStep { step_s: end, busy }
    }
}

/// The share of its memory each stage of `spec` holds, for a job whose stages hold `mean` on
/// average: its layers' weights and optimizer state, in proportion to its compute time, and the
/// activations of the micro-batches in flight on it — every micro-batch on every stage under
/// GPipe, `stages − s` on stage `s` under 1F1B and its interleaved form (the first stage holds
/// the most; Narayanan et al., 2021). Half of each, so stages of one pipeline hold different
/// memory where data-parallel replicas hold the same.
pub(crate) fn stage_memory(spec: &PipelineSpec, mean: f64) -> Vec<f64> {
    let stages = spec.forward_s.len();
    if stages == 0 {
        return Vec::new();
    }
    let in_flight: Vec<f64> = (0..stages)
        .map(|s| match spec.schedule {
            Schedule::GPipe => f64::from(spec.micro_batches),
            Schedule::OneFOneB | Schedule::Interleaved { .. } => {
                ((stages - s) as f64).min(f64::from(spec.micro_batches))
            }
        })
        .collect();
    let n = stages as f64;
    let forward_mean = spec.forward_s.iter().sum::<f64>() / n;
    let in_flight_mean = in_flight.iter().sum::<f64>() / n;
    let raw: Vec<f64> = (0..stages)
        .map(|s| {
            let weights = spec.forward_s[s] / forward_mean.max(1e-12);
            let activations = in_flight[s] / in_flight_mean.max(1e-12);
            mean * (0.5 * weights + 0.5 * activations)
        })
        .collect();
    // Scaled down as a whole where the fullest stage would pass 93 % (a job sized to fit): its
    // stages keep their proportions, as clamping each would not.
    let fullest = raw.iter().copied().fold(0.0, f64::max);
    let scale = if fullest > 0.93 { 0.93 / fullest } else { 1.0 };
    raw.into_iter().map(|m| (m * scale).max(0.1)).collect()
}

/// Appends `[a, b]`, merging it with the last stretch when they touch.
fn push_merged(v: &mut Vec<[f64; 2]>, a: f64, b: f64) {
    if b <= a {
        return;
    }
    match v.last_mut() {
        Some(last) if a <= last[1] + 1e-9 => last[1] = last[1].max(b),
        _ => v.push([a, b]),
    }
}

/// The busy share of a list of stretches within a cycle.
pub(crate) fn busy_time(busy: &[[f64; 2]]) -> f64 {
    busy.iter().map(|[a, b]| b - a).sum()
}

/// The share of a cycle of `cycle` seconds spent idle in stretches at least `min_s` long: the
/// waits a driver sampling every `min_s` can read as idle. Shorter ones fall within one sample
/// beside busy time and read as a lower level, like lighter work — a 1F1B stage whose bubbles
/// are mostly the short gaps between micro-batches reads flat, whatever its one longer bubble.
pub(crate) fn readable_idle_share(busy: &[[f64; 2]], cycle: f64, min_s: f64) -> f64 {
    if cycle <= 0.0 {
        return 0.0;
    }
    let Some(&[head, _]) = busy.first() else { return 1.0 };
    let mut readable = 0.0;
    let mut last = None;
    for &[a, b] in busy {
        if let Some(end) = last {
            let gap: f64 = a - end;
            if gap >= min_s {
                readable += gap;
            }
        }
        last = Some(b);
    }
    // The idle tail of one cycle runs into the idle head of the next.
    let wrap = cycle - last.unwrap_or(cycle) + head;
    if wrap >= min_s {
        readable += wrap;
    }
    readable / cycle
}

/// The longest busy stretch and the longest idle stretch of a cycle of `cycle` seconds.
pub(crate) fn longest_stretches(busy: &[[f64; 2]], cycle: f64) -> (f64, f64) {
    let longest_busy = busy.iter().map(|[a, b]| b - a).fold(0.0, f64::max);
    let mut longest_idle: f64 = 0.0;
    let mut last = 0.0;
    for [a, b] in busy {
        longest_idle = longest_idle.max(a - last);
        last = *b;
    }
    // The idle tail of one cycle runs into the idle head of the next.
    let head = busy.first().map_or(cycle, |[a, _]| *a);
    longest_idle = longest_idle.max(cycle - last + head);
    (longest_busy, longest_idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(schedule: Schedule, stages: usize, micro: u32) -> PipelineSpec {
        PipelineSpec {
            schedule,
            forward_s: vec![0.01; stages],
            backward_ratio: 2.0,
            micro_batches: micro,
            transfer_s: 0.0,
            optimizer_s: 0.0,
        }
    }

    #[test]
    fn a_1f1b_pipeline_s_first_stage_holds_the_most_and_gpipe_s_stages_hold_alike() {
        let one_f_one_b = stage_memory(&spec(Schedule::OneFOneB, 4, 8), 0.6);
        // In flight: 4, 3, 2, 1 micro-batches (mean 2.5); equal weights.
        for (s, m) in one_f_one_b.iter().enumerate() {
            let expected = 0.6 * (0.5 + 0.5 * (4 - s) as f64 / 2.5);
            assert!((m - expected).abs() < 1e-9, "stage {s}: {m} against {expected}");
        }
        assert!(one_f_one_b.windows(2).all(|w| w[0] > w[1] + 0.05), "{one_f_one_b:?}");
        let gpipe = stage_memory(&spec(Schedule::GPipe, 4, 8), 0.6);
        assert!(gpipe.iter().all(|m| (m - 0.6).abs() < 1e-9), "{gpipe:?}");
        assert!(stage_memory(&spec(Schedule::GPipe, 0, 8), 0.6).is_empty());
        // A job near full: scaled as a whole, the stages keep their order and differences.
        let full = stage_memory(&spec(Schedule::OneFOneB, 8, 8), 0.9);
        assert!((full[0] - 0.93).abs() < 1e-9, "{full:?}");
        assert!(full.windows(2).all(|w| w[0] > w[1]), "{full:?}");
    }

    #[test]
    fn only_idle_stretches_a_driver_period_long_are_readable() {
        // Busy 0.2–0.5 and 0.6–0.9 of a 1 s cycle: gaps of 0.1 (between) and 0.3 (the tail
        // into the next cycle's head).
        let busy = [[0.2, 0.5], [0.6, 0.9]];
        assert!((readable_idle_share(&busy, 1.0, 0.05) - 0.4).abs() < 1e-9);
        assert!((readable_idle_share(&busy, 1.0, 0.2) - 0.3).abs() < 1e-9);
        assert_eq!(readable_idle_share(&busy, 1.0, 0.5), 0.0);
        // Never busy: all of it idle; a zero cycle: nothing.
        assert_eq!(readable_idle_share(&[], 1.0, 0.5), 1.0);
        assert_eq!(readable_idle_share(&busy, 0.0, 0.1), 0.0);
        // A 1F1B stage: the gaps between micro-batches in its steady phase are short (a
        // forward's length, 0.01 s here), its bubbles at the step's ends long (three forwards or
        // more): read at a period between the two, only the bubbles count.
        let step = spec(Schedule::OneFOneB, 4, 8).step();
        let first = &step.busy[0];
        let total = 1.0 - busy_time(first) / step.step_s;
        let readable = readable_idle_share(first, step.step_s, 0.025);
        assert!(readable > 0.0 && readable < total - 1e-9, "{readable} of {total}");
        assert!((readable_idle_share(first, step.step_s, 1e-6) - total).abs() < 1e-9);
    }

    #[test]
    fn the_bubble_share_is_the_textbook_one() {
        // GPipe and 1F1B both idle (p - 1) / (m + p - 1) of a step; interleaving with v chunks
        // divides the bubble by v.
        for (schedule, p, m) in [(Schedule::GPipe, 4, 8), (Schedule::OneFOneB, 4, 8), (Schedule::OneFOneB, 8, 32)] {
            let step = spec(schedule, p, m).step();
            let expected = (p as f64 - 1.0) / (f64::from(m) + p as f64 - 1.0);
            for (s, b) in step.busy.iter().enumerate() {
                let idle = 1.0 - busy_time(b) / step.step_s;
                assert!((idle - expected).abs() < 1e-6, "{schedule:?} stage {s}: idle {idle} vs {expected}");
            }
        }
        let plain = spec(Schedule::OneFOneB, 4, 8).step();
        let inter = spec(Schedule::Interleaved { chunks: 2 }, 4, 8).step();
        let idle = |st: &PipelineStep| 1.0 - busy_time(&st.busy[0]) / st.step_s;
        assert!(idle(&inter) < idle(&plain) * 0.75, "{} vs {}", idle(&inter), idle(&plain));
    }

    #[test]
    fn stages_start_and_end_in_a_staircase() {
        let step = spec(Schedule::OneFOneB, 4, 8).step();
        let starts: Vec<f64> = step.busy.iter().map(|b| b[0][0]).collect();
        assert!(starts.windows(2).all(|w| w[1] > w[0]), "{starts:?}");
        // The first stage finishes last (its last backward comes back down the pipeline).
        let ends: Vec<f64> = step.busy.iter().map(|b| b.last().unwrap()[1]).collect();
        assert!(ends.windows(2).all(|w| w[1] < w[0]), "{ends:?}");
    }

    #[test]
    fn transfers_lengthen_the_step() {
        let mut slow = spec(Schedule::GPipe, 4, 8);
        let quick = slow.step().step_s;
        slow.transfer_s = 0.005;
        assert!(slow.step().step_s > quick + 0.02);
    }

    #[test]
    fn stretches_wrap_around_the_cycle() {
        // The idle tail (0.1 s) and head (0.2 s) of a cycle are one 0.3 s stretch.
        let (b, i) = longest_stretches(&[[0.2, 0.5], [0.6, 0.9]], 1.0);
        assert!((b - 0.3).abs() < 1e-9 && (i - 0.3).abs() < 1e-9, "{b} {i}");
        let (b, i) = longest_stretches(&[[0.5, 0.6]], 1.0);
        assert!((b - 0.1).abs() < 1e-9 && (i - 0.9).abs() < 1e-9);
    }
}
