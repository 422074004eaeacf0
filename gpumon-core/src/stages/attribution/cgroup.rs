//! `/proc/<pid>/cgroup` → which container, pod or systemd unit a process runs in.
//!
//! A pure parser: it takes the file's contents and never fails. What it does not recognise —
//! garbage, a truncated file, the root cgroup, a layout no runtime here uses — gives an
//! [`Owner`] with the fields it could not find left `None` (possibly
//! [`Owner::is_unknown`]), never an error that could stop sampling.
//!
//! # Layouts recognised
//! The file has one line per hierarchy, `ID:controllers:path` (cgroup v1: many lines, one of
//! them `name=systemd`; cgroup v2: the single line `0::path`; hybrid hosts: both). Every path is
//! read, and the most specific answer wins: a container beats a systemd unit, which beats
//! nothing. Components of a path:
//!
//! | component | meaning |
//! |---|---|
//! | `docker-<id>.scope`, `/docker/<id>` | Docker container (systemd / cgroupfs driver) |
//! | `cri-containerd-<id>.scope`, `nerdctl-<id>.scope` | containerd container |
//! | `crio-<id>.scope`, `crio-conmon-<id>.scope` | CRI-O container (and its monitor) |
//! | `libpod-<id>.scope`, `libpod-conmon-<id>.scope`, `/libpod_parent/libpod-<id>` | Podman container (and its monitor), rootful or rootless |
//! | a bare 64-hex-digit component | a container of the runtime named by the component above it (`docker`), else of an unknown runtime (Kubernetes' cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`) |
//! | `kubepods-<qos>-pod<uid>.slice`, `kubepods-pod<uid>.slice` | Kubernetes pod, systemd driver (`_` in the UID stands for `-`) |
//! | `pod<uid>` under `kubepods/<qos>/` or `kubepods/` | Kubernetes pod, cgroupfs driver |
//! | `kubepods-burstable.slice`, `kubepods/besteffort`, … | the pod's QoS class; a pod directly under `kubepods` is `Guaranteed` |
//! | `<name>.service`, `<name>.scope` (not a container's) | a systemd unit: a service, a user session (`session-3.scope`) |
//!
//! A container id is 64 hex digits (what every runtime above generates); anything else in a
//! container-shaped component is not taken for one.
//!
//! Paths may begin with `/..` components when the reader sits in a different cgroup namespace
//! than the process (an agent in a container with the host's `/proc`); those are skipped.
//!
//! ```
//! use gpumon_core::attribution::{cgroup, ContainerRuntime, QosClass};
//!
//! let owner = cgroup::parse(
//!     "0::/kubepods.slice/kubepods-burstable.slice/\
//!      kubepods-burstable-pod0f1e2d3c_4b5a_6978_8695_a4b3c2d1e0f9.slice/\
//!      cri-containerd-4a5f3c0e9b8d7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f.scope\n",
//! );
//! assert_eq!(owner.runtime, Some(ContainerRuntime::Containerd));
//! assert_eq!(owner.pod_uid.as_deref(), Some("0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9"));
//! assert_eq!(owner.qos, Some(QosClass::Burstable));
//! assert!(owner.container_id.as_deref().unwrap().starts_with("4a5f3c0e9b8d"));
//!
//! assert!(cgroup::parse("not a cgroup file").is_unknown());
//! ```

use super::{ContainerRuntime, Owner, QosClass};

/// Length of the short container id (as `docker ps` shows it) used as the `container` label
/// outside Kubernetes.
pub const SHORT_ID_LEN: usize = 12;

/// Parses the contents of a `/proc/<pid>/cgroup` file (v1, v2 or hybrid). Never fails: what is
/// not recognised is left `None`. The returned owner has no user fields (`uid`, `gid`, `user`).
///
/// `container` is set to the short container id only for containers outside Kubernetes: in a
/// pod the `container` label is the Kubernetes container name, which the cgroup path does not
/// carry (the kubelet's pod-resources API does); the full id stays in `container_id`.
pub fn parse(contents: &str) -> Owner {
    let mut best = Owner::default();
    let mut best_rank = 0;
    for line in contents.lines() {
        // `ID:controllers:path`; the path itself may contain `:`.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let owner = parse_path(path);
        let rank = rank(&owner);
        if rank > best_rank {
            best = owner;
            best_rank = rank;
        }
    }
    best
}

