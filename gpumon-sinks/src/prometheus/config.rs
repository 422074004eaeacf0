//! Configuration types shared by the scrape endpoint and the Pushgateway sink. The listener's
//! own types (auth, TLS, tenants, limits) are [`crate::http`]'s, shared with the web view.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::http::access::Auth;
use crate::http::listener::{listener_section, ListenerConfig};
use crate::http::tenants::TenantConfig;

/// The scrape address used when [`PrometheusConfig::listen`] is not set: `127.0.0.1:9400`
/// (dcgm-exporter's port, on loopback only; set `listen = "0.0.0.0:9400"` to expose it).
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 9400));

gpumon_core::named_enum! {
    /// Which metric and label names to emit.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
    #[serde(rename_all = "lowercase")]
    #[non_exhaustive]
    pub enum Naming as "naming" {
        /// Prometheus conventions: `gpumon_<name>_<unit>[_total]`, labels `gpu`, `uuid`, `host`,
        /// everything else in `gpumon_gpu_info`.
        #[default]
        Native = "native",
        /// dcgm-exporter's names (`DCGM_FI_DEV_GPU_UTIL`, …), units (percent, MiB, MHz, mJ) and
        /// labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`,
        /// `DCGM_FI_DRIVER_VERSION`, `GPU_I_PROFILE`/`GPU_I_ID`), so dashboards built for
        /// dcgm-exporter work unchanged. Metrics dcgm-exporter has no field for keep their
        /// native names (with the dcgm label set).
        Dcgm = "dcgm",
    }
}

listener_section! {
    /// Settings of the Prometheus scrape sink (`[prometheus]` in the agent's config file): its
    /// own keys, then the listener's (shared with `[web]`).
    ///
    /// Every field has a default; `PrometheusConfig::default()` serves `127.0.0.1:9400` with native
    /// names, no auth and no TLS. The struct is `#[non_exhaustive]`: outside this crate, start from
    /// `PrometheusConfig::default()` and assign the fields you need.
    #[derive(Clone, Debug, PartialEq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    #[non_exhaustive]
    pub struct PrometheusConfig {
        /// Metric and label names: `"native"` (default) or `"dcgm"`.
        pub naming: Naming = Naming::Native,
        /// Require credentials on `/metrics` (`/health` stays open for probes). With
        /// [`tenants`](Self::tenants), this is the admin credential: it reads every GPU.
        pub auth: Option<Auth> = None,
        /// Tenants: each credential reads only its tenant's view of the GPUs
        /// (`[[prometheus.tenants]]`, see [`TenantConfig`] and `docs/tenancy.md`). When tenants are
        /// configured, a scrape without a credential gets `401` (unless no credential is
        /// configured at all).
        #[serde(default)]
        pub tenants: Vec<TenantConfig> = Vec::new(),
        /// Put the host name on every series (`host`, or `Hostname` in dcgm naming). Default true:
        /// fleet dashboards can filter by host without joins. When false, the host name is only in
        /// `gpumon_gpu_info`.
        pub host_label: bool = true,
        /// dcgm naming: `hostname` (dcgm-exporter since 2026-05) instead of `Hostname`.
        pub dcgm_lowercase_hostname: bool = false,
        /// Offer OpenMetrics to scrapers that ask for it (default true). When false, always serve
        /// the 0.0.4 text format.
        pub openmetrics: bool = true,
        /// Stop exporting device series (and answer `/health` with `503`) when the latest snapshot
        /// is older than this: sampling has stalled or keeps failing, and serving the last values
        /// forever would hide it. Self-metrics (`gpumon_last_sample_success`, sample counters, sink
        /// status) are still exported, so alerts on them keep working.
        ///
        /// Default (`None`): derived from the agent the sink is attached to —
        /// [`default_stale_after`](super::default_stale_after)`(interval)` = three sampling
        /// intervals, but at least 5 s (1 s interval: 5 s; 10 s interval: 30 s). Without an agent
        /// (an embedder calling [`PrometheusHandle::store`](super::PrometheusHandle::store) itself)
        /// nothing is ever hidden unless this is set. Set it to override the derived value (e.g.
        /// `"2m"` for a sampler that is slow by nature).
        #[serde(default, with = "crate::duration::opt")]
        pub stale_after: Option<Duration> = None,
    }
    listener defaults: ListenerConfig::default();
}
