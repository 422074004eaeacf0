//! How the fake is configured: environment variables read at the first `nvmlInit`, or the same
//! keys given in-process through [`crate::control`].
//!
//! | Variable | Key | Meaning | Default |
//! |---|---|---|---|
//! | `GPUMON_FAKE_NVML_PROFILE` | `profile` | built-in fleet name or TOML file | `h100x8` |
//! | `GPUMON_FAKE_NVML_SCENARIO` | `scenario` | built-in scenario name or TOML file | the mock's default |
//! | `GPUMON_FAKE_NVML_SEED` | `seed` | seed for UUIDs and workloads | the profile's |
//! | `GPUMON_FAKE_NVML_FAULTS` | `faults` | comma-separated fault spec (below) | none |
//! | `GPUMON_FAKE_NVML_CLOCK` | `clock` | `wall`, `manual` or `step:<nvml function>` | `wall` |
//! | `GPUMON_FAKE_NVML_TICK_MS` | `tick_ms` | length of a `wall` tick; `0` = `manual` | `1000` |
//! | `GPUMON_FAKE_NVML_TICK` | `tick` | the first tick | `0` |
//!
//! Clocks: `wall` advances one tick every `tick_ms` of wall time since the first `nvmlInit`;
//! `manual` stays at `tick` until [`crate::control::set_tick`] (or the exported
//! `gpumon_fake_nvml_set_tick`) moves it; `step:nvmlDeviceGetCount_v2` makes the Nth call of that
//! function start tick `tick + N - 1` — a deterministic clock for unmodified programs that call
//! it once per sampling round.
//!
//! Fault spec (`GPUMON_FAKE_NVML_FAULTS`), comma-separated:
//! - `driver-not-loaded`: `nvmlInit*` fails with `NVML_ERROR_DRIVER_NOT_LOADED`.
//! - `lost:<gpu>@<tick>` / `lost:<gpu>@<from>-<until>`: GPU `<gpu>` (NVML index; its MIG
//!   instances too) returns `NVML_ERROR_GPU_IS_LOST` from tick `<from>` on (sticky), or only
//!   for ticks `from..until` (then it returns, to test re-discovery).
//! - `lost:<gpu>@<n>calls`: lost (sticky) after `<n>` calls that took its handle.
//! - `notsupported:<function>[@<gpu>]`: that NVML function returns `NVML_ERROR_NOT_SUPPORTED`.
//! - `nopermission:<function>[@<gpu>]`: that NVML function returns `NVML_ERROR_NO_PERMISSION`.
//! - `unknown:<function>[@<gpu>]`: that NVML function returns `NVML_ERROR_UNKNOWN` (what real
//!   drivers answer for single fields: "[Unknown Error]").
//! - `replaced:<gpu>@<tick>`: from `<tick>` on the board at that index is another one: a new
//!   UUID and serial (its MIG instances' too). Combine with `lost:<gpu>@<from>-<until>` to model
//!   a hot swap.
//! - `mig-absent:<gpu>:<mig>@<tick>` / `mig-absent:<gpu>:<mig>@<from>-<until>`: MIG instance
//!   `<mig>` (its `mig_index` in the profile) of GPU `<gpu>` is destroyed from `<tick>` on, or
//!   absent for ticks `from..until` (created at `until`): it is not enumerated and its handle
//!   answers `NVML_ERROR_INVALID_ARGUMENT`.
//! - `ecc-burst:<gpu>@<tick>[:<xid>]`: from `<tick>` on, the GPU's ECC counters jump
//!   (+16 corrected, +2 uncorrected) and one XID `<xid>` (default 48, double-bit ECC) is
//!   delivered through the event set.

use std::fmt;

/// Default wall-clock tick length.
pub const DEFAULT_TICK_MS: u64 = 1000;

