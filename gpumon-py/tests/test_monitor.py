"""Monitor on the mock backend: snapshot values, steps on the Prometheus endpoint, bad input."""

import json
import ctypes.util
import re
import time

import pytest

import gpumon
from conftest import mark_steps, scrape, series, training_steps, wait_for

H100_MEMORY = 85520809984  # the h100x8 profile's NVIDIA H100 80GB HBM3


def test_snapshot_is_the_mock_fleet(no_rank_env):
    with gpumon.Monitor(backend="mock", interval="100ms") as m:
        assert m.backend == "mock"
        s = m.snapshot()
        assert s["system"]["backend"] == "mock"
        devices = s["devices"]
        assert [d["info"]["index"] for d in devices] == list(range(8))  # h100x8, the default profile
        for d in devices:
            assert d["info"]["name"] == "NVIDIA H100 80GB HBM3"
            assert d["info"]["memory_total_bytes"] == H100_MEMORY
            assert d["memory"]["total"] == H100_MEMORY
            assert d["memory"]["used"] + d["memory"]["free"] + d["memory"]["reserved"] == H100_MEMORY
            assert 0.0 <= d["utilization"]["gpu"] <= 1.0
            assert 0.0 < d["power"]["usage_watts"] <= d["power"]["limit_watts"]
        # The latest tick: later snapshots move on.
        first = s["seq"]
        wait_for("a later tick", lambda: m.snapshot()["seq"] > first)
    assert m.closed


def test_devices_and_rank_select_devices(no_rank_env, monkeypatch):
    with gpumon.Monitor(backend="mock", devices=[0, 2]) as m:
        assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [0, 2]
    with gpumon.Monitor(backend="mock", devices="3") as m:
        assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [3]
    # A rank watches its own GPU: without CUDA_VISIBLE_DEVICES, GPU `rank`.
    with gpumon.Monitor(backend="mock", rank=5) as m:
        assert m.rank == 5
        assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [5]
    # With CUDA_VISIBLE_DEVICES, the rank's entry of it; LOCAL_RANK gives the rank.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with gpumon.Monitor(backend="mock") as m:
        assert m.rank == 1
        assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [7]


def test_twenty_steps_on_the_prometheus_endpoint(no_rank_env):
    # devices="all": a rank alone would watch only its own GPU.
    with gpumon.Monitor(
        backend="mock", interval="100ms", prometheus_listen="127.0.0.1:0", job="pytest", rank=0, devices="all"
    ) as m:
        addr = m.prometheus_address
        started = time.monotonic()
        mark_steps(m, 20, every=0.03)
        elapsed = time.monotonic() - started

        def step_series():
            text = scrape(addr)
            got = series(text, "gpumon_training_step")
            return text if got and got[0][1] == 20 else None

        text = wait_for("gpumon_training_step 20", step_series)
        ((labels, value),) = series(text, "gpumon_training_step")
        assert labels["job"] == "pytest" and labels["rank"] == "0" and labels["backend"] == "mock"
        ((_, duration),) = series(text, "gpumon_step_duration_seconds")
        # Step 20 lasted from mark 19 to mark 20: about the loop's sleep.
        assert 0.02 <= duration <= elapsed
        # Per GPU: every device, with the figures the snapshot's last step report holds.
        snap = m.snapshot()
        (run,) = snap["steps"]["runs"]
        assert (run["job"], run["rank"], run["last_step"]) == ("pytest", 0, 20)
        last = run["last"]
        assert last["step"] == 20
        report = {d["uuid"]: d for d in last["devices"]}
        text = scrape(addr)
        for metric, field in [
            ("gpumon_step_utilization_ratio", "utilization_mean"),
            ("gpumon_step_memory_peak_bytes", "memory_peak_bytes"),
            ("gpumon_step_energy_joules", "energy_joules"),
        ]:
            got = series(text, metric)
            assert len(got) == 8, metric
            for labels, value in got:
                assert labels["job"] == "pytest" and labels["rank"] == "0"
                assert value == pytest.approx(report[labels["uuid"]][field]), (metric, labels)
        for labels, value in series(text, "gpumon_step_utilization_ratio"):
            assert 0.0 <= value <= 1.0
        # The step's utilisation is that of the samples it overlaps: the mock's values of the
        # device at those ticks.
        by_uuid = {d["info"]["uuid"]: d for d in snap["devices"]}
        assert set(report) == set(by_uuid)


