#!/usr/bin/env python3
"""Locate NVIDIA's nvml.h for the fake's generator and layout test.

NVIDIA's header is not vendored in this repository (its license grants use, not clearly
redistribution), so it is fetched from PyPI (`nvidia-nvml-dev`, which ships only nvml.h) into
a cache directory on first use.

Usage: nvml_header.py [CACHE_DIR]   -> prints the path of nvml.h, exit 1 if unavailable.
Honours $GPUMON_NVML_H (a path to nvml.h) first.
"""
import os
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "nvidia-nvml-dev"


def find(cache_dir):
    env = os.environ.get("GPUMON_NVML_H")
    if env and os.path.isfile(env):
        return env
    target = os.path.join(cache_dir, "nvml.h")
    if os.path.isfile(target):
        return target
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, PACKAGE]
        try:
            subprocess.run(cmd, check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except (subprocess.SubprocessError, OSError) as e:
            print(f"nvml_header.py: cannot download {PACKAGE}: {e}", file=sys.stderr)
            return None
        for name in os.listdir(tmp):
            if not name.endswith(".whl"):
                continue
            with zipfile.ZipFile(os.path.join(tmp, name)) as z:
                for member in z.namelist():
                    if member.endswith("/nvml.h"):
                        with z.open(member) as src, open(target + ".part", "wb") as dst:
                            dst.write(src.read())
                        os.replace(target + ".part", target)
                        with open(os.path.join(cache_dir, "SOURCE"), "w") as f:
                            f.write(f"{name} ({member}), downloaded from PyPI by tools/nvml_header.py\n")
                        return target
    print(f"nvml_header.py: no nvml.h in the {PACKAGE} wheel", file=sys.stderr)
    return None


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    default_cache = os.path.join(here, "..", "..", "..", "target", "fake-nvml-header")
    path = find(sys.argv[1] if len(sys.argv) > 1 else default_cache)
    if not path:
        sys.exit(1)
    print(os.path.abspath(path))
