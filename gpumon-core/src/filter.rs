//! Which GPUs a sampler may see.
//!
//! On a shared host, a tenant's agent must not read, let alone export, another tenant's GPUs.
//! A [`DeviceFilter`] is part of every [`SampleRequest`](crate::SampleRequest): backends skip
//! hidden devices before touching them, and the runtime drops any that slip through.
//!
//! The list syntax is the one CUDA and the NVIDIA container runtime use for
//! `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES`: comma-separated indices (`0,2`), UUIDs or
//! unique UUID prefixes (`GPU-8f1e…`, `MIG-…`), `gpu:mig` pairs (`0:1`), or `all` / `none` / `void`.
//!
//! Indices are NVML's, as the agent's own process sees them. Inside a container that the NVIDIA
//! runtime limited to some GPUs, NVML already numbers the visible ones from 0, so the host's
//! `NVIDIA_VISIBLE_DEVICES=3` means nothing there: select by UUID on shared hosts. A UUID prefix
//! that matches several GPUs selects none of them (see [`DeviceFilter::apply`]); every sampler in
//! gpumon applies that rule itself, and the runtime applies it again.
//!
//! **Device order.** NVML numbers GPUs in PCI bus order; CUDA numbers them fastest first unless
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID`. On a host whose GPUs are all the same model the two orders
//! agree, but on a mixed host `CUDA_VISIBLE_DEVICES=0` may be a different GPU for the job than
//! for gpumon. So indices taken from `CUDA_VISIBLE_DEVICES` without `CUDA_DEVICE_ORDER=PCI_BUS_ID`
//! are refused on hosts with different GPU models ([`DeviceFilter::check_device_order`]: the
//! sample fails with a [`DeviceOrderError`] naming both variables). UUIDs always work.

use crate::model::DeviceInfo;

/// One entry of an allowlist.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceSelector {
    /// A physical GPU by NVML index (its MIG instances included).
    Index(u32),
    /// A GPU or MIG instance by UUID or UUID prefix (`GPU-…`, `MIG-…`). A GPU UUID includes its MIG
    /// instances.
    Uuid(String),
    /// MIG instance `mig` of GPU `gpu` (`gpu:mig`).
    Mig {
        /// Parent GPU index.
        gpu: u32,
        /// MIG device index within the parent.
        mig: u32,
    },
}

impl DeviceSelector {
    fn matches(&self, d: &DeviceInfo) -> bool {
        match self {
            DeviceSelector::Index(i) => d.index == *i,
            DeviceSelector::Uuid(prefix) => {
                d.uuid.starts_with(prefix.as_str())
                    || d.mig.as_ref().is_some_and(|m| m.parent_uuid.starts_with(prefix.as_str()))
            }
            DeviceSelector::Mig { gpu, mig } => d.index == *gpu && d.mig.as_ref().is_some_and(|m| m.mig_index == *mig),
        }
    }
}

impl std::fmt::Display for DeviceSelector {
    /// As written in a device list: `3`, `GPU-8f2…`, `0:1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelector::Index(i) => write!(f, "{i}"),
            DeviceSelector::Uuid(prefix) => f.write_str(prefix),
            DeviceSelector::Mig { gpu, mig } => write!(f, "{gpu}:{mig}"),
        }
    }
}

