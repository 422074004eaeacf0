//! Fleet profiles: which GPUs a mock host has.
//!
//! See the crate docs for the TOML format. Built-ins ship as TOML files under
//! `gpumon-mock/profiles/` (compiled in), plus generated uniform fleets named
//! `<model>x<count>` (`h100x64`, `a100x3`, `rtx4090x1`, …, 1 to 64 GPUs).

use std::path::Path;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::gpus::{GpuModel, MigProfile};

/// Most physical GPUs a fleet may have.
pub const MAX_GPUS: usize = 64;

/// Driver version the built-in profiles report.
pub const DEFAULT_DRIVER_VERSION: &str = "570.86.15";
/// CUDA driver version the built-in profiles report (12.8).
pub const DEFAULT_CUDA_DRIVER_VERSION: i32 = 12080;

const BUILTIN: &[(&str, &str)] = &[
    ("h100x8", include_str!("../profiles/h100x8.toml")),
    ("a100x4", include_str!("../profiles/a100x4.toml")),
    ("h200x8", include_str!("../profiles/h200x8.toml")),
    ("rtx4090x2", include_str!("../profiles/rtx4090x2.toml")),
    ("a100x8-mig", include_str!("../profiles/a100x8-mig.toml")),
    ("mixed", include_str!("../profiles/mixed.toml")),
];

/// One physical GPU of a fleet: its model (overrides applied) and its MIG instances.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GpuSpec {
    /// The model, with any per-device overrides applied.
    pub model: GpuModel,
    /// MIG instances, in order (empty = MIG off).
    pub mig: Vec<MigProfile>,
}

impl GpuSpec {
    /// A GPU of `model` with MIG off.
    pub fn new(model: GpuModel) -> Self {
        Self { model, mig: Vec::new() }
    }

    /// The same GPU split into MIG instances of the named profiles (e.g. `["1g.10gb"; 7]`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] (key `mig`) if the model has no MIG, a profile is unknown for
    /// it, or the instances need more than 7 slices or more memory than the GPU has.
    pub fn with_mig<S: AsRef<str>>(mut self, profiles: impl IntoIterator<Item = S>) -> Result<Self, ConfigError> {
        self.mig = resolve_mig(&self.model, profiles, "mig")?;
        Ok(self)
    }
}

fn resolve_mig<S: AsRef<str>>(
    model: &GpuModel,
    names: impl IntoIterator<Item = S>,
    key: &str,
) -> Result<Vec<MigProfile>, ConfigError> {
    let names: Vec<S> = names.into_iter().collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    if !model.capabilities.mig {
        return Err(ConfigError::invalid(key, format!("model `{}` does not support MIG", model.key)));
    }
    let mut out = Vec::with_capacity(names.len());
    for name in &names {
        let name = name.as_ref();
        let Some(p) = model.mig_profile(name) else {
            let known: Vec<&str> = model.mig_profiles.iter().map(|p| p.name.as_str()).collect();
            return Err(ConfigError::invalid(
                key,
                format!("unknown MIG profile `{name}` for `{}` (known: {})", model.key, known.join(", ")),
            ));
        };
        out.push(p.clone());
    }
    let slices: u32 = out.iter().map(|p| p.slices).sum();
    if slices > 7 {
        return Err(ConfigError::invalid(key, format!("MIG instances need {slices} compute slices; a GPU has 7")));
    }
    let memory: u64 = out.iter().map(|p| p.memory_bytes).sum();
    let usable = model.memory_total_bytes - model.memory_reserved_bytes;
    if memory > usable {
        return Err(ConfigError::invalid(key, format!("MIG instances need {memory} bytes; the GPU has {usable}")));
    }
    Ok(out)
}

/// A mock host: its GPUs and driver facts.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct FleetProfile {
    /// Profile name (the built-in name, or the file's `name`, or its path).
    pub name: String,
    /// One-line description.
    pub description: Option<String>,
    /// Driver version reported in [`SystemInfo`](gpumon_core::SystemInfo).
    pub driver_version: String,
    /// CUDA driver version as NVML encodes it (`12080` = 12.8).
    pub cuda_driver_version: i32,
    /// NVML library version; defaults to `"12." + driver_version`.
    pub nvml_version: String,
    /// Seed for UUIDs, serials and workloads unless the sampler is given one.
    pub seed: Option<u64>,
    /// Physical GPUs in NVML index order.
    pub gpus: Vec<GpuSpec>,
}

impl Default for FleetProfile {
    /// The default fleet: `h100x8`.
    fn default() -> Self {
        Self::builtin("h100x8").unwrap_or_else(|_| Self::uniform("h100x8", GpuModel::by_name("h100")))
    }
}

