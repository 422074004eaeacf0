//! A physical GPU's activity at one tick ([`Load`]): from its timeline when the scenario gives
//! it phases, else from its tick-based [`Workload`]. Split from `fleet.rs` (one concept per
//! file, no function over 120 lines); every value is drawn exactly as before.

use super::*;

/// The model's facts and the tick's random draws every workload's values come from.
struct Env<'a> {
    d: Draw,
    m: &'a GpuModel,
    limit_mw: u64,
    idle_mw: u64,
    idle_t: f64,
    max_sm: u32,
    link_kbps: f64,
    /// -1..1, slow.
    slow_drift: f64,
}

impl Env<'_> {
    fn pct(&self, lo: f64, hi: f64, s: u64) -> u32 {
        self.d.range(s, lo, hi).floor().clamp(0.0, 100.0) as u32
    }

    fn frac_mw(&self, lo: f64, hi: f64) -> u64 {
        (self.limit_mw as f64 * self.d.range(stream::POWER, lo, hi)) as u64
    }

    fn between_mw(&self, lo: f64, hi: f64) -> u64 {
        self.idle_mw + ((self.limit_mw - self.idle_mw) as f64 * self.d.range(stream::POWER, lo, hi)) as u64
    }

    fn clock(&self, lo: f64, hi: f64) -> u32 {
        ((f64::from(self.max_sm) * self.d.range(stream::CLOCK, lo, hi)) as u32).clamp(1, self.max_sm)
    }

    /// DRAM bandwidth follows the memory controller (GPM measures it a little lower).
    fn dram_of(&self, mem_pct: u32) -> f64 {
        (f64::from(mem_pct) / 100.0 * self.d.range(stream::GPM + 3, 0.9, 1.0)).min(1.0)
    }

    /// Healthy training; `capped` = one of its short power-cap events (see `power_cap_blip`).
    fn training_at(&self, capped: bool, idle: Load) -> Load {
        let e = self;
        let gpu_pct = e.pct(90.0, 99.0, stream::GPU_UTIL);
        let mem_pct = e.pct(40.0, 56.0, stream::MEM_UTIL);
        Load {
            gpu_pct,
            mem_pct,
            mem_frac: 0.86 + 0.03 * e.slow_drift,
            // At the limit the firmware trims clocks; otherwise the board runs just below it.
            power_mw: if capped { e.frac_mw(0.97, 0.995) } else { e.frac_mw(0.88, 0.955) },
            temp_c: (e.idle_t + 35.0 + e.d.range(stream::TEMP, -1.5, 1.5)) as u32,
            sm_mhz: if capped { e.clock(0.86, 0.92) } else { e.clock(0.95, 1.0) },
            mem_mhz: e.m.max_memory_clock_mhz,
            video_mhz: (f64::from(e.m.max_video_clock_mhz) * e.d.range(stream::VIDEO, 0.9, 1.0)) as u32,
            reasons: if capped { ClockEventReasons::SW_POWER_CAP } else { 0 },
            busy: true,
            tx_kbps: e.d.range(stream::PCIE_TX, 0.3e6, 1.5e6) as u64,
            rx_kbps: e.d.range(stream::PCIE_RX, 1.0e6, 4.0e6) as u64,
            tensor_share: e.d.range(stream::GPM, 0.6, 0.8),
            activity: f64::from(gpu_pct) / 100.0,
            dram: e.dram_of(mem_pct),
            util_spread: 0.04,
            ..idle
        }
    }
}