/// Which devices are visible. The default shows every device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    /// `None` = every device; `Some(list)` = only those the list matches (empty = none).
    allow: Option<Vec<DeviceSelector>>,
    /// The indices are CUDA's fastest-first ones (`CUDA_VISIBLE_DEVICES` without
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`), which match NVML's only when all GPUs are one model.
    cuda_fastest_first: bool,
}

/// `CUDA_VISIBLE_DEVICES` selects GPUs by index on a host with different GPU models, where CUDA's
/// default (fastest first) order and NVML's (PCI bus) order may disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "CUDA_VISIBLE_DEVICES selects GPUs by index, but this host has different GPU models ({}) and \
     CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers GPUs fastest first, NVML in PCI bus order, so an \
     index can mean another GPU; use GPU UUIDs in CUDA_VISIBLE_DEVICES or set CUDA_DEVICE_ORDER=PCI_BUS_ID",
    models.join(", ")
)]
pub struct DeviceOrderError {
    /// The distinct GPU model names found.
    pub models: Vec<String>,
}

/// A device list that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid device list entry `{entry}` in `{list}`: expected an index (0), a UUID or prefix (GPU-…, MIG-…), gpu:mig (0:1), `all` or `none`")]
pub struct FilterParseError {
    /// The whole list.
    pub list: String,
    /// The entry that is wrong.
    pub entry: String,
}

impl DeviceFilter {
    /// Every device is visible.
    pub fn all() -> Self {
        Self { allow: None, cuda_fastest_first: false }
    }

    /// No device is visible.
    pub fn none() -> Self {
        Self { allow: Some(Vec::new()), cuda_fastest_first: false }
    }

    /// Only devices matching one of `selectors`.
    pub fn only(selectors: impl IntoIterator<Item = DeviceSelector>) -> Self {
        Self { allow: Some(selectors.into_iter().collect()), cuda_fastest_first: false }
    }

    /// Parses a `CUDA_VISIBLE_DEVICES`-style list.
    ///
    /// ```
    /// use gpumon_core::DeviceFilter;
    /// let f = DeviceFilter::parse("0, GPU-8f1e").unwrap();
    /// assert!(!f.is_all());
    /// assert!(DeviceFilter::parse("all").unwrap().is_all());
    /// assert!(DeviceFilter::parse("zero").is_err());
    /// ```
    ///
    /// # Errors
    /// [`FilterParseError`] naming the first entry that is not an index, UUID (prefix), `gpu:mig`
    /// pair, `all` or `none`/`void`.
    pub fn parse(list: &str) -> Result<Self, FilterParseError> {
        let trimmed = list.trim();
        match trimmed.to_ascii_lowercase().as_str() {
            "all" => return Ok(Self::all()),
            "" | "none" | "void" => return Ok(Self::none()),
            _ => {}
        }
        let err = |entry: &str| FilterParseError { list: list.to_owned(), entry: entry.to_owned() };
        let mut selectors = Vec::new();
        for raw in trimmed.split(',') {
            let entry = raw.trim();
            let selector = if let Ok(i) = entry.parse::<u32>() {
                DeviceSelector::Index(i)
            } else if let Some((g, m)) = entry.split_once(':') {
                match (g.trim().parse(), m.trim().parse()) {
                    (Ok(gpu), Ok(mig)) => DeviceSelector::Mig { gpu, mig },
                    _ => return Err(err(entry)),
                }
            } else if (entry.starts_with("GPU-") || entry.starts_with("MIG-")) && entry.len() > 4 {
                DeviceSelector::Uuid(entry.to_owned())
            } else {
                return Err(err(entry));
            };
            selectors.push(selector);
        }
        Ok(Self::only(selectors))
    }

    /// The filter the environment asks for: `CUDA_VISIBLE_DEVICES` if set, else
    /// `NVIDIA_VISIBLE_DEVICES`, else every device. Indices from `CUDA_VISIBLE_DEVICES` are in
    /// CUDA's order, fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID` (see the module docs).
    ///
    /// # Errors
    /// [`FilterParseError`] if the variable that is set cannot be parsed: a monitoring agent must
    /// not guess which GPUs a tenant meant.
    pub fn from_env() -> Result<Self, FilterParseError> {
        Self::from_vars_ordered(
            std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            std::env::var("NVIDIA_VISIBLE_DEVICES").ok(),
            std::env::var("CUDA_DEVICE_ORDER").ok(),
        )
    }

    /// [`DeviceFilter::from_env`] with `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES` given
    /// explicitly and `CUDA_DEVICE_ORDER` unset (CUDA's default, fastest first).
    ///
    /// # Errors
    /// As [`DeviceFilter::from_env`].
    pub fn from_vars(cuda: Option<String>, nvidia: Option<String>) -> Result<Self, FilterParseError> {
        Self::from_vars_ordered(cuda, nvidia, None)
    }

    /// [`DeviceFilter::from_env`] with all three variables given explicitly.
    ///
    /// # Errors
    /// As [`DeviceFilter::from_env`].
    pub fn from_vars_ordered(
        cuda: Option<String>,
        nvidia: Option<String>,
        cuda_device_order: Option<String>,
    ) -> Result<Self, FilterParseError> {
        match (cuda, nvidia) {
            (Some(v), _) => {
                let mut f = Self::parse(&v)?;
                f.cuda_fastest_first = cuda_device_order.as_deref().map(str::trim) != Some("PCI_BUS_ID");
                Ok(f)
            }
            // The NVIDIA container runtime numbers GPUs as NVML (and nvidia-smi) do.
            (None, Some(v)) => Self::parse(&v),
            (None, None) => Ok(Self::all()),
        }
    }

    /// Refuses index selection that CUDA and NVML may read differently: when the indices came
    /// from `CUDA_VISIBLE_DEVICES` without `CUDA_DEVICE_ORDER=PCI_BUS_ID` and `host_gpus` (every
    /// physical GPU on the host, hidden ones included) are of more than one model. UUID
    /// selectors never depend on order. Samplers call this before returning devices.
    ///
    /// # Errors
    /// [`DeviceOrderError`] naming the models found, `CUDA_VISIBLE_DEVICES` and
    /// `CUDA_DEVICE_ORDER`.
    pub fn check_device_order<'a>(
        &self,
        host_gpus: impl IntoIterator<Item = &'a DeviceInfo>,
    ) -> Result<(), DeviceOrderError> {
        if !self.uses_cuda_indices() {
            return Ok(());
        }
        let models: std::collections::BTreeSet<&str> =
            host_gpus.into_iter().filter(|d| d.mig.is_none()).map(|d| d.name.as_str()).collect();
        if models.len() > 1 {
            return Err(DeviceOrderError { models: models.into_iter().map(str::to_owned).collect() });
        }
        Ok(())
    }

    /// Whether [`DeviceFilter::check_device_order`] has anything to check: GPU indices in CUDA's
    /// fastest-first order. Lets a sampler skip reading every GPU's name otherwise.
    pub fn uses_cuda_indices(&self) -> bool {
        self.cuda_fastest_first
            && self
                .allow
                .as_ref()
                .is_some_and(|l| l.iter().any(|s| matches!(s, DeviceSelector::Index(_) | DeviceSelector::Mig { .. })))
    }

    /// Whether every device is visible.
    pub fn is_all(&self) -> bool {
        self.allow.is_none()
    }

    /// Whether `device` is visible.
    pub fn allows(&self, device: &DeviceInfo) -> bool {
        match &self.allow {
            None => true,
            Some(list) => list.iter().any(|s| s.matches(device)),
        }
    }

    /// Keeps only the visible devices of `devices`, enforcing what [`DeviceFilter::allows`] alone
    /// cannot: a UUID prefix must be *unique*. A prefix that matches more than one physical GPU
    /// (or, for a `MIG-` prefix, more than one MIG instance) is ambiguous and matches nothing —
    /// on a shared host, `GPU-8` must not expose every GPU whose UUID starts with 8. Returns the
    /// ambiguous prefixes (empty when there are none), which the caller should report.
    pub fn apply(&self, devices: &mut Vec<crate::model::DeviceSample>) -> Vec<String> {
        let Some(list) = &self.allow else { return Vec::new() };
        let ambiguous: Vec<&str> = list
            .iter()
            .filter_map(|s| match s {
                DeviceSelector::Uuid(p) => Some(p.as_str()),
                _ => None,
            })
            .filter(|p| {
                let mut owners =
                    devices.iter().filter(|d| DeviceSelector::Uuid((*p).to_owned()).matches(&d.info)).map(|d| {
                        match (&d.info.mig, p.starts_with("MIG-")) {
                            (Some(m), false) => m.parent_uuid.as_str(),
                            _ => d.info.uuid.as_str(),
                        }
                    });
                let first = owners.next();
                owners.any(|o| Some(o) != first)
            })
            .collect();
        devices.retain(|d| {
            list.iter().any(|s| match s {
                DeviceSelector::Uuid(p) if ambiguous.contains(&p.as_str()) => false,
                s => s.matches(&d.info),
            })
        });
        ambiguous.into_iter().map(str::to_owned).collect()
    }

    /// The entries of the list that select none of `visible` (the devices left after
    /// [`DeviceFilter::apply`]), as written: `--devices 0,99` on a host with GPUs 0–7 gives
    /// `["99"]`. Empty for the default filter.
    pub fn unmatched(&self, visible: &[crate::model::DeviceSample]) -> Vec<String> {
        let Some(list) = &self.allow else { return Vec::new() };
        list.iter().filter(|s| !visible.iter().any(|d| s.matches(&d.info))).map(ToString::to_string).collect()
    }

    /// Whether a physical GPU with this index and UUID might be visible, itself or through one of
    /// its MIG instances — lets a backend skip hidden GPUs before reading anything else.
    pub fn may_allow_gpu(&self, index: u32, uuid: &str) -> bool {
        match &self.allow {
            None => true,
            Some(list) => list.iter().any(|s| match s {
                DeviceSelector::Index(i) | DeviceSelector::Mig { gpu: i, .. } => *i == index,
                DeviceSelector::Uuid(p) => uuid.starts_with(p.as_str()) || p.starts_with("MIG-"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MigInfo;

    fn gpu(i: u32) -> DeviceInfo {
        DeviceInfo::new(i, format!("GPU-{i}aaa-bbb"), "X")
    }
    fn mig(parent: u32, m: u32) -> DeviceInfo {
        let mut d = DeviceInfo::new(parent, format!("MIG-{parent}{m}cc"), "X MIG");
        d.mig = Some(MigInfo::new(format!("GPU-{parent}aaa-bbb"), m, m + 1, 0));
        d
    }

    #[test]
    fn parses_cuda_conventions() {
        assert!(DeviceFilter::parse("all").unwrap().is_all());
        for none in ["", "none", "void", " NONE "] {
            let f = DeviceFilter::parse(none).unwrap();
            assert!(!f.allows(&gpu(0)), "{none:?}");
        }
        let f = DeviceFilter::parse("1, GPU-3aaa").unwrap();
        assert!(!f.allows(&gpu(0)));
        assert!(f.allows(&gpu(1)));
        assert!(f.allows(&gpu(3)));
        assert!(f.allows(&mig(1, 0)), "an index includes its MIG instances");
        assert!(f.allows(&mig(3, 2)), "a GPU UUID includes its MIG instances");
        assert!(!f.allows(&mig(2, 0)));
    }

    #[test]
    fn mig_pair_and_mig_uuid_select_one_instance() {
        let f = DeviceFilter::parse("0:1").unwrap();
        assert!(f.allows(&mig(0, 1)));
        assert!(!f.allows(&mig(0, 0)));
        assert!(!f.allows(&gpu(0)));
        let f = DeviceFilter::parse("MIG-01").unwrap();
        assert!(f.allows(&mig(0, 1)));
        assert!(!f.allows(&mig(0, 2)));
        assert!(f.may_allow_gpu(5, "GPU-whatever"), "a MIG UUID can only be resolved after enumeration");
    }

    #[test]
    fn rejects_garbage_with_the_entry_named() {
        let e = DeviceFilter::parse("0,gpu0").unwrap_err();
        assert_eq!(e.entry, "gpu0");
        assert!(e.to_string().contains("gpu0"));
        assert!(DeviceFilter::parse("0:x").is_err());
        assert!(DeviceFilter::parse("GPU-").is_err());
        assert!(DeviceFilter::parse("-1").is_err());
    }

    #[test]
    fn env_precedence() {
        let f = DeviceFilter::from_vars(Some("1".into()), Some("all".into())).unwrap();
        assert!(!f.allows(&gpu(0)));
        let f = DeviceFilter::from_vars(None, Some("0".into())).unwrap();
        assert!(f.allows(&gpu(0)) && !f.allows(&gpu(1)));
        assert!(DeviceFilter::from_vars(None, None).unwrap().is_all());
    }

    #[test]
    fn cuda_indices_are_refused_on_a_mixed_host_unless_pci_bus_order() {
        let named = |i: u32, name: &str| DeviceInfo::new(i, format!("GPU-{i}aaa"), name);
        let mixed = [named(0, "NVIDIA H100 80GB HBM3"), named(1, "NVIDIA GeForce RTX 4090")];
        let same = [named(0, "NVIDIA H100 80GB HBM3"), named(1, "NVIDIA H100 80GB HBM3")];
        let cuda = |list: &str, order: Option<&str>| {
            DeviceFilter::from_vars_ordered(Some(list.into()), None, order.map(str::to_owned)).unwrap()
        };
        for list in ["1", "0:1"] {
            let e = cuda(list, None).check_device_order(&mixed).unwrap_err();
            assert_eq!(e.models, ["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"]);
            let msg = e.to_string();
            assert!(msg.contains("CUDA_VISIBLE_DEVICES") && msg.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"), "{msg}");
            assert!(cuda(list, Some("FASTEST_FIRST")).check_device_order(&mixed).is_err());
            assert!(cuda(list, Some("PCI_BUS_ID")).check_device_order(&mixed).is_ok());
            assert!(cuda(list, None).check_device_order(&same).is_ok(), "one model: both orders agree");
        }
        // UUIDs never depend on order; NVIDIA_VISIBLE_DEVICES indices are NVML's; so are parse()'s.
        assert!(cuda("GPU-1aaa", None).check_device_order(&mixed).is_ok());
        let nvidia = DeviceFilter::from_vars_ordered(None, Some("1".into()), None).unwrap();
        assert!(nvidia.check_device_order(&mixed).is_ok());
        assert!(DeviceFilter::parse("1").unwrap().check_device_order(&mixed).is_ok());
        // MIG instances are not models of their own.
        let mut with_mig = same.to_vec();
        with_mig.push(mig(0, 0));
        assert!(cuda("0", None).check_device_order(&with_mig).is_ok());
    }

    #[test]
    fn entries_that_select_nothing_are_named_as_written() {
        use crate::model::DeviceSample;
        use std::sync::Arc;
        let dev = |i, uuid| DeviceSample::new(Arc::new(DeviceInfo::new(i, uuid, "X")));
        let mut d = vec![dev(0, "GPU-aaa"), dev(1, "GPU-bbb")];
        let filter = DeviceFilter::parse("0,99,GPU-zzz").unwrap();
        filter.apply(&mut d);
        assert_eq!(filter.unmatched(&d), ["99", "GPU-zzz"]);
        assert!(DeviceFilter::all().unmatched(&d).is_empty());
    }

    #[test]
    fn ambiguous_uuid_prefixes_match_nothing() {
        use crate::model::DeviceSample;
        use std::sync::Arc;
        let fleet = || {
            vec![
                DeviceSample::new(Arc::new(DeviceInfo::new(0, "GPU-8aa", "X"))),
                DeviceSample::new(Arc::new(DeviceInfo::new(1, "GPU-8bb", "X"))),
                DeviceSample::new(Arc::new(DeviceInfo::new(2, "GPU-9cc", "X"))),
                DeviceSample::new(Arc::new(mig(2, 0))),
            ]
        };
        let indices =
            |d: &Vec<DeviceSample>| d.iter().map(|d| (d.info.index, d.info.mig.is_some())).collect::<Vec<_>>();

        let mut d = fleet();
        let ambiguous = DeviceFilter::parse("GPU-8,2").unwrap().apply(&mut d);
        assert_eq!(ambiguous, ["GPU-8"]);
        assert_eq!(indices(&d), [(2, false), (2, true)], "the ambiguous prefix shows nothing; the index still works");

        let mut d = fleet();
        assert!(DeviceFilter::parse("GPU-8a").unwrap().apply(&mut d).is_empty());
        assert_eq!(indices(&d), [(0, false)]);

        // A GPU's own UUID prefix also matches its MIG instances: one owner, not ambiguous.
        let mut d = fleet();
        d[2] = DeviceSample::new(Arc::new(DeviceInfo::new(2, "GPU-2aaa-bbb", "X")));
        assert!(DeviceFilter::parse("GPU-2").unwrap().apply(&mut d).is_empty());
        assert_eq!(indices(&d), [(2, false), (2, true)]);

        let mut d = fleet();
        assert!(DeviceFilter::all().apply(&mut d).is_empty());
        assert_eq!(d.len(), 4);
    }

    #[test]
    fn may_allow_gpu_prefilters() {
        let f = DeviceFilter::parse("2").unwrap();
        assert!(f.may_allow_gpu(2, "GPU-2"));
        assert!(!f.may_allow_gpu(1, "GPU-1"));
    }
}
