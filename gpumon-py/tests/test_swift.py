"""The ms-swift integration without ms-swift installed: fake `swift` modules stand for 3.x
(`swift.plugin.callback.extra_callbacks`) and 4.x (`swift.callbacks.callbacks_map`). The real
`swift sft` run is tests-swift/run.sh's."""

import importlib.util
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("transformers")

from gpumon.integrations import swift as gswift  # noqa: E402
from gpumon.integrations.transformers import GpumonCallback  # noqa: E402


@pytest.fixture
def fake_swift(monkeypatch):
    """Installs a fake ms-swift of the version asked; no `ms-swift` distribution exists in this
    virtualenv, so the version is read from `swift.__version__`."""
    for var in ("GPUMON_SWIFT_BACKEND", "GPUMON_SWIFT_EVERY_N_STEPS", "GPUMON_SWIFT_PER_GPU"):
        monkeypatch.delenv(var, raising=False)

    def install(version):
        swift = types.ModuleType("swift")
        swift.__version__ = version
        monkeypatch.setitem(sys.modules, "swift", swift)
        if version.startswith("4."):
            callbacks = types.ModuleType("swift.callbacks")
            callbacks.callbacks_map = {"lisa": object}
            swift.callbacks = callbacks
            monkeypatch.setitem(sys.modules, "swift.callbacks", callbacks)
        if version.startswith("3."):
            plugin = types.ModuleType("swift.plugin")
            callback = types.ModuleType("swift.plugin.callback")
            callback.extra_callbacks = []
            plugin.callback = callback
            swift.plugin = plugin
            monkeypatch.setitem(sys.modules, "swift.plugin", plugin)
            monkeypatch.setitem(sys.modules, "swift.plugin.callback", callback)
        return swift

    return install


def test_no_ms_swift_distribution_in_the_test_venv():
    # The fakes rely on it: the version then comes from the fake module.
    from importlib import metadata

    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("ms-swift")


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((), {}),
        (("TRAINER",), {}),  # ms-swift 4.0: factory(trainer)
        (("ARGS", "TRAINER"), {}),  # 4.6: factory(args, trainer)
        ((), {"args": "ARGS", "trainer": "TRAINER"}),
        ((), {"trainer": "TRAINER"}),
        (("ARGS",), {"trainer": "TRAINER"}),
    ],
)
def test_every_call_form_gives_a_new_default_callback(fake_swift, args, kwargs):
    first = gswift.gpumon_callback(*args, **kwargs)
    second = gswift.gpumon_callback(*args, **kwargs)
    assert isinstance(first, GpumonCallback) and isinstance(second, GpumonCallback)
    assert first is not second
    assert first.every_n_steps == 1 and first.target is None


@pytest.mark.parametrize("args", [(), ("TRAINER",), ("ARGS", "TRAINER")])
def test_callback_factory_keeps_its_settings_whatever_swift_passes(args):
    make = gswift.callback_factory(every_n_steps=5, backend="mock")
    cb = make(*args, trainer="TRAINER") if not args else make(*args)
    assert isinstance(cb, GpumonCallback) and cb.every_n_steps == 5
    assert make(*args) is not cb


def test_callback_factory_checks_settings_when_made():
    # The 4.x failure the issue saw: the trainer taken for every_n_steps. A bad setting is
    # refused when the factory is made, not at ms-swift's first step.
    with pytest.raises(ValueError, match="every_n_steps"):
        gswift.callback_factory(every_n_steps=0)
    with pytest.raises(ValueError, match="backend"):
        gswift.callback_factory(backend="cuda")


def test_environment_settings(fake_swift, monkeypatch):
    monkeypatch.setenv("GPUMON_SWIFT_EVERY_N_STEPS", "4")
    monkeypatch.setenv("GPUMON_SWIFT_BACKEND", "mock")
    assert gswift.gpumon_callback("ARGS", "TRAINER").every_n_steps == 4
    monkeypatch.setenv("GPUMON_SWIFT_EVERY_N_STEPS", "four")
    with pytest.raises(ValueError, match="GPUMON_SWIFT_EVERY_N_STEPS: 'four'"):
        gswift.gpumon_callback()
    monkeypatch.setenv("GPUMON_SWIFT_EVERY_N_STEPS", "1")
    monkeypatch.setenv("GPUMON_SWIFT_PER_GPU", "yes")
    with pytest.raises(ValueError, match="GPUMON_SWIFT_PER_GPU"):
        gswift.gpumon_callback()


