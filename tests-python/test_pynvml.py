"""NVIDIA's nvidia-ml-py (pynvml), unmodified, reads the fake and gets the profile's values."""
import json
import unittest

import fakenvml

READ_ALL = r'''
import json, pynvml as N
def ns(f):
    """None where NVML says NotSupported (e.g. a MIG parent's utilisation, a GeForce serial)."""
    try:
        return f()
    except N.NVMLError_NotSupported:
        return None
N.nvmlInit()
out = {"driver": N.nvmlSystemGetDriverVersion(), "count": N.nvmlDeviceGetCount(),
       "cuda": N.nvmlSystemGetCudaDriverVersion_v2(), "devices": []}
for i in range(out["count"]):
    h = N.nvmlDeviceGetHandleByIndex(i)
    u = ns(lambda: N.nvmlDeviceGetUtilizationRates(h))
    m1 = N.nvmlDeviceGetMemoryInfo(h)
    m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    procs = N.nvmlDeviceGetComputeRunningProcesses(h)
    out["devices"].append({
        "index": N.nvmlDeviceGetIndex(h),
        "name": N.nvmlDeviceGetName(h),
        "uuid": N.nvmlDeviceGetUUID(h),
        "serial": ns(lambda: N.nvmlDeviceGetSerial(h)),
        "pci_bus_id": N.nvmlDeviceGetPciInfo(h).busId,
        "util": u and [u.gpu, u.memory],
        "mem_v1": [m1.total, m1.free, m1.used],
        "mem_v2": [m2.total, m2.reserved, m2.free, m2.used],
        "temp": ns(lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)),
        "power": ns(lambda: N.nvmlDeviceGetPowerUsage(h)),
        "limit": ns(lambda: N.nvmlDeviceGetEnforcedPowerLimit(h)),
        "energy": ns(lambda: N.nvmlDeviceGetTotalEnergyConsumption(h)),
        "sm_clock": ns(lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)),
        "pstate": ns(lambda: N.nvmlDeviceGetPerformanceState(h)),
        "fan": ns(lambda: N.nvmlDeviceGetFanSpeed(h)),
        "enc": ns(lambda: N.nvmlDeviceGetEncoderUtilization(h)[0]),
        "dec": ns(lambda: N.nvmlDeviceGetDecoderUtilization(h)[0]),
        "procs": [[p.pid, p.usedGpuMemory] for p in procs],
        "proc_names": [N.nvmlSystemGetProcessName(p.pid) for p in procs],
    })
N.nvmlShutdown()
print(json.dumps(out))
'''

# READ_ALL's field -> the expected device's key or a function of it[, why the value is so].
FIELDS = [
    ("index", "index"),
    ("name", "name"),
    ("uuid", "uuid"),
    ("pci_bus_id", "pci_bus_id"),
    ("serial", "serial", "GeForce boards have none: NotSupported"),
    ("util", lambda w: w["utilization"] and [w["utilization"]["gpu"], w["utilization"]["memory"]]),
    ("mem_v1", lambda w: [w["memory"]["total"], w["memory"]["free"], w["memory"]["v1_used"]], "v1 counts reserved as used"),
    ("mem_v2", lambda w: [w["memory"][k] for k in ("total", "reserved", "free", "used")]),
    ("temp", "temperature"),
    ("power", "power_mw"),
    ("limit", "power_limit_mw"),
    ("energy", "energy_mj"),
    ("sm_clock", lambda w: w["clocks_mhz"]["sm"]),
    ("pstate", "pstate"),
    ("fan", "fan"),
    ("enc", "encoder"),
    ("dec", "decoder"),
    ("procs", lambda w: [[p["pid"], p["used_memory"]] for p in w["processes"]]),
    ("proc_names", lambda w: [p["name"] for p in w["processes"]]),
]


class PynvmlReadsTheProfile(unittest.TestCase):
    def check(self, profile, tick=0):
        got = fakenvml.run_python(READ_ALL, profile=profile, tick=tick)
        want = fakenvml.expected(profile=profile, tick=tick)
        gpus = fakenvml.physical_gpus(want)
        self.assertEqual(got["count"], want["device_count"])
        self.assertEqual(got["driver"], want["driver_version"])
        self.assertEqual(got["cuda"], want["cuda_driver_version"])
        fakenvml.assert_each_gpu(self, profile, got["devices"], gpus, FIELDS)

    def test_default_fleet_is_h100x8(self):
        got = fakenvml.run_python(
            "import json, pynvml as N; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0);"
            "print(json.dumps([N.nvmlDeviceGetCount(), N.nvmlDeviceGetName(h)]))",
            profile="h100x8",
        )
        self.assertEqual(got, [8, "NVIDIA H100 80GB HBM3"])

    def test_h100x8(self):
        self.check("h100x8")

    def test_h100x8_later_tick(self):
        self.check("h100x8", tick=9)

    def test_rtx4090x2_has_a_fan_and_an_encoder(self):
        self.check("rtx4090x2")

    def test_mixed_fleet(self):
        self.check("mixed")

    def test_unimplemented_function_is_not_supported(self):
        got = fakenvml.run_python(
            "import json, pynvml as N; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)\n"
            "try:\n    N.nvmlDeviceGetBrand(h); r = 'ok'\nexcept N.NVMLError_NotSupported: r = 'not supported'\n"
            "print(json.dumps(r))"
        )
        self.assertEqual(got, "not supported")

    def test_faults_reach_pynvml(self):
        code = (
            "import json, pynvml as N\n"
            "try:\n    N.nvmlInit(); r = 'ok'\nexcept N.NVMLError_DriverNotLoaded: r = 'driver not loaded'\n"
            "print(json.dumps(r))"
        )
        self.assertEqual(fakenvml.run_python(code, faults="driver-not-loaded"), "driver not loaded")
        code = (
            "import json, pynvml as N\nN.nvmlInit()\nr = []\n"
            "for i in range(N.nvmlDeviceGetCount()):\n"
            "    try:\n        N.nvmlDeviceGetPowerUsage(N.nvmlDeviceGetHandleByIndex(i)); r.append('ok')\n"
            "    except N.NVMLError_GpuIsLost: r.append('lost')\n"
            "print(json.dumps(r))"
        )
        self.assertEqual(fakenvml.run_python(code, faults="lost:3@0"), ["ok"] * 3 + ["lost"] + ["ok"] * 4)


if __name__ == "__main__":
    unittest.main()
