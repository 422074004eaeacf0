//! [`FleetError`]: why `gpumon-agent fleet` gives no report. Apart from the command (`mod.rs`)
//! and the queries (`figures.rs`), which both say it, so that neither imports the other.

use crate::sinks::prometheus_query::QueryError;

/// Why no report.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A flag that cannot be used.
    #[error("{0}")]
    Flags(String),
    /// The query API could not be asked.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The API answers, but holds no gpumon series over the period.
    #[error("{url} holds no gpumon series over the last {since}: are the agents writing to it (--remote-write-url, docs/remote-write.md), or scraped by it?")]
    NoGpumonSeries {
        /// The API.
        url: String,
        /// The period.
        since: String,
    },
    /// gpumon series, but no accounts.
    #[error("{url} holds gpumon series but no accounts (gpumon_account_*) over the last {since}: the agents are older than the accounts, or run with the `accounts` family off (--disable accounts)")]
    NoAccounts {
        /// The API.
        url: String,
        /// The period.
        since: String,
    },
}
