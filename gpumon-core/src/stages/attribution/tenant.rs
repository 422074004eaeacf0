//! Tenant-scoped reading: which GPUs a tenant holds, and the part of a snapshot it may see.
//!
//! A [`TenantSelector`] names a tenant by what attribution knows about the owners of GPU
//! processes and GPU allocations ([`Owner`]): Kubernetes namespace, container, Unix user, Unix
//! group. [`Snapshot::scoped_to`] turns a snapshot into that tenant's view; the scrape endpoint
//! and the web view serve it to requests that carry the tenant's credentials.
//!
//! # Which devices a tenant holds
//! A tenant holds a device when one of the device's [`owners`](DeviceSample::owners) (a pod the
//! kubelet allocated it to, or a process owner) or the owner of one of its
//! [`processes`](DeviceSample::processes) matches the selector. A MIG instance is a device of
//! its own. A GPU in MIG mode (a device whose MIG instances are in the snapshot) is held only
//! through an allocation of the whole GPU, never through processes: the driver lists every
//! instance's processes on the parent too, so holding one slice would otherwise show the whole
//! GPU's series — and its utilisation, power and memory are those of every tenant's slices.
//!
//! # What the view keeps
//! - the devices the tenant holds, each with every device-wide value (utilisation, memory,
//!   power, clocks, ECC, XIDs, NVLink…): those are facts about the hardware, not about who
//!   uses it;
//! - on each of them, only the tenant's own processes (a process whose owner is unknown is
//!   nobody's, so it is dropped) and only the tenant's own owners, so that the owner labels
//!   never name anyone else;
//! - the active findings (and this tick's finding events) about kept devices, unless their text
//!   names a GPU outside the view (the imbalance finding quotes the busiest other GPU);
//! - the host-wide facts ([`SystemInfo`](crate::SystemInfo): host name, driver) and the tick's
//!   number, time and sampling duration;
//! - the training runs registered over the steps socket by one of the view's processes (same
//!   pid and uid), with the figures of the view's GPUs only
//!   ([`Steps`](crate::steps::Steps)' `scoped`).
//!
//! Everything else is left out: devices the tenant does not hold, other owners' processes and
//! owner records, host-level findings and the per-kind count of findings raised (they count
//! every tenant's GPUs), other users' training runs and the steps socket's rejection counts. A
//! field added to [`Snapshot`] later is left out of the view until it is judged tenant-neutral
//! here.
//!
//! # A GPU shared by two tenants
//! Each tenant sees the device and its device-wide series (the utilisation of a time-sliced GPU
//! is the sum of both tenants' work; that is what the GPU did), labelled with its own owners
//! only, and only its own processes.
//!
//! ```
//! use std::sync::Arc;
//! use gpumon_core::attribution::{Owner, TenantSelector};
//! use gpumon_core::{DeviceInfo, DeviceSample, ProcessSample, Snapshot, SystemInfo};
//!
//! let team = |ns: &str| {
//!     let mut o = Owner::default();
//!     o.namespace = Some(ns.to_owned());
//!     Arc::new(o)
//! };
//! let gpu = |i: u32, pid: u32, ns: &str| {
//!     let mut d = DeviceSample::new(Arc::new(DeviceInfo::new(i, format!("GPU-{i}"), "H100")));
//!     let mut p = ProcessSample::new(pid);
//!     p.owner = Some(team(ns));
//!     d.processes.push(p);
//!     d.owners.push(team(ns));
//!     d
//! };
//! let snapshot = Snapshot::new(
//!     Arc::new(SystemInfo::new("node-1", "nvml")),
//!     vec![gpu(0, 100, "team-a"), gpu(1, 200, "team-b")],
//! );
//!
//! let team_a: TenantSelector = "namespace=team-a".parse().unwrap();
//! let view = snapshot.scoped_to(&team_a);
//! assert_eq!(view.devices.len(), 1);
//! assert_eq!(view.devices[0].info.uuid, "GPU-0");
//! assert_eq!(view.devices[0].processes[0].pid, 100);
//! ```

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use super::Owner;
use crate::model::{DeviceSample, NvlinkRemote, Snapshot};

