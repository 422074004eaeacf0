//! The simulated fleet: determinism, invariants, workload signatures, MIG, large fleets, metric
//! selection and device filtering.

use std::time::{Duration, SystemTime};

use gpumon_core::{ClockEventReasons, DeviceFilter, DeviceSample, Family, MetricSet, SampleRequest, Sampler, Snapshot};
use gpumon_mock::{FleetProfile, MockFleet, MockSampler, Scenario, Workload};

fn fleet(profile: &str, workload: Workload, seed: u64) -> MockFleet {
    MockFleet::new(&FleetProfile::load(profile).unwrap(), &Scenario::new(workload), seed)
        .unwrap()
        .with_epoch(SystemTime::UNIX_EPOCH)
}

fn all_devices(f: &MockFleet, tick: u64, metrics: MetricSet) -> Vec<DeviceSample> {
    f.sample(tick, metrics, &DeviceFilter::all())
}

/// Checks every invariant of one sample; `prev_energy` is the previous tick's counter.
fn check_invariants(s: &DeviceSample, prev_energy: Option<f64>, ctx: &str) -> Option<f64> {
    let info = &s.info;
    assert!(s.is_up(), "{ctx}");
    let unit = |name: &str, v: Option<f64>| {
        if let Some(v) = v {
            assert!((0.0..=1.0).contains(&v), "{ctx}: {name} = {v}");
        }
    };
    let u = &s.utilization;
    for (n, v) in [("gpu", u.gpu), ("memory", u.memory), ("encoder", u.encoder), ("decoder", u.decoder)] {
        unit(n, v);
    }
    unit("fan", s.fan_speed);
    let m = &s.memory;
    if let (Some(used), Some(free), Some(total)) = (m.used, m.free, m.total) {
        assert_eq!(used + free + m.reserved.unwrap(), total, "{ctx}: memory sum");
        assert_eq!(Some(total), info.memory_total_bytes, "{ctx}");
    }
    let max = &info.max_clocks;
    for (n, v, hi) in [
        ("graphics", s.clocks.graphics, max.graphics),
        ("sm", s.clocks.sm, max.sm),
        ("memory", s.clocks.memory, max.memory),
        ("video", s.clocks.video, max.video),
    ] {
        if let Some(v) = v {
            assert!(v > 0.0 && v <= hi.unwrap(), "{ctx}: {n} clock {v} > {hi:?}");
        }
    }
    if let Some(p) = s.power.usage_watts {
        let limit = s.power.limit_watts.unwrap();
        assert!(p > 0.0 && p <= limit, "{ctx}: power {p} limit {limit}");
        assert!(limit <= info.power_limit_max_watts.unwrap() && limit >= info.power_limit_min_watts.unwrap());
    }
    if let Some(t) = s.temperature.gpu {
        assert!(t > 15.0 && t < info.temperature_shutdown_celsius.unwrap(), "{ctx}: temp {t}");
    }
    if let Some(p) = s.performance_state {
        assert!(p <= 15, "{ctx}");
    }
    if let Some(g) = s.pcie.link_generation {
        assert!(g >= 1 && g <= info.pcie_max_link_generation.unwrap(), "{ctx}");
    }
    let w = &s.windows;
    for (n, stats, value) in [
        ("gpu util", w.gpu_utilization, u.gpu),
        ("mem util", w.memory_utilization, u.memory),
        ("power", w.power_watts, s.power.usage_watts),
        ("sm clock", w.sm_clock, s.clocks.sm),
        ("mem clock", w.memory_clock, s.clocks.memory),
    ] {
        if let Some(st) = stats {
            assert!(st.min <= st.mean && st.mean <= st.max && st.count >= 1, "{ctx}: {n} {st:?}");
            if let Some(v) = value {
                assert!(st.min <= v && v <= st.max, "{ctx}: {n} value {v} outside {st:?}");
            }
        }
    }
    for g in
        [s.gpm.graphics_activity, s.gpm.sm_activity, s.gpm.sm_occupancy, s.gpm.tensor_activity, s.gpm.dram_bandwidth]
    {
        unit("gpm", g);
    }
    if !s.processes.is_empty() {
        let mem: u64 = s.processes.iter().map(|p| p.memory_used.unwrap()).sum();
        assert!(mem <= m.used.unwrap(), "{ctx}: process memory {mem}");
        if let Some(gpu) = u.gpu {
            let sm: f64 = s.processes.iter().map(|p| p.sm_utilization.unwrap()).sum();
            assert!(sm <= gpu + 1e-9, "{ctx}: process SM {sm} > {gpu}");
        }
    }
    if let Some(e) = s.power.energy_joules {
        if let (Some(prev), Some(p)) = (prev_energy, s.power.usage_watts) {
            assert!(e >= prev, "{ctx}: energy went back {prev} -> {e}");
            // One tick of 1 s at this tick's power.
            assert!((e - prev - p).abs() < 0.002, "{ctx}: energy step {} vs power {p}", e - prev);
        }
        return Some(e);
    }
    None
}

