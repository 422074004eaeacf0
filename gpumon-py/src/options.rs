//! `Monitor(...)`'s arguments, checked and turned into plain Rust settings while the GIL is held
//! (the agent then starts with the GIL released). Every error names the argument.

use std::net::SocketAddr;
use std::time::Duration;

pub use gpumon::assembly::backend::Backend;
use gpumon_core::DeviceFilter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt, PyString};

/// Everything `Monitor.__init__` was given, checked.
#[derive(Debug)]
pub struct Settings {
    /// `auto`, `nvml` or `mock` (the agent's rule, `gpumon::assembly::backend`; no `replay`).
    pub backend: Backend,
    pub interval: Duration,
    pub prometheus_listen: Option<SocketAddr>,
    pub influx: Option<(String, Option<String>)>,
    pub otlp_endpoint: Option<String>,
    pub mock_profile: String,
    pub mock_scenario: Option<String>,
    pub devices: DeviceFilter,
    /// Where a device selection came from and its list (`("devices", "0,9")`), so that a
    /// selection naming a GPU the node does not have is an error at start, not an empty
    /// snapshot. None when every visible device is watched.
    pub device_list: Option<(String, String)>,
    pub job: String,
    pub rank: Option<u32>,
}

/// The raw arguments (borrowed from Python).
pub struct Args<'py> {
    pub backend: &'py str,
    pub interval: Option<Bound<'py, PyAny>>,
    pub prometheus_listen: Option<String>,
    pub influx_url: Option<String>,
    pub influx_db: Option<String>,
    pub otlp_endpoint: Option<String>,
    pub mock_profile: Option<String>,
    pub mock_scenario: Option<String>,
    pub devices: Option<Bound<'py, PyAny>>,
    pub job: Option<String>,
    pub rank: Option<Bound<'py, PyAny>>,
}

/// The job name `step()` reports under when none is given (the agent's socket client uses the
/// same default).
pub const DEFAULT_JOB: &str = "train";

fn err(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

impl Args<'_> {
    /// Checks every argument; the environment supplies the rank (`LOCAL_RANK`) and the devices
    /// (`CUDA_VISIBLE_DEVICES`) where the arguments do not.
    pub fn resolve(self) -> PyResult<Settings> {
        let backend = match self.backend {
            "auto" => Backend::Auto,
            "nvml" => Backend::Nvml,
            "mock" => Backend::Mock,
            other => return Err(err(format!("backend: unknown backend `{other}` (expected auto, nvml or mock)"))),
        };
        let interval = match &self.interval {
            None => gpumon_core::DEFAULT_INTERVAL,
            Some(v) => duration(v, "interval")?,
        };
        if interval < gpumon_core::MIN_INTERVAL {
            return Err(err(format!("interval: {interval:?} is below the minimum of {:?}", gpumon_core::MIN_INTERVAL)));
        }
        let rank = match &self.rank {
            Some(r) => Some(rank_arg(r)?),
            None => env_rank()?,
        };
        let prometheus_listen = match &self.prometheus_listen {
            None => None,
            Some(s) => {
                let mut addr: SocketAddr = s.parse().map_err(|e| {
                    err(format!("prometheus_listen: `{s}` is not an address like 127.0.0.1:9400 ({e})"))
                })?;
                // Every rank on a node runs its own Monitor; each listens on port + local rank
                // so that none fails to bind and every GPU is scraped (port 0: any free port).
                if let (Some(r), true) = (rank, addr.port() != 0) {
                    let port = u16::try_from(u32::from(addr.port()) + r).map_err(|_| {
                        err(format!("prometheus_listen: port {} + rank {r} is above 65535", addr.port()))
                    })?;
                    addr.set_port(port);
                }
                Some(addr)
            }
        };
        let influx = match (self.influx_url, self.influx_db) {
            (Some(url), db) => Some((url, db)),
            (None, Some(_)) => return Err(err("influx_db: given without influx_url".to_owned())),
            (None, None) => None,
        };
        let (devices, device_list) = match &self.devices {
            Some(d) => device_arg(d)?,
            None => env_devices(rank)?,
        };
        let job = self.job.unwrap_or_else(|| DEFAULT_JOB.to_owned());
        if job.trim().is_empty() {
            return Err(err("job: must not be empty".to_owned()));
        }
        Ok(Settings {
            backend,
            interval,
            prometheus_listen,
            influx,
            otlp_endpoint: self.otlp_endpoint,
            mock_profile: self.mock_profile.unwrap_or_else(|| gpumon::assembly::defaults::MOCK_PROFILE.to_owned()),
            mock_scenario: self.mock_scenario,
            devices,
            device_list,
            job,
            rank,
        })
    }
}