impl MockFleet {
    /// The activity of the physical GPU at `position` at `tick`.
    pub(super) fn load(&self, position: usize, tick: u64) -> Load {
        let dev = &self.devices[position];
        let m = &*dev.model;
        let e = Env {
            d: Draw::new(self.seed, position, tick),
            m,
            limit_mw: watts_to_mw(m.power_limit_default_watts),
            idle_mw: watts_to_mw(m.power_idle_watts),
            idle_t: m.temperature_idle_celsius,
            max_sm: m.max_sm_clock_mhz,
            link_kbps: pcie_link_kbps(m.pcie_max_link_generation, m.pcie_max_link_width),
            slow_drift: ((tick as f64 / 300.0) + (position as f64)).sin(),
        };
        let idle_util = e.pct(0.0, 2.0, stream::GPU_UTIL);
        let idle = Load {
            gpu_pct: idle_util,
            mem_pct: e.pct(0.0, 1.0, stream::MEM_UTIL),
            dec_pct: 0,
            mem_frac: 0.0,
            power_mw: (e.idle_mw as f64 * e.d.range(stream::POWER, 0.95, 1.08)) as u64,
            limit_mw: e.limit_mw,
            temp_c: (e.idle_t + e.d.range(stream::TEMP, 0.0, 2.0)) as u32,
            sm_mhz: e.m.idle_graphics_clock_mhz.max(1),
            mem_mhz: if e.m.hbm { e.m.max_memory_clock_mhz } else { (e.m.max_memory_clock_mhz / 25).max(1) },
            video_mhz: (e.m.max_video_clock_mhz / 3).max(1),
            reasons: ClockEventReasons::GPU_IDLE,
            busy: false,
            tx_kbps: e.d.range(stream::PCIE_TX, 0.0, 50.0) as u64,
            rx_kbps: e.d.range(stream::PCIE_RX, 0.0, 50.0) as u64,
            tensor_share: 0.0,
            activity: f64::from(idle_util) / 100.0,
            dram: 0.0,
            util_window: None,
            // Without kernels there is nothing to vary: the driver's samples stay at 0–2 %.
            util_spread: 0.01,
            power_spread: 0.05,
            timeline: false,
        };
        if let Some(t) = self.timeline(dev.gpu) {
            return self.timeline_load(&e, t, tick, idle);
        }
        let mut load = self.workload_load(&e, dev, position, tick, idle);
        load.power_mw = load.power_mw.min(e.limit_mw);
        load.gpu_pct = load.gpu_pct.min(100);
        load.mem_pct = load.mem_pct.min(100);
        load.mem_frac = load.mem_frac.clamp(0.0, MAX_MEM_FRAC);
        load.video_mhz = load.video_mhz.clamp(1, e.m.max_video_clock_mhz);
        load.mem_mhz = load.mem_mhz.clamp(1, e.m.max_memory_clock_mhz);
        load
    }

    /// The load of a GPU running phases.
    fn timeline_load(&self, e: &Env<'_>, t: &crate::timeline::GpuTimeline, tick: u64, idle: Load) -> Load {
        let end = self.tick_end(tick);
        let at = t.tick(end, self.tick_period.as_secs_f64());
        let Some(phase) = at.phase else {
            // No job on it: idle and empty, as before a job starts or after it ends.
            return Load { util_window: None, timeline: true, ..idle };
        };
        let link_share = |share: f64| (e.link_kbps * share * e.d.range(stream::PCIE_RX, 0.9, 1.1)) as u64;
        let activity = at.activity;
        let mc = phase.memory_controller.map_or(0.45 * activity, |m| m * activity / phase.busy.max(1e-9)).min(1.0);
        let mut reasons = phase.reason_bits().unwrap_or(0);
        let window = WindowStats::from_values(at.window.iter().copied()).map(|mut w| {
            w.mean = w.mean.clamp(w.min, w.max);
            w
        });
        let power_full = e.limit_mw as f64 * phase.power;
        let power_mw = (e.idle_mw as f64 + (power_full - e.idle_mw as f64).max(0.0) * activity) as u64;
        // The power cap holds only while the draw is at the limit: a dip below it lifts it.
        if (power_mw as f64) < POWER_CAPPED * e.limit_mw as f64 {
            reasons &= !ClockEventReasons::SW_POWER_CAP;
        }
        // Nothing ran all interval: the clocks drop to idle, as on a GPU with no work.
        let mut sm_mhz = ((f64::from(e.max_sm) * phase.sm_clock) as u32).clamp(1, e.max_sm);
        if activity < 0.005 {
            reasons |= ClockEventReasons::GPU_IDLE;
            sm_mhz = sm_mhz.min(idle.sm_mhz);
        }
        let temp_c = phase.temperature_at(end).unwrap_or(e.idle_t + 35.0 * activity);
        // Copies the SMs wait for run while the GPU idles (ZeRO offload).
        let waiting = at.instant < 0.5 * phase.busy.max(1e-9);
        let pcie_rx = phase.pcie_rx_idle.filter(|_| waiting).unwrap_or(phase.pcie_rx);
        Load {
            gpu_pct: (at.latest * 100.0).round() as u32,
            mem_pct: (mc * 100.0).floor() as u32,
            dec_pct: 0,
            mem_frac: phase.memory_at(end),
            power_mw,
            limit_mw: e.limit_mw,
            temp_c: temp_c.min(e.m.temperature_shutdown_celsius - 1.0) as u32,
            sm_mhz,
            mem_mhz: e.m.max_memory_clock_mhz,
            video_mhz: (e.m.max_video_clock_mhz / 3).max(1),
            reasons,
            busy: activity > 0.05,
            tx_kbps: link_share(pcie_rx * 0.1),
            rx_kbps: link_share(pcie_rx),
            tensor_share: 0.5,
            activity: phase.sm_activity.map_or(0.9 * activity, |a| a * activity / phase.busy.max(1e-9)).min(1.0),
            dram: phase.dram.unwrap_or(mc),
            util_window: window,
            util_spread: 0.0,
            // Capped, the firmware holds the draw at the limit: its samples barely move.
            power_spread: if reasons & ClockEventReasons::SW_POWER_CAP != 0 { 0.015 } else { 0.03 },
            timeline: true,
        }
    }

