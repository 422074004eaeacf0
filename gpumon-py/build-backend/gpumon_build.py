"""The PEP 517 build backend of gpumon-nvml: maturin, with two things pip's users need when they
build from source (an sdist, or `pip install ./gpumon-py`):

- without a Rust toolchain, one line saying so and what to do, instead of maturin's traceback;
- a line saying that a Rust build is starting and how long it takes, written to the terminal
  (pip hides a backend's output unless `-v`, so a several-minute build looked hung).

Everything else is maturin's own hooks, unchanged.
"""

import functools
import os
import shutil
import sys

import maturin as _maturin
from maturin import (  # noqa: F401  (re-exported hooks)
    build_sdist,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)

# What exists today: nothing is published on PyPI under `gpumon-nvml` yet (the name it will be
# published under), so no prebuilt wheel can be suggested from an index; the wheel is built by
# gpumon-py/build-wheel.sh. The build needs the workspace's rust-version (Cargo.toml), newer than
# what Debian's and Ubuntu's `cargo` packages ship (1.63 in Debian 12): rustup installs it.
# tests/test_packaging.py holds this text to the workspace's rust-version.
RUST_VERSION = "1.88"
_NO_RUST = (
    "gpumon-nvml: building from source needs Rust " + RUST_VERSION + " or newer (cargo was not found on PATH): "
    "install it with rustup (https://rustup.rs; Debian's `cargo` package, rustc 1.63, is too old) and retry, "
    "or install a wheel built by gpumon-py/build-wheel.sh (pip install gpumon_nvml-*.whl; nothing is "
    "published on PyPI under gpumon-nvml yet)"
)


def _need_cargo() -> None:
    if shutil.which(os.environ.get("CARGO", "cargo")) is None:
        sys.stderr.write(_NO_RUST + "\n")
        raise SystemExit(1)


def _announce() -> None:
    msg = (
        "gpumon-nvml: compiling the Rust extension (about 6 minutes on 2 cores; "
        "`pip install -v` shows cargo's progress)\n"
    )
    sys.stderr.write(msg)
    try:  # pip captures our stderr; the terminal, if there is one, sees the line now
        with open("/dev/tty", "w") as tty:
            tty.write(msg)
    except OSError:
        pass


def _checked(hook, announce=False):
    """maturin's ``hook``, run once cargo is known to be there (and, for a hook that compiles,
    after saying so)."""

    @functools.wraps(hook)
    def run(*args, **kwargs):
        _need_cargo()
        if announce:
            _announce()
        return hook(*args, **kwargs)

    return run


prepare_metadata_for_build_wheel = _checked(_maturin.prepare_metadata_for_build_wheel)
build_wheel = _checked(_maturin.build_wheel, announce=True)
prepare_metadata_for_build_editable = _checked(_maturin.prepare_metadata_for_build_editable)
build_editable = _checked(_maturin.build_editable, announce=True)


def get_requires_for_build_editable(config_settings=None):
    return _maturin.get_requires_for_build_editable(config_settings)