impl FleetProfile {
    /// Names of the built-in profiles (besides the generated `<model>x<count>` ones).
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// The TOML source of a built-in profile (to show users an example).
    pub fn builtin_toml(name: &str) -> Option<&'static str> {
        BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// A fleet of the given GPUs, MIG off, default driver facts.
    pub fn uniform(name: impl Into<String>, models: impl IntoIterator<Item = GpuModel>) -> Self {
        Self {
            name: name.into(),
            description: None,
            driver_version: DEFAULT_DRIVER_VERSION.to_owned(),
            cuda_driver_version: DEFAULT_CUDA_DRIVER_VERSION,
            nvml_version: format!("12.{DEFAULT_DRIVER_VERSION}"),
            seed: None,
            gpus: models.into_iter().map(GpuSpec::new).collect(),
        }
    }

    /// `count` GPUs of the model `model` (key, alias or NVML name).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for an unknown model or a count outside `1..=64`.
    pub fn of_model(model: &str, count: usize) -> Result<Self, ConfigError> {
        let m = GpuModel::by_name(model).ok_or_else(|| unknown_model("model", model))?;
        if !(1..=MAX_GPUS).contains(&count) {
            return Err(ConfigError::invalid("count", format!("{count} GPUs; a fleet has 1 to {MAX_GPUS}")));
        }
        let mut p = Self::uniform(format!("{model}x{count}"), std::iter::repeat_n(m, count));
        p.description = Some(format!("{count}x {}", p.gpus[0].model.name));
        Ok(p)
    }

    /// A built-in profile, or a generated `<model>x<count>` one (`h100x64`).
    ///
    /// # Errors
    /// [`ConfigError::UnknownName`] listing the built-ins.
    pub fn builtin(name: &str) -> Result<Self, ConfigError> {
        if let Some(src) = Self::builtin_toml(name) {
            return Self::from_toml_str(src, name);
        }
        if let Some((model, count)) = name.rsplit_once('x') {
            if let (Ok(count), Some(_)) = (count.parse::<usize>(), GpuModel::by_name(model)) {
                return Self::of_model(model, count);
            }
        }
        Err(ConfigError::UnknownName {
            what: "profile",
            name: name.to_owned(),
            known: format!("{}, or <model>x<1..64> with model one of {}", Self::builtin_names().join(", "), {
                GpuModel::builtin_keys().join(", ")
            }),
        })
    }

    /// A built-in name (see [`FleetProfile::builtin`]) or the path of a TOML file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the bad key, the unreadable file, or the unknown name.
    pub fn load(name_or_path: &str) -> Result<Self, ConfigError> {
        crate::error::load_builtin_or_file(name_or_path, Self::builtin, Self::from_file)
    }

    /// Reads a TOML profile file.
    ///
    /// # Errors
    /// [`ConfigError::Io`], or as [`FleetProfile::from_toml_str`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        crate::error::parse_file("profile", path, Self::from_toml_str)
    }

    /// Parses a TOML profile; `origin` (a path or name) is used in errors and as the default name.
    ///
    /// # Errors
    /// [`ConfigError::Toml`] for malformed TOML or an unknown key; [`ConfigError::Invalid`] for
    /// an unknown model, a bad MIG layout, incoherent overrides or a GPU count outside 1..=64.
    pub fn from_toml_str(src: &str, origin: &str) -> Result<Self, ConfigError> {
        let raw: ProfileToml = toml::from_str(src).map_err(|e| ConfigError::toml("profile", origin, src, &e))?;
        let driver_version = raw.driver_version.unwrap_or_else(|| DEFAULT_DRIVER_VERSION.to_owned());
        let mut gpus = Vec::new();
        for (i, d) in raw.devices.into_iter().enumerate() {
            let key = |k: &str| format!("devices[{i}].{k}");
            let mut model = GpuModel::by_name(&d.model).ok_or_else(|| unknown_model(&key("model"), &d.model))?;
            d.overrides.apply(&mut model);
            model.validate().map_err(|(k, reason)| ConfigError::invalid(key(&format!("overrides.{k}")), reason))?;
            let mig = resolve_mig(&model, &d.mig, &key("mig"))?;
            if d.count == 0 {
                return Err(ConfigError::invalid(key("count"), "must be at least 1"));
            }
            for _ in 0..d.count {
                gpus.push(GpuSpec { model: model.clone(), mig: mig.clone() });
                if gpus.len() > MAX_GPUS {
                    return Err(ConfigError::invalid(key("count"), format!("the fleet has more than {MAX_GPUS} GPUs")));
                }
            }
        }
        if gpus.is_empty() {
            return Err(ConfigError::invalid("devices", "a fleet needs at least one device"));
        }
        Ok(Self {
            name: raw.name.unwrap_or_else(|| origin.to_owned()),
            description: raw.description,
            nvml_version: raw.nvml_version.unwrap_or_else(|| format!("12.{driver_version}")),
            driver_version,
            cuda_driver_version: raw.cuda_driver_version.unwrap_or(DEFAULT_CUDA_DRIVER_VERSION),
            seed: raw.seed,
            gpus,
        })
    }

    /// Builder-style: the same fleet with another driver version.
    #[must_use]
    pub fn with_driver_version(mut self, version: impl Into<String>) -> Self {
        self.driver_version = version.into();
        self
    }
}

