//! Advice: one sentence per kind on what to do (docs/diagnosis.md says more).

use super::swings::idle_stretches;
use super::Past;
use crate::stages::diagnose::finding::FindingKind;
use crate::stages::diagnose::window::Ring;
use crate::stages::diagnose::Thresholds;

/// Idle stretches this long or longer (mean over the window) are named as what they most
/// likely are: a host phase of the loop — in-loop evaluation, RL rollouts on the CPU, a
/// checkpoint — rather than a loader's gap between batches. 3 s: the corpus' starving loaders
/// wait 0.1–2.25 s per step; an evaluation pass takes seconds. Both stay `dataloader_starvation`
/// (a loader that stalls for seconds, loading a shard, reads the same): only the evidence and
/// the advice change.
pub(crate) const LONG_IDLE_SECS: f64 = 3.0;

/// The advice for a finding raised on a GPU with `history` as its window: the kind's, or for
/// `dataloader_starvation` the reading its pattern fits — long idle stretches (a host phase or
/// a stalling loader), no marked steps (a training loop or a server idling between requests),
/// marked steps (a training loop whose loader starves it).
pub(crate) fn advice_for(kind: FindingKind, history: &Ring<Past>, t: &Thresholds) -> &'static str {
    if kind != FindingKind::DataloaderStarvation {
        return advice(kind);
    }
    if idle_stretches(history, t).is_some_and(|(secs, ..)| secs >= LONG_IDLE_SECS) {
        return "The GPU idles for seconds at a time: if the loop runs an evaluation pass, RL rollouts on the CPU or checkpoints between training steps, that is the idle time (by design; overlap it or move it off the training GPUs if it matters). Otherwise the loader stalls between bursts (e.g. loading the next shard): prefetch it in the background, and raise num_workers.";
    }
    if history.iter().any(|h| h.step_level.get().is_some()) {
        return advice(kind);
    }
    "The GPU waits for input: raise the data loader's num_workers, use pinned memory (pin_memory=True) and prefetching, and move decoding/augmentation off the critical path. If this GPU serves requests rather than trains, it idles between requests by design and there is nothing to fix."
}

/// One sentence of advice per kind (docs/diagnosis.md says more).
pub(crate) fn advice(kind: FindingKind) -> &'static str {
    use FindingKind as K;
    match kind {
        K::DataloaderStarvation => {
            "The GPU waits for input: raise the data loader's num_workers, use pinned memory (pin_memory=True) and prefetching, and move decoding/augmentation off the critical path."
        }
        K::MemoryBound => {
            "Kernels wait on memory bandwidth: use fused kernels (e.g. flash attention), mixed precision (bf16/fp16) and larger batches to raise arithmetic intensity."
        }
        K::Imbalance => {
            "Work is not spread evenly: check the data/model sharding and that every rank gets its share (DistributedSampler, balanced pipeline stages). On a shared node this GPU may instead hold another job idle (a paused notebook, a finished run): check who owns its processes (--enable processes with attribution tells owners apart) and release it."
        }
        K::IdleAllocated => {
            "Memory is held but nothing runs: a stalled or finished job still owns the GPU — check for deadlocked ranks, a paused notebook, or release the device."
        }
        K::ThermalThrottling => {
            "The GPU slows itself down to cool: check airflow, fans and inlet temperature, and the chassis' cooling capacity."
        }
        K::PowerThrottling => {
            "Clocks are held at the power limit: raise the limit if the board allows (nvidia-smi -pl), or accept it as the cost of a capped node."
        }
        K::NearOom => {
            "Device memory is almost full: reduce the batch size, enable activation checkpointing, or shard the optimizer state (ZeRO/FSDP) before the job fails."
        }
        K::PcieBound => {
            "Host-device copies saturate the PCIe link: keep data on the GPU, use pinned memory with non_blocking copies, and overlap transfers with compute."
        }
        K::HardwareErrors => {
            "The hardware reports errors: drain the GPU, check nvidia-smi -q and the kernel log for XIDs, and reset or replace it."
        }
        K::Straggler => {
            "This GPU runs behind its peers doing the same work, and every synchronous step waits for it: check its clocks, PCIe link and NVLink, its share of the data, and for other processes on it."
        }
        K::ExternalSlowdown => {
            "The GPU is told to slow down from outside while cool and below its power limit (HW slowdown or power brake): check the node's power supplies, the chassis/BMC event log and the rack's power capping."
        }
        K::StarvationOrBubbles => {
            "Either the data loader starves the GPU or it is a pipeline stage idling in bubbles, and the readings cannot tell which. If the job is data-parallel: raise the loader's num_workers, pin memory and prefetch. If it is pipeline-parallel: use more micro-batches per step or an interleaved schedule. Marking steps with the job's name and rank (or sampling processes with attribution) lets gpumon tell."
        }
        K::StragglerOrOwnJob => {
            "Either this GPU holds back the GPUs of its job (a straggler) or it runs a job of its own at a lower level, and nothing read says which. If it is one rank of theirs: check its clocks, PCIe link and NVLink, its share of the data, and other processes on it. If it is a job of its own: it waits on its own input or host work — raise its loader's num_workers. Marking steps with the job's name and rank, or sampling processes with attribution (owners, launcher), lets gpumon tell."
        }
        K::ImbalanceOrOwnJob => {
            "Either the work of one job is split unevenly and this GPU gets too little, or it holds a job of its own that idles, and nothing read says which. If one job: check the data/model sharding (device_map, balanced pipeline stages). If its own: find who holds it (a paused notebook, a finished run) and release it, or feed it. Sampling processes (--enable processes, with attribution) lets gpumon tell."
        }
        K::PipelineBubbles => {
            "The GPUs idle in turn, not together: pipeline-parallel bubbles — use more micro-batches per step or an interleaved schedule. If this is data-parallel training, the data loaders starve the ranks unevenly: raise num_workers."
        }
    }
}
