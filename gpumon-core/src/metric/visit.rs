//! The visitor: [`DeviceSample::visit_points`], the uniform view of a device's typed fields as
//! catalogue [`Point`]s that every sink encodes from (`shared/STYLE.md`, "Data model":
//! "Uniform view used by every sink; encoders never match on fields").
//!
//! It lives with the catalogue, not in the model: the model holds values and spells no metric;
//! this file is the one place that maps a field to its [`MetricId`].

use super::catalogue::{Family, MetricId};
use super::point::{LabelValue, Point, Value};
use crate::model::{ClockEventReasons, DeviceSample, DeviceState, ProcessSample, WindowStats};

impl DeviceSample {
    /// Calls `f` once for every value present in this sample, in catalogue order within each
    /// family. Absent values produce no point. A lost device produces only `DeviceUp = 0`. Each
    /// family in [`DeviceSample::errors`] produces one [`MetricId::MetricFailure`] = 1, labelled
    /// with the family's name.
    ///
    /// This is the uniform view every sink encodes from; it allocates nothing.
    pub fn visit_points<'a>(&'a self, mut f: impl FnMut(Point<'a>)) {
        use MetricId as M;
        let f = &mut f as &mut dyn FnMut(Point<'a>);

        // A suspended GPU is present (up = 1) but carries nothing else this tick.
        int(M::DeviceUp, Some(u64::from(self.is_present())), f);
        if self.state == DeviceState::Suspended {
            int(M::DeviceSuspended, Some(1), f);
            return;
        }
        if !self.is_up() {
            return;
        }
        // A family that could not be read is "not monitored", not "fine": one point per family,
        // however many of its calls failed.
        for family in self.failed_families() {
            f(Point { id: M::MetricFailure, value: Value::Int(1), label: Some(LabelValue::Str(family.name())) });
        }
        // In catalogue order, family by family.
        self.visit_readings(f);
        self.visit_ecc_and_xid(f);
        self.visit_processes(f);
        self.visit_windows(f);
        self.visit_gpm_and_nvlink(f);
    }

    /// Utilisation, memory, temperatures, power, clocks, fan, P-state, clock-event reasons, PCIe.
    fn visit_readings<'a>(&'a self, f: &mut dyn FnMut(Point<'a>)) {
        use MetricId as M;
        let u = &self.utilization;
        float(M::GpuUtilization, u.gpu, f);
        float(M::MemoryUtilization, u.memory, f);
        float(M::EncoderUtilization, u.encoder, f);
        float(M::DecoderUtilization, u.decoder, f);

        let m = &self.memory;
        int(M::MemoryUsed, m.used, f);
        int(M::MemoryFree, m.free, f);
        int(M::MemoryTotal, m.total, f);
        int(M::MemoryReserved, m.reserved, f);
        float(M::MemoryUsedRatio, m.used_ratio(), f);

        float(M::GpuTemperature, self.temperature.gpu, f);
        float(M::MemoryTemperature, self.temperature.memory, f);

        float(M::PowerUsage, self.power.usage_watts, f);
        float(M::PowerLimit, self.power.limit_watts, f);
        float(M::EnergyConsumed, self.power.energy_joules, f);

        let c = &self.clocks;
        float(M::ClockGraphics, c.graphics, f);
        float(M::ClockSm, c.sm, f);
        float(M::ClockMemory, c.memory, f);
        float(M::ClockVideo, c.video, f);

        float(M::FanSpeed, self.fan_speed, f);
        int(M::PerformanceState, self.performance_state.map(u64::from), f);
        if let Some(reasons) = self.clock_event_reasons {
            f(Point { id: M::ClockEventReasonsMask, value: Value::Int(reasons.0), label: None });
            // Each reason's own series only when asked for (`Family::ClockEventsByReason`).
            for (bit, name) in ClockEventReasons::ALL.into_iter().filter(|_| !self.clock_event_mask_only) {
                let active = u64::from(reasons.contains(bit));
                f(Point { id: M::ClockEventActive, value: Value::Int(active), label: Some(LabelValue::Str(name)) });
            }
        }

        let p = &self.pcie;
        int(M::PcieLinkGeneration, p.link_generation.map(u64::from), f);
        int(M::PcieLinkWidth, p.link_width.map(u64::from), f);
        int(M::PcieReplays, p.replays, f);
        float(M::PcieTxThroughput, p.tx_bytes_per_second, f);
        float(M::PcieRxThroughput, p.rx_bytes_per_second, f);
    }

    /// ECC counters, retired pages, remapped rows, and the Xid errors seen.
    fn visit_ecc_and_xid<'a>(&'a self, f: &mut dyn FnMut(Point<'a>)) {
        use MetricId as M;
        let e = &self.ecc;
        int(M::EccCorrected, e.corrected, f);
        int(M::EccUncorrected, e.uncorrected, f);
        int(M::RetiredPagesSingleBit, e.retired_pages_single_bit, f);
        int(M::RetiredPagesDoubleBit, e.retired_pages_double_bit, f);
        flag(M::RetiredPagesPending, e.retired_pages_pending, f);
        int(M::RemappedRowsCorrectable, e.remapped_rows_correctable, f);
        int(M::RemappedRowsUncorrectable, e.remapped_rows_uncorrectable, f);
        flag(M::RemappedRowsPending, e.remapped_rows_pending, f);
        flag(M::RemappedRowsFailure, e.remapped_rows_failure, f);

        for x in &self.xid_errors {
            let label = Some(LabelValue::Int(x.code));
            f(Point { id: M::XidErrors, value: Value::Int(x.count), label });
            let secs = x.last_seen.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            f(Point { id: M::XidLastSeen, value: Value::Float(secs), label });
        }
    }

    /// Each process's figures, labelled with its pid.
    fn visit_processes<'a>(&'a self, f: &mut dyn FnMut(Point<'a>)) {
        use MetricId as M;
        for proc in &self.processes {
            let label = Some(LabelValue::Int(u64::from(proc.pid)));
            let mut with_pid = |id, v: Option<Value>| {
                if let Some(value) = v {
                    f(Point { id, value, label });
                }
            };
            with_pid(M::ProcessMemoryUsed, proc.memory_used.map(Value::Int));
            with_pid(M::ProcessSmUtilization, proc.sm_utilization.map(Value::Float));
            with_pid(M::ProcessMemoryUtilization, proc.memory_utilization.map(Value::Float));
            with_pid(M::ProcessEncoderUtilization, proc.encoder_utilization.map(Value::Float));
            with_pid(M::ProcessDecoderUtilization, proc.decoder_utilization.map(Value::Float));
        }
    }

    /// The sub-interval windows' min / max / mean.
    fn visit_windows<'a>(&'a self, f: &mut dyn FnMut(Point<'a>)) {
        use MetricId as M;
        let w = &self.windows;
        let mut window = |ids: [Option<MetricId>; 3], s: Option<WindowStats>| {
            if let Some(s) = s {
                for (id, v) in ids.into_iter().zip([s.min, s.max, s.mean]) {
                    if let Some(id) = id {
                        f(Point { id, value: Value::Float(v), label: None });
                    }
                }
            }
        };
        window(
            [Some(M::GpuUtilizationMin), Some(M::GpuUtilizationMax), Some(M::GpuUtilizationMean)],
            w.gpu_utilization,
        );
        window(
            [Some(M::MemoryUtilizationMin), Some(M::MemoryUtilizationMax), Some(M::MemoryUtilizationMean)],
            w.memory_utilization,
        );
        window([Some(M::PowerUsageMin), Some(M::PowerUsageMax), Some(M::PowerUsageMean)], w.power_watts);
        window([Some(M::ClockSmMin), Some(M::ClockSmMax), None], w.sm_clock);
        window([Some(M::ClockMemoryMin), Some(M::ClockMemoryMax), None], w.memory_clock);
    }

    /// GPM activity, and NVLink: each link's series when asked for, the totals always.
    fn visit_gpm_and_nvlink<'a>(&'a self, f: &mut dyn FnMut(Point<'a>)) {
        use MetricId as M;
        let g = &self.gpm;
        float(M::GpmGraphicsActivity, g.graphics_activity, f);
        float(M::GpmSmActivity, g.sm_activity, f);
        float(M::GpmSmOccupancy, g.sm_occupancy, f);
        float(M::GpmTensorActivity, g.tensor_activity, f);
        float(M::GpmDramBandwidth, g.dram_bandwidth, f);

        if let Some(nv) = &self.nvlink {
            // Each link's own series only when asked for (`Family::NvlinkLinks`); the totals below
            // always.
            for l in nv.links.iter().filter(|_| nv.per_link) {
                let label = Some(LabelValue::Int(u64::from(l.link)));
                let mut per_link = |id, v: Option<u64>| {
                    if let Some(v) = v {
                        f(Point { id, value: Value::Int(v), label });
                    }
                };
                per_link(M::NvlinkLinkUp, Some(u64::from(l.is_up())));
                per_link(M::NvlinkLinkVersion, l.version.map(u64::from));
                per_link(M::NvlinkLinkTx, l.tx_bytes);
                per_link(M::NvlinkLinkRx, l.rx_bytes);
                per_link(M::NvlinkLinkCrcErrors, l.crc_errors);
                per_link(M::NvlinkLinkReplayErrors, l.replay_errors);
                per_link(M::NvlinkLinkRecoveryErrors, l.recovery_errors);
            }
            int(M::NvlinkLinksUp, Some(nv.links_up()), f);
            int(M::NvlinkTx, nv.tx_bytes(), f);
            int(M::NvlinkRx, nv.rx_bytes(), f);
            int(M::NvlinkCrcErrors, nv.crc_errors(), f);
            int(M::NvlinkReplayErrors, nv.replay_errors(), f);
            int(M::NvlinkRecoveryErrors, nv.recovery_errors(), f);
        }
    }

    /// Every point of this sample, collected (convenience over [`DeviceSample::visit_points`]).
    pub fn points(&self) -> Vec<Point<'_>> {
        let mut out = Vec::with_capacity(64);
        self.visit_points(|p| out.push(p));
        out
    }