/// One condition on an [`Owner`]. A [`TenantSelector`] holds one or several, all of which must
/// hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Criterion {
    /// `namespace=<name>`: the Kubernetes namespace.
    Namespace(String),
    /// `container=<name or id>`: the container's name (Kubernetes) or its id, the full one or
    /// the 12-character short one that [`Owner::container`] carries outside Kubernetes.
    Container(String),
    /// `user=<name>`: the Unix user name of the process ([`Owner::user`]).
    User(String),
    /// `user=<uid>`: the real user id of the process.
    Uid(u32),
    /// `group=<gid>`: the real group id of the process. Only numeric: a process carries its group
    /// id, and group names differ between a container's `/etc/group` and the host's.
    Gid(u32),
}

impl Criterion {
    /// The configuration key: `namespace`, `container`, `user` or `group`.
    pub fn key(&self) -> &'static str {
        match self {
            Self::Namespace(_) => "namespace",
            Self::Container(_) => "container",
            Self::User(_) | Self::Uid(_) => "user",
            Self::Gid(_) => "group",
        }
    }

    /// Whether `owner` satisfies this criterion. An unknown field never matches.
    pub fn matches(&self, owner: &Owner) -> bool {
        match self {
            Self::Namespace(v) => owner.namespace.as_deref() == Some(v),
            Self::Container(v) => owner.container.as_deref() == Some(v) || owner.container_id.as_deref() == Some(v),
            Self::User(v) => owner.user.as_deref() == Some(v),
            Self::Uid(v) => owner.uid == Some(*v),
            Self::Gid(v) => owner.gid == Some(*v),
        }
    }
}

impl fmt::Display for Criterion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Namespace(v) | Self::Container(v) | Self::User(v) => write!(f, "{}={v}", self.key()),
            Self::Uid(v) | Self::Gid(v) => write!(f, "{}={v}", self.key()),
        }
    }
}

/// Why a tenant selector was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TenantSelectorError {
    /// No criterion at all (it would select nobody, or, worse, be read as "everybody").
    #[error("a tenant selector needs at least one of namespace, container, user or group")]
    Empty,
    /// A criterion with an empty value.
    #[error("`{key}` must not be empty")]
    EmptyValue {
        /// The key.
        key: &'static str,
    },
    /// The same key twice (`user` counts once, whether a name or a uid).
    #[error("`{key}` is given twice")]
    Duplicate {
        /// The key.
        key: &'static str,
    },
    /// A key that is not a criterion.
    #[error("unknown selector key `{key}` (expected namespace, container, user or group)")]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A `group` that is not a number.
    #[error("group `{value}`: give the numeric gid (processes carry their group id, not a group name)")]
    GroupName {
        /// The value as written.
        value: String,
    },
    /// A number out of range for a uid or gid.
    #[error("`{key}`: {value} is not a valid id (0 to 4294967295)")]
    BadId {
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
    },
    /// A part of the text form without `=`.
    #[error("`{part}`: expected key=value")]
    Malformed {
        /// The part as written.
        part: String,
    },
}

/// Who a tenant is: one or several [`Criterion`]s on the owners of GPU processes and GPU
/// allocations, all of which must hold (`namespace=team-a,user=alice` is alice's processes in
/// team-a). See the [module docs](self) for what a tenant's view holds.
///
/// Text form (`FromStr`, `Display`): `key=value` pairs separated by commas, keys `namespace`,
/// `container`, `user` (a name, or a uid when all digits) and `group` (a gid). Configuration
/// files (with the `serde` feature) take the same text, or a table:
/// `selector = { namespace = "team-a" }`, `{ user = "alice" }`, `{ user = 1000 }`,
/// `{ group = 100 }`.
///
/// ```
/// use gpumon_core::attribution::{Criterion, TenantSelector, TenantSelectorError};
///
/// let s: TenantSelector = "namespace=team-a, user=1000".parse().unwrap();
/// assert_eq!(s.criteria(), &[Criterion::Namespace("team-a".into()), Criterion::Uid(1000)]);
/// assert_eq!(s.to_string(), "namespace=team-a,user=1000");
/// assert_eq!("".parse::<TenantSelector>(), Err(TenantSelectorError::Empty));
/// assert!(matches!("group=gpu".parse::<TenantSelector>(), Err(TenantSelectorError::GroupName { .. })));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TenantSelector {
    criteria: Vec<Criterion>,
}

