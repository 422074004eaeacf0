//! `Monitor(...)`'s arguments, checked and turned into plain Rust settings while the GIL is held
//! (the agent then starts with the GIL released). Every error names the argument.

use std::net::SocketAddr;
use std::time::Duration;

pub use gpumon::assembly::backend::Backend;
use gpumon::core::DeviceFilter;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

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
    /// Whether the diagnosis stage runs (`diagnose=`; by default, unless an agent of
    /// `gpumon-agent run` watches the job's GPUs: [`STEPS_SOCKET_ENV`] is set).
    pub diagnose: bool,
    /// `diagnose_window=`: the diagnosis window (the agent's `[diagnose] window`).
    pub diagnose_window: Option<Duration>,
}

/// The environment variable `gpumon-agent run` sets for its command (its steps socket): there an
/// agent already watches the job's GPUs and diagnoses them, so a Monitor does not by default.
pub const STEPS_SOCKET_ENV: &str = "GPUMON_STEPS_SOCKET";

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
    pub diagnose: Option<bool>,
    pub diagnose_window: Option<Bound<'py, PyAny>>,
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
            None => gpumon::core::DEFAULT_INTERVAL,
            Some(v) => duration(v, "interval")?,
        };
        // The interval's bounds live in one place, its type: checked here too only so that the
        // error comes when the Monitor is made, naming the argument.
        let interval = gpumon::core::Interval::new(interval).map_err(|e| err(format!("interval: {e}")))?.get();
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
            (Some(url), Some(db)) => Some((url, Some(db))),
            // The sink's own message names its v2 keys (`bucket`, `org`), which the Monitor has
            // not: say it in the Monitor's arguments.
            (Some(url), None) => {
                return Err(err(format!(
                    "influx_db: required with influx_url `{url}` (the database the Monitor writes to \
                     through InfluxDB's 1.x write API, which InfluxDB 2.x also serves for a bucket \
                     mapped to a database)"
                )))
            }
            (None, Some(_)) => return Err(err("influx_db: given without influx_url".to_owned())),
            (None, None) => None,
        };
        let (devices, device_list) = match &self.devices {
            Some(d) => device_arg(d)?,
            None => env_devices(rank)?,
        };
        let job = job_arg(self.job.as_deref().unwrap_or(DEFAULT_JOB))?;
        let diagnose = self.diagnose.unwrap_or_else(|| {
            std::env::var_os(STEPS_SOCKET_ENV).is_none_or(|v| v.to_string_lossy().trim().is_empty())
        });
        let diagnose_window = self.diagnose_window.as_ref().map(|w| duration(w, "diagnose_window")).transpose()?;
        if diagnose_window.is_some() && !diagnose {
            return Err(err("diagnose_window: given with diagnose=False".to_owned()));
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
            diagnose,
            diagnose_window,
        })
    }
}

