//! # gpumon-mock
//!
//! A mock GPU backend for gpumon, for tests, demos and machines without a GPU: scripted GPU
//! models, fleets, workloads over time and faults behind the [`Sampler`](gpumon_core::Sampler)
//! seam, plus test sinks.
//!
//! - [`MockSampler`] samples a [`MockFleet`] — GPUs built from a [`FleetProfile`], doing what a
//!   [`Scenario`] says. Every value is a pure function of (seed, device, tick): the same seed
//!   gives the same snapshots, run after run. Each `sample()` call is one tick.
//! - [`MockFleet`] is the pure model. The fake `libnvidia-ml` serves the same fleet through the
//!   NVML C ABI, so the two mocks agree value for value (values are quantised to NVML's units).
//! - [`RecordingSink`] keeps every snapshot (clones share storage); [`FaultySink`] fails,
//!   stalls, sleeps or panics on cue; `MockSamplerSeam` (feature `mockall`) is a `mockall` mock of the sampler
//!   seam for call-order tests.
//! - [`test_env`] gates tests on real backends and serves a loopback HTTP stub; `test_kit`
//!   (feature `test-kit`) is the harness of tests that start an agent process: kill on drop,
//!   wait for its listener, scrape until a condition with credentials, free ports; `kubelet`
//!   (feature `test-kubelet`) is a test kubelet serving the pod-resources API on a Unix socket.
//!
//! ## Layout: what ships where
//!
//! | where | what | shipped |
//! |---|---|---|
//! | `src/fleet.rs`, `gpus.rs`, `profile.rs`, `scenario.rs`, `timeline.rs`, `sampler.rs`, `nvlink.rs`, `rng.rs`, `error.rs` | the mock backend: GPU models, fleets, scenarios and phases, the driver's sampling model, [`MockSampler`] | yes (feature `mock` of `gpumon`) |
//! | `src/sim/` | [`sim`]: the simulator of how jobs run (draws, schedules, truth, regions) | yes, with the mock |
//! | `src/harness/` | test support: [`RecordingSink`], [`FaultySink`], [`test_env`]; features `test-kit`, `test-kubelet`, `mockall` | test sinks only; the rest behind test features |
//! | `tests/` | the mock's tests, the corpus accuracy test, the held-back simulator test (`tests/heldout.rs`) | no |
//! | `corpus/`, `profiles/` | hand-written corpus (regression), built-in profiles and scenarios | profiles and scenarios compiled in |
//! | `../fake-nvml/` (crate `gpumon-fake-nvml`) | the fake `libnvidia-ml.so`, serving the same fleets through the NVML C ABI | no (`publish = false`) |
//!
//! ## GPU models
//!
//! | key (aliases) | NVML name | memory | power default (min–max) | notable |
//! |---|---|---|---|---|
//! | `a100-sxm4-40gb` (`a100`) | NVIDIA A100-SXM4-40GB | 40 960 MiB | 400 W (100–400) | MIG, ECC, no NVENC |
//! | `a100-sxm4-80gb` (`a100-80gb`) | NVIDIA A100-SXM4-80GB | 81 920 MiB | 400 W (100–400) | MIG, ECC |
//! | `h100-sxm5-80gb` (`h100`) | NVIDIA H100 80GB HBM3 | 81 559 MiB | 700 W (200–700) | MIG, ECC, GPM |
//! | `h200-sxm-141gb` (`h200`) | NVIDIA H200 | 143 771 MiB | 700 W (200–700) | MIG, ECC, GPM |
//! | `rtx4090` (`4090`) | NVIDIA GeForce RTX 4090 | 24 564 MiB | 450 W (150–600) | fan, NVENC; no ECC/MIG/GPM/HBM temp |
//! | `v100-sxm2-32gb` (`v100`) | Tesla V100-SXM2-32GB | 32 768 MiB | 300 W (150–300) | page retirement |
//!
//! A family a model lacks stays `None` in every sample. See [`GpuModel`] for every fact.
//!
//! ## Fleet profiles
//!
//! Built-ins: `h100x8` (the default), `a100x4`, `h200x8`, `rtx4090x2`, `a100x8-mig` (each A100
//! split into 3g.20gb + 2g.10gb + 2× 1g.5gb) and `mixed`; their TOML ships in
//! `gpumon-mock/profiles/`. Any `<model>x<count>` with 1–64 GPUs is generated on demand
//! (`h100x64`, `a100-80gbx2`). [`FleetProfile::load`] takes a built-in name or a file path:
//!
//! ```toml
//! name = "my-node"                  # optional; default: the file path
//! description = "two H100s and a 4090"
//! driver_version = "570.86.15"      # optional (this is the default)
//! cuda_driver_version = 12080       # optional; NVML encoding, 12080 = 12.8
//! nvml_version = "12.570.86.15"     # optional; default "12." + driver_version
//! seed = 42                         # optional; UUIDs, serials and values derive from it
//!
//! [[devices]]                       # one entry per GPU model, in NVML index order
//! model = "h100"                    # key, alias or NVML name of a built-in model
//! count = 2                         # optional, default 1
//! mig = ["3g.40gb", "3g.40gb"]      # optional MIG instances (≤ 7 slices, the model's profiles)
//!
//! [[devices]]
//! model = "rtx4090"
//! # optional overrides of any model fact:
//! #   name, architecture, memory_total_bytes, memory_reserved_bytes,
//! #   power_limit_default_watts, power_limit_min_watts, power_limit_max_watts, power_idle_watts,
//! #   max_graphics_clock_mhz, max_sm_clock_mhz, max_memory_clock_mhz, max_video_clock_mhz,
//! #   temperature_slowdown_celsius, temperature_shutdown_celsius,
//! #   pcie_max_link_generation, pcie_max_link_width,
//! #   and capabilities gpm, memory_temperature, ecc, mig, encoder, decoder, fan (booleans)
//! overrides = { power_limit_default_watts = 400.0 }
//! ```
//!
//! Unknown keys are errors naming the key; an unknown model lists the known ones. A GPU `i` gets
//! a deterministic UUID `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (MIG instances `MIG-…`), a
//! 13-digit serial (datacenter parts) and PCI bus id `0000000d:BB:00.0` (DGX H100 bus numbers,
//! one PCI domain per 8 GPUs). [`MockFleet::devices`] lists each physical GPU followed by its MIG
//! instances, which carry [`MigInfo`](gpumon_core::MigInfo) with the parent's UUID.
//!
//! ## Scenarios
//!
//! Built-ins: `training` (the default), `idle`, `dataloader-starved`, `memory-bound`,
//! `imbalance`, `thermal-throttling`, `power-capped`, `near-oom`, `idle-allocated`, `pcie-bound`,
//! `lost-gpu` (training; GPU 3 lost from 5 s) and `ecc-burst` (training; GPU 1 gets 4
//! uncorrectable ECC errors, XID 48, at tick 10). They are written in phases
//! ([`Phase`]s: what each GPU does over simulated seconds, sampled by a driver every 1/6 s), so
//! run with one tick per sampling interval ([`Scenario::following_interval`], as the agent does)
//! each tick's high-resolution window holds what a real driver would have taken in it at any
//! interval. Each shows one pattern gpumon's diagnosis recognises, with values clearly on one side
//! of every rule's threshold (`tests/scenarios.rs` checks that contract on the raw data,
//! `tests/diagnosis.rs` the findings at 100 ms, 1 s and 2 s); their files are in
//! `gpumon-mock/profiles/scenarios/`.
//!
//! A scenario file can also name a [`Workload`] per GPU — the tick-based shapes below, kept for
//! code ([`Scenario::new`]) and older files: every tick's window holds about ten samples per
//! second of tick period, whatever the interval. [`Scenario::load`] takes a built-in name or a
//! file path:
//!
//! ```toml
//! name = "my-scenario"
//! workload = "training"      # a workload name from the table below
//! tick_period_ms = 1000      # simulated time per tick (energy integrates power over it)
//! seed = 7                   # optional
//!
//! [devices]                  # optional per-GPU workloads, by physical index
//! 1 = "idle"
//!
//! # Faults; ticks count samples from 0; `device` is a physical GPU index (its MIG instances
//! # are affected too).
//! [[faults]]
//! kind = "device_lost"       # sticky: DeviceSample::lost from at_tick on
//! device = 3
//! at_tick = 5
//!
//! [[faults]]
//! kind = "not_supported"     # the family's values are absent, no error recorded
//! family = "fan"             # a gpumon_core::Family name: utilization, memory, power, ...
//! device = 0                 # optional: omitted = every GPU
//!
//! [[faults]]
//! kind = "no_permission"     # values absent + MetricFailure { family, NoPermission }
//! family = "processes"
//!
//! [[faults]]
//! kind = "unknown_error"     # values absent + MetricFailure { family, Other("NVML unknown error") }
//! family = "ecc"             # (NVML_ERROR_UNKNOWN for single fields; the GPU stays up)
//! device = 1
//!
//! [[faults]]
//! kind = "hang"              # the sample call at at_tick blocks for duration_ms
//! at_tick = 10
//! duration_ms = 5000
//!
//! [[faults]]
//! kind = "unavailable"       # sample() fails with SampleError::Unavailable
//! from_tick = 20             # optional, default 0
//! until_tick = 25            # optional; omitted = forever
//!
//! [[faults]]
//! kind = "ecc_burst"         # ECC uncorrected (+ remapped rows / retired pages) rise by count,
//! device = 1                 # xid_errors gets `count` events of `xid`, from at_tick on
//! at_tick = 7
//! xid = 48                   # optional, default 48
//! count = 4                  # optional, default 1
//!
//! [[faults]]
//! kind = "nvlink_down"       # NVLink link down from at_tick: state down, counters stop,
//! device = 2                 # one recovery error
//! link = 5
//! at_tick = 10
//!
//! [[faults]]
//! kind = "nvlink_errors"     # CRC errors rise by per_tick each tick (replays half as fast,
//! device = 3                 # a recovery per 10 ticks) from at_tick on
//! link = 0
//! at_tick = 4
//! per_tick = 10              # optional, default 10
//! ```
//!
//! [`Fault::HangUntilReleased`] (blocks until a [`Gate`] is released) exists only in Rust, for
//! tests that drive the agent on a [`ManualClock`](gpumon_core::ManualClock) (`tests/runtime.rs`).
//!
//! ## Workloads
//!
//! The tick-based [`Workload`]s (not used by the built-in scenarios):
//!
//! | workload | GPU util | memory-controller util | memory used | power | other |
//! |---|---|---|---|---|---|
//! | `idle` | 0–1 % | 0 % | 0 | idle draw | no processes, P8 on GeForce, `GPU_IDLE`, PCIe gen 1 |
//! | `training` | 90–98 %, window min ≥ 85 % | 40–55 % | ~86 % ± 3 % | 88–95 % of limit | one-tick `SW_POWER_CAP` event (97–99 %, SM clock 86–92 %) in ~60 % of 30-tick blocks, never two in a block |
//! | `dataloader-starved` | reading 0–3 % or 85–97 %; window min ≤ 3 %, max ≥ 85 %, mean 25–41 % | 8–21 % | ~70 % | 25–40 % above idle | GPM activity = window mean, PCIe rx 1–4 GB/s |
//! | `memory-bound` | 30–35 %, steady | 76–86 % | ~80 % | 55–70 % of limit | GPM SM activity 24–32 %, DRAM bandwidth 76–86 % |
//! | `imbalance` | even GPU: training; odd twin: 6–12 % | twin 2–5 % | same | twin near idle | |
//! | `thermal-throttling` | as training | | | 70–78 % once hot | +0.5 °C/tick to slowdown, then SM clock 55–65 %, `HW_SLOWDOWN`/`HW_THERMAL_SLOWDOWN`/`SW_THERMAL_SLOWDOWN`; no power-cap reason |
//! | `power-capped` | as training | as training | as training | 97.5–99.8 % of limit (24 ticks in 25), else 92–95 % | SM clock 70–82 % with `SW_POWER_CAP`, else 88–94 % |
//! | `near-oom` | as training | as training | 95.5 % of total rising toward 99 %, never falling | as training | |
//! | `idle-allocated` | 0–1 %, window max ≤ 2 % | 0 % | 32–58 %, constant | just above idle | a compute process, `GPU_IDLE` |
//! | `pcie-bound` | 27–33 %, steady | 10–19 % | ~62 % | 30–42 % above idle | PCIe rx 74–86 % of the link's bandwidth, tx 4–12 % |
//!
//! Invariants hold at every tick: `used + free + reserved = total`, utilisations in `0..=1`,
//! clocks ≤ their maxima, power ≤ limit, the energy counter (the integral of reported power
//! over tick periods) never decreases, and window statistics satisfy `min ≤ value ≤ max`.
//! Families not asked for in the [`MetricSet`](gpumon_core::MetricSet) stay empty;
//! [`Family::PcieThroughput`](gpumon_core::Family::PcieThroughput) and
//! [`Family::Processes`](gpumon_core::Family::Processes) are opt-in. A GPU in MIG mode reports
//! no whole-GPU utilisation or processes (NVML doesn't either); its MIG instances report memory,
//! processes and (Hopper) GPM.
//!
//! ## Example
//!
//! ```
//! use gpumon_core::{DeviceFilter, Family, MetricSet, SampleRequest, Sampler};
//! use gpumon_mock::{Fault, FleetProfile, MockSampler, Scenario};
//!
//! let scenario = Scenario::from_toml_str(
//!     r#"
//!     workload = "training"
//!     [devices]
//!     1 = "idle"
//!     [[faults]]
//!     kind = "device_lost"
//!     device = 3
//!     at_tick = 2
//!     "#,
//!     "example",
//! )?;
//! let sampler = MockSampler::builder()
//!     .profile(FleetProfile::load("h100x8")?)
//!     .scenario(scenario)
//!     .seed(42)
//!     .fault(Fault::NotSupported { device: None, family: Family::Fan })
//!     .build()?;
//!
//! let request = SampleRequest::new(MetricSet::default(), DeviceFilter::parse("0,1,3")?);
//! let first = sampler.sample(&request)?; // tick 0
//! assert_eq!(first.system.backend, "mock");
//! assert_eq!(first.devices.len(), 3, "the filter hides GPUs 2 and 4-7");
//! let h100 = &first.devices[0];
//! assert_eq!(h100.info.name, "NVIDIA H100 80GB HBM3");
//! assert_eq!(h100.memory.total, Some(85_520_809_984));
//! assert!(h100.utilization.gpu.unwrap() >= 0.9);
//! assert!(first.devices[1].utilization.gpu.unwrap() < 0.05, "GPU 1 is idle");
//!
//! sampler.set_tick(2);
//! let later = sampler.sample(&request)?;
//! assert!(!later.devices[2].is_up(), "GPU 3 is lost from tick 2 on");
//! assert!(later.devices[0].is_up());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![warn(missing_debug_implementations, unreachable_pub, rust_2018_idioms)]