@pytest.mark.parametrize(
    "version, major", [("4.6.0", 4), ("4.0.0", 4), ("3.12.6", 3), ("2.6.1", 2), ("5.0.0rc1", 5), ("v4.1.2", 4)]
)
def test_major_version(version, major):
    assert gswift.swift_major_version(version) == major


def test_unreadable_version():
    with pytest.raises(gswift.SwiftVersionError, match="not a version number"):
        gswift.swift_major_version("main")


def test_installed_version_read_from_the_module(fake_swift):
    fake_swift("4.6.0")
    assert gswift.swift_major_version() == 4


def test_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "swift", None)  # `import swift` raises ImportError
    with pytest.raises(gswift.SwiftVersionError, match="ms-swift is not installed"):
        gswift.register()


@pytest.mark.parametrize("version", ["4.6.0", "4.0.0"])
def test_register_on_4x_fills_callbacks_map(fake_swift, version):
    swift = fake_swift(version)
    how = gswift.register()
    assert "callbacks_map['gpumon']" in how and "--callbacks gpumon" in how
    factory = swift.callbacks.callbacks_map["gpumon"]
    assert factory is gswift.gpumon_callback
    assert swift.callbacks.callbacks_map["lisa"] is object  # others untouched
    # What ms-swift 4.6's trainer mixin does: callbacks_map[name](args, self); 4.0: (self).
    assert isinstance(factory("ARGS", "TRAINER"), GpumonCallback)
    assert isinstance(factory("TRAINER"), GpumonCallback)
    gswift.register()  # replayed in dataloader workers: same result
    assert swift.callbacks.callbacks_map["gpumon"] is factory


def test_register_on_3x_appends_to_extra_callbacks_once(fake_swift):
    swift = fake_swift("3.12.6")
    assert "extra_callbacks" in gswift.register()
    gswift.register()
    extra = swift.plugin.callback.extra_callbacks
    assert len(extra) == 1 and isinstance(extra[0], GpumonCallback)


def test_4x_without_callbacks_map_is_a_clear_error(fake_swift, monkeypatch):
    fake_swift("4.6.0")
    monkeypatch.setitem(sys.modules, "swift.callbacks", None)
    with pytest.raises(gswift.SwiftVersionError, match=r"ms-swift 4.6.0: no swift.callbacks.callbacks_map"):
        gswift.register()


@pytest.mark.parametrize("version", ["2.6.1", "5.0.0", "1.7.3"])
def test_other_versions_are_refused(fake_swift, version):
    swift = fake_swift(version)
    with pytest.raises(gswift.SwiftVersionError, match=rf"ms-swift {version} is not supported: .*3.x and 4.x"):
        gswift.register()
    assert not hasattr(swift, "callbacks") or "gpumon" not in swift.callbacks.callbacks_map


def test_plugin_path_from_the_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "gpumon.integrations.swift", "--plugin-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == gswift.plugin_path() and os.path.isfile(out)
    bad = subprocess.run([sys.executable, "-m", "gpumon.integrations.swift", "--nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--plugin-path" in bad.stderr


def test_plugin_sits_where_it_shadows_no_package():
    # ms-swift inserts the plugin's directory at sys.path[0].
    here = os.path.dirname(gswift.plugin_path())
    assert sorted(f for f in os.listdir(here) if not f.startswith("__pycache__")) == [
        "__init__.py",
        "gpumon_swift_plugin.py",
    ]


def test_plugin_loaded_as_ms_swift_loads_it(fake_swift):
    # swift.utils.import_external_file: spec_from_file_location under a hashed module name.
    swift = fake_swift("4.6.0")
    spec = importlib.util.spec_from_file_location("_swift_external_test", gswift.plugin_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert swift.callbacks.callbacks_map["gpumon"] is gswift.gpumon_callback


def test_plugin_on_an_unsupported_version_fails_loudly(fake_swift):
    fake_swift("5.0.0")
    spec = importlib.util.spec_from_file_location("_swift_external_test5", gswift.plugin_path())
    with pytest.raises(gswift.SwiftVersionError, match="not supported"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