def test_step_rejects_bad_marks(no_rank_env):
    with gpumon.Monitor(backend="mock") as m:
        m.step(0)
        m.step(5)
        with pytest.raises(ValueError, match="negative"):
            m.step(-1)
        with pytest.raises(ValueError, match="not after"):
            m.step(5)
        with pytest.raises(ValueError, match="not after"):
            m.step(3)
        with pytest.raises(TypeError):
            m.step("6")
        # A bool is an int to Python, but step(True) is no step number; nor is a float.
        with pytest.raises(TypeError, match="got a bool"):
            m.step(True)
        with pytest.raises(TypeError, match="got float"):
            m.step(6.0)
        assert m.last_step == 5
        m.step(6)
        assert m.last_step == 6
    with pytest.raises(gpumon.GpumonError, match="closed"):
        m.step(7)
    with pytest.raises(gpumon.GpumonError, match="closed"):
        m.snapshot()
    m.close()  # a second close does nothing


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(devices="9"), r"devices: `9` matches no device of this node \(8 GPUs, indices 0-7\)"),
        (dict(devices=[0, 9]), r"devices: `9` matches no device"),
        (dict(devices="GPU-no-such-uuid"), r"`GPU-no-such-uuid` matches no device"),
        (dict(rank=9), r"rank 9 .*: `9` matches no device"),
        (dict(devices="8", mock_profile="a100x8-mig"), r"`8` matches no device"),
    ],
)
def test_a_device_the_node_lacks_is_an_error(no_rank_env, kwargs, match):
    # devices="9" on an 8-GPU node used to start and show empty snapshots.
    with pytest.raises(ValueError, match=match):
        gpumon.Monitor(backend="mock", **kwargs)


def test_mig_instances_and_uuids_are_selectable(no_rank_env):
    with gpumon.Monitor(backend="mock", mock_profile="a100x8-mig", devices="0:0") as m:
        (d,) = m.snapshot()["devices"]
        assert d["info"]["index"] == 0 and d["info"]["mig"]["mig_index"] == 0
    with gpumon.Monitor(backend="mock") as m:
        uuid = m.snapshot()["devices"][3]["info"]["uuid"]
    with gpumon.Monitor(backend="mock", devices=[uuid]) as m:
        assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [3]


def test_exceptions_are_gpumons_and_pickle(no_rank_env):
    import pickle

    assert gpumon.GpumonError.__module__ == "gpumon"
    assert issubclass(gpumon.BackendUnavailableError, gpumon.GpumonError)
    m = gpumon.Monitor(backend="mock")
    m.close()
    with pytest.raises(gpumon.GpumonError) as raised:
        m.step(1)
    again = pickle.loads(pickle.dumps(raised.value))
    assert type(again) is gpumon.GpumonError and str(again) == str(raised.value)
    e = pickle.loads(pickle.dumps(gpumon.BackendUnavailableError("no NVML")))
    assert type(e) is gpumon.BackendUnavailableError and e.args == ("no NVML",)


def test_an_exception_leaving_a_temporary_monitor_is_kept(no_rank_env):
    # The temporary is dropped (and closed) while the exception leaves the call: closing it used
    # to clear the exception ("SystemError: error return without exception set").
    import pickle

    with pytest.raises(ValueError, match="step: -1 is negative"):
        gpumon.Monitor(backend="mock", devices="0").step(-1)
    with pytest.raises(TypeError, match="Monitor"):
        pickle.dumps(gpumon.Monitor(backend="mock", devices="0"))


def _raise_in_worker(_):
    import gpumon as g

    m = g.Monitor(backend="mock")
    m.close()
    m.step(1)  # raises GpumonError in the worker


def test_an_error_in_a_worker_process_reaches_the_parent(no_rank_env):
    # multiprocessing sends a worker's exception back pickled: it must arrive as itself.
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        with pytest.raises(gpumon.GpumonError, match="closed"):
            pool.map(_raise_in_worker, [0])


def test_flush_reports_the_steps_marked_since_the_last_tick(no_rank_env):
    # A 10 s interval: no tick comes on its own during the test after the first.
    with gpumon.Monitor(backend="mock", interval="10s", prometheus_listen="127.0.0.1:0", job="f", rank=0,
                        devices="all") as m:
        mark_steps(m, 5, every=0.02)
        m.flush()
        assert training_steps(m.prometheus_address) == [5.0]
        with pytest.raises(ValueError, match="timeout"):
            m.flush(timeout="soon")
        m.flush(timeout=2.5)
    with pytest.raises(gpumon.GpumonError, match="closed"):
        m.flush()