impl TenantSelector {
    /// A selector of these criteria.
    ///
    /// # Errors
    /// [`TenantSelectorError::Empty`] without a criterion, [`TenantSelectorError::EmptyValue`]
    /// for an empty name, [`TenantSelectorError::Duplicate`] for a key given twice.
    pub fn new(criteria: impl IntoIterator<Item = Criterion>) -> Result<Self, TenantSelectorError> {
        let criteria: Vec<Criterion> = criteria.into_iter().collect();
        if criteria.is_empty() {
            return Err(TenantSelectorError::Empty);
        }
        for (i, c) in criteria.iter().enumerate() {
            if let Criterion::Namespace(v) | Criterion::Container(v) | Criterion::User(v) = c {
                if v.trim().is_empty() {
                    return Err(TenantSelectorError::EmptyValue { key: c.key() });
                }
            }
            if criteria[..i].iter().any(|d| d.key() == c.key()) {
                return Err(TenantSelectorError::Duplicate { key: c.key() });
            }
        }
        Ok(Self { criteria })
    }

    /// The criteria, in the order given.
    pub fn criteria(&self) -> &[Criterion] {
        &self.criteria
    }

    /// Whether `owner` is this tenant: every criterion holds.
    pub fn matches(&self, owner: &Owner) -> bool {
        self.criteria.iter().all(|c| c.matches(owner))
    }

    /// Which devices of `snapshot` this tenant holds, one entry per device in
    /// [`Snapshot::devices`] order (see the [module docs](self) for the rule, MIG included).
    pub fn held_devices(&self, snapshot: &Snapshot) -> Vec<bool> {
        let parents = snapshot.mig_parents();
        snapshot.devices.iter().map(|d| self.holds(d, parents.contains(d.info.uuid.as_str()))).collect()
    }

    fn holds(&self, device: &DeviceSample, mig_parent: bool) -> bool {
        let of_a_process = |o: &Owner| device.processes.iter().any(|p| p.owner.as_deref() == Some(o));
        if mig_parent {
            // Only an allocation of the whole GPU: owners that are no process's.
            return device.owners.iter().any(|o| self.matches(o) && !of_a_process(o));
        }
        device.owners.iter().any(|o| self.matches(o))
            || device.processes.iter().any(|p| p.owner.as_deref().is_some_and(|o| self.matches(o)))
    }

    fn parse_value(key: &str, value: &str) -> Result<Criterion, TenantSelectorError> {
        let id = |key: &'static str| {
            value.parse::<u32>().map_err(|_| TenantSelectorError::BadId { key, value: value.to_owned() })
        };
        let all_digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
        Ok(match key {
            "namespace" => Criterion::Namespace(value.to_owned()),
            "container" => Criterion::Container(value.to_owned()),
            "user" if all_digits => Criterion::Uid(id("user")?),
            "user" => Criterion::User(value.to_owned()),
            "group" if all_digits => Criterion::Gid(id("group")?),
            "group" if value.is_empty() => return Err(TenantSelectorError::EmptyValue { key: "group" }),
            "group" => return Err(TenantSelectorError::GroupName { value: value.to_owned() }),
            other => return Err(TenantSelectorError::UnknownKey { key: other.to_owned() }),
        })
    }
}

impl FromStr for TenantSelector {
    type Err = TenantSelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut criteria = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) =
                part.split_once('=').ok_or_else(|| TenantSelectorError::Malformed { part: part.to_owned() })?;
            criteria.push(Self::parse_value(k.trim(), v.trim())?);
        }
        Self::new(criteria)
    }
}

