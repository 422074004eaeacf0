"""`gpustat --json`, unmodified, lists the profile's GPUs with the profile's values."""
import json
import unittest

import fakenvml

MIB = 1024 * 1024


class GpustatListsTheProfile(unittest.TestCase):
    def check(self, profile):
        out = fakenvml.run([fakenvml.PYTHON, "-m", "gpustat", "--json"], profile=profile)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        want = fakenvml.expected(profile=profile)
        gpus = [d for d in want["devices"] if d["mig"] is None]
        self.assertEqual(got["driver_version"], want["driver_version"])
        self.assertEqual(len(got["gpus"]), len(gpus))
        for g, w in zip(got["gpus"], gpus):
            with self.subTest(profile=profile, gpu=w["index"]):
                self.assertEqual(g["index"], w["index"])
                self.assertEqual(g["uuid"], w["uuid"])
                self.assertEqual(g["name"], w["name"])
                self.assertEqual(g["temperature.gpu"], w["temperature"])
                self.assertEqual(g["fan.speed"], w["fan"])
                # With MIG on, the parent's utilisation is NotSupported (null), as on real GPUs.
                self.assertEqual(g["utilization.gpu"], w["utilization"] and w["utilization"]["gpu"])
                self.assertEqual(g["utilization.enc"], w["encoder"])
                self.assertEqual(g["utilization.dec"], w["decoder"])
                self.assertEqual(g["power.draw"], w["power_mw"] // 1000)
                self.assertEqual(g["enforced.power.limit"], w["power_limit_mw"] // 1000)
                self.assertEqual(g["memory.used"], w["memory"]["used"] // MIB)
                self.assertEqual(g["memory.total"], w["memory"]["total"] // MIB)

    def test_h100x8(self):
        self.check("h100x8")

    def test_rtx4090x2(self):
        self.check("rtx4090x2")

    def test_a100x8_mig_lists_the_physical_gpus(self):
        self.check("a100x8-mig")


if __name__ == "__main__":
    unittest.main()
