//! Prints, as JSON, what an NVML client should read from the fake at one tick: the fleet the
//! `GPUMON_FAKE_NVML_*` environment selects, in NVML's own units (percent, mW, MHz, bytes, °C).
//! Used by the Python tests; handy to see what a profile serves.
//!
//! ```text
//! gpumon-fake-nvml-expect [--tick N]        # default: GPUMON_FAKE_NVML_TICK, else 0
//! ```

use std::process::ExitCode;

use gpumon_fake_nvml::expected::faulted_sample;
use gpumon_fake_nvml::units;
use gpumon_fake_nvml::{Config, Fleet};
use serde_json::{json, Value};

fn main() -> ExitCode {
    let mut config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpumon-fake-nvml-expect: {e}");
            return ExitCode::from(2);
        }
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().map(|v| v.parse::<u64>())) {
            ("--tick", Some(Ok(t))) => config.start_tick = t,
            _ => {
                eprintln!("usage: gpumon-fake-nvml-expect [--tick N]");
                return ExitCode::from(2);
            }
        }
    }
    let fleet = match Fleet::load(&config) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gpumon-fake-nvml-expect: {e}");
            return ExitCode::from(2);
        }
    };
    let tick = config.start_tick;
    let devices: Vec<Value> = (0..fleet.devices.len()).map(|i| device(&fleet, &config, i, tick)).collect();
    let sys = &fleet.system;
    let out = json!({
        "tick": tick,
        "driver_version": sys.driver_version,
        "cuda_driver_version": sys.cuda_driver_version,
        "nvml_version": sys.nvml_version,
        "device_count": fleet.devices.iter().filter(|d| d.mig.is_none()).count(),
        "devices": devices,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    ExitCode::SUCCESS
}

fn device(fleet: &Fleet, config: &Config, i: usize, tick: u64) -> Value {
    let info = &fleet.devices[i];
    let s = faulted_sample(fleet, &config.faults, i, tick);
    let extras = fleet.extras.get(i).cloned().unwrap_or_default();
    let pct = |v: Option<f64>| v.map(units::percent);
    let mw = |v: Option<f64>| v.map(units::milliwatts);
    let m = s.memory;
    json!({
        "index": info.index,
        "mig": info.mig.as_ref().map(|m| json!({"parent_uuid": m.parent_uuid, "mig_index": m.mig_index})),
        "uuid": info.uuid,
        "name": info.name,
        "serial": info.serial,
        "pci_bus_id": info.pci_bus_id,
        "lost": !s.is_up(),
        "utilization": s.utilization.gpu.map(|g| json!({"gpu": units::percent(g), "memory": units::percent(s.utilization.memory.unwrap_or(0.0))})),
        "encoder": pct(s.utilization.encoder),
        "decoder": pct(s.utilization.decoder),
        "memory": m.total.map(|t| json!({
            "total": t,
            "free": m.free.unwrap_or(0),
            "used": m.used.unwrap_or(0),
            "reserved": m.reserved.unwrap_or(0),
            "v1_used": m.used.unwrap_or(0) + m.reserved.unwrap_or(0),
        })),
        "temperature": s.temperature.gpu.map(units::celsius),
        "fan": pct(s.fan_speed),
        "power_mw": mw(s.power.usage_watts),
        "power_limit_mw": mw(s.power.limit_watts),
        "energy_mj": s.power.energy_joules.map(units::millijoules),
        "clocks_mhz": {
            "graphics": s.clocks.graphics.map(units::megahertz),
            "sm": s.clocks.sm.map(units::megahertz),
            "memory": s.clocks.memory.map(units::megahertz),
            "video": s.clocks.video.map(units::megahertz),
        },
        "pstate": s.performance_state,
        "memory_temperature": s.temperature.memory.map(units::celsius),
        "thresholds": {
            "slowdown": info.temperature_slowdown_celsius.map(units::celsius),
            "shutdown": info.temperature_shutdown_celsius.map(units::celsius),
        },
        "limits_mw": {
            "default": info.power_limit_default_watts.map(units::milliwatts),
            "min": info.power_limit_min_watts.map(units::milliwatts),
            "max": info.power_limit_max_watts.map(units::milliwatts),
        },
        "max_clocks_mhz": {
            "graphics": info.max_clocks.graphics.map(units::megahertz),
            "sm": info.max_clocks.sm.map(units::megahertz),
            "memory": info.max_clocks.memory.map(units::megahertz),
            "video": info.max_clocks.video.map(units::megahertz),
        },
        "architecture": info.architecture.as_deref().and_then(units::architecture_code),
        "compute_capability": extras.compute_capability,
        "clock_event_reasons": s.clock_event_reasons.map(|r| r.0),
        "pcie": {
            "generation": s.pcie.link_generation,
            "width": s.pcie.link_width,
            "max_generation": info.pcie_max_link_generation,
            "max_width": info.pcie_max_link_width,
            "replays": s.pcie.replays,
            "tx_kbps": s.pcie.tx_bytes_per_second.map(units::kilobytes_per_second),
            "rx_kbps": s.pcie.rx_bytes_per_second.map(units::kilobytes_per_second),
        },
        "ecc": {
            "corrected": s.ecc.corrected,
            "uncorrected": s.ecc.uncorrected,
            "retired_single_bit": s.ecc.retired_pages_single_bit,
            "retired_double_bit": s.ecc.retired_pages_double_bit,
            "retired_pending": s.ecc.retired_pages_pending,
            "remapped": s.ecc.remapped_rows_correctable.map(|c| json!([
                c,
                s.ecc.remapped_rows_uncorrectable.unwrap_or(0),
                s.ecc.remapped_rows_pending.unwrap_or(false),
                s.ecc.remapped_rows_failure.unwrap_or(false),
            ])),
        },
        "modes": {
            "persistence": u32::from(!extras.geforce),
            "display_mode": u32::from(extras.geforce && info.mig.is_none()),
            "display_active": 0,
            "compute_mode": 0,
            "mig_mode": if info.mig.is_some() { None } else if fleet.mock.device(i).is_some_and(|d| d.mig_enabled()) { Some(1) } else if extras.mig_capable { Some(0) } else { None },
        },
        "nvlink": s.nvlink.as_ref().map(|nv| nv.links.iter().map(|l| json!({
            "link": l.link,
            "up": u32::from(l.is_up()),
            "version": l.version,
            "remote_pci_bus_id": l.remote_pci_bus_id,
            "remote_type": l.remote_device_type.map(|t| t.nvml_code()),
            "tx_kib": l.tx_bytes.map(|b| b / 1024),
            "rx_kib": l.rx_bytes.map(|b| b / 1024),
            "crc": l.crc_errors,
            "replay": l.replay_errors,
            "recovery": l.recovery_errors,
        })).collect::<Vec<_>>()),
        "processes": s.processes.iter().map(|p| json!({
            "pid": p.pid,
            "name": p.name,
            "used_memory": p.memory_used,
        })).collect::<Vec<_>>(),
    })
}
