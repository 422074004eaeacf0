#!/usr/bin/env python3
"""Record what every NVML function the fake implements returns, and compare two records.

    scripts/fake-nvml-surface.py record [OUT.json]     # on the NVML found by nvidia-ml-py
    scripts/fake-nvml-surface.py compare REAL.json FAKE.json

`record` calls each row of tests-python/test_surface.py's TABLE (the fake's whole implemented
surface, NVLink rows once per link) on every GPU and stores, per GPU and function, whether it is
supported and the class of its value: `err:<NVML error name>`, or `ok:<type>` with `zero` /
`nonzero` for numbers and the length for lists. Values themselves are kept too, for reading.
Run it on a GPU host (scripts/fake-nvml-gpu-check.sh does) and under the fake with the profile of
that model (LD_LIBRARY_PATH=$(scripts/fake-nvml-dir.sh) GPUMON_FAKE_NVML_PROFILE=h200x1 …);
`compare` prints where support or value class differ: what the fake's profile gets wrong.
Needs nvidia-ml-py (the test venv has it).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests-python"))


def value_class(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "zero" if v == 0 else "nonzero"
    if isinstance(v, (bytes, str)):
        return "str" if v else "empty-str"
    if isinstance(v, (list, tuple)):
        return f"list[{len(v)}]:" + ",".join(value_class(x) for x in v)
    if isinstance(v, dict):
        return "dict:" + ",".join(f"{k}={value_class(x)}" for k, x in sorted(v.items()))
    return "none" if v is None else type(v).__name__


def record():
    import pynvml as N
    from test_surface import TABLE, PER_LINK

    errors = {getattr(N, k): k for k in dir(N) if k.startswith("NVML_ERROR_")}

    def call(expr, h, link=None):
        try:
            v = eval(expr, {"N": N, "h": h, "L": link})  # noqa: S307 - our own table
            if isinstance(v, bytes):
                v = v.decode(errors="replace")
            return {"class": "ok:" + value_class(v), "value": v}
        except N.NVMLError as e:
            return {"class": "err:" + errors.get(e.value, str(e.value))}

    N.nvmlInit()
    out = {"driver": N.nvmlSystemGetDriverVersion(), "devices": []}
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        dev = {"index": i, "name": N.nvmlDeviceGetName(h), "functions": {}}
        count = call("N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal", h)
        links = range(count.get("value") or 0) or [0]
        for name, (expr, _) in TABLE.items():
            if name in PER_LINK:
                dev["functions"][name] = [call(expr, h, link) for link in links]
            else:
                dev["functions"][name] = call(expr, h)
        out["devices"].append(dev)
    N.nvmlShutdown()
    return out


def classes(entry):
    if isinstance(entry, list):
        kinds = sorted({e["class"] for e in entry})
        return f"{len(entry)} link(s): " + " | ".join(kinds)
    return entry["class"]


def compare(real, fake):
    diffs = 0
    print(f"real driver {real['driver']}, fake driver {fake['driver']}")
    for r, f in zip(real["devices"], fake["devices"]):
        print(f"\nGPU {r['index']}: real {r['name']!r}, fake {f['name']!r}")
        for name in sorted(set(r["functions"]) | set(f["functions"])):
            a = classes(r["functions"][name]) if name in r["functions"] else "absent"
            b = classes(f["functions"][name]) if name in f["functions"] else "absent"
            if a != b:
                diffs += 1
                print(f"  {name}: real {a}  /  fake {b}")
    if len(real["devices"]) != len(fake["devices"]):
        print(f"\nGPU count differs: real {len(real['devices'])}, fake {len(fake['devices'])}")
        diffs += 1
    print(f"\n{diffs} difference(s)")
    return diffs


def main(argv):
    if len(argv) >= 2 and argv[1] == "record":
        data = json.dumps(record(), indent=1, default=str)
        if len(argv) > 2:
            open(argv[2], "w").write(data + "\n")
        else:
            print(data)
        return 0
    if len(argv) == 4 and argv[1] == "compare":
        return 1 if compare(json.load(open(argv[2])), json.load(open(argv[3]))) else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