def test_a_port_in_use_raises_gpumon_error(no_rank_env):
    with gpumon.Monitor(backend="mock", prometheus_listen="127.0.0.1:0") as first:
        with pytest.raises(gpumon.GpumonError, match="prometheus_listen"):
            gpumon.Monitor(backend="mock", prometheus_listen=first.prometheus_address)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(backend="cuda"), "backend: unknown backend `cuda`"),
        (dict(interval="fast"), "interval"),
        (dict(interval="1ms"), "interval: .* below the minimum"),
        (dict(interval=-1), "interval"),
        (dict(prometheus_listen="localhost"), "prometheus_listen"),
        (dict(influx_db="gpumon"), "influx_db: given without influx_url"),
        (dict(influx_url="http://127.0.0.1:18086"), "^influx_db: required with influx_url `http://127.0.0.1:18086`"),
        (dict(devices="zero"), "devices"),
        (dict(devices=[]), "devices"),
        (dict(rank=-1), "rank"),
        (dict(job=""), "job"),
        (dict(job="a\nb"), "job"),
        (dict(mock_profile="no-such-profile"), "mock_profile"),
        (dict(mock_scenario="no-such-scenario"), "mock_scenario"),
    ],
)
def test_bad_arguments_raise_value_error(no_rank_env, kwargs, match):
    kwargs.setdefault("backend", "mock")
    with pytest.raises(ValueError, match=match) as e:
        gpumon.Monitor(**kwargs)
    # Every message names the Monitor's own arguments, never a key of the agent's config file
    # that the Monitor has no argument for.
    assert not re.search(r"`(bucket|org|token|db)`", str(e.value)), e.value


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(interval=True), "interval: .* got a bool"),
        (dict(rank=True), "rank: expected an int, got a bool"),
        (dict(devices=True), "devices: .* got a bool"),
        (dict(devices=[True]), "devices: .* got a bool"),
        (dict(devices=[0, False]), "devices: .* got a bool"),
        (dict(rank=1.0), "rank: expected an int, got float"),
    ],
)
def test_bools_and_floats_are_no_numbers(no_rank_env, kwargs, match):
    # `True` is an int to Python: it used to be 1 s, rank 1 or GPU 1.
    with pytest.raises(TypeError, match=match):
        gpumon.Monitor(backend="mock", **kwargs)


@pytest.mark.parametrize(
    "env, kwargs, match",
    [
        ({}, dict(devices=""), "devices: `` selects no GPU"),
        ({}, dict(devices="none"), "devices: `none` selects no GPU"),
        ({"CUDA_VISIBLE_DEVICES": ""}, {}, "environment CUDA_VISIBLE_DEVICES=`` hides every GPU"),
        ({"CUDA_VISIBLE_DEVICES": "", "LOCAL_RANK": "1"}, {}, r"rank 1 \(LOCAL_RANK\) has no device"),
        ({"CUDA_VISIBLE_DEVICES": "void", "LOCAL_RANK": "0"}, {}, r"rank 0 \(LOCAL_RANK\) has no device"),
        ({"CUDA_VISIBLE_DEVICES": ""}, dict(rank=0), r"rank 0 \(LOCAL_RANK\) has no device"),
    ],
)
def test_a_selection_of_no_gpu_is_an_error(no_rank_env, monkeypatch, env, kwargs, match):
    # These used to start a Monitor that watched nothing.
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=match):
        gpumon.Monitor(backend="mock", **kwargs)
    # devices= still chooses GPUs whatever the environment hides.
    with gpumon.Monitor(backend="mock", devices="1") as m:
        assert [d["info"]["index"] for d in m.snapshot()["devices"]] == [1]


def test_step_range_and_the_order_of_errors(no_rank_env):
    with gpumon.Monitor(backend="mock", devices="0") as m:
        # Every step the tracker stores is taken (2**63 used to be "expected an int, got int").
        with pytest.raises(ValueError, match=r"step: 18446744073709551616 is out of range \(0 to 18446744073709551614\)"):
            m.step(2**64)
        with pytest.raises(ValueError, match="step: 18446744073709551615 is out of range"):
            m.step(2**64 - 1)
        with pytest.raises(ValueError, match=r"step: -36893488147419103232 is negative"):
            m.step(-(2**65))
        m.step(2**63)
        assert m.last_step == 2**63
        with pytest.raises(TypeError, match="timeout: .* got a bool"):
            m.flush(timeout=True)
    # A closed Monitor takes no mark, whatever the argument: GpumonError first.
    for n in (2**63 + 1, 2**64, -1, True, "1"):
        with pytest.raises(gpumon.GpumonError, match="closed"):
            m.step(n)


def test_bad_local_rank_names_the_variable(no_rank_env, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "first")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        gpumon.Monitor(backend="mock")


NO_NVML = ctypes.util.find_library("nvidia-ml") is None


@pytest.mark.skipif(not NO_NVML, reason="this machine has libnvidia-ml: the no-NVML rule cannot be seen")
def test_nvml_without_nvml_raises(no_rank_env):
    with pytest.raises(gpumon.BackendUnavailableError, match="NVML"):
        gpumon.Monitor(backend="nvml")