/// `"1s"`, `"250ms"` (gpumon's duration grammar) or a number of seconds (not a bool: `True`
/// is no duration).
pub(crate) fn duration(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Duration> {
    if v.is_instance_of::<PyBool>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{name}: expected a duration string such as \"1s\" or a number of seconds, got a bool"
        )));
    }
    if v.is_instance_of::<PyString>() {
        let s: String = v.extract()?;
        let s = s.as_str();
        return gpumon::sinks::duration::parse_duration(s).map_err(|e| err(format!("{name}: `{s}`: {e}")));
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

/// The highest step number gpumon stores (the step tracker refuses `u64::MAX`: `StepError::OutOfRange`).
pub const MAX_STEP: u64 = u64::MAX - 1;

/// An int argument (a Python int or anything with `__index__`, such as a NumPy integer) as a
/// `u64`: `Ok(Ok(n))`, or `Ok(Err(text))` for an int outside `0..=u64::MAX` (the caller names
/// its range), or a TypeError naming `name` for anything else — a bool included (`True` is an
/// int to Python, but no step, rank or device number).
fn index_arg(v: &Bound<'_, PyAny>, name: &str) -> PyResult<Result<u64, String>> {
    let type_error =
        |got: String| pyo3::exceptions::PyTypeError::new_err(format!("{name}: expected an int, got {got}"));
    if v.is_instance_of::<PyBool>() {
        return Err(type_error("a bool".to_owned()));
    }
    if let Ok(n) = v.extract::<u64>() {
        return Ok(Ok(n));
    }
    // Not a u64: an int out of range, or no int at all.
    match v.py().import("operator")?.call_method1("index", (v,)) {
        Ok(int) => Ok(Err(int.str()?.to_string())),
        Err(_) => Err(type_error(v.get_type().name().map(|t| t.to_string()).unwrap_or_else(|_| "?".to_owned()))),
    }
}

/// A step number: `step(n)` of the Monitor and of the StepClient (`_check_step`), so that both
/// take exactly what the step tracker stores — on this process's tracker or the agent's.
pub(crate) fn step_number(n: &Bound<'_, PyAny>) -> PyResult<u64> {
    match index_arg(n, "step")? {
        Ok(n) if n <= MAX_STEP => Ok(n),
        Ok(n) => Err(err(format!("step: {n} is out of range (0 to {MAX_STEP})"))),
        Err(n) if n.starts_with('-') => Err(err(format!("step: {n} is negative"))),
        Err(n) => Err(err(format!("step: {n} is out of range (0 to {MAX_STEP})"))),
    }
}

/// A rank: an int from 0 to `u32::MAX` (what the agent's step marks carry).
fn rank_arg(v: &Bound<'_, PyAny>) -> PyResult<u32> {
    let r = index_arg(v, "rank")?;
    r.ok().and_then(|r| u32::try_from(r).ok()).ok_or_else(|| {
        err(format!("rank: {} is not a rank (0 to {})", v.str().map(|s| s.to_string()).unwrap_or_default(), u32::MAX))
    })
}

/// A job name as the step tracker takes it (the agent applies the same rule to every mark of
/// its steps socket): 1 to 128 bytes, no control characters — and not blank.
pub(crate) fn job_arg(job: &str) -> PyResult<String> {
    if job.trim().is_empty() {
        return Err(err("job: must not be empty".to_owned()));
    }
    // The step tracker's own rule, which the agent applies to every mark of its steps socket.
    gpumon::core::steps::validate_job(job).map_err(|e| err(format!("job: {e}")))?;
    Ok(job.to_owned())
}

/// `StepClient(job=, rank=)` checked as `Monitor(job=, rank=)` is: the job name, and the rank
/// (`None`: `LOCAL_RANK` from the environment, if set). Returns `(job, rank)`.
#[pyfunction]
#[pyo3(signature = (job, rank))]
pub fn _check_run(job: &Bound<'_, PyAny>, rank: Option<&Bound<'_, PyAny>>) -> PyResult<(String, Option<u32>)> {
    let job: String = job.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err("job: expected a string"))?;
    let job = job_arg(&job)?;
    let rank = match rank {
        Some(r) => Some(rank_arg(r)?),
        None => env_rank()?,
    };
    Ok((job, rank))
}

/// `StepClient.step(n)`'s number checked as `Monitor.step(n)`'s is: returns it as an int.
#[pyfunction]
pub fn _check_step(n: &Bound<'_, PyAny>) -> PyResult<u64> {
    step_number(n)
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
    let bool_error = || pyo3::exceptions::PyTypeError::new_err("devices: expected a GPU index or UUID, got a bool");
    if v.is_instance_of::<PyBool>() {
        return Err(bool_error());
    }
    let list = if v.is_instance_of::<PyString>() {
        let list = v.extract::<String>()?;
        if selects_nothing(&list) {
            return Err(err(format!("devices: `{list}` selects no GPU (None monitors every visible device)")));
        }
        list
    } else if let Ok(i) = v.extract::<i64>() {
        i.to_string()
    } else {
        let mut parts = Vec::new();
        for item in v.try_iter().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err("devices: expected a string, an int or a list of ints / UUIDs")
        })? {
            let item = item?;
            if item.is_instance_of::<PyBool>() {
                return Err(bool_error());
            }
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
    let env_err = |e: gpumon::core::FilterParseError| err(format!("environment CUDA_VISIBLE_DEVICES: {e}"));
    let Some(rank) = rank else {
        // What the environment hides stays hidden — but a Monitor left with no GPU at all
        // (CUDA_VISIBLE_DEVICES="", a CPU-only process) is a mistake to say, not an empty
        // snapshot: `devices=` chooses GPUs regardless.
        let nvidia = std::env::var("NVIDIA_VISIBLE_DEVICES").ok();
        let visible = cuda
            .as_ref()
            .map(|v| ("CUDA_VISIBLE_DEVICES", v))
            .or(nvidia.as_ref().map(|v| ("NVIDIA_VISIBLE_DEVICES", v)));
        if let Some((var, list)) = visible.filter(|(_, list)| selects_nothing(list)) {
            return Err(err(format!(
                "environment {var}=`{list}` hides every GPU: the Monitor would watch none (pass devices= to choose GPUs)"
            )));
        }
        let filter = DeviceFilter::from_vars_ordered(cuda, nvidia, order).map_err(env_err)?;
        return Ok((filter, None));
    };
    let filter = match cuda {
        None => {
            let list = rank.to_string();
            let filter = DeviceFilter::parse(&list).map_err(env_err)?;
            return Ok((filter, Some((format!("rank {rank} (its GPU, CUDA_VISIBLE_DEVICES unset)"), list))));
        }
        Some(list) => {
            let entry = rank_entry(rank, &list)?;
            let filter = DeviceFilter::from_vars_ordered(Some(entry.to_owned()), None, order).map_err(env_err)?;
            (filter, entry.to_owned())
        }
    };
    let (filter, entry) = filter;
    Ok((filter, Some((format!("rank {rank}'s entry of CUDA_VISIBLE_DEVICES"), entry))))
}