    /// Which process a point of metric `id` with `label` is about: `None` for a point about
    /// the device, `Some(None)` for a per-process point ([`Family::Processes`], labelled with
    /// its pid) whose pid the device does not list, `Some(Some(process))` otherwise. The one
    /// place the exporters learn whose owner a point carries: the inverse of the pid label
    /// [`visit_points`](Self::visit_points) gives a per-process point.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::{DeviceInfo, DeviceSample, LabelValue, MetricId, ProcessSample};
    ///
    /// let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "GPU")));
    /// gpu.processes.push(ProcessSample::new(10));
    /// let memory = MetricId::ProcessMemoryUsed;
    /// assert_eq!(gpu.process_of(memory, Some(LabelValue::Int(10))).flatten().map(|p| p.pid), Some(10));
    /// assert!(gpu.process_of(memory, Some(LabelValue::Int(11))).is_some_and(|p| p.is_none()));
    /// assert!(gpu.process_of(MetricId::DeviceUp, None).is_none());
    /// ```
    pub fn process_of(&self, id: MetricId, label: Option<LabelValue<'_>>) -> Option<Option<&ProcessSample>> {
        match (id.family(), label) {
            (Family::Processes, Some(LabelValue::Int(pid))) => {
                Some(u32::try_from(pid).ok().and_then(|pid| self.process(pid)))
            }
            _ => None,
        }
    }
}

