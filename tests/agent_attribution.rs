//! The example agent's attribution settings as a user meets them: bad keys and paths are
//! configuration errors (exit 2) naming the key, and a run with `--attribution` reads a fixture
//! proc root. (With real processes on the fake libnvidia-ml: fake-nvml/tests/
//! agent_attribution.rs.)
#![cfg(all(feature = "agent", feature = "stdout"))]

mod common;
use common::{agent, mock_once, proc_root_owning, run};

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumon-agent-attribution-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn bad_attribution_settings_exit_2_naming_the_key() {
    let dir = temp_dir("config");
    let mut cases = vec![
        ("[attribution]\nenabled = true\nproc_root = \"/nonexistent/proc\"\n", "attribution.proc_root"),
        ("[attribution]\nenabled = true\npasswd_file = \"/nonexistent/passwd\"\n", "attribution.passwd_file"),
        ("[attribution]\nkubelet_refresh = \"0s\"\n", "attribution.kubelet_refresh"),
        ("[attribution]\nenable = true\n", "enable"),
        ("[attribution]\nenabled = true\n[agent]\ndisable = [\"processes\"]\n", "processes"),
    ];
    if !cfg!(feature = "kubelet") {
        // A build without the kubelet client refuses to be asked for it.
        cases.push(("[attribution]\nkubelet = true\n", "attribution.kubelet"));
    }
    for (i, (text, key)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let (code, _, stderr) = run(agent().args(["--backend", "mock", "--once", "--config"]).arg(&path));
        assert_eq!(code, 2, "{text}: {stderr}");
        assert!(stderr.contains(key), "{text}: {stderr}");
    }
    let (code, _, stderr) =
        run(agent().args(["--backend", "mock", "--once", "--attribution", "--proc-root", "/nonexistent"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--proc-root"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn attribution_turns_on_processes_and_reads_the_proc_root_it_is_given() {
    // The mock's process tables name simulated pids; a fixture proc root gives one of them
    // (GPU 0's first process, whichever pid it is) an owner.
    let plain = mock_once(agent().args(["--enable", "processes"]));
    let pid = plain.devices[0].processes.first().expect("the mock's GPU 0 has processes").pid;
    assert!(
        plain.output::<gpumon::core::attribution::AttributionSummary>().is_none() && plain.devices[0].owners.is_empty()
    );

    let dir = temp_dir("run");
    let (proc_root, passwd) = proc_root_owning(&dir, pid, "carol");
    let snap =
        mock_once(agent().args(["--attribution", "--proc-root"]).arg(proc_root).arg("--passwd-file").arg(passwd));
    let gpu = &snap.devices[0];
    let owner = gpu.process(pid).and_then(|p| p.owner.as_ref()).expect("the fixture's process has an owner");
    assert_eq!(owner.user.as_deref(), Some("carol"));
    assert_eq!(owner.unit.as_deref(), Some("session-7.scope"));
    assert!(gpu.owners.iter().any(|o| o.user.as_deref() == Some("carol")));
    // The other simulated pids are not in the fixture: counted, not fatal.
    let pids: std::collections::HashSet<u32> =
        snap.devices.iter().flat_map(|d| d.processes.iter().map(|p| p.pid)).collect();
    assert_eq!(
        snap.output::<gpumon::core::attribution::AttributionSummary>().cloned().unwrap().proc_read_failures,
        pids.len() as u64 - 1
    );
    let _ = std::fs::remove_dir_all(dir);
}