fn unknown_model(key: &str, model: &str) -> ConfigError {
    ConfigError::invalid(key, format!("unknown GPU model `{model}` (known: {})", GpuModel::builtin_keys().join(", ")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileToml {
    name: Option<String>,
    description: Option<String>,
    driver_version: Option<String>,
    cuda_driver_version: Option<i32>,
    nvml_version: Option<String>,
    seed: Option<u64>,
    devices: Vec<DeviceToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceToml {
    model: String,
    #[serde(default = "one")]
    count: usize,
    #[serde(default)]
    mig: Vec<String>,
    #[serde(default)]
    overrides: Overrides,
}

fn one() -> usize {
    1
}

macro_rules! overrides {
    ($( $field:ident : $ty:ty ),* ; caps: $( $cap:ident ),* $(,)?) => {
        /// Per-device overrides of model facts; every key optional.
        #[derive(Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Overrides {
            $( $field: Option<$ty>, )*
            $( $cap: Option<bool>, )*
        }

        impl Overrides {
            fn apply(self, m: &mut GpuModel) {
                $( if let Some(v) = self.$field { m.$field = v; } )*
                $( if let Some(v) = self.$cap { m.capabilities.$cap = v; } )*
            }
        }
    };
}

overrides! {
    name: String,
    architecture: String,
    memory_total_bytes: u64,
    memory_reserved_bytes: u64,
    power_limit_default_watts: f64,
    power_limit_min_watts: f64,
    power_limit_max_watts: f64,
    power_idle_watts: f64,
    max_graphics_clock_mhz: u32,
    max_sm_clock_mhz: u32,
    max_memory_clock_mhz: u32,
    max_video_clock_mhz: u32,
    temperature_slowdown_celsius: f64,
    temperature_shutdown_celsius: f64,
    pcie_max_link_generation: u32,
    pcie_max_link_width: u32,
    nvlink_links: u32,
    nvlink_version: u32;
    caps: gpm, memory_temperature, ecc, mig, encoder, decoder, fan,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_loads() {
        for name in FleetProfile::builtin_names() {
            let p = FleetProfile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.name, name);
            assert_eq!(p.driver_version, "570.86.15");
        }
        assert_eq!(FleetProfile::load("h100x8").unwrap().gpus.len(), 8);
        assert_eq!(FleetProfile::load("a100x4").unwrap().gpus.len(), 4);
        let mig = FleetProfile::load("a100x8-mig").unwrap();
        assert!(mig.gpus.iter().all(|g| g.mig.len() == 4));
        assert_eq!(FleetProfile::default().gpus[0].model.name, "NVIDIA H100 80GB HBM3");
    }

    #[test]
    fn generated_uniform_fleets() {
        let p = FleetProfile::load("h100x64").unwrap();
        assert_eq!(p.gpus.len(), 64);
        assert_eq!(FleetProfile::load("rtx4090x1").unwrap().gpus.len(), 1);
        let e = FleetProfile::load("h100x65").unwrap_err();
        assert_eq!(e.key(), Some("count"));
        assert!(FleetProfile::load("h100x0").is_err());
        let e = FleetProfile::load("b200x8").unwrap_err();
        assert!(matches!(e, ConfigError::UnknownName { .. }), "{e}");
        assert!(e.to_string().contains("h100x8"), "{e}");
    }

    #[test]
    fn mig_validation() {
        let h100 = GpuModel::by_name("h100").unwrap();
        let g = GpuSpec::new(h100.clone()).with_mig(["1g.10gb"; 7]).unwrap();
        assert_eq!(g.mig.len(), 7);
        let e = GpuSpec::new(h100.clone()).with_mig(["4g.40gb", "4g.40gb"]).unwrap_err();
        assert!(e.to_string().contains("8 compute slices"), "{e}");
        let e = GpuSpec::new(h100).with_mig(["1g.5gb"]).unwrap_err();
        assert!(e.to_string().contains("1g.10gb"), "lists known profiles: {e}");
        let e = GpuSpec::new(GpuModel::by_name("rtx4090").unwrap()).with_mig(["1g.10gb"]).unwrap_err();
        assert!(e.to_string().contains("does not support MIG"), "{e}");
    }
}
