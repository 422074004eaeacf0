"""`gpustat --json`, unmodified, lists the profile's GPUs with the profile's values."""
import json
import unittest

import fakenvml

MIB = 1024 * 1024

# gpustat's field -> the expected device's key, or a function of the expected device.
FIELDS = [
    ("index", "index"),
    ("uuid", "uuid"),
    ("name", "name"),
    ("temperature.gpu", "temperature"),
    ("fan.speed", "fan"),
    # With MIG on, the parent's utilisation is NotSupported (null), as on real GPUs.
    ("utilization.gpu", lambda w: w["utilization"] and w["utilization"]["gpu"]),
    ("utilization.enc", "encoder"),
    ("utilization.dec", "decoder"),
    ("power.draw", lambda w: w["power_mw"] // 1000),
    ("enforced.power.limit", lambda w: w["power_limit_mw"] // 1000),
    ("memory.used", lambda w: w["memory"]["used"] // MIB),
    ("memory.total", lambda w: w["memory"]["total"] // MIB),
]


class GpustatListsTheProfile(unittest.TestCase):
    def check(self, profile):
        out = fakenvml.run([fakenvml.PYTHON, "-m", "gpustat", "--json"], profile=profile)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        want = fakenvml.expected(profile=profile)
        gpus = fakenvml.physical_gpus(want)
        self.assertEqual(got["driver_version"], want["driver_version"])
        self.assertEqual(len(got["gpus"]), len(gpus))
        fakenvml.assert_each_gpu(self, profile, got["gpus"], gpus, FIELDS)

    def test_h100x8(self):
        self.check("h100x8")

    def test_rtx4090x2(self):
        self.check("rtx4090x2")

    def test_a100x8_mig_lists_the_physical_gpus(self):
        self.check("a100x8-mig")


if __name__ == "__main__":
    unittest.main()
