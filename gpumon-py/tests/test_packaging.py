"""The distribution as people get it: the wheel run-tests.sh built (release, stripped,
manylinux2014, abi3) is what this virtualenv imports, and the sdist without Rust says so in one
line. GPUMON_TEST_WHEEL / GPUMON_TEST_SDIST / GPUMON_TEST_NORUST_PATH come from run-tests.sh."""

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile

import pytest

import gpumon

WHEEL = os.environ.get("GPUMON_TEST_WHEEL")
SDIST = os.environ.get("GPUMON_TEST_SDIST")
NORUST_PATH = os.environ.get("GPUMON_TEST_NORUST_PATH")


@pytest.mark.skipif(not WHEEL, reason="needs gpumon-py/run-tests.sh (GPUMON_TEST_WHEEL unset)")
def test_the_installed_package_is_the_wheel():
    name = os.path.basename(WHEEL)
    # abi3 for CPython >= 3.9, manylinux 2.17 (glibc 2.17): installable beyond this machine.
    assert "-cp39-abi3-" in name and "manylinux_2_17_x86_64" in name and "manylinux2014_x86_64" in name, name
    dist = importlib.metadata.distribution("gpumon-nvml")
    assert dist.version == gpumon.__version__
    with zipfile.ZipFile(WHEEL) as z:
        wheel_files = {i.filename: i.file_size for i in z.infolist()}
    (ext,) = [f for f in wheel_files if f.startswith("gpumon/_gpumon") and f.endswith(".so")]
    installed = os.path.join(os.path.dirname(gpumon.__file__), os.path.basename(ext))
    assert os.path.getsize(installed) == wheel_files[ext]
    # Stripped: no symbol table, no DWARF (43 MB with debug information before).
    sections = subprocess.run(["readelf", "-S", "-W", installed], capture_output=True, text=True, check=True).stdout
    assert ".symtab" not in sections and ".debug_info" not in sections
    assert wheel_files[ext] < 20 * 1024 * 1024, wheel_files[ext]


@pytest.mark.skipif(not (SDIST and NORUST_PATH), reason="needs gpumon-py/run-tests.sh (GPUMON_TEST_SDIST unset)")
def test_the_sdist_without_rust_says_so_in_one_line(tmp_path):
    env = dict(os.environ, PATH=NORUST_PATH, PIP_NO_INDEX="1")
    env.pop("CARGO", None)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target", str(tmp_path), SDIST],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert p.returncode != 0
    out = p.stdout + p.stderr
    lines = [l for l in out.splitlines() if "building from source needs Rust" in l]
    assert len(lines) == 1, out
    # Honest: no index has the package, Debian's cargo cannot build it, rustup can.
    assert "rustup" in lines[0] and "build-wheel.sh" in lines[0] and "nothing is published" in lines[0]
    assert "--only-binary" not in lines[0] and "Debian's `cargo` package, rustc 1.63, is too old" in lines[0]
    assert "Traceback" not in out, out


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rust_version():
    with open(os.path.join(REPO, "Cargo.toml")) as f:
        return re.search(r'^rust-version = "([0-9.]+)"', f.read(), re.M).group(1)


def test_the_install_text_says_what_exists():
    # Nothing is published under gpumon-nvml yet: no page tells a user to `pip install
    # gpumon-nvml` as if it were, each names the Rust version the build needs and rustup.
    version = _rust_version()
    for rel in ("docs/run.md", "gpumon-py/README.md", "gpumon-py/build-backend/gpumon_build.py"):
        with open(os.path.join(REPO, rel)) as f:
            text = f.read()
        assert not re.search(r"pip install (--only-binary \S+ )?gpumon-nvml\b(?!-)", text), rel
        assert "not published" in text or "nothing is published" in text.lower(), rel
        assert version in text and "rustup" in text, rel


def test_the_binding_uses_the_facade_only():
    # #43: gpumon-py reaches the inner crates through `gpumon` (gpumon::core, gpumon::sinks).
    with open(os.path.join(REPO, "gpumon-py", "Cargo.toml")) as f:
        manifest = f.read()
    deps = manifest.split("[dependencies]", 1)[1]
    assert not re.search(r"^gpumon-(core|sinks|mock)\s*=", deps, re.M), deps
    src = os.path.join(REPO, "gpumon-py", "src")
    for root, _, files in os.walk(src):
        for name in files:
            with open(os.path.join(root, name)) as f:
                code = f.read()
            assert not re.search(r"\bgpumon_(core|sinks|mock)::", code), name