#[test]
fn invariants_hold_for_1000_ticks_of_every_workload() {
    let all = MetricSet::everything();
    for workload in Workload::ALL {
        for profile in ["h100x8", "mixed", "a100x8-mig", "rtx4090x2"] {
            let f = fleet(profile, workload, 11);
            let mut energy = vec![None; f.devices().len()];
            for tick in 0..1000 {
                for (i, s) in all_devices(&f, tick, all).iter().enumerate() {
                    let ctx = format!("{profile}/{workload} tick {tick} dev {i} ({})", s.info.name);
                    energy[i] = check_invariants(s, energy[i], &ctx).or(energy[i]);
                }
            }
        }
    }
}

#[test]
fn same_seed_same_snapshots_different_seed_different() {
    let all = MetricSet::everything();
    let a = fleet("mixed", Workload::Training, 1);
    let b = fleet("mixed", Workload::Training, 1);
    let c = fleet("mixed", Workload::Training, 2);
    for tick in [0, 1, 17, 500] {
        assert_eq!(all_devices(&a, tick, all), all_devices(&b, tick, all), "tick {tick}");
    }
    assert_ne!(a.devices()[0].uuid, c.devices()[0].uuid);
    assert_ne!(all_devices(&a, 3, all)[0].utilization, all_devices(&c, 3, all)[0].utilization);

    // Through the sampler too: same seed, same sequence.
    let req = SampleRequest::new(all, DeviceFilter::all());
    let s1 = MockSampler::builder().seed(9).epoch(SystemTime::UNIX_EPOCH).build().unwrap();
    let s2 = MockSampler::builder().seed(9).epoch(SystemTime::UNIX_EPOCH).build().unwrap();
    for _ in 0..5 {
        let (x, y) = (s1.sample(&req).unwrap(), s2.sample(&req).unwrap());
        assert_eq!(x.devices, y.devices);
    }
    // Out-of-order evaluation gives the same values (no hidden state).
    let fresh = fleet("mixed", Workload::Training, 1);
    assert_eq!(all_devices(&fresh, 500, all), all_devices(&a, 500, all));
}

#[test]
fn identities_are_well_formed_and_unique() {
    let f = fleet("h100x64", Workload::Idle, 3);
    assert_eq!(f.devices().len(), 64);
    let mut uuids = std::collections::HashSet::new();
    let mut buses = std::collections::HashSet::new();
    for (i, d) in f.devices().iter().enumerate() {
        assert_eq!(d.index as usize, i);
        assert!(d.uuid.starts_with("GPU-") && d.uuid.len() == 40, "{}", d.uuid);
        assert!(uuids.insert(d.uuid.clone()));
        assert!(buses.insert(d.pci_bus_id.clone().unwrap()));
        assert_eq!(d.serial.as_ref().unwrap().len(), 13);
    }
    let samples = all_devices(&f, 0, MetricSet::default().with_stage_inputs());
    assert_eq!(samples.len(), 64);
    assert!(samples.iter().all(|s| s.is_up() && s.memory.total == Some(85_520_809_984)));
    // GeForce has no serial.
    assert!(fleet("rtx4090x2", Workload::Idle, 3).devices()[0].serial.is_none());
}