/// The fake's whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Fleet profile: a built-in name or a TOML path (`None` = `h100x8`).
    pub profile: Option<String>,
    /// Scenario: a built-in name or a TOML path (`None` = the mock's default).
    pub scenario: Option<String>,
    /// Seed (`None` = the profile's).
    pub seed: Option<u64>,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// How ticks advance.
    pub clock: Clock,
    /// The first tick.
    pub start_tick: u64,
}

/// How the fake's tick advances.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Clock {
    /// One tick per `tick_ms` milliseconds of wall time since the first `nvmlInit`.
    Wall {
        /// Tick length.
        tick_ms: u64,
    },
    /// Only [`crate::control::set_tick`] moves it.
    Manual,
    /// Each call of the named NVML function starts a new tick.
    Step {
        /// The function, e.g. `nvmlDeviceGetCount_v2`.
        function: String,
    },
}

impl Default for Clock {
    fn default() -> Self {
        Clock::Wall { tick_ms: DEFAULT_TICK_MS }
    }
}

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// `nvmlInit*` returns `NVML_ERROR_DRIVER_NOT_LOADED`.
    DriverNotLoaded,
    /// The GPU is lost from `from` (inclusive) until `until` (exclusive; `None` = forever).
    Lost {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// First lost tick.
        from: u64,
        /// First tick it is back.
        until: Option<u64>,
    },
    /// The GPU is lost (sticky) once `calls` calls have taken its handle.
    LostAfterCalls {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// Calls before it is lost.
        calls: u64,
    },
    /// The function returns `NVML_ERROR_NOT_SUPPORTED`.
    NotSupported {
        /// NVML function name.
        function: String,
        /// Only for this GPU (`None` = all).
        gpu: Option<u32>,
    },
    /// The function returns `NVML_ERROR_NO_PERMISSION`.
    NoPermission {
        /// NVML function name.
        function: String,
        /// Only for this GPU (`None` = all).
        gpu: Option<u32>,
    },
    /// The function returns `NVML_ERROR_UNKNOWN`.
    Unknown {
        /// NVML function name.
        function: String,
        /// Only for this GPU (`None` = all).
        gpu: Option<u32>,
    },
    /// From `tick` on, another board sits at this index: new UUID and serial.
    Replaced {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// First tick with the new board.
        tick: u64,
    },
    /// MIG instance `mig` of GPU `gpu` does not exist from `from` (inclusive) until `until`
    /// (exclusive; `None` = forever).
    MigAbsent {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// The instance's `mig_index` in the profile.
        mig: u32,
        /// First tick it is absent.
        from: u64,
        /// First tick it exists again.
        until: Option<u64>,
    },
    /// ECC counters jump and one XID is delivered, from `tick` on.
    EccBurst {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// When.
        tick: u64,
        /// The XID code delivered.
        xid: u64,
    },
    /// NVLink link `link` of the GPU is down from `tick` on (counters stop, one recovery).
    NvlinkDown {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// The link.
        link: u32,
        /// First tick it is down.
        tick: u64,
    },
    /// NVLink link `link` of the GPU counts `per_tick` CRC errors per tick from `tick` on
    /// (half as many replays, a recovery per 10 ticks).
    NvlinkErrors {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// The link.
        link: u32,
        /// First tick with errors.
        tick: u64,
        /// CRC errors per tick.
        per_tick: u64,
    },
    /// The GPU's process list is these real PIDs (not a fault: a way to make process tables
    /// name processes that exist, for end-to-end tests of user names and attribution). The
    /// model's memory is split evenly between them; names come from `/proc/<pid>/comm`.
    Pids {
        /// NVML index of the physical GPU.
        gpu: u32,
        /// The PIDs.
        pids: Vec<u32>,
    },
}

/// CRC errors per tick of an `nvlink-errors` fault without an explicit count.
pub const NVLINK_ERRORS_DEFAULT_PER_TICK: u64 = 10;

/// A configuration value that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// Corrected / uncorrected ECC errors an `ecc-burst` adds.
pub const ECC_BURST_CORRECTED: u64 = 16;
/// See [`ECC_BURST_CORRECTED`].
pub const ECC_BURST_UNCORRECTED: u64 = 2;
/// XID of an `ecc-burst` without an explicit code (double-bit ECC error).
pub const ECC_BURST_DEFAULT_XID: u64 = 48;

