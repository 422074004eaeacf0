//! Attribution — who uses which GPU: the flags `--attribution`, `--proc-root`, `--passwd-file`
//! and the `[attribution]` section (docs/attribution.md).
//!
//! ```toml
//! [attribution]
//! enabled = true             # --attribution; default off. Turns on the `processes` family.
//! proc_root = "/host/proc"   # --proc-root / GPUMON_PROC_ROOT; default /proc (the host's)
//! passwd_file = "/host/etc/passwd"   # --passwd-file / GPUMON_PASSWD_FILE; default /etc/passwd
//! kubelet = false            # GPU → pod from the kubelet's pod-resources API (`kubelet` feature)
//! kubelet_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"
//! kubelet_refresh = "10s"
//! ```
//! With `enabled`, every GPU process gets its container, pod and Unix user from the proc root,
//! and every GPU the distinct owners of its processes; with `kubelet`, every GPU (and MIG
//! instance) the pod the kubelet allocated it to. Either installs the attribution stage; both
//! together give a GPU its pod's `namespace`, `pod`, `container` and its processes' `user`.
//! Failures are counted in `gpumon_attribution_failures_total{source}`, never fatal.
//!
//! The library resolves `[attribution]`, adds the stage and runs the kubelet refresher
//! (`crate::assembly::KubeletService`); the flags are set onto the section here.

use std::path::PathBuf;

use crate::assembly::config::AttributionSection;

use crate::cli::common::ConfigError;

/// The flags of this module (flattened into the agent's command line).
#[derive(Debug, clap::Args)]
pub struct AttributionArgs {
    /// Attribute GPU processes to their container, Kubernetes pod and Unix user, and label every
    /// GPU's series with its owners (namespace, pod, container, user). Turns on the processes
    /// family. See docs/attribution.md.
    #[arg(long)]
    pub attribution: bool,
    /// Where the host's /proc is mounted (default /proc): from inside a container, mount the
    /// host's /proc (e.g. at /host/proc) and point here.
    #[arg(long, env = "GPUMON_PROC_ROOT", value_name = "DIR")]
    pub proc_root: Option<PathBuf>,
    /// The passwd file user names come from (default /etc/passwd; in a container, the host's,
    /// mounted e.g. at /host/etc/passwd).
    #[arg(long, env = "GPUMON_PASSWD_FILE", value_name = "FILE")]
    pub passwd_file: Option<PathBuf>,
    /// Ask the kubelet's pod-resources API which pod holds each GPU and MIG device, and label
    /// their series with namespace, pod and container (`[attribution] kubelet`).
    /// See docs/kubernetes.md.
    #[arg(long)]
    pub kubelet: bool,
    /// The kubelet's pod-resources socket (default /var/lib/kubelet/pod-resources/kubelet.sock).
    #[arg(long, env = "GPUMON_KUBELET_SOCKET", value_name = "PATH")]
    pub kubelet_socket: Option<PathBuf>,
}

impl AttributionArgs {
    /// The attribution flags, set onto `[attribution]` (flags win over the file).
    ///
    /// ## Errors
    ///
    /// `--kubelet-socket` when the kubelet is not asked: it would be silently ignored.
    pub fn onto_config(&self, file: &mut AttributionSection) -> Result<(), ConfigError> {
        let kubelet = self.kubelet || file.kubelet == Some(true);
        if self.kubelet_socket.is_some() && !kubelet && std::env::var_os("GPUMON_KUBELET_SOCKET").is_none() {
            return Err(ConfigError(
                "--kubelet-socket: the kubelet is not asked (--kubelet or attribution.kubelet)".into(),
            ));
        }
        if self.attribution {
            file.enabled = Some(true);
        }
        if self.kubelet {
            file.kubelet = Some(true);
        }
        for (flag, key) in [
            (&self.proc_root, &mut file.proc_root),
            (&self.passwd_file, &mut file.passwd_file),
            (&self.kubelet_socket, &mut file.kubelet_socket),
        ] {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        Ok(())
    }
}