#[test]
fn datasheet_values_reach_the_snapshot() {
    let f = fleet("h200x8", Workload::Training, 1);
    let d = &f.devices()[0];
    assert_eq!(d.name, "NVIDIA H200");
    assert_eq!(d.memory_total_bytes, Some(143_771 * 1024 * 1024));
    assert_eq!(d.power_limit_default_watts, Some(700.0));
    assert_eq!(d.architecture.as_deref(), Some("Hopper"));
    let s = &all_devices(&f, 0, MetricSet::everything())[0];
    assert_eq!(s.power.limit_watts, Some(700.0));
    assert!(s.gpm.sm_activity.is_some() && s.temperature.memory.is_some() && s.ecc.uncorrected == Some(0));
    assert!(s.fan_speed.is_none(), "SXM parts have no fan");
    assert!(s.xid_errors.is_empty());
    assert_eq!(s.ecc.remapped_rows_uncorrectable, Some(0));
    assert_eq!(s.ecc.retired_pages_double_bit, None, "Hopper remaps rows instead of retiring pages");
    assert_eq!(s.utilization.encoder, None, "no NVENC on H100/H200");

    let rtx = fleet("rtx4090x2", Workload::Training, 1);
    let s = &all_devices(&rtx, 0, MetricSet::everything())[0];
    assert_eq!(s.info.name, "NVIDIA GeForce RTX 4090");
    assert!(s.fan_speed.is_some() && s.utilization.encoder.is_some());
    assert!(s.ecc.corrected.is_none() && s.ecc.remapped_rows_uncorrectable.is_none());
    assert!(s.gpm.sm_activity.is_none() && s.temperature.memory.is_none());

    let mixed = fleet("mixed", Workload::Training, 1);
    let v100 =
        all_devices(&mixed, 0, MetricSet::everything()).into_iter().find(|s| s.info.name.contains("V100")).unwrap();
    assert_eq!(v100.ecc.retired_pages_double_bit, Some(0));
    assert_eq!(v100.ecc.remapped_rows_uncorrectable, None);
    assert_eq!(mixed.system().driver_version.as_deref(), Some("570.86.15"));
    assert_eq!(mixed.system().cuda_driver_version, Some(12080));
}

#[test]
fn training_signature() {
    let f = fleet("h100x8", Workload::Training, 5);
    for tick in 0..200 {
        for s in all_devices(&f, tick, MetricSet::everything().with(Family::Processes)) {
            let gpu = s.utilization.gpu.unwrap();
            assert!((0.9..=0.98).contains(&gpu), "{gpu}");
            assert!(s.memory.used_ratio().unwrap() > 0.8);
            assert!(s.power.usage_watts.unwrap() >= 0.88 * 700.0 - 0.01);
            assert!(!s.processes.is_empty());
            assert_eq!(s.performance_state, Some(0));
        }
    }
}

#[test]
fn idle_signature() {
    let f = fleet("rtx4090x2", Workload::Idle, 5);
    for tick in 0..100 {
        for s in all_devices(&f, tick, MetricSet::everything()) {
            assert!(s.utilization.gpu.unwrap() <= 0.02);
            assert_eq!(s.memory.used, Some(0));
            assert!(s.processes.is_empty());
            assert_eq!(s.performance_state, Some(8));
            assert!(s.clock_event_reasons.unwrap().contains(ClockEventReasons::GPU_IDLE));
            assert!(s.power.usage_watts.unwrap() < 30.0);
        }
    }
}

#[test]
fn dataloader_starved_signature() {
    // Within each interval the GPU runs a batch, then waits for the next: the high-resolution
    // window spans ~0 to high, the instantaneous reading lands at one end or the other, and the
    // memory controller stays quiet (a busy one would read as memory-bound instead).
    let f = fleet("a100x4", Workload::DataloaderStarved, 5);
    let (mut low, mut high) = (0, 0);
    for tick in 0..100 {
        for s in all_devices(&f, tick, MetricSet::default().with_stage_inputs()) {
            let gpu = s.utilization.gpu.unwrap();
            let mem = s.utilization.memory.unwrap();
            let w = s.windows.gpu_utilization.unwrap();
            assert!(w.min <= 0.05 && w.max >= 0.8 && (0.25..=0.5).contains(&w.mean), "tick {tick}: {w:?}");
            assert!(mem < 0.3 && mem < w.mean, "memory controller {mem} vs mean utilisation {}", w.mean);
            assert!(s.memory.used_ratio().unwrap() > 0.5, "work is allocated");
            if gpu <= 0.05 {
                low += 1;
            } else {
                assert!(gpu >= 0.8, "tick {tick}: instantaneous {gpu} is neither waiting nor running");
                high += 1;
            }
        }
    }
    assert!(low > high && high >= 100, "jumps between ~0 and high: {low} low, {high} high");
}