const ENV_KEYS: [(&str, &str); 8] = [
    ("GPUMON_FAKE_NVML_PIDS", "pids"),
    ("GPUMON_FAKE_NVML_PROFILE", "profile"),
    ("GPUMON_FAKE_NVML_SCENARIO", "scenario"),
    ("GPUMON_FAKE_NVML_SEED", "seed"),
    ("GPUMON_FAKE_NVML_FAULTS", "faults"),
    ("GPUMON_FAKE_NVML_CLOCK", "clock"),
    ("GPUMON_FAKE_NVML_TICK_MS", "tick_ms"),
    ("GPUMON_FAKE_NVML_TICK", "tick"),
];

impl Config {
    /// The configuration the environment asks for (unset variables keep their defaults).
    ///
    /// # Errors
    /// [`ConfigError`] naming the variable whose value cannot be parsed.
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut c = Config::default();
        // `tick_ms` must be applied after `clock` so that `TICK_MS=0` wins.
        for (var, key) in ENV_KEYS {
            if let Ok(v) = std::env::var(var) {
                if !v.trim().is_empty() {
                    c.set(key, &v).map_err(|e| ConfigError(format!("{var}: {e}")))?;
                }
            }
        }
        Ok(c)
    }

    /// Parses `key=value;key=value` with the keys of the table in the module docs.
    ///
    /// ```
    /// use gpumon_fake_nvml::config::{Clock, Config};
    /// let c = Config::parse("profile=a100x8-mig; clock=manual; faults=lost:3@5,driver-not-loaded").unwrap();
    /// assert_eq!(c.profile.as_deref(), Some("a100x8-mig"));
    /// assert_eq!(c.clock, Clock::Manual);
    /// assert_eq!(c.faults.len(), 2);
    /// ```
    ///
    /// # Errors
    /// [`ConfigError`] naming the key or value at fault.
    pub fn parse(spec: &str) -> Result<Self, ConfigError> {
        let mut c = Config::default();
        for part in spec.split(';') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, v) = part.split_once('=').ok_or_else(|| ConfigError(format!("`{part}`: expected key=value")))?;
            c.set(k.trim(), v.trim())?;
        }
        Ok(c)
    }

    /// Sets one key.
    ///
    /// # Errors
    /// [`ConfigError`] for an unknown key or a bad value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let num = |v: &str| v.trim().parse::<u64>().map_err(|_| ConfigError(format!("`{key}`: `{v}` is not a number")));
        match key {
            "profile" => self.profile = Some(value.to_owned()),
            "scenario" => self.scenario = Some(value.to_owned()),
            "seed" => self.seed = Some(num(value)?),
            "faults" => self.faults.extend(parse_faults(value)?),
            "pids" => {
                for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                    self.faults.push(parse_fault(&format!("pids:{entry}"))?);
                }
            }
            "tick" => self.start_tick = num(value)?,
            "tick_ms" => {
                let ms = num(value)?;
                if ms == 0 {
                    self.clock = Clock::Manual;
                } else if let Clock::Wall { tick_ms } = &mut self.clock {
                    *tick_ms = ms;
                }
            }
            "clock" => {
                self.clock = match value.trim() {
                    "wall" => Clock::Wall { tick_ms: DEFAULT_TICK_MS },
                    "manual" | "frozen" => Clock::Manual,
                    other => match other.strip_prefix("step:") {
                        Some(f) if f.starts_with("nvml") => Clock::Step { function: f.to_owned() },
                        _ => {
                            return Err(ConfigError(format!(
                                "`clock`: `{other}`; expected wall, manual or step:<nvml function>"
                            )))
                        }
                    },
                }
            }
            other => {
                return Err(ConfigError(format!(
                    "unknown key `{other}` (known: profile, scenario, seed, faults, clock, tick_ms, tick)"
                )))
            }
        }
        Ok(())
    }
}