/// A float point, when the value is present.
fn float<'a>(id: MetricId, v: Option<f64>, f: &mut dyn FnMut(Point<'a>)) {
    if let Some(v) = v {
        f(Point { id, value: Value::Float(v), label: None });
    }
}

/// An integer point, when the value is present.
fn int<'a>(id: MetricId, v: Option<u64>, f: &mut dyn FnMut(Point<'a>)) {
    if let Some(v) = v {
        f(Point { id, value: Value::Int(v), label: None });
    }
}

/// A 0/1 point, when the flag is known.
fn flag<'a>(id: MetricId, v: Option<bool>, f: &mut dyn FnMut(Point<'a>)) {
    if let Some(v) = v {
        f(Point { id, value: Value::Int(u64::from(v)), label: None });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceInfo, XidCount};
    use std::sync::Arc;

    #[test]
    fn lost_device_only_reports_down() {
        let s = DeviceSample::lost(Arc::new(DeviceInfo::new(0, "GPU-x", "X")));
        let pts = s.points();
        assert_eq!(pts.len(), 1);
        assert_eq!(pts[0].id, MetricId::DeviceUp);
        assert_eq!(pts[0].value, Value::Int(0));
    }

    #[test]
    fn points_skip_absent_values_and_carry_labels() {
        let mut s = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-x", "X")));
        s.utilization.gpu = Some(0.5);
        s.memory.used = Some(10);
        s.memory.total = Some(40);
        s.xid_errors.push(XidCount::new(79, 2, std::time::UNIX_EPOCH + std::time::Duration::from_secs(5)));
        let pts = s.points();
        let ids: Vec<_> = pts.iter().map(|p| p.id).collect();
        assert_eq!(
            ids,
            [
                MetricId::DeviceUp,
                MetricId::GpuUtilization,
                MetricId::MemoryUsed,
                MetricId::MemoryTotal,
                MetricId::MemoryUsedRatio,
                MetricId::XidErrors,
                MetricId::XidLastSeen
            ]
        );
        let xid = pts.iter().find(|p| p.id == MetricId::XidErrors).unwrap();
        assert_eq!(xid.label, Some(LabelValue::Int(79)));
        assert_eq!(xid.value, Value::Int(2));
        assert_eq!(pts.last().unwrap().value, Value::Float(5.0));
    }

    #[test]
    fn each_failed_family_is_one_metric_failure_point() {
        use crate::model::FailureReason;
        let mut s = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-x", "X")));
        s.record_failure(Family::Xid, FailureReason::Other("XID events not monitored".into()));
        s.record_failure(Family::Ecc, FailureReason::NoPermission);
        s.record_failure(Family::Xid, FailureReason::Timeout);
        let failures: Vec<_> = s.points().into_iter().filter(|p| p.id == MetricId::MetricFailure).collect();
        let labels: Vec<_> = failures.iter().map(|p| (p.label, p.value)).collect();
        assert_eq!(
            labels,
            [(Some(LabelValue::Str("xid")), Value::Int(1)), (Some(LabelValue::Str("ecc")), Value::Int(1))]
        );
        // A lost GPU says only that it is lost.
        let mut lost = DeviceSample::lost(s.info.clone());
        lost.errors = s.errors.clone();
        assert_eq!(lost.points().len(), 1);
    }
}