    /// The load of a GPU running a tick-based workload.
    fn workload_load(&self, e: &Env<'_>, dev: &MockDevice, position: usize, tick: u64, idle: Load) -> Load {
        match dev.workload {
            Workload::Idle => idle,
            Workload::Training => e.training_at(power_cap_blip(self.seed, position, tick), idle),
            Workload::DataloaderStarved => {
                let window = starved_window(self.seed, position, tick, self.window_len());
                let gpu_pct = (window.latest * 100.0).round() as u32;
                let mem_pct = e.pct(8.0, 22.0, stream::MEM_UTIL);
                Load {
                    gpu_pct,
                    mem_pct,
                    dec_pct: 0,
                    mem_frac: 0.70 + 0.03 * e.slow_drift,
                    power_mw: e.between_mw(0.25, 0.40),
                    temp_c: (e.idle_t + 18.0 + e.d.range(stream::TEMP, -1.0, 1.0)) as u32,
                    // Clocks stay up between batches: the GPU is ready, it just has no input.
                    sm_mhz: e.clock(0.93, 1.0),
                    reasons: 0,
                    // Batches arrive in bursts well below the link's bandwidth: the loader is
                    // slow at producing them (decode, augmentation), not at copying them.
                    tx_kbps: e.d.range(stream::PCIE_TX, 0.1e6, 0.5e6) as u64,
                    rx_kbps: e.d.range(stream::PCIE_RX, 1.0e6, 4.0e6) as u64,
                    tensor_share: e.d.range(stream::GPM, 0.5, 0.7),
                    activity: window.stats.mean,
                    dram: e.dram_of(mem_pct),
                    util_window: Some(window.stats),
                    ..e.training_at(false, idle)
                }
            }
            Workload::MemoryBound => {
                let gpu_pct = e.pct(30.0, 36.0, stream::GPU_UTIL);
                Load {
                    gpu_pct,
                    mem_pct: e.pct(76.0, 87.0, stream::MEM_UTIL),
                    mem_frac: 0.80 + 0.03 * e.slow_drift,
                    power_mw: e.frac_mw(0.55, 0.70),
                    temp_c: (e.idle_t + 28.0 + e.d.range(stream::TEMP, -1.0, 1.0)) as u32,
                    sm_mhz: e.clock(0.95, 1.0),
                    reasons: 0,
                    tensor_share: e.d.range(stream::GPM, 0.1, 0.2),
                    activity: f64::from(gpu_pct) / 100.0,
                    // Streaming kernels (unfused element-wise ops, attention without
                    // flash-attention) saturate HBM while the SMs wait on loads.
                    dram: e.d.range(stream::GPM + 3, 0.76, 0.86),
                    ..e.training_at(false, idle)
                }
            }
            Workload::Imbalance => {
                let has_twin = dev.gpu % 2 == 1 || (dev.gpu as usize + 1) < self.gpu_count();
                if dev.gpu.is_multiple_of(2) || !has_twin {
                    e.training_at(power_cap_blip(self.seed, position, tick), idle)
                } else {
                    // Waiting on its twin in a collective: model loaded, clocks up, SMs idle.
                    let gpu_pct = e.pct(6.0, 13.0, stream::GPU_UTIL);
                    let mem_pct = e.pct(2.0, 6.0, stream::MEM_UTIL);
                    Load {
                        gpu_pct,
                        mem_pct,
                        power_mw: e.between_mw(0.08, 0.15),
                        temp_c: (e.idle_t + 8.0 + e.d.range(stream::TEMP, -1.0, 1.0)) as u32,
                        sm_mhz: e.clock(0.93, 1.0),
                        reasons: 0,
                        tx_kbps: e.d.range(stream::PCIE_TX, 0.05e6, 0.2e6) as u64,
                        rx_kbps: e.d.range(stream::PCIE_RX, 0.05e6, 0.2e6) as u64,
                        tensor_share: 0.1,
                        activity: f64::from(gpu_pct) / 100.0,
                        dram: e.dram_of(mem_pct),
                        util_spread: 0.025,
                        ..e.training_at(false, idle)
                    }
                }
            }
            _ => self.throttled_load(e, dev, position, tick, idle),
        }
    }

