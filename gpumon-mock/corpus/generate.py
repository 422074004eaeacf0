#!/usr/bin/env python3
"""Writes the diagnosis corpus: one TOML file per workload, each a mock scenario in the phase
format (gpumon-mock/src/timeline.rs) plus `[expect]`, its labelled verdict. The accuracy test
(gpumon-mock/tests/accuracy.rs) replays every file at every sampling setting.

    python3 gpumon-mock/corpus/generate.py      # rewrites gpumon-mock/corpus/*.toml

The files are committed; edit this script (not the files) and run it again. Keys of [expect]:
  findings        [{kind, gpus}], gpus a list of GPU indices or "all"; [] = nothing may be raised
  raise_within_s  every expected finding is raised by onset_s + this
  onset_s         when the cause starts (default 0)
  cleared_at_s    when the cause ends: the finding must be cleared after it, within clear_within_s
  duration_s      simulated seconds to run
  profile         the fleet (default a100x4): a built-in name, or a file (corpus/profiles/)
  metrics         extra metric families (e.g. ["pcie_throughput"])
  visible_above_s the shortest busy or idle stretch; a driver sampling period longer than it
                  averages the pattern away, and such settings are reported as unsupported
  interval_at_most_s  longer sampling intervals cannot see the pattern (reported as unsupported)
  ecc_at_s        inject an ECC burst (XID 48) on GPU `ecc_gpu` at this time
  exact           every supported setting must say exactly the expected findings, no miss and
                  nothing else (the test fails otherwise, whatever the floors): for the cases a
                  rule was changed for, the look-alike and the real case
A phase with `steps = true` marks the job's training steps (rank r on GPU r); the test feeds the
marks to a step tracker ahead of diagnosis.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


WRITTEN = []


def write(name, description, phases, expect, driver=None):
    WRITTEN.append(name)
    lines = [f"# {description}", f'name = "{name}"', f'description = "{description}"']
    if driver:
        lines.append(f"driver_period_ms = {driver}")
    for p in phases:
        lines.append("")
        lines.append("[[phases]]")
        for k, v in p.items():
            lines.append(f"{k} = {toml_value(v)}")
    lines.append("")
    lines.append("[expect]")
    for k, v in expect.items():
        lines.append(f"{k} = {toml_value(v)}")
    with open(os.path.join(HERE, f"{name}.toml"), "w") as f:
        f.write("\n".join(lines) + "\n")


def every(kind, gpus="all"):
    return [{"kind": kind, "gpus": gpus}]


TRAIN = {"shape": "steady", "busy": 0.95, "memory": 0.85, "memory_controller": 0.45}

# Loader starvation: duty cycles 25-55 %, steps 0.3 s to 3 s, four GPUs in lockstep.
for duty in (0.25, 0.4, 0.55):
    for step in (0.3, 1.0, 3.0):
        busy_s, idle_s = round(duty * step, 3), round((1 - duty) * step, 3)
        write(
            f"starved-duty{int(duty * 100)}-step{str(step).replace('.', 'p')}",
            f"Loader starvation: {busy_s} s of compute then {idle_s} s waiting for input, every GPU in lockstep",
            [{"shape": "square", "busy_s": busy_s, "idle_s": idle_s, "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15}],
            {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150,
             "visible_above_s": min(busy_s, idle_s)},
        )
write("starved-h100x8-jittery", "Loader starvation on eight H100s, 1.5 s steps with 30 % jitter",
      [{"shape": "square", "busy_s": 0.6, "idle_s": 0.9, "jitter": 0.3, "memory": 0.75, "memory_controller": 0.2}],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150, "profile": "h100x8",
       "visible_above_s": 0.6})
write("starved-after-warmup", "40 s of loading and compiling, then loader starvation (1 s steps, 40 % busy)",
      [{"until_s": 40, "busy": 0.0, "memory": 0.6},
       {"from_s": 40, "shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15}],
      {"findings": every("dataloader_starvation"), "onset_s": 40, "raise_within_s": 60, "duration_s": 180,
       "visible_above_s": 0.4})

# Healthy look-alikes: nothing to raise.
write("training-steady", "Healthy training: 95 % busy, memory 85 %", [TRAIN], {"findings": [], "duration_s": 180})
write("training-checkpoint-dips", "Healthy training with a 5 s checkpoint dip every 60 s",
      [dict(TRAIN, shape="dips", period_s=60.0, dip_s=5.0, idle=0.02)], {"findings": [], "duration_s": 240})
write("training-eval-dips", "Healthy training with a 15 s evaluation pause every 120 s",
      [dict(TRAIN, shape="dips", period_s=120.0, dip_s=15.0, idle=0.03)], {"findings": [], "duration_s": 300})
write("warmup-then-training", "A 40 s compile / warm-up phase holding memory, then healthy training",
      [{"until_s": 40, "busy": 0.0, "memory": 0.6}, dict(TRAIN, from_s=40.0)], {"findings": [], "duration_s": 180})
write("warmup-ramp-then-training", "A 30 s ramp up from idle, then healthy training",
      [{"until_s": 30, "shape": "ramp", "idle": 0.0, "busy": 0.95, "memory": 0.8}, dict(TRAIN, from_s=30.0)],
      {"findings": [], "duration_s": 150})
write("inference-steady", "An inference server at a steady 35 %", [{"shape": "steady", "busy": 0.35, "memory": 0.4}],
      {"findings": [], "duration_s": 150})
write("inference-bursty-200ms", "An inference server: 40 ms bursts every 400 ms (idle 90 % of the time)",
      [{"shape": "bursts", "busy_s": 0.04, "idle_s": 0.36, "busy": 0.9, "idle": 0.0, "jitter": 0.3, "memory": 0.4}],
      {"findings": [], "duration_s": 150})
write("inference-sparse-bursts", "An inference server: 200 ms bursts every 2 s",
      [{"shape": "bursts", "busy_s": 0.2, "idle_s": 1.8, "busy": 0.9, "idle": 0.0, "jitter": 0.3, "memory": 0.4}],
      {"findings": [], "duration_s": 150})
write("job-end-teardown", "Training ends at 120 s: 15 s of teardown with memory held, then nothing",
      [dict(TRAIN, until_s=120.0), {"from_s": 120, "until_s": 135, "busy": 0.0, "memory": 0.6}],
      {"findings": [], "duration_s": 240})
write("idle-fleet", "No job at all: idle, no memory", [{"busy": 0.0, "memory": 0.0}], {"findings": [], "duration_s": 120})
write("mig-training", "A MIG-partitioned A100 fleet running training on every instance", [TRAIN],
      {"findings": [], "duration_s": 120, "profile": "a100x8-mig"})

# Pipeline bubbles: stages idle in turn.
def stages(phase):
    """One phase per stage of four, each holding its own memory as a pipeline's stages do (its
    layers and the micro-batches in flight on it: under 1F1B the first stage holds the most),
    where data-parallel replicas hold the same."""
    return [dict({"gpus": [g]}, **dict(phase, memory=m)) for g, m in enumerate([0.84, 0.78, 0.72, 0.66])]


write("pipeline-bubbles-4s", "Four pipeline stages, 3 s busy then 1 s idle, each stage 1 s after the previous",
      stages({"shape": "square", "busy_s": 3.0, "idle_s": 1.0, "stagger_s": 1.0, "memory_controller": 0.2}),
      {"findings": every("pipeline_bubbles"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 0.5,
       "interval_at_most_s": 1.0})
write("pipeline-bubbles-2s", "Four pipeline stages, 1.5 s busy then 0.5 s idle, staggered by 0.5 s",
      stages({"shape": "square", "busy_s": 1.5, "idle_s": 0.5, "stagger_s": 0.5, "memory_controller": 0.2}),
      {"findings": every("pipeline_bubbles"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 0.5,
       "interval_at_most_s": 0.5})

# Comparisons between GPUs.
write("straggler-60", "Four GPUs in lockstep; GPU 2 runs at 60 % while the others run at 97 %",
      [{"busy": 0.97, "memory": 0.8}, {"gpus": [2], "busy": 0.6, "memory": 0.8}],
      {"findings": every("straggler", [2]), "raise_within_s": 40, "duration_s": 120})
write("straggler-h100x8", "Eight H100s at 96 %, GPU 5 at 50 % (clocks halved by a bad riser)",
      [{"busy": 0.96, "memory": 0.8}, {"gpus": [5], "busy": 0.5, "memory": 0.8}],
      {"findings": every("straggler", [5]), "raise_within_s": 40, "duration_s": 120, "profile": "h100x8"})
write("twin-idle", "GPUs 0 and 2 train, their twins 1 and 3 hold memory and wait",
      [{"busy": 0.95, "memory": 0.8}, {"gpus": [1, 3], "busy": 0.06, "memory": 0.8}],
      {"findings": every("imbalance", [1, 3]), "raise_within_s": 40, "duration_s": 120})
write("twin-idle-h100x8", "Eight H100s: GPU 7 holds memory and idles while the others train",
      [{"busy": 0.95, "memory": 0.8}, {"gpus": [7], "busy": 0.03, "memory": 0.8}],
      {"findings": every("imbalance", [7]), "raise_within_s": 40, "duration_s": 120, "profile": "h100x8"})

# Single-GPU causes.
write("near-oom", "Training with 97 % of memory used", [dict(TRAIN, memory=0.97)],
      {"findings": every("near_oom"), "raise_within_s": 40, "duration_s": 120})
write("thermal", "Training at 90 °C: thermal slowdown, clocks at 60 %",
      [dict(TRAIN, temperature_c=90.0, sm_clock=0.6, power=0.7, reasons=["hw_thermal_slowdown", "sw_thermal_slowdown"])],
      {"findings": every("thermal_throttling"), "raise_within_s": 40, "duration_s": 120})
write("power-capped", "Training pinned at the power limit, clocks at 75 %",
      [dict(TRAIN, busy=0.98, power=1.0, sm_clock=0.75, reasons=["sw_power_cap"])],
      {"findings": every("power_throttling"), "raise_within_s": 40, "duration_s": 120})
write("external-hw-slowdown", "A cool GPU (55 °C) with HW_SLOWDOWN asserted: clocks halved",
      [dict(TRAIN, temperature_c=55.0, sm_clock=0.5, power=0.5, reasons=["hw_slowdown"])],
      {"findings": every("external_slowdown"), "raise_within_s": 40, "duration_s": 120})
write("external-power-brake", "A cool GPU held down by the chassis' power brake",
      [dict(TRAIN, temperature_c=50.0, sm_clock=0.4, power=0.4, reasons=["hw_power_brake_slowdown"])],
      {"findings": every("external_slowdown"), "raise_within_s": 40, "duration_s": 120})
write("memory-bound", "Memory-bandwidth bound: 33 % utilisation, memory controller and DRAM at 80 %",
      [{"busy": 0.33, "memory": 0.8, "memory_controller": 0.8, "sm_activity": 0.28, "dram": 0.8}],
      {"findings": every("memory_bound"), "raise_within_s": 40, "duration_s": 120})
write("pcie-bound", "Host-to-device copies at 80 % of the PCIe link, utilisation 30 %",
      [{"busy": 0.3, "memory": 0.6, "memory_controller": 0.15, "pcie_rx": 0.8}],
      {"findings": every("pcie_bound"), "raise_within_s": 40, "duration_s": 120, "metrics": ["pcie_throughput"]})
write("idle-allocated", "A process holds 40 % of memory and never runs (a hung rank)",
      [{"busy": 0.0, "memory": 0.4}],
      {"findings": every("idle_allocated"), "raise_within_s": 100, "duration_s": 150})
write("finished-left-holding", "Training ends at 60 s and the process keeps its memory, idle",
      [dict(TRAIN, until_s=60.0), {"from_s": 60, "busy": 0.0, "memory": 0.6}],
      {"findings": every("idle_allocated"), "onset_s": 60, "raise_within_s": 60, "duration_s": 150})
write("lost-gpu", "Training; GPU 3 falls off the bus at 60 s",
      [TRAIN, {"gpus": [3], "from_s": 60, "lost": True}],
      {"findings": every("hardware_errors", [3]), "onset_s": 60, "raise_within_s": 5, "duration_s": 120})
write("ecc-burst", "Training; GPU 1 reports uncorrectable ECC errors (XID 48) at 60 s", [TRAIN],
      {"findings": every("hardware_errors", [1]), "onset_s": 60, "raise_within_s": 5, "duration_s": 120,
       "ecc_at_s": 60, "ecc_gpu": 1})

# The same workload with the driver's slowest documented period.
write("starved-slow-driver", "Loader starvation with 3 s steps on a board whose driver samples every second",
      [{"shape": "square", "busy_s": 1.2, "idle_s": 1.8, "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15}],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 1.2},
      driver=1000)

# A cause that ends: the loader is fixed at 90 s; the finding must clear within 60 s of it. The
# cross-tick pattern holds while the window (30 s) still holds starving ticks, and clearing then
# takes most of another window (held on at most a fifth of it): up to two windows.
write("starved-then-fixed", "Loader starvation (1 s steps, 40 % busy) until 90 s, then healthy training",
      [{"until_s": 90.0, "shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "memory": 0.7,
       "memory_controller": 0.15}, dict(TRAIN, from_s=90.0)],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "cleared_at_s": 90, "clear_within_s": 60,
       "duration_s": 180, "visible_above_s": 0.4})

# 2 s steps: a step as long as the default interval's double.
write("starved-duty40-step2p0", "Loader starvation with 2 s steps: 0.8 s of compute then 1.2 s waiting for input",
      [{"shape": "square", "busy_s": 0.8, "idle_s": 1.2, "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15}],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 0.8})

# With step marks (`steps = true`: the loop marks the end of every cycle, rank r on GPU r): the
# share of each step the GPU idles decides, at every sampling setting, also where the driver's
# period averages every idle stretch away.
MARKED_STARVED = {"shape": "square", "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15, "steps": True}
for duty in (0.25, 0.4, 0.55):
    busy_s, idle_s = round(duty * 0.3, 3), round((1 - duty) * 0.3, 3)
    write(f"starved-marked-duty{int(duty * 100)}-step0p3",
          f"Loader starvation with step marks: {busy_s} s of compute then {idle_s} s waiting, every GPU in lockstep",
          [dict(MARKED_STARVED, busy_s=busy_s, idle_s=idle_s)],
          {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150})
write("starved-marked-step1p0-slow-driver",
      "Loader starvation with step marks, 1 s steps 40 % busy, on a board whose driver samples every second",
      [dict(MARKED_STARVED, busy_s=0.4, idle_s=0.6)],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150}, driver=1000)
write("starved-marked-step2p0-slow-driver",
      "Loader starvation with step marks, 2 s steps 40 % busy, on a board whose driver samples every second",
      [dict(MARKED_STARVED, busy_s=0.8, idle_s=1.2)],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150}, driver=1000)
write("steps-ranks-h100x8",
      "Ranks 0-3 of a marked job starve on GPUs 0-3 (0.3 s steps, 40 % busy); GPUs 4-7 serve at a steady 40 %, unmarked",
      [{"gpus": [4, 5, 6, 7], "busy": 0.4, "memory": 0.5},
       dict(MARKED_STARVED, gpus=[0, 1, 2, 3], busy_s=0.12, idle_s=0.18)],
      {"findings": every("dataloader_starvation", [0, 1, 2, 3]), "raise_within_s": 60, "duration_s": 150,
       "profile": "h100x8"})
write("training-steady-marked", "Healthy training with step marks every 0.5 s: 95 % busy",
      [dict(TRAIN, steps=True, step_s=0.5)], {"findings": [], "duration_s": 180})
write("training-checkpoint-dips-marked", "Healthy marked training (0.8 s steps) with a 5 s checkpoint every 60 s",
      [dict(TRAIN, shape="dips", period_s=60.0, dip_s=5.0, idle=0.02, steps=True, step_s=0.8)],
      {"findings": [], "duration_s": 240})
write("straggler-marked-h100x8", "Eight H100s marking 1 s steps at 96 %, GPU 5 at 50 %",
      [{"busy": 0.96, "memory": 0.8, "steps": True}, {"gpus": [5], "busy": 0.5, "memory": 0.8, "steps": True}],
      {"findings": every("straggler", [5]), "raise_within_s": 40, "duration_s": 120, "profile": "h100x8"})
write("pipeline-bubbles-4s-marked", "Four marked pipeline stages, 3 s busy then 1 s idle, each 1 s after the previous",
      stages({"shape": "square", "busy_s": 3.0, "idle_s": 1.0, "stagger_s": 1.0, "memory_controller": 0.2,
              "steps": True}),
      {"findings": every("pipeline_bubbles"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 0.5,
       "interval_at_most_s": 1.0})

# Found by an outside review (each rule change has its look-alike that must stay quiet and its
# real case that must raise, `exact`: checked at every supported setting).
#
# Steady light work whose loop marks its steps: every step is 72 % idle, and the readings never
# alternate. The first review had it stay quiet; issue #42 (item 5) has marked steps decide
# however little the readings vary: 72 % of each step the GPU waits on its host, a loader's waits
# too short for the driver to show or host work between small kernels — the evidence names both.
# Four ranks of one run, flat readings: together or in turn cannot be told ("cannot tell").
write("steady-low-marked", "A small job at a steady 28 %, marking 0.2 s steps (nothing alternates)",
      [{"shape": "steady", "busy": 0.28, "memory": 0.3, "memory_controller": 0.12, "steps": True, "step_s": 0.2}],
      {"findings": every("starvation_or_bubbles"), "raise_within_s": 60, "duration_s": 150, "exact": True})
write("steady-40-marked-step0p3", "A steady 40 % job marking 0.3 s steps: the marks of starved-marked-duty40-step0p3",
      [{"shape": "steady", "busy": 0.4, "memory": 0.7, "memory_controller": 0.15, "steps": True, "step_s": 0.3}],
      {"findings": every("starvation_or_bubbles"), "raise_within_s": 60, "duration_s": 150, "exact": True})
# Its real case: the same mean, the same marks, but the step's 0.144 s of waiting is one stretch.
# A driver period longer than the step averages whole steps into the same flat reading as the
# look-alike's; the marks still show the wait.
write("starved-marked-duty28-step0p2", "Loader starvation with step marks: 0.056 s of compute then 0.144 s waiting",
      [dict(MARKED_STARVED, busy_s=0.056, idle_s=0.144, memory=0.3, memory_controller=0.12)],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 0.2,
       "exact": True})
# One data-parallel rank thermally throttled and always busy; its healthy peers wait for it at
# every step, in lockstep with each other: the cause is the hot GPU, not bubbles nor a loader.
SLOW_RANK_HOT = {"gpus": [0], "shape": "steady", "busy": 0.97, "memory": 0.8, "memory_controller": 0.4,
                 "temperature_c": 89.0, "sm_clock": 0.6, "power": 0.75,
                 "reasons": ["hw_thermal_slowdown", "sw_thermal_slowdown"]}
write("slow-rank-thermal", "GPU 0 throttled at 89 °C and always busy; GPUs 1-2 wait for it (0.55 s busy, 0.45 s idle)",
      [SLOW_RANK_HOT,
       {"gpus": [1, 2], "shape": "square", "busy_s": 0.55, "idle_s": 0.45, "jitter": 0.05, "busy": 0.95, "idle": 0.02,
        "memory": 0.8, "memory_controller": 0.25}],
      {"findings": every("thermal_throttling", [0]), "raise_within_s": 40, "duration_s": 150, "exact": True})
# Its real case: every rank starves (1 s steps, 40 % busy), one of them also hot — it idles with
# the others, so the others do not wait for it: starvation everywhere, and the throttling.
write("starved-one-rank-hot", "Loader starvation on every GPU (1 s steps, 40 % busy); GPU 0 also thermally throttled",
      [{"shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15},
       {"gpus": [0], "shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "memory": 0.7,
        "memory_controller": 0.15, "temperature_c": 89.0, "sm_clock": 0.6, "power": 0.6,
        "reasons": ["hw_thermal_slowdown", "sw_thermal_slowdown"]}],
      {"findings": every("dataloader_starvation") + every("thermal_throttling", [0]), "raise_within_s": 60,
       "duration_s": 150, "visible_above_s": 0.4, "exact": True})
# Copies saturating the link between compute bursts (0.4 s at 90 %, 0.6 s at 5 %): PCIe-bound on
# every GPU at every interval, though no short tick in a burst reads a low level.
write("memcopy-square", "Copies at 85 % of the PCIe link between 0.4 s compute bursts, 63 % idle",
      [{"shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "busy": 0.9, "idle": 0.05, "memory": 0.6,
        "memory_controller": 0.2, "pcie_rx": 0.85}],
      {"findings": every("pcie_bound"), "raise_within_s": 60, "duration_s": 150, "metrics": ["pcie_throughput"],
       "exact": True})
# Its look-alike for starvation: the same loop with a quiet link, PCIe sampled: still a loader.
write("starved-pcie-sampled", "Loader starvation (1 s steps, 40 % busy) with PCIe sampled and the link at 5 %",
      [{"shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "memory": 0.7, "memory_controller": 0.15,
        "pcie_rx": 0.05}],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150,
       "metrics": ["pcie_throughput"], "visible_above_s": 0.4, "exact": True})
# One rank slowed with no slowdown reason (another process on GPU 3): busy throughout, while its
# seven peers compute 0.6 s of each 1 s step and wait 0.4 s for it in lockstep. Nothing says
# the eight run one job, so GPU 3 is named `straggler_or_own_job` (the rank every step waits
# for, or a busy job of its own beside a starving one: issue #42), its peers are not starving.
# A 1 s driver averages the peers' steps flat: unsupported there.
SLOW_RANK_PEERS = {"shape": "square", "busy_s": 0.6, "idle_s": 0.4, "jitter": 0.05, "memory": 0.8,
                   "memory_controller": 0.3}
write("slow-rank-busy-h100x8", "GPU 3 busy 98 % with no slowdown reason; its 7 peers wait 0.4 s of each 1 s step",
      [SLOW_RANK_PEERS, {"gpus": [3], "busy": 0.98, "memory": 0.8, "memory_controller": 0.4}],
      {"findings": every("straggler_or_own_job", [3]), "raise_within_s": 45, "duration_s": 150,
       "profile": "h100x8", "visible_above_s": 0.4, "exact": True})
# Its look-alike: a starving job (GPUs 0-5, 1 s steps, 40 % busy) next to another job busy on
# GPUs 6-7. Two GPUs busy throughout is not one rank the others wait for: starvation stands.
write("starved-next-to-busy-job-h100x8", "GPUs 0-5 starve (1 s steps, 40 % busy); GPUs 6-7 run another job at 95 %",
      [{"gpus": [0, 1, 2, 3, 4, 5], "shape": "square", "busy_s": 0.4, "idle_s": 0.6, "jitter": 0.1, "memory": 0.7,
        "memory_controller": 0.15},
       {"gpus": [6, 7], "shape": "steady", "busy": 0.95, "memory": 0.85, "memory_controller": 0.45}],
      {"findings": every("dataloader_starvation", [0, 1, 2, 3, 4, 5]), "raise_within_s": 60, "duration_s": 150,
       "profile": "h100x8", "visible_above_s": 0.4, "exact": True})
# Memory-bound kernels that run all the time (utilisation 97 %, memory controller 85 %): on
# H100s GPM's SM activity (30 %) and DRAM bandwidth show it; on A100s, without GPM, the level
# stands in for SM activity and reads busy, and the memory controller busy nearly all the time
# decides. Its look-alike: memory-heavy but compute-bound training (controller at 70 %).
MEMBOUND_BUSY = {"busy": 0.97, "memory": 0.8, "memory_controller": 0.85, "sm_activity": 0.3, "dram": 0.88}
write("memory-bound-busy-a100", "Memory-bound kernels running all the time on A100s (no GPM): controller 85 %",
      [MEMBOUND_BUSY], {"findings": every("memory_bound"), "raise_within_s": 40, "duration_s": 120, "exact": True})
write("memory-bound-busy-h100x8", "Memory-bound kernels running all the time on H100s: SM activity 30 %, DRAM 88 %",
      [MEMBOUND_BUSY], {"findings": every("memory_bound"), "raise_within_s": 40, "duration_s": 120,
                        "profile": "h100x8", "exact": True})
write("training-memory-heavy-a100", "Compute-bound training on A100s (no GPM) with the memory controller at 70 %",
      [dict(TRAIN, memory_controller=0.7)], {"findings": [], "duration_s": 120, "exact": True})
# MIG instances (no utilisation from NVML): on H100, GPM's SM activity is the level. Instances
# holding memory with nothing running are idle while allocated; busy ones are not.
H100_MIG = "corpus/profiles/h100x2-mig.toml"
write("mig-idle-h100", "Two H100s in MIG mode: every instance holds memory and runs nothing",
      [{"busy": 0.0, "idle": 0.0, "memory": 0.5}],
      {"findings": every("idle_allocated"), "raise_within_s": 100, "duration_s": 150, "profile": H100_MIG,
       "exact": True})
write("mig-training-h100", "Two H100s in MIG mode running training on every instance", [TRAIN],
      {"findings": [], "duration_s": 120, "profile": H100_MIG, "exact": True})
# Look-alikes NVML alone cannot tell from a starving loader, raised as `dataloader_starvation`
# with advice that names them (docs/diagnosis.md): a regular 5 s evaluation pass every 15 s
# (idle stretches of seconds: the advice names host phases first), an inference server at
# 40 % duty (no marked steps: the advice names serving). Next to them, a loader that starves
# in 1.5 s gaps of 4 s cycles, which must stay raised.
write("eval-every-15s", "Training at 95 % with a 5 s evaluation pass (GPU at 3 %) every 15 s",
      [dict(TRAIN, shape="dips", period_s=15.0, dip_s=5.0, idle=0.03)],
      {"findings": every("dataloader_starvation"), "raise_within_s": 70, "duration_s": 150, "exact": True})
write("inference-duty40", "An inference server: 0.2 s batches every 0.5 s (40 % busy)",
      [{"shape": "bursts", "busy_s": 0.2, "idle_s": 0.3, "busy": 0.9, "idle": 0.0, "jitter": 0.3, "memory": 0.5,
        "memory_controller": 0.2}],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 0.2})
write("starved-duty62-step4p0", "Loader starvation in 4 s cycles: 2.5 s of compute, then a 1.5 s wait",
      [{"shape": "square", "busy_s": 2.5, "idle_s": 1.5, "jitter": 0.2, "memory": 0.75, "memory_controller": 0.2}],
      {"findings": every("dataloader_starvation"), "raise_within_s": 60, "duration_s": 150, "visible_above_s": 1.5})
# A multi-tenant node: GPUs 0-6 run one job at 95 %, GPU 7 holds 12 GiB for someone's paused
# notebook. With no process read (the default sampling) both readings are named,
# `imbalance_or_own_job` (issue #42); with its own process or owners that differ it is
# `idle_allocated` (a unit test: the mock has none).
write("idle-notebook-shared-h100x8", "GPUs 0-6 train at 95 %; GPU 7 holds 12 GiB for a paused notebook",
      [{"busy": 0.95, "memory": 0.85}, {"gpus": [7], "busy": 0.0, "idle": 0.0, "memory": 0.15}],
      {"findings": every("imbalance_or_own_job", [7]), "raise_within_s": 100, "duration_s": 120,
       "profile": "h100x8", "exact": True})
print(f"{len(WRITTEN)} corpus entries written to {HERE}")
