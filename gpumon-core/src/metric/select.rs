//! Which of a sample's fields a family owns: [`DeviceSample::clear_family`] empties them, and
//! [`Snapshot::retain_exported`] narrows a snapshot to the families an agent exports, the families
//! it sampled only for its stages removed (`Family::READ_BY_STAGES`, `docs/fleet.md` §8).
//!
//! It lives with the visitor (`visit.rs`), the other place that knows which field is which family.

use super::catalogue::{Family, MetricSet};
use crate::model::{DeviceSample, Snapshot};

impl DeviceSample {
    /// Empties `family`'s values: the sample then reads as if the family had not been sampled.
    /// [`Family::NvlinkLinks`] drops each link's series (the per-GPU totals stay);
    /// [`Family::ClockEventsByReason`] drops each reason's series (the mask stays). Status and the
    /// derived families own no field: nothing to clear.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::{DeviceInfo, DeviceSample, Family, MetricId};
    ///
    /// let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "GPU")));
    /// gpu.utilization.gpu = Some(0.5);
    /// gpu.clear_family(Family::Utilization);
    /// assert!(gpu.points().iter().all(|p| p.id != MetricId::GpuUtilization));
    /// ```
    pub fn clear_family(&mut self, family: Family) {
        match family {
            Family::Utilization => self.utilization = Default::default(),
            Family::Memory => self.memory = Default::default(),
            Family::Temperature => self.temperature = Default::default(),
            Family::Power => {
                self.power.usage_watts = None;
                self.power.limit_watts = None;
            }
            Family::Energy => self.power.energy_joules = None,
            Family::Clocks => self.clocks = Default::default(),
            Family::Fan => self.fan_speed = None,
            Family::PerformanceState => self.performance_state = None,
            Family::ClockEvents => self.clock_event_reasons = None,
            Family::ClockEventsByReason => self.clock_event_mask_only = true,
            Family::PcieLink => {
                self.pcie.link_generation = None;
                self.pcie.link_width = None;
                self.pcie.replays = None;
            }
            Family::PcieThroughput => {
                self.pcie.tx_bytes_per_second = None;
                self.pcie.rx_bytes_per_second = None;
            }
            Family::Ecc => {
                self.ecc.corrected = None;
                self.ecc.uncorrected = None;
            }
            Family::RetiredPages => {
                self.ecc.retired_pages_single_bit = None;
                self.ecc.retired_pages_double_bit = None;
                self.ecc.retired_pages_pending = None;
            }
            Family::RemappedRows => {
                self.ecc.remapped_rows_correctable = None;
                self.ecc.remapped_rows_uncorrectable = None;
                self.ecc.remapped_rows_pending = None;
                self.ecc.remapped_rows_failure = None;
            }
            Family::Xid => self.xid_errors.clear(),
            Family::Processes => self.processes.clear(),
            Family::HighResolution => self.windows = Default::default(),
            Family::Gpm => self.gpm = Default::default(),
            Family::Nvlink => self.nvlink = None,
            Family::NvlinkLinks => {
                if let Some(nv) = &mut self.nvlink {
                    nv.per_link = false;
                }
            }
            Family::Status | Family::Diagnosis | Family::Steps | Family::Derived | Family::Accounts => {}
        }
    }
}