/// Parses a comma-separated fault spec (see the module docs).
///
/// # Errors
/// [`ConfigError`] naming the entry that is wrong and the accepted forms.
pub fn parse_faults(spec: &str) -> Result<Vec<Fault>, ConfigError> {
    spec.split(',').map(str::trim).filter(|s| !s.is_empty()).map(parse_fault).collect()
}

fn parse_fault(entry: &str) -> Result<Fault, ConfigError> {
    let bad = |why: &str| {
        ConfigError(format!(
            "fault `{entry}`: {why}; expected driver-not-loaded, lost:<gpu>@<tick>[-<until>], lost:<gpu>@<n>calls, \
             notsupported:<fn>[@<gpu>], nopermission:<fn>[@<gpu>], unknown:<fn>[@<gpu>], \
             replaced:<gpu>@<tick>, mig-absent:<gpu>:<mig>@<tick>[-<until>], ecc-burst:<gpu>@<tick>[:<xid>], \
             nvlink-down:<gpu>:<link>@<tick>, nvlink-errors:<gpu>:<link>@<tick>[:<per tick>] or pids:<gpu>=<pid>[+<pid>…]"
        ))
    };
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad(&format!("`{s}` is not a number")));
    let gpu = |s: &str| s.trim().parse::<u32>().map_err(|_| bad(&format!("`{s}` is not a GPU index")));
    if entry == "driver-not-loaded" {
        return Ok(Fault::DriverNotLoaded);
    }
    let (kind, rest) = entry.split_once(':').ok_or_else(|| bad("missing `:`"))?;
    match kind {
        "lost" => {
            let (g, when) = rest.split_once('@').ok_or_else(|| bad("missing `@`"))?;
            let gpu = gpu(g)?;
            if let Some(n) = when.strip_suffix("calls") {
                return Ok(Fault::LostAfterCalls { gpu, calls: num(n)? });
            }
            match when.split_once('-') {
                Some((a, b)) => Ok(Fault::Lost { gpu, from: num(a)?, until: Some(num(b)?) }),
                None => Ok(Fault::Lost { gpu, from: num(when)?, until: None }),
            }
        }
        "notsupported" | "nopermission" | "unknown" => {
            let (function, g) = match rest.split_once('@') {
                Some((f, g)) => (f.to_owned(), Some(gpu(g)?)),
                None => (rest.to_owned(), None),
            };
            if !function.starts_with("nvml") {
                return Err(bad("the function name must start with `nvml`"));
            }
            Ok(match kind {
                "notsupported" => Fault::NotSupported { function, gpu: g },
                "nopermission" => Fault::NoPermission { function, gpu: g },
                _ => Fault::Unknown { function, gpu: g },
            })
        }
        "replaced" => {
            let (g, when) = rest.split_once('@').ok_or_else(|| bad("missing `@`"))?;
            Ok(Fault::Replaced { gpu: gpu(g)?, tick: num(when)? })
        }
        "mig-absent" => {
            let (which, when) = rest.split_once('@').ok_or_else(|| bad("missing `@`"))?;
            let (g, m) = which.split_once(':').ok_or_else(|| bad("expected <gpu>:<mig>"))?;
            let mig = m.trim().parse::<u32>().map_err(|_| bad(&format!("`{m}` is not a MIG index")))?;
            let (from, until) = match when.split_once('-') {
                Some((a, b)) => (num(a)?, Some(num(b)?)),
                None => (num(when)?, None),
            };
            Ok(Fault::MigAbsent { gpu: gpu(g)?, mig, from, until })
        }
        "ecc-burst" => {
            let (g, when) = rest.split_once('@').ok_or_else(|| bad("missing `@`"))?;
            let (tick, xid) = match when.split_once(':') {
                Some((t, x)) => (num(t)?, num(x)?),
                None => (num(when)?, ECC_BURST_DEFAULT_XID),
            };
            Ok(Fault::EccBurst { gpu: gpu(g)?, tick, xid })
        }
        "nvlink-down" | "nvlink-errors" => {
            let (which, when) = rest.split_once('@').ok_or_else(|| bad("missing `@`"))?;
            let (g, l) = which.split_once(':').ok_or_else(|| bad("expected <gpu>:<link>"))?;
            let link = l.trim().parse::<u32>().map_err(|_| bad(&format!("`{l}` is not a link number")))?;
            if kind == "nvlink-down" {
                return Ok(Fault::NvlinkDown { gpu: gpu(g)?, link, tick: num(when)? });
            }
            let (tick, per_tick) = match when.split_once(':') {
                Some((t, n)) => (num(t)?, num(n)?),
                None => (num(when)?, NVLINK_ERRORS_DEFAULT_PER_TICK),
            };
            Ok(Fault::NvlinkErrors { gpu: gpu(g)?, link, tick, per_tick })
        }
        "pids" => {
            let (g, list) = rest.split_once('=').ok_or_else(|| bad("expected <gpu>=<pid>[+<pid>…]"))?;
            let pids = list
                .split('+')
                .map(|p| p.trim().parse::<u32>().map_err(|_| bad(&format!("`{p}` is not a PID"))))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Fault::Pids { gpu: gpu(g)?, pids })
        }
        _ => Err(bad(&format!("unknown fault kind `{kind}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_fault_form() {
        let f = parse_faults(
            "lost:3@5, lost:2@1-4, lost:1@40calls, notsupported:nvmlDeviceGetFanSpeed_v2, \
             nopermission:nvmlDeviceGetPowerUsage@2, ecc-burst:1@3, ecc-burst:0@2:63, driver-not-loaded, \
             unknown:nvmlDeviceGetUUID@4, replaced:3@2, mig-absent:0:3@0-5, mig-absent:1:0@7",
        )
        .unwrap();
        assert_eq!(
            f,
            vec![
                Fault::Lost { gpu: 3, from: 5, until: None },
                Fault::Lost { gpu: 2, from: 1, until: Some(4) },
                Fault::LostAfterCalls { gpu: 1, calls: 40 },
                Fault::NotSupported { function: "nvmlDeviceGetFanSpeed_v2".into(), gpu: None },
                Fault::NoPermission { function: "nvmlDeviceGetPowerUsage".into(), gpu: Some(2) },
                Fault::EccBurst { gpu: 1, tick: 3, xid: 48 },
                Fault::EccBurst { gpu: 0, tick: 2, xid: 63 },
                Fault::DriverNotLoaded,
                Fault::Unknown { function: "nvmlDeviceGetUUID".into(), gpu: Some(4) },
                Fault::Replaced { gpu: 3, tick: 2 },
                Fault::MigAbsent { gpu: 0, mig: 3, from: 0, until: Some(5) },
                Fault::MigAbsent { gpu: 1, mig: 0, from: 7, until: None },
            ]
        );
    }

    #[test]
    fn rejects_bad_entries_naming_them() {
        for bad in
            ["lost:x@1", "lost:1", "boom:1", "notsupported:GetFan", "ecc-burst:1@x", "mig-absent:0@1", "replaced:1"]
        {
            let e = parse_faults(bad).unwrap_err();
            assert!(e.0.contains(bad), "{e}");
        }
    }

    #[test]
    fn clock_keys() {
        assert_eq!(Config::parse("tick_ms=0").unwrap().clock, Clock::Manual);
        assert_eq!(Config::parse("tick_ms=250").unwrap().clock, Clock::Wall { tick_ms: 250 });
        assert_eq!(
            Config::parse("clock=step:nvmlDeviceGetCount_v2").unwrap().clock,
            Clock::Step { function: "nvmlDeviceGetCount_v2".into() }
        );
        assert!(Config::parse("clock=sometimes").is_err());
        assert!(Config::parse("colour=blue").unwrap_err().0.contains("colour"));
    }
}