#[test]
fn imbalance_signature() {
    let f = fleet("h100x8", Workload::Imbalance, 5);
    let mut sums = [0.0f64; 2];
    for tick in 0..100 {
        let s = all_devices(&f, tick, MetricSet::default().with_stage_inputs());
        let (busy, twin) = (s[0].utilization.gpu.unwrap(), s[1].utilization.gpu.unwrap());
        assert!(busy > 0.85 && twin < 0.15, "tick {tick}: {busy} vs {twin}");
        sums[0] += busy;
        sums[1] += twin;
        assert!(s[0].power.usage_watts.unwrap() > 3.0 * s[1].power.usage_watts.unwrap());
    }
    assert!(sums[0] > 5.0 * sums[1]);
}

#[test]
fn thermal_throttling_signature() {
    let f = fleet("h100x8", Workload::ThermalThrottling, 5);
    let slowdown = f.devices()[0].temperature_slowdown_celsius.unwrap();
    let first = &all_devices(&f, 0, MetricSet::default().with_stage_inputs())[0];
    let cool_sm = first.clocks.sm.unwrap();
    assert!(!first.clock_event_reasons.unwrap().contains(ClockEventReasons::HW_THERMAL_SLOWDOWN));
    let mut hot_at = None;
    for tick in 0..300 {
        let s = &all_devices(&f, tick, MetricSet::default().with_stage_inputs())[0];
        if s.temperature.gpu.unwrap() >= slowdown {
            hot_at.get_or_insert(tick);
        }
        if let Some(t0) = hot_at {
            assert!(s.temperature.gpu.unwrap() >= slowdown, "tick {tick}: stays hot after {t0}");
            let r = s.clock_event_reasons.unwrap();
            assert!(r.contains(ClockEventReasons::HW_THERMAL_SLOWDOWN), "tick {tick}");
            assert!(r.contains(ClockEventReasons::SW_THERMAL_SLOWDOWN), "tick {tick}");
            assert!(r.is_throttled());
            assert!(s.clocks.sm.unwrap() < 0.7 * cool_sm, "SM clock drops: {} vs {cool_sm}", s.clocks.sm.unwrap());
            assert!(s.power.usage_watts.unwrap() < 0.8 * s.power.limit_watts.unwrap(), "power capped");
        }
    }
    let t0 = hot_at.expect("temperature reaches slowdown");
    assert!(t0 > 10 && t0 < 120, "climbs over time: hot at tick {t0}");
}

#[test]
fn mig_instances_carry_their_parent() {
    let f = fleet("a100x8-mig", Workload::Training, 5);
    assert_eq!(f.devices().len(), 8 * 5);
    assert_eq!(f.gpu_count(), 8);
    let parent = &f.devices()[0];
    assert!(parent.mig.is_none());
    let profiles: Vec<_> = f.devices()[1..5].iter().map(|d| d.mig.as_ref().unwrap().profile.clone().unwrap()).collect();
    assert_eq!(profiles, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]);
    for (m, d) in f.devices()[1..5].iter().enumerate() {
        let mig = d.mig.as_ref().unwrap();
        assert_eq!(mig.parent_uuid, parent.uuid);
        assert_eq!(mig.mig_index as usize, m);
        assert_eq!(d.index, 0);
        assert!(d.uuid.starts_with("MIG-"));
        assert!(d.name.contains("MIG 3g.20gb") || d.name.contains("MIG 2g") || d.name.contains("MIG 1g"));
    }
    let s = all_devices(&f, 3, MetricSet::everything());
    let children_used: u64 = s[1..5].iter().map(|c| c.memory.used.unwrap()).sum();
    assert_eq!(s[0].memory.used, Some(children_used), "parent memory = sum of its instances");
    assert!(s[0].utilization.gpu.is_none(), "no whole-GPU utilisation in MIG mode");
    assert!(!s[1].processes.is_empty() && s[0].processes.is_empty());
    // Filtering by the parent's UUID keeps its instances; a `gpu:mig` pair picks one.
    let only = f.sample(0, MetricSet::default().with_stage_inputs(), &DeviceFilter::parse(&parent.uuid).unwrap());
    assert_eq!(only.len(), 5);
    let one = f.sample(0, MetricSet::default().with_stage_inputs(), &DeviceFilter::parse("2:1").unwrap());
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].info.mig.as_ref().unwrap().parent_uuid, f.devices()[10].uuid);
}

