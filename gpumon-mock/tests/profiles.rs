//! Loading fleet profiles and scenarios: built-ins, user files, and errors that name the key.

use std::path::PathBuf;

use gpumon_core::{DeviceFilter, MetricSet, SampleRequest, Sampler};
use gpumon_mock::{ConfigError, FleetProfile, MockFleet, MockSampler, Scenario, Workload};

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gpumon-mock-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn builtin_profiles_have_datasheet_values() {
    let h100 = FleetProfile::load("h100x8").unwrap();
    assert_eq!(h100.gpus.len(), 8);
    let m = &h100.gpus[0].model;
    assert_eq!(m.name, "NVIDIA H100 80GB HBM3");
    assert_eq!(m.memory_total_bytes, 85_520_809_984);
    assert_eq!(m.power_limit_default_watts, 700.0);
    assert_eq!(m.max_sm_clock_mhz, 1980);
    assert_eq!(m.pcie_max_link_generation, 5);

    let a100 = FleetProfile::load("a100x4").unwrap();
    assert_eq!(a100.gpus.len(), 4);
    assert_eq!(a100.gpus[0].model.name, "NVIDIA A100-SXM4-40GB");
    assert_eq!(a100.gpus[0].model.power_limit_default_watts, 400.0);

    let h200 = FleetProfile::load("h200x8").unwrap();
    assert_eq!(h200.gpus[0].model.name, "NVIDIA H200");
    assert_eq!(h200.gpus[0].model.memory_total_bytes, 150_754_820_096);

    let rtx = FleetProfile::load("rtx4090x2").unwrap();
    assert_eq!(rtx.gpus.len(), 2);
    assert!(rtx.gpus[0].model.capabilities.fan);

    let mixed = FleetProfile::load("mixed").unwrap();
    let names: Vec<&str> = mixed.gpus.iter().map(|g| g.model.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H200",
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA GeForce RTX 4090",
            "Tesla V100-SXM2-32GB"
        ]
    );
    assert_eq!(mixed.gpus[3].model.power_limit_default_watts, 400.0, "override applied");
    assert_eq!(mixed.gpus[2].mig.len(), 2);

    // The shipped TOML files are what the built-ins load.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("profiles");
    for name in FleetProfile::builtin_names() {
        let from_file = FleetProfile::load(dir.join(format!("{name}.toml")).to_str().unwrap()).unwrap();
        assert_eq!(from_file.gpus, FleetProfile::load(name).unwrap().gpus, "{name}");
    }
    for name in Scenario::builtin_names() {
        let path = dir.join("scenarios").join(format!("{name}.toml"));
        assert_eq!(Scenario::load(path.to_str().unwrap()).unwrap().faults, Scenario::load(name).unwrap().faults);
    }
}