/// `"1s"`, `"250ms"` (gpumon's duration grammar) or a number of seconds.
pub(crate) fn duration(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Duration> {
    if v.is_instance_of::<PyString>() {
        let s: String = v.extract()?;
        let s = s.as_str();
        return gpumon_sinks::duration::parse_duration(s).map_err(|e| err(format!("{name}: `{s}`: {e}")));
    }
    if v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>() {
        let secs: f64 = v.extract()?;
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| err(format!("{name}: {secs} is not a number of seconds >= 0")));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "{name}: expected a duration string such as \"1s\" or a number of seconds"
    )))
}

fn rank_arg(v: &Bound<'_, PyAny>) -> PyResult<u32> {
    let r: i64 = v.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err("rank: expected an int or None"))?;
    u32::try_from(r).map_err(|_| err(format!("rank: {r} is not a rank (0 or more)")))
}

fn env_rank() -> PyResult<Option<u32>> {
    match std::env::var("LOCAL_RANK") {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<u32>()
            .map(Some)
            .map_err(|_| err(format!("environment LOCAL_RANK: `{v}` is not a rank (0 or more)"))),
    }
}

/// A checked selection and where it came from (see [`Settings::device_list`]).
type Selection = (DeviceFilter, Option<(String, String)>);

/// `devices=`: a CUDA_VISIBLE_DEVICES-style string, or a list of indices / UUIDs.
fn device_arg(v: &Bound<'_, PyAny>) -> PyResult<Selection> {
    let list = if v.is_instance_of::<PyString>() {
        v.extract::<String>()?
    } else if let Ok(i) = v.extract::<i64>() {
        i.to_string()
    } else {
        let mut parts = Vec::new();
        for item in v.try_iter().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err("devices: expected a string, an int or a list of ints / UUIDs")
        })? {
            let item = item?;
            parts.push(if let Ok(i) = item.extract::<i64>() { i.to_string() } else { item.str()?.to_string() });
        }
        if parts.is_empty() {
            return Err(err("devices: the list is empty (None monitors every visible device)".to_owned()));
        }
        parts.join(",")
    };
    let filter = DeviceFilter::parse(&list).map_err(|e| err(format!("devices: {e}")))?;
    let source = (!filter.is_all()).then(|| ("devices".to_owned(), list));
    Ok((filter, source))
}

/// The rank's own devices: with a local rank, the rank's entry of `CUDA_VISIBLE_DEVICES` (the
/// device `torch.cuda.set_device(local_rank)` picks), or the only entry when the launcher gave
/// each rank one device, or GPU `local_rank` when the variable is unset. Without a rank: what
/// the environment makes visible (as the agent).
fn env_devices(rank: Option<u32>) -> PyResult<Selection> {
    let cuda = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let order = std::env::var("CUDA_DEVICE_ORDER").ok();
    let env_err = |e: gpumon_core::FilterParseError| err(format!("environment CUDA_VISIBLE_DEVICES: {e}"));
    let Some(rank) = rank else {
        // What the environment hides stays hidden; an empty visible set is the environment's
        // choice (CUDA_VISIBLE_DEVICES="" hides every GPU from CUDA too), not checked.
        let filter = DeviceFilter::from_vars_ordered(cuda, std::env::var("NVIDIA_VISIBLE_DEVICES").ok(), order)
            .map_err(env_err)?;
        return Ok((filter, None));
    };
    let filter = match cuda {
        None => {
            let list = rank.to_string();
            let filter = DeviceFilter::parse(&list).map_err(env_err)?;
            return Ok((filter, Some((format!("rank {rank} (its GPU, CUDA_VISIBLE_DEVICES unset)"), list))));
        }
        Some(list) => {
            let entries: Vec<&str> = list.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
            let entry = match entries.as_slice() {
                [] => return Ok((DeviceFilter::parse("none").map_err(env_err)?, None)),
                [only] => *only,
                many => *many.get(rank as usize).ok_or_else(|| {
                    err(format!(
                        "rank {rank} (LOCAL_RANK) has no device: CUDA_VISIBLE_DEVICES lists {} (pass devices=)",
                        many.len()
                    ))
                })?,
            };
            let filter = DeviceFilter::from_vars_ordered(Some(entry.to_owned()), None, order).map_err(env_err)?;
            (filter, entry.to_owned())
        }
    };
    let (filter, entry) = filter;
    Ok((filter, Some((format!("rank {rank}'s entry of CUDA_VISIBLE_DEVICES"), entry))))
}