impl Snapshot {
    /// Narrows the devices to the families in `exported`, for an agent that sampled `sampled`:
    /// each family sampled but not exported — read only for the stages, which have run — is
    /// cleared ([`DeviceSample::clear_family`]) with its failures, so that no sink, subscriber
    /// or caller sees it. A family whose fields an exported family shares keeps them: the NVLink
    /// totals' while [`Family::NvlinkLinks`] is exported, the clocks-event mask while
    /// [`Family::ClockEventsByReason`] is. Each reason's own series stay only when
    /// [`Family::ClockEventsByReason`] is exported.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gpumon_core::{DeviceInfo, DeviceSample, Family, MetricId, MetricSet, Snapshot, SystemInfo, WindowStats};
    ///
    /// let mut gpu = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "GPU")));
    /// gpu.utilization.gpu = Some(0.5);
    /// gpu.windows.gpu_utilization = WindowStats::from_values([0.0, 1.0]);
    /// let mut snapshot = Snapshot::new(Arc::new(SystemInfo::new("node", "nvml")), vec![gpu]);
    /// let exported = MetricSet::default();
    /// snapshot.retain_exported(exported.with(Family::HighResolution), exported);
    /// let ids: Vec<_> = snapshot.devices[0].points().iter().map(|p| p.id).collect();
    /// assert_eq!(ids, [MetricId::DeviceUp, MetricId::GpuUtilization]);
    /// ```
    pub fn retain_exported(&mut self, sampled: MetricSet, exported: MetricSet) {
        let shared_with = |family: Family| match family {
            Family::Nvlink => Some(Family::NvlinkLinks),
            Family::ClockEvents => Some(Family::ClockEventsByReason),
            _ => None,
        };
        let stage_only: MetricSet = sampled
            .iter()
            .filter(|f| !exported.contains(*f))
            .filter(|f| !shared_with(*f).is_some_and(|other| exported.contains(other)))
            .collect();
        let by_reason = exported.contains(Family::ClockEventsByReason);
        for device in &mut self.devices {
            for family in stage_only.iter() {
                device.clear_family(family);
            }
            if stage_only != MetricSet::nothing() {
                device.errors.retain(|e| !stage_only.contains(e.family));
            }
            device.clock_event_mask_only = !by_reason;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::metric::{LabelValue, MetricId};
    use crate::model::{ClockEventReasons, DeviceInfo, FailureReason, Nvlink, NvlinkLink, SystemInfo, WindowStats};

    /// A GPU with a reading in the families this file splits: utilisation, its windows, GPM,
    /// NVLink (one link), the clocks-event reasons, and a GPM failure.
    fn gpu() -> DeviceSample {
        let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-1", "GPU")));
        d.utilization.gpu = Some(0.5);
        d.windows.gpu_utilization = WindowStats::from_values([0.0, 1.0]);
        d.gpm.sm_activity = Some(0.4);
        d.clock_event_reasons = Some(ClockEventReasons(ClockEventReasons::SW_POWER_CAP));
        let mut link = NvlinkLink::new(0);
        link.tx_bytes = Some(10);
        d.nvlink = Some(Nvlink::new(vec![link]));
        d.record_failure(Family::Gpm, FailureReason::Timeout);
        d
    }

    fn ids(s: &Snapshot) -> Vec<MetricId> {
        s.devices[0].points().iter().map(|p| p.id).collect()
    }

    fn narrowed(sampled: MetricSet, exported: MetricSet) -> Snapshot {
        let mut s = Snapshot::new(Arc::new(SystemInfo::new("node", "nvml")), vec![gpu()]);
        s.retain_exported(sampled, exported);
        s
    }

    #[test]
    fn families_sampled_for_the_stages_only_leave_no_point_and_no_failure() {
        let exported = MetricSet::default();
        let s = narrowed(exported.with_stage_inputs(), exported);
        let ids = ids(&s);
        use MetricId as M;
        assert_eq!(ids, [M::DeviceUp, M::GpuUtilization, M::ClockEventReasonsMask], "{ids:?}");
        assert!(s.devices[0].errors.is_empty(), "the GPM failure went with GPM");
        assert_eq!(s.devices[0].windows, Default::default(), "no sink or subscriber sees the windows");
        // A family neither sampled for the stages nor exported is left as the backend gave it.
        let s = narrowed(MetricSet::default(), MetricSet::default());
        let ids = self::ids(&s);
        assert!(ids.contains(&M::GpuUtilizationMin) && ids.contains(&M::NvlinkTx), "{ids:?}");
    }

    #[test]
    fn an_exported_opt_in_family_keeps_its_points() {
        let exported = MetricSet::default().with(Family::HighResolution).with(Family::ClockEventsByReason);
        let s = narrowed(MetricSet::default().with_stage_inputs(), exported);
        let ids = ids(&s);
        assert!(ids.contains(&MetricId::GpuUtilizationMean) && !ids.contains(&MetricId::GpmSmActivity), "{ids:?}");
        let reasons: Vec<_> = s.devices[0]
            .points()
            .into_iter()
            .filter(|p| p.id == MetricId::ClockEventActive)
            .map(|p| (p.label, p.value))
            .collect();
        assert_eq!(reasons.len(), ClockEventReasons::ALL.len(), "one series per reason");
        assert!(reasons.contains(&(Some(LabelValue::Str("sw_power_cap")), crate::metric::Value::Int(1))));
    }

    #[test]
    fn shared_fields_stay_for_the_exported_family_that_reads_them() {
        // Each link's series exported, the totals not: the links stay (and the totals with them).
        let sampled = MetricSet::default().with_stage_inputs();
        let s = narrowed(sampled, MetricSet::default().with(Family::NvlinkLinks));
        assert!(ids(&s).contains(&MetricId::NvlinkLinkTx));
        // Only the totals: the links' own series go.
        let s = narrowed(sampled.with(Family::NvlinkLinks), MetricSet::default().with(Family::Nvlink));
        let totals = ids(&s);
        assert!(totals.contains(&MetricId::NvlinkTx) && !totals.contains(&MetricId::NvlinkLinkTx), "{totals:?}");
        // The reasons' own series without the mask family: the reasons are read and exported.
        let s = narrowed(
            MetricSet::nothing().with(Family::ClockEventsByReason),
            MetricSet::nothing().with(Family::ClockEventsByReason),
        );
        assert!(ids(&s).contains(&MetricId::ClockEventActive));
    }
}