/// How specific an answer is: container in a pod > container > pod > unit > nothing.
fn rank(o: &Owner) -> u8 {
    u8::from(o.container_id.is_some()) * 4 + u8::from(o.pod_uid.is_some()) * 2 + u8::from(o.unit.is_some())
}

/// Parses one cgroup path (`/kubepods.slice/…/cri-containerd-<id>.scope`). Never fails.
///
/// ```
/// use gpumon_core::attribution::{cgroup, ContainerRuntime};
///
/// let owner = cgroup::parse_path("/system.slice/train.service");
/// assert_eq!(owner.unit.as_deref(), Some("train.service"));
/// assert_eq!(owner.runtime, Some(ContainerRuntime::Systemd));
/// ```
pub fn parse_path(path: &str) -> Owner {
    let mut owner = Owner::default();
    let mut in_kubepods = false;
    let mut previous = "";
    for component in path.split('/').filter(|c| !c.is_empty() && *c != "." && *c != "..") {
        if let Some((runtime, id)) = container_component(component, previous) {
            // The innermost container wins (a Podman container's `/container` child, say, is
            // not a container of its own; a nested one would be).
            owner.runtime = runtime;
            owner.container_id = Some(id.to_owned());
        } else if let Some((qos, uid)) = pod_component(component, previous, in_kubepods) {
            owner.pod_uid = Some(uid);
            owner.qos = Some(qos);
        } else if component.contains("kubepods") {
            in_kubepods = true;
        } else if owner.container_id.is_none() && is_unit(component) {
            owner.unit = Some(component.to_owned());
        }
        previous = component;
    }
    if owner.container_id.is_some() {
        // A unit above a container is the runtime's (`containerd.service`), not the process's.
        owner.unit = None;
        if owner.pod_uid.is_none() {
            owner.container = owner.container_id.as_deref().map(|id| id[..SHORT_ID_LEN].to_owned());
        }
    } else if owner.unit.is_some() && owner.pod_uid.is_none() {
        owner.runtime = Some(ContainerRuntime::Systemd);
    }
    owner
}

/// `docker-<id>.scope`, `crio-<id>`, a bare id under `docker`, …: the runtime (if known) and
/// the container id.
fn container_component<'a>(component: &'a str, parent: &str) -> Option<(Option<ContainerRuntime>, &'a str)> {
    const PREFIXES: [(&str, ContainerRuntime); 7] = [
        ("docker-", ContainerRuntime::Docker),
        ("cri-containerd-", ContainerRuntime::Containerd),
        ("nerdctl-", ContainerRuntime::Containerd),
        ("crio-conmon-", ContainerRuntime::Crio),
        ("crio-", ContainerRuntime::Crio),
        ("libpod-conmon-", ContainerRuntime::Podman),
        ("libpod-", ContainerRuntime::Podman),
    ];
    let name = component.strip_suffix(".scope").unwrap_or(component);
    for (prefix, runtime) in PREFIXES {
        if let Some(id) = name.strip_prefix(prefix) {
            return is_container_id(id).then_some((Some(runtime), id));
        }
    }
    if is_container_id(component) {
        let runtime = match parent {
            "docker" => Some(ContainerRuntime::Docker),
            "libpod_parent" => Some(ContainerRuntime::Podman),
            _ => None,
        };
        return Some((runtime, component));
    }
    None
}

/// 64 lowercase-or-uppercase hex digits.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod's cgroup: `kubepods-<qos>-pod<uid>.slice` (systemd driver) or `pod<uid>` right under
/// `kubepods` or `kubepods/<qos>` (cgroupfs driver). Returns the QoS class and the UID with its
/// dashes.
fn pod_component(component: &str, parent: &str, in_kubepods: bool) -> Option<(QosClass, String)> {
    if let Some(slice) = component.strip_suffix(".slice") {
        // `kubepods-burstable-pod<uid>`, possibly with a prefix (`kubelet-kubepods-…`).
        let at = slice.find("kubepods")?;
        let rest = &slice[at + "kubepods".len()..];
        let (qos, uid) = match rest.strip_prefix("-burstable-pod") {
            Some(uid) => (QosClass::Burstable, uid),
            None => match rest.strip_prefix("-besteffort-pod") {
                Some(uid) => (QosClass::BestEffort, uid),
                None => (QosClass::Guaranteed, rest.strip_prefix("-pod")?),
            },
        };
        return pod_uid(uid).map(|uid| (qos, uid));
    }
    if !in_kubepods {
        return None;
    }
    let uid = pod_uid(component.strip_prefix("pod")?)?;
    let qos = match parent {
        "burstable" => QosClass::Burstable,
        "besteffort" => QosClass::BestEffort,
        p if p.contains("kubepods") => QosClass::Guaranteed,
        _ => return None,
    };
    Some((qos, uid))
}