#[test]
fn metric_set_is_respected() {
    let f = fleet("h100x8", Workload::Training, 5);
    let none = &all_devices(&f, 1, MetricSet::nothing())[0];
    assert!(none.is_up());
    assert_eq!(none.points().len(), 1, "only `up`: {:?}", none.points());

    let default = &all_devices(&f, 1, MetricSet::default().with_stage_inputs())[0];
    assert!(default.processes.is_empty() && default.pcie.tx_bytes_per_second.is_none(), "opt-in families off");
    assert!(default.pcie.link_generation.is_some() && default.power.energy_joules.is_some());

    let all = &all_devices(&f, 1, MetricSet::everything())[0];
    assert!(!all.processes.is_empty() && all.pcie.rx_bytes_per_second.unwrap() > 0.0);

    let only_mem = &all_devices(&f, 1, MetricSet::nothing().with(Family::Memory))[0];
    assert!(only_mem.memory.used.is_some());
    assert!(only_mem.utilization.gpu.is_none() && only_mem.power.usage_watts.is_none() && only_mem.clocks.sm.is_none());
    // What is asked for is the same value whatever else is asked for.
    assert_eq!(only_mem.memory, all.memory);
    assert_eq!(default.power, all.power);
}

#[test]
fn filter_is_honoured_by_the_sampler() {
    let sampler = MockSampler::from_profile_name("h100x8").unwrap();
    let filter = DeviceFilter::parse("1,5").unwrap();
    let snap: Snapshot = sampler.sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), filter)).unwrap();
    let idx: Vec<u32> = snap.devices.iter().map(|d| d.info.index).collect();
    assert_eq!(idx, [1, 5]);
    let uuid = sampler.fleet().devices()[6].uuid.clone();
    let snap = sampler
        .sample(&SampleRequest::new(
            MetricSet::default().with_stage_inputs(),
            DeviceFilter::parse(&uuid[..12]).unwrap(),
        ))
        .unwrap();
    assert_eq!(snap.devices.len(), 1);
    assert_eq!(snap.devices[0].info.uuid, uuid);
    let none =
        sampler.sample(&SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::none())).unwrap();
    assert!(none.devices.is_empty());
}

#[test]
fn sampler_ticks_and_reports_system() {
    let sampler = MockSampler::builder().scenario(Scenario::new(Workload::Training)).build().unwrap();
    assert_eq!(sampler.tick(), 0);
    let req = SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::all());
    let a = sampler.sample(&req).unwrap();
    assert_eq!(sampler.tick(), 1);
    assert_eq!(a.seq, 0, "the runtime numbers snapshots");
    assert_eq!(a.system.backend, "mock");
    assert_eq!(a.system.hostname, gpumon_core::hostname());
    assert_eq!(a.system.driver_version.as_deref(), Some("570.86.15"));
    assert_eq!(a.system.cuda_driver_version, Some(12080));
    assert_eq!(sampler.name(), "mock");
    // set_tick replays a tick exactly.
    sampler.set_tick(0);
    assert_eq!(sampler.sample(&req).unwrap().devices, a.devices);
    let b = sampler.sample(&req).unwrap();
    assert_ne!(b.devices, a.devices);
    let e = |s: &Snapshot| s.devices[0].power.energy_joules.unwrap();
    assert!(e(&b) > e(&a));
}