@pytest.mark.skipif(not NO_NVML, reason="this machine has libnvidia-ml: the no-NVML rule cannot be seen")
def test_auto_falls_back_to_the_mock_only_without_exporting_sinks(no_rank_env):
    with gpumon.Monitor() as m:
        assert m.backend == "mock"
        assert m.snapshot()["system"]["backend"] == "mock"
    # Exporting: no simulated data leaves the process; the endpoint says there is no GPU data.
    with gpumon.Monitor(prometheus_listen="127.0.0.1:0", interval="100ms") as m:
        assert m.backend == "nvml"
        time.sleep(0.5)
        text = scrape(m.prometheus_address)
        assert 'backend="mock"' not in text
        assert series(text, "gpumon_gpu_utilization_ratio") == []
        assert [v for _, v in series(text, "gpumon_up")] == [0.0]


def test_mock_data_is_marked_on_every_series(no_rank_env):
    with gpumon.Monitor(backend="mock", prometheus_listen="127.0.0.1:0", interval="100ms") as m:
        m.step(1)
        text = wait_for("a scrape with GPU series", lambda: (t := scrape(m.prometheus_address)) and "gpumon_gpu" in t and t)
        gpu_lines = [l for l in text.splitlines() if l.startswith("gpumon_gpu")]
        assert gpu_lines and all('backend="mock"' in l for l in gpu_lines)


@pytest.mark.skipif(not NO_NVML, reason="this machine has libnvidia-ml: the no-NVML rule cannot be seen")
def test_without_nvml_an_exporting_monitor_flushes_and_says_why_it_has_no_snapshot(no_rank_env):
    # backend="auto" with a sink and no NVML: gpumon_up 0, NVML retried. flush() flushes the
    # sinks and does not raise for the missing GPU data; snapshot() has none to give.
    with gpumon.Monitor(prometheus_listen="127.0.0.1:0", interval="100ms") as m:
        assert m.backend == "nvml"
        m.step(1)
        m.flush()
        with pytest.raises(gpumon.GpumonError, match=r"snapshot: no GPU data: .*gpumon_up 0 and retries NVML"):
            m.snapshot()
        assert [v for _, v in series(scrape(m.prometheus_address), "gpumon_up")] == [0.0]


# --- diagnosis, findings and the run report (#44: findings reach Python) --------------------------


def test_a_monitor_diagnoses_unless_gpumon_run_watches_the_job(no_rank_env, monkeypatch):
    with gpumon.Monitor(backend="mock", devices="0") as m:
        assert m.diagnose
    monkeypatch.setenv("GPUMON_STEPS_SOCKET", "/run/gpumon-run.sock")
    with gpumon.Monitor(backend="mock", devices="0") as m:
        assert not m.diagnose  # gpumon-run's agent diagnoses the job's GPUs
        assert m.finding_events() == []
    with gpumon.Monitor(backend="mock", devices="0", diagnose=True) as m:
        assert m.diagnose
    with pytest.raises(ValueError, match="^diagnose_window"):
        gpumon.Monitor(backend="mock", devices="0", diagnose=False, diagnose_window="5s")
    with pytest.raises(ValueError, match="^diagnose_window"):
        gpumon.Monitor(backend="mock", devices="0", interval="1s", diagnose_window="2s")  # < 5 ticks


def test_findings_raised_reach_python_once_each(no_rank_env):
    # ecc-burst: GPU 1's uncorrectable ECC errors at tick 10 raise hardware_errors at once.
    with gpumon.Monitor(backend="mock", interval="100ms", mock_scenario="ecc-burst", devices="1",
                        diagnose_window="1s") as m:
        events = wait_for("a finding raised", lambda: m.finding_events(), timeout=20)
        assert m.finding_events() == []  # taken: each event once
        assert m.findings_dropped == 0
        report = m.report()
    (event,) = events
    assert event["transition"] == "raised"
    assert event["finding"]["kind"] == "hardware_errors" and event["finding"]["gpu"] == 1
    assert "ECC" in event["finding"]["evidence"] and event["finding"]["advice"]
    # The run report names it as gpumon-run's does.
    assert "hardware_errors" in report


def test_report_is_the_run_report_gpumon_run_prints(no_rank_env):
    m = gpumon.Monitor(backend="mock", interval="100ms", devices="0,1", job="rep")
    mark_steps(m, 4, 0.2)
    text = m.report()  # open: the steps marked so far are reported first
    assert text.startswith("gpumon run report: host "), text
    assert " (MOCK backend: simulated GPUs), " in text
    assert "\nsteps                   4 step(s)" in text, text
    m.close()
    data = json.loads(m.report(format="json"))  # after close: the whole run's
    assert len(data["gpus"]) == 2
    assert data["steps"]["runs"][0]["last_step"] == 4
    with pytest.raises(ValueError, match="format"):
        m.report(format="html")