// What ships: the mock backend (fleets, scenarios, timelines, the sampler) and the simulator.
mod error;
mod fleet;
mod gpus;
mod profile;
mod rng;
mod sampler;
mod scenario;
pub mod sim;
mod timeline;

// Test support, in `src/harness/`: sinks that record or fail on cue, the environment gates and
// loopback stub, and behind features the agent-process harness, the test kubelet and the
// mockall seam. Module paths are unchanged (`gpumon_mock::test_env`, …).
#[cfg(feature = "test-kubelet")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-kubelet")))]
#[path = "harness/kubelet.rs"]
pub mod kubelet;
#[cfg(feature = "mockall")]
#[path = "harness/seam.rs"]
mod seam;
#[path = "harness/sinks.rs"]
mod sinks;
#[path = "harness/test_env.rs"]
pub mod test_env;
#[cfg(feature = "test-kit")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-kit")))]
#[path = "harness/test_kit.rs"]
pub mod test_kit;

pub use error::ConfigError;
pub use fleet::{nvlink_share, DeviceKind, MockDevice, MockFleet, DEFAULT_SEED};
pub use gpus::{Capabilities, GpuModel, MigProfile, MAX_NVLINK_LINKS};
pub use profile::{FleetProfile, GpuSpec, DEFAULT_CUDA_DRIVER_VERSION, DEFAULT_DRIVER_VERSION, MAX_GPUS};
pub use sampler::{MockSampler, MockSamplerBuilder};
pub use scenario::{Fault, Gate, Scenario, Workload, UNKNOWN_ERROR};
#[cfg(feature = "mockall")]
#[cfg_attr(docsrs, doc(cfg(feature = "mockall")))]
pub use seam::MockSamplerSeam;
pub use sinks::{Behavior, FailKind, FaultyCalls, FaultySink, NullSink, RecordingSink};
pub use timeline::{Phase, Shape, DEFAULT_DRIVER_PERIOD_S};
