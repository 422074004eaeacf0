//! The fleet report's figures: PromQL over the accounts counters, one instant query per figure,
//! each `increase()` over the period so that agent restarts (counter resets) are handled.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::core::FindingKind;
use crate::sinks::prometheus_query::{QueryClient, Sample};

use super::error::FleetError;

const OBSERVED: &str = "gpumon_account_observed_seconds_total";
const ALLOCATED: &str = "gpumon_account_allocated_seconds_total";
const IDLE: &str = "gpumon_account_idle_allocated_seconds_total";
const LOST: &str = "gpumon_account_lost_seconds_total";
const ENERGY: &str = "gpumon_account_energy_joules_total";

/// What the groups are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// Kubernetes namespace.
    Namespace,
    /// The training run (`job` of the step marks).
    Job,
    /// The whole owner: namespace, pod, container, user.
    Owner,
    /// The node.
    Host,
}

impl GroupBy {
    /// The labels a group is made of.
    pub fn labels(self) -> &'static [&'static str] {
        match self {
            GroupBy::Namespace => &["namespace"],
            GroupBy::Job => &["job"],
            GroupBy::Owner => &["namespace", "pod", "container", "user"],
            GroupBy::Host => &["host"],
        }
    }
}

/// The fleet's GPU-hours over one period (1 GPU for 1 hour = 1).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Totals {
    /// Observed while up.
    pub observed_gpu_hours: f64,
    /// Allocated (memory held or a process on the GPU).
    pub allocated_gpu_hours: f64,
    /// Idle while allocated.
    pub idle_allocated_gpu_hours: f64,
    /// Lost per cause (causes can hold at once: they overlap), largest first in the text.
    pub lost_gpu_hours: BTreeMap<String, f64>,
    /// Energy, kWh.
    pub energy_kwh: f64,
}

/// One group's share.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Group {
    /// The group's label values (a label the series lack is empty: no owner known).
    pub labels: BTreeMap<String, String>,
    /// GPU-hours idle while allocated.
    pub idle_allocated_gpu_hours: f64,
    /// GPU-hours allocated.
    pub allocated_gpu_hours: f64,
    /// The cause that cost it most, with its GPU-hours lost.
    pub main_cause: Option<String>,
    /// GPU-hours the main cause cost.
    pub main_cause_gpu_hours: f64,
    /// What to do about the main cause.
    pub advice: Option<String>,
    /// Idle GPU-hours in the compared period (with `--compare-with`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_idle_allocated_gpu_hours: Option<f64>,
}

/// One period.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Period {
    /// Its start, Unix seconds.
    pub from: f64,
    /// Its end, Unix seconds.
    pub until: f64,
    /// The fleet's GPU-hours.
    pub totals: Totals,
    /// GPUs (series of `gpumon_account_observed_seconds_total` by host and uuid) seen.
    pub gpus: usize,
    /// Hosts seen.
    pub hosts: usize,
    /// Whether any of it is simulated or replayed data (`backend` mock or replay).
    pub simulated: bool,
}

/// The report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FleetReport {
    /// The API asked.
    pub source: String,
    /// How the groups are made.
    pub by: GroupBy,
    /// The period.
    pub period: Period,
    /// The groups that held GPUs idle longest, longest first.
    pub groups: Vec<Group>,
    /// How many groups there are in all.
    pub group_count: usize,
    /// The compared period (`--compare-with`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Period>,
}

