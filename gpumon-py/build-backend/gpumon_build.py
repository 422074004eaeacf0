"""The PEP 517 build backend of gpumon-nvml: maturin, with two things pip's users need when they
build from source (an sdist, or `pip install ./gpumon-py`):

- without a Rust toolchain, one line saying so and what to do, instead of maturin's traceback;
- a line saying that a Rust build is starting and how long it takes, written to the terminal
  (pip hides a backend's output unless `-v`, so a several-minute build looked hung).

Everything else is maturin's own hooks, unchanged.
"""

import os
import shutil
import sys

import maturin as _maturin
from maturin import (  # noqa: F401  (re-exported hooks)
    build_sdist,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)

# The workspace's rust-version (Cargo.toml); checked there by cargo itself.
_NO_RUST = (
    "gpumon-nvml: building from source needs a Rust toolchain (cargo was not found on PATH): "
    "install Rust (rustup, or Debian's `cargo` package) and retry, or install a prebuilt wheel "
    "(pip install --only-binary gpumon-nvml gpumon-nvml)"
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


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _need_cargo()
    return _maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _need_cargo()
    _announce()
    return _maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _need_cargo()
    return _maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _need_cargo()
    _announce()
    return _maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    return _maturin.get_requires_for_build_editable(config_settings)