impl fmt::Display for TenantSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.criteria.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for TenantSelector {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = TenantSelector;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tenant selector: a table of namespace, container, user, group, or \"key=value,…\"")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TenantSelector, E> {
                v.parse().map_err(E::custom)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TenantSelector, A::Error> {
                use serde::de::Error as _;
                let mut criteria = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value: IdOrName = map.next_value()?;
                    let text = match (value, key.as_str()) {
                        (IdOrName::Name(name), _) => name,
                        (IdOrName::Id(id), k @ ("user" | "group")) => {
                            let key = if k == "user" { "user" } else { "group" };
                            u32::try_from(id)
                                .map_err(|_| {
                                    A::Error::custom(TenantSelectorError::BadId { key, value: id.to_string() })
                                })?
                                .to_string()
                        }
                        (IdOrName::Id(_), "namespace" | "container") => {
                            return Err(A::Error::custom(format!("`{key}` takes a name, not a number")));
                        }
                        (IdOrName::Id(_), _) => {
                            return Err(A::Error::custom(TenantSelectorError::UnknownKey { key }));
                        }
                    };
                    criteria.push(TenantSelector::parse_value(&key, &text).map_err(A::Error::custom)?);
                }
                TenantSelector::new(criteria).map_err(A::Error::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A selector value in a table: a name, or a number (a uid or gid).
#[cfg(feature = "serde")]
enum IdOrName {
    Id(i128),
    Name(String),
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for IdOrName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = IdOrName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a name or a numeric id")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IdOrName, E> {
                Ok(IdOrName::Name(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IdOrName, E> {
                Ok(IdOrName::Id(i128::from(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IdOrName, E> {
                Ok(IdOrName::Id(i128::from(v)))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Snapshot {
    /// The view of this snapshot that `tenant` may read: the devices it holds, with only its
    /// own processes and owners, and only the derived data that is about those devices and
    /// names nobody else. See the [module docs](crate::attribution::tenant) for the rules.
    pub fn scoped_to(&self, tenant: &TenantSelector) -> Snapshot {
        self.scoped_to_held(tenant, &tenant.held_devices(self))
    }

    /// [`Snapshot::scoped_to`] for a caller that has already computed
    /// `held = tenant.held_devices(self)` for another purpose (the web view keeps every tenant's
    /// holdings in its history), so that it is computed once per tick. The view shows exactly
    /// the devices `held` marks: pass the result of that call for this snapshot and tenant, and
    /// nothing else. A `held` of the wrong length (one computed for another snapshot) is
    /// ignored and the holdings are computed afresh.
    pub fn scoped_to_held(&self, tenant: &TenantSelector, held: &[bool]) -> Snapshot {
        if held.len() != self.devices.len() {
            return self.scoped_to(tenant);
        }
        let mut devices: Vec<DeviceSample> =
            self.devices.iter().zip(held).filter(|(_, &h)| h).map(|(d, _)| scope_device(d, tenant)).collect();
        hide_unheld_peers(&mut devices);
        // Built from `new` rather than cloned, so that a field added to `Snapshot` later stays
        // out of tenant views until someone decides it is tenant-neutral.
        let mut view = Snapshot::new(self.system.clone(), devices)
            .with_seq(self.seq)
            .with_taken_at(self.taken_at)
            .with_duration(self.duration);
        // Each stage decides what of its output a tenant may read (`StageOutput::scoped`); an
        // output that does not say stays out. Diagnosis keeps the findings about the view's
        // GPUs, steps the runs the tenant's processes registered; the attribution counters (the
        // operator's concern, about no tenant's GPUs) stay out.
        for output in self.outputs.iter() {
            if let Some(scoped) = output.scoped(&view) {
                view.outputs.insert(scoped);
            }
        }
        // Whether the backend could be read is a fact about the host, not about any tenant: a
        // tenant's scrape must say "up 0" while sampling fails, like the admin's.
        view.sampling = self.sampling.clone();
        view
    }
}

/// Blanks the far end of every NVLink link that leads to a GPU outside the view: its PCI bus id
/// names another tenant's GPU (an NVSwitch's or an NPU's names nobody's).
fn hide_unheld_peers(devices: &mut [DeviceSample]) {
    let held: HashSet<String> =
        devices.iter().filter_map(|d| d.info.pci_bus_id.as_deref()).map(str::to_ascii_lowercase).collect();
    for d in devices {
        let Some(nv) = &mut d.nvlink else { continue };
        for l in &mut nv.links {
            let to_gpu = !matches!(l.remote_device_type, Some(NvlinkRemote::Switch | NvlinkRemote::IbmNpu));
            let unheld = l.remote_pci_bus_id.as_deref().is_some_and(|b| !held.contains(&b.to_ascii_lowercase()));
            if to_gpu && unheld {
                l.remote_pci_bus_id = None;
            }
        }
    }
}

fn scope_device(device: &DeviceSample, tenant: &TenantSelector) -> DeviceSample {
    let mut d = device.clone();
    d.processes.retain(|p| p.owner.as_deref().is_some_and(|o| tenant.matches(o)));
    d.owners.retain(|o| tenant.matches(o));
    d
}

#[cfg(test)]
mod tests;