    /// The workloads held back by clocks, power or the bus, and the idle allocation.
    fn throttled_load(&self, e: &Env<'_>, dev: &MockDevice, position: usize, tick: u64, idle: Load) -> Load {
        match dev.workload {
            Workload::ThermalThrottling => {
                // No power-cap events here: once hot the board draws well below its limit, and
                // the clocks are down for thermal reasons alone.
                let base = e.training_at(false, idle);
                let slow = e.m.temperature_slowdown_celsius;
                let shut = e.m.temperature_shutdown_celsius;
                // Climbs 0.5 °C per tick from its training temperature until it hits slowdown.
                // The switch is decided on the noise-free ramp, so once hot it stays hot.
                let climb = tick as f64 * 0.5;
                if e.idle_t + 35.0 + climb < slow {
                    Load { temp_c: (f64::from(base.temp_c) + climb).min(slow - 1.0) as u32, ..base }
                } else {
                    let span = (shut - slow).max(1.0);
                    Load {
                        temp_c: (slow + (span * e.d.range(stream::TEMP, 0.0, 0.999)).floor()).min(shut - 1.0) as u32,
                        power_mw: e.frac_mw(0.70, 0.78),
                        sm_mhz: e.clock(0.55, 0.65),
                        reasons: ClockEventReasons::HW_SLOWDOWN
                            | ClockEventReasons::HW_THERMAL_SLOWDOWN
                            | ClockEventReasons::SW_THERMAL_SLOWDOWN,
                        ..base
                    }
                }
            }
            Workload::PowerCapped => {
                // Pinned at the power limit: the firmware holds clocks down on all but one tick
                // in 25, when the draw dips just under the limit and the clocks recover a little.
                let off = hash(&[self.seed, 0x9C, position as u64]) % POWER_CAP_RELIEF;
                let capped = !(tick + off).is_multiple_of(POWER_CAP_RELIEF);
                Load {
                    power_mw: if capped { e.frac_mw(0.975, 0.998) } else { e.frac_mw(0.92, 0.95) },
                    sm_mhz: if capped { e.clock(0.70, 0.82) } else { e.clock(0.88, 0.94) },
                    temp_c: (e.idle_t + 40.0 + e.d.range(stream::TEMP, -1.5, 1.5)) as u32,
                    reasons: if capped { ClockEventReasons::SW_POWER_CAP } else { 0 },
                    // The firmware holds the draw at the limit: its samples barely move.
                    power_spread: 0.015,
                    ..e.training_at(false, idle)
                }
            }
            Workload::NearOom => Load {
                mem_frac: near_oom_fraction(e.m, tick),
                ..e.training_at(power_cap_blip(self.seed, position, tick), idle)
            },
            Workload::IdleAllocated => {
                // A process holds its allocation (a notebook kernel, a hung rank) and runs nothing.
                let held = 0.32 + 0.26 * Draw::new(self.seed, position, 0).unit(stream::MEM_FRAC);
                Load {
                    mem_frac: held,
                    power_mw: (e.idle_mw as f64 * e.d.range(stream::POWER, 1.05, 1.2)) as u64,
                    temp_c: (e.idle_t + e.d.range(stream::TEMP, 2.0, 4.0)) as u32,
                    ..idle
                }
            }
            Workload::PcieBound => {
                let gpu_pct = e.pct(27.0, 34.0, stream::GPU_UTIL);
                let mem_pct = e.pct(10.0, 20.0, stream::MEM_UTIL);
                Load {
                    gpu_pct,
                    mem_pct,
                    mem_frac: 0.62 + 0.03 * e.slow_drift,
                    power_mw: e.between_mw(0.30, 0.42),
                    temp_c: (e.idle_t + 20.0 + e.d.range(stream::TEMP, -1.0, 1.0)) as u32,
                    sm_mhz: e.clock(0.93, 1.0),
                    reasons: 0,
                    // Host-to-device copies near the link's bandwidth every step (offloaded
                    // optimizer state, pageable batches re-copied): the GPU waits on the bus.
                    tx_kbps: (e.link_kbps * e.d.range(stream::PCIE_TX, 0.04, 0.12)) as u64,
                    rx_kbps: (e.link_kbps * e.d.range(stream::PCIE_RX, 0.74, 0.86)) as u64,
                    tensor_share: e.d.range(stream::GPM, 0.3, 0.5),
                    activity: f64::from(gpu_pct) / 100.0,
                    dram: e.dram_of(mem_pct),
                    ..e.training_at(false, idle)
                }
            }
            _ => idle,
        }
    }
}