/// A PromQL duration.
fn range(d: Duration) -> String {
    format!("{}s", d.as_secs().max(1))
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The one value of a `sum(…)`, 0 when no series.
fn scalar(samples: &[Sample]) -> f64 {
    samples.first().map_or(0.0, |s| s.value)
}

/// The report: the period ending `now`, its groups, and with `offset` the one ending `offset`
/// earlier.
///
/// # Errors
/// [`FleetError`]: a query failed, or the API holds no gpumon accounts over the period.
pub async fn fleet_report(
    client: &QueryClient,
    by: GroupBy,
    since: Duration,
    top: usize,
    now: SystemTime,
    offset: Option<Duration>,
) -> Result<FleetReport, FleetError> {
    let w = range(since);
    let seen = scalar(&client.instant(&format!("count(last_over_time({OBSERVED}[{w}]))"), Some(now)).await?);
    if seen == 0.0 {
        let any = scalar(&client.instant(&format!("count(last_over_time(gpumon_up[{w}]))"), Some(now)).await?);
        let (url, since) = (client.endpoint().to_owned(), humantime::format_duration(since).to_string());
        return Err(if any == 0.0 {
            FleetError::NoGpumonSeries { url, since }
        } else {
            FleetError::NoAccounts { url, since }
        });
    }
    let current = period(client, since, now).await?;
    let mut groups = groups(client, by, since, now).await?;
    let group_count = groups.len();
    groups.truncate(top);
    let previous = match offset {
        None => None,
        Some(offset) => {
            let then = now.checked_sub(offset).unwrap_or(UNIX_EPOCH);
            let before = groups_idle(client, by, since, then).await?;
            for g in &mut groups {
                g.previous_idle_allocated_gpu_hours = Some(before.get(&g.labels).copied().unwrap_or(0.0));
            }
            Some(period(client, since, then).await?)
        }
    };
    Ok(FleetReport { source: client.endpoint().to_owned(), by, period: current, groups, group_count, previous })
}

/// The fleet's totals over the `since` before `at`.
async fn period(client: &QueryClient, since: Duration, at: SystemTime) -> Result<Period, FleetError> {
    let w = range(since);
    let sum = |metric: &str| format!("sum(increase({metric}[{w}]))");
    let hours = 1.0 / 3600.0;
    let mut totals = Totals {
        observed_gpu_hours: scalar(&client.instant(&sum(OBSERVED), Some(at)).await?) * hours,
        allocated_gpu_hours: scalar(&client.instant(&sum(ALLOCATED), Some(at)).await?) * hours,
        idle_allocated_gpu_hours: scalar(&client.instant(&sum(IDLE), Some(at)).await?) * hours,
        energy_kwh: scalar(&client.instant(&sum(ENERGY), Some(at)).await?) / 3.6e6,
        lost_gpu_hours: BTreeMap::new(),
    };
    for s in client.instant(&format!("sum by (cause) (increase({LOST}[{w}]))"), Some(at)).await? {
        if let Some(cause) = s.labels.get("cause") {
            totals.lost_gpu_hours.insert(cause.clone(), s.value * hours);
        }
    }
    let gpus = scalar(
        &client.instant(&format!("count(count by (host, uuid) (last_over_time({OBSERVED}[{w}])))"), Some(at)).await?,
    );
    let hosts =
        scalar(&client.instant(&format!("count(count by (host) (last_over_time({OBSERVED}[{w}])))"), Some(at)).await?);
    let simulated = scalar(
        &client
            .instant(&format!("count(last_over_time({OBSERVED}{{backend=~\"mock|replay\"}}[{w}]))"), Some(at))
            .await?,
    ) > 0.0;
    let until = unix(at);
    Ok(Period {
        from: until - since.as_secs_f64(),
        until,
        totals,
        gpus: gpus as usize,
        hosts: hosts as usize,
        simulated,
    })
}

/// The group of a sample: its values of `by`'s labels.
fn key(by: GroupBy, s: &Sample) -> BTreeMap<String, String> {
    by.labels().iter().map(|l| ((*l).to_owned(), s.labels.get(*l).cloned().unwrap_or_default())).collect()
}

/// Every group's idle GPU-hours over the `since` before `at`.
async fn groups_idle(
    client: &QueryClient,
    by: GroupBy,
    since: Duration,
    at: SystemTime,
) -> Result<BTreeMap<BTreeMap<String, String>, f64>, FleetError> {
    let q = format!("sum by ({}) (increase({IDLE}[{}]))", by.labels().join(", "), range(since));
    Ok(client.instant(&q, Some(at)).await?.iter().map(|s| (key(by, s), s.value / 3600.0)).collect())
}

/// Every group, the longest idle first, with its main cause.
async fn groups(client: &QueryClient, by: GroupBy, since: Duration, at: SystemTime) -> Result<Vec<Group>, FleetError> {
    let labels = by.labels().join(", ");
    let w = range(since);
    let idle = groups_idle(client, by, since, at).await?;
    let allocated: BTreeMap<_, _> = client
        .instant(&format!("sum by ({labels}) (increase({ALLOCATED}[{w}]))"), Some(at))
        .await?
        .iter()
        .map(|s| (key(by, s), s.value / 3600.0))
        .collect();
    let mut causes: BTreeMap<BTreeMap<String, String>, (String, f64)> = BTreeMap::new();
    for s in client.instant(&format!("sum by ({labels}, cause) (increase({LOST}[{w}]))"), Some(at)).await? {
        let Some(cause) = s.labels.get("cause") else { continue };
        let hours = s.value / 3600.0;
        let entry = causes.entry(key(by, &s)).or_insert_with(|| (cause.clone(), hours));
        if hours > entry.1 || (hours == entry.1 && *cause < entry.0) {
            *entry = (cause.clone(), hours);
        }
    }
    let mut groups: Vec<Group> = idle
        .into_iter()
        .map(|(labels, idle)| {
            let main = causes.get(&labels).filter(|(_, hours)| *hours > 0.0);
            Group {
                allocated_gpu_hours: allocated.get(&labels).copied().unwrap_or(0.0),
                idle_allocated_gpu_hours: idle,
                main_cause: main.map(|(cause, _)| cause.clone()),
                main_cause_gpu_hours: main.map_or(0.0, |(_, hours)| *hours),
                advice: main.and_then(|(cause, _)| advice(cause)),
                previous_idle_allocated_gpu_hours: None,
                labels,
            }
        })
        .collect();
    groups.sort_by(|a, b| {
        b.idle_allocated_gpu_hours.total_cmp(&a.idle_allocated_gpu_hours).then(a.labels.cmp(&b.labels))
    });
    Ok(groups)
}

/// Where the diagnosis' advice for a cause is. The advice sentences live in the diagnosis
/// rules, which do not export them yet (gpumon-core's `diagnose::rules::advice`, crate-private);
/// until they do, the report points to the documentation of the cause rather than copy them.
fn advice(cause: &str) -> Option<String> {
    let kind = FindingKind::from_name(cause)?;
    Some(kind.advice().to_owned())
}