/// The entry of `CUDA_VISIBLE_DEVICES` (`list`) that rank `rank` drives: entry `rank`, as
/// `torch.cuda.set_device(local_rank)` picks it, or the only entry when the launcher gave each
/// rank one device.
fn rank_entry(rank: u32, list: &str) -> PyResult<&str> {
    let entries: Vec<&str> = list.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    match entries.as_slice() {
        [] => {
            Err(err(format!("rank {rank} (LOCAL_RANK) has no device: CUDA_VISIBLE_DEVICES is empty (pass devices=)")))
        }
        [only] if selects_nothing(only) => Err(err(format!(
            "rank {rank} (LOCAL_RANK) has no device: CUDA_VISIBLE_DEVICES is `{only}` (pass devices=)"
        ))),
        [only] => Ok(only),
        many => many.get(rank as usize).copied().ok_or_else(|| {
            err(format!(
                "rank {rank} (LOCAL_RANK) has no device: CUDA_VISIBLE_DEVICES lists {} (pass devices=)",
                many.len()
            ))
        }),
    }
}

/// The physical GPUs a `StepClient`'s marks are about, as the steps socket's `gpu` key writes
/// them (`CUDA_VISIBLE_DEVICES` syntax), by the rule the Monitor chooses its devices with — one
/// resolver for both: `gpu` when given (`devices=`'s syntax); else with a rank, the rank's
/// entry of `CUDA_VISIBLE_DEVICES` (GPU `rank` when it is unset); without one, what
/// `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` make visible. `None`: every GPU (nothing
/// narrows it). Raises ValueError where the Monitor would.
#[pyfunction]
#[pyo3(signature = (rank, gpu=None))]
pub fn _steps_gpu(rank: Option<u32>, gpu: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    let (_, source) = match gpu {
        Some(g) => device_arg(g).map_err(|e| rename_arg(e, "devices", "gpu"))?,
        None => env_devices(rank)?,
    };
    if let Some((_, list)) = source {
        return Ok(Some(list));
    }
    // No rank: env_devices names no source, as the Monitor then watches every visible GPU.
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok().or_else(|| std::env::var("NVIDIA_VISIBLE_DEVICES").ok());
    Ok(visible.filter(|v| gpu.is_none() && !DeviceFilter::parse(v).is_ok_and(|f| f.is_all())))
}

/// `e`'s message with the argument `from` named `to` (a shared check, another argument's name).
fn rename_arg(e: PyErr, from: &str, to: &str) -> PyErr {
    Python::attach(|py| {
        let message = e.value(py).to_string();
        let renamed = message.strip_prefix(from).map_or(message.clone(), |rest| format!("{to}{rest}"));
        if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) {
            pyo3::exceptions::PyTypeError::new_err(renamed)
        } else {
            err(renamed)
        }
    })
}

/// Whether a CUDA-style list selects no device at all (`""`, `none`, `void`).
fn selects_nothing(list: &str) -> bool {
    matches!(list.trim().to_ascii_lowercase().as_str(), "" | "none" | "void")
}