#[test]
fn custom_fleet_from_a_file() {
    let path = temp_file(
        "custom.toml",
        r#"
        name = "lab-box"
        driver_version = "550.54.15"
        cuda_driver_version = 12040
        seed = 99

        [[devices]]
        model = "H100"
        count = 2
        mig = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]

        [[devices]]
        model = "NVIDIA GeForce RTX 4090"
        overrides = { name = "NVIDIA GeForce RTX 4090 D", power_limit_default_watts = 425.0, fan = false }
        "#,
    );
    let profile = FleetProfile::load(path.to_str().unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(profile.name, "lab-box");
    assert_eq!(profile.seed, Some(99));
    assert_eq!(profile.gpus.len(), 3);
    assert_eq!(profile.gpus[0].mig.len(), 4);

    let sampler = MockSampler::builder().profile(profile).build().unwrap();
    let fleet = sampler.fleet();
    assert_eq!(fleet.devices().len(), 2 * 5 + 1);
    let snap = sampler.sample(&SampleRequest::new(MetricSet::everything(), DeviceFilter::all())).unwrap();
    assert_eq!(snap.system.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(snap.system.cuda_driver_version, Some(12040));
    let rtx = snap.devices.last().unwrap();
    assert_eq!(rtx.info.name, "NVIDIA GeForce RTX 4090 D");
    assert_eq!(rtx.power.limit_watts, Some(425.0));
    assert!(rtx.fan_speed.is_none(), "fan switched off by override");
    // The profile's seed drives identities: a different seed gives different UUIDs.
    let other = MockSampler::builder().profile(FleetProfile::load("h100x8").unwrap()).seed(99).build().unwrap();
    assert_eq!(other.fleet().devices()[0].uuid, fleet.devices()[0].uuid, "same seed, same GPU 0 identity");
}

#[test]
fn bad_profiles_name_the_key() {
    let cases: &[(&str, &str)] = &[
        ("[[devices]]\nmodel = \"h100\"\ncuont = 2\n", "cuont"),
        ("naem = \"x\"\n[[devices]]\nmodel = \"h100\"\n", "naem"),
        ("[[devices]]\nmodel = \"h100\"\noverrides = { power_limt = 1.0 }\n", "power_limt"),
        ("[[devices]]\nmodel = \"h100\"\ncount = \"eight\"\n", "count"),
        ("[[devices]]\nmodel = \"b200\"\n", "devices[0].model"),
        ("[[devices]]\nmodel = \"h100\"\n[[devices]]\nmodel = \"a100\"\nmig = [\"9g.99gb\"]\n", "devices[1].mig"),
        ("[[devices]]\nmodel = \"rtx4090\"\nmig = [\"1g.10gb\"]\n", "devices[0].mig"),
        ("[[devices]]\nmodel = \"h100\"\ncount = 65\n", "devices[0].count"),
        ("[[devices]]\nmodel = \"h100\"\ncount = 0\n", "devices[0].count"),
        (
            "[[devices]]\nmodel = \"h100\"\noverrides = { memory_reserved_bytes = 99999999999999 }\n",
            "devices[0].overrides.memory_reserved_bytes",
        ),
        ("devices = []\n", "devices"),
    ];
    for (src, key) in cases {
        let e = FleetProfile::from_toml_str(src, "test").unwrap_err();
        assert_eq!(e.key(), Some(*key), "{src:?} -> {e}");
        assert!(e.to_string().contains(key), "{e}");
    }
    let e = FleetProfile::from_toml_str("[[devices]]\nmodel = \"b200\"\n", "t").unwrap_err();
    assert!(e.to_string().contains("h100-sxm5-80gb") && e.to_string().contains("rtx4090"), "lists known: {e}");
    let e = FleetProfile::from_toml_str("[[devices]\nmodel = 1", "t").unwrap_err();
    assert!(matches!(e, ConfigError::Toml { .. }), "{e}");

    let e = FleetProfile::load("/nonexistent/fleet.toml").unwrap_err();
    assert!(matches!(e, ConfigError::UnknownName { .. }) && e.to_string().contains("h100x8"), "{e}");
}

#[test]
fn scenario_file_drives_the_fleet() {
    let path = temp_file(
        "scenario.toml",
        r#"
        workload = "idle"
        [devices]
        0 = "training"
        [[faults]]
        kind = "ecc_burst"
        device = 1
        at_tick = 0
        "#,
    );
    let scenario = Scenario::load(path.to_str().unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    let f = MockFleet::new(&FleetProfile::load("a100x4").unwrap(), &scenario, 1).unwrap();
    assert_eq!(f.device(0).unwrap().workload(), Workload::Training);
    assert_eq!(f.device(3).unwrap().workload(), Workload::Idle);
    let s = f.sample(0, MetricSet::default().with_stage_inputs(), &DeviceFilter::all());
    assert!(s[0].utilization.gpu.unwrap() > 0.8 && s[2].utilization.gpu.unwrap() < 0.05);
    assert_eq!(s[1].ecc.uncorrected, Some(1));

    // A scenario naming GPUs the fleet lacks is refused, naming the key.
    let two = FleetProfile::load("rtx4090x2").unwrap();
    let one = FleetProfile::load("rtx4090x1").unwrap();
    let e = MockFleet::new(&one, &Scenario::load("ecc-burst").unwrap(), 1).unwrap_err();
    assert_eq!(e.key(), Some("faults[0].device"), "{e}");
    // `lost-gpu` loses GPU 3 in a phase that names only it.
    let e = MockFleet::new(&two, &Scenario::load("lost-gpu").unwrap(), 1).unwrap_err();
    assert_eq!(e.key(), Some("phases[1].gpus"), "{e}");
    let e = MockFleet::new(
        &FleetProfile::load("rtx4090x2").unwrap(),
        &Scenario::new(Workload::Idle).with_device_workload(7, Workload::Training),
        1,
    )
    .unwrap_err();
    assert_eq!(e.key(), Some("devices.7"), "{e}");
}