#[test]
fn tick_period_scales_energy() {
    let profile = FleetProfile::load("a100x4").unwrap();
    let scenario = Scenario::new(Workload::Training).with_tick_period(Duration::from_secs(10));
    let f = MockFleet::new(&profile, &scenario, 1).unwrap();
    let m = MetricSet::default().with_stage_inputs();
    let e0 = all_devices(&f, 0, m)[0].power.energy_joules.unwrap();
    let s1 = &all_devices(&f, 1, m)[0];
    let step = s1.power.energy_joules.unwrap() - e0;
    assert!((step - 10.0 * s1.power.usage_watts.unwrap()).abs() < 0.01, "{step}");
}

/// A paced sampler (the agent's and the Python binding's mock): a sample taken between two of
/// the interval's ticks — a flush, the sample at exit — reads the coming tick without
/// taking it, with its energy counter only as far into the interval as the time since; the
/// next sample on time takes that tick whole, as an unpaced sampler's second call does.
#[test]
fn a_paced_sample_taken_early_is_part_of_the_coming_tick() {
    use std::time::Instant;
    // Long enough that the early sample, 20 ms in, stays early on a loaded machine.
    let interval = Duration::from_secs(1);
    let paced = MockSampler::builder().seed(7).paced(interval).build().unwrap();
    let unpaced = MockSampler::builder().seed(7).build().unwrap();
    let request = SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::all());
    let energy = |s: &Snapshot| s.devices[0].power.energy_joules.unwrap();
    let first = Instant::now();
    let (t0, u0) = (paced.sample(&request).unwrap(), unpaced.sample(&request).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    let early = paced.sample(&request).unwrap();
    // At most this share of the interval had passed when the early sample was read.
    let early_share = first.elapsed().as_secs_f64() / interval.as_secs_f64();
    assert_eq!(paced.tick(), 1, "an early sample does not take the tick");
    std::thread::sleep(interval.saturating_sub(first.elapsed()));
    let (t1, u1) = (paced.sample(&request).unwrap(), unpaced.sample(&request).unwrap());
    assert_eq!(paced.tick(), 2);
    // Whole ticks read as unpaced ones do.
    assert_eq!((energy(&t0), energy(&t1)), (energy(&u0), energy(&u1)));
    let whole = energy(&t1) - energy(&t0);
    let part = energy(&early) - energy(&t0);
    assert!(whole > 0.0 && part > 0.0, "{part} of {whole}");
    // The share of the interval that had passed: at least the 20 ms slept (2 %).
    assert!(part >= 0.02 * whole - 1e-9 && part <= early_share * whole + 1e-9, "{part} of {whole} ({early_share})");
}

/// A sample well past half an interval but before the next tick (a job that ends 65 % into an
/// interval) is still early: it used to take a whole tick, a whole interval of energy. A tick
/// that comes late (the agent's schedule held up) is still a tick.
#[test]
fn a_paced_sample_late_in_the_interval_is_still_part_of_the_coming_tick() {
    use std::time::Instant;
    let interval = Duration::from_secs(1);
    let paced = MockSampler::builder().seed(7).paced(interval).build().unwrap();
    let request = SampleRequest::new(MetricSet::default().with_stage_inputs(), DeviceFilter::all());
    let energy = |s: &Snapshot| s.devices[0].power.energy_joules.unwrap();
    let first = Instant::now();
    let t0 = paced.sample(&request).unwrap();
    std::thread::sleep(Duration::from_millis(650));
    let early = paced.sample(&request).unwrap();
    let early_share = first.elapsed().as_secs_f64() / interval.as_secs_f64();
    assert_eq!(paced.tick(), 1, "65 % into the interval is not the next tick");
    // The next tick, 300 ms late: taken whole.
    std::thread::sleep((interval + Duration::from_millis(300)).saturating_sub(first.elapsed()));
    let t1 = paced.sample(&request).unwrap();
    assert_eq!(paced.tick(), 2, "a late tick is still a tick");
    let (whole, part) = (energy(&t1) - energy(&t0), energy(&early) - energy(&t0));
    assert!(part >= 0.65 * whole - 1e-9 && part <= early_share * whole + 1e-9, "{part} of {whole} ({early_share})");
    // The tick after it, on its schedule (2 s from the first), only 700 ms after the late one.
    std::thread::sleep((2 * interval).saturating_sub(first.elapsed()));
    paced.sample(&request).unwrap();
    assert_eq!(paced.tick(), 3, "the schedule, not the last sample, says when a tick is due");
}