/// A pod UID as a cgroup name spells it — a UUID with `-` or `_`, or the 32 hex digits of a
/// static pod's config hash — with its dashes restored.
fn pod_uid(s: &str) -> Option<String> {
    let uuid = s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-' || b == b'_',
            _ => b.is_ascii_hexdigit(),
        });
    let hash = s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (uuid || hash).then(|| s.replace('_', "-"))
}

/// A systemd service or scope (`train.service`, `session-3.scope`), not a slice.
fn is_unit(component: &str) -> bool {
    let name = component.strip_suffix(".service").or_else(|| component.strip_suffix(".scope"));
    name.is_some_and(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4a5f3c0e9b8d7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f";

    #[test]
    fn the_innermost_container_and_the_pod_above_it_are_found() {
        let o = parse_path(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8695_a4b3c2d1e0f9.slice/crio-{ID}.scope"
        ));
        assert_eq!(o.runtime, Some(ContainerRuntime::Crio));
        assert_eq!(o.container_id.as_deref(), Some(ID));
        assert_eq!(o.container, None, "a pod's container label is its name, from the kubelet");
        assert_eq!(o.qos, Some(QosClass::BestEffort));
        assert_eq!(o.pod_uid.as_deref(), Some("0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9"));
        assert_eq!(o.unit, None);
    }

    #[test]
    fn a_guaranteed_pod_sits_directly_under_kubepods() {
        let o = parse_path(&format!("/kubepods/pod0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9/{ID}"));
        assert_eq!(o.qos, Some(QosClass::Guaranteed));
        assert_eq!(o.runtime, None, "the cgroupfs driver does not name the runtime");
        assert_eq!(o.container_id.as_deref(), Some(ID));
        let o = parse_path("/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8695_a4b3c2d1e0f9.slice");
        assert_eq!(o.qos, Some(QosClass::Guaranteed));
        assert_eq!(o.container_id, None);
    }

    #[test]
    fn a_static_pods_hash_uid_is_a_pod_uid() {
        let o = parse_path("/kubepods/burstable/pod6e9c8c9c3a0bfb5e1f2a3b4c5d6e7f80/");
        assert_eq!(o.pod_uid.as_deref(), Some("6e9c8c9c3a0bfb5e1f2a3b4c5d6e7f80"));
    }

    #[test]
    fn ids_of_the_wrong_shape_are_not_containers() {
        for path in ["/docker/abc", "/system.slice/docker-xyz.scope", &format!("/docker/{}", &ID[1..])] {
            let o = parse_path(path);
            assert_eq!(o.container_id, None, "{path}");
        }
        // Not a pod either: `pod<uid>` outside kubepods is just a name.
        assert_eq!(parse_path("/pod0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9").pod_uid, None);
    }

    #[test]
    fn namespace_relative_paths_are_read() {
        let o = parse_path(&format!("/../../system.slice/docker-{ID}.scope"));
        assert_eq!(o.runtime, Some(ContainerRuntime::Docker));
        assert_eq!(o.container.as_deref(), Some(&ID[..12]));
    }

    #[test]
    fn lines_with_a_bad_hierarchy_id_are_ignored_and_the_most_specific_line_wins() {
        let text = format!("x:memory:/docker/{ID}\n0::/system.slice/containerd.service\n");
        let o = parse(&text);
        assert_eq!(o.unit.as_deref(), Some("containerd.service"));
        assert_eq!(o.container_id, None);
        let text = format!("0::/system.slice/containerd.service\n4:memory:/docker/{ID}\n");
        assert_eq!(parse(&text).container_id.as_deref(), Some(ID));
    }
}
