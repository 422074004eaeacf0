"""A fake process list of REAL PIDs (GPUMON_FAKE_NVML_PIDS): processes this test starts show up in
gpustat and nvidia-ml-py with their real user and command, as on a GPU host."""
import getpass
import json
import os
import subprocess
import sys
import unittest

import fakenvml

MIB = 1024 * 1024


class RealPidsShowTheirUserAndCommand(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Two distinct commands, so the test can tell a right answer from a lucky one.
        cls.children = [
            subprocess.Popen(["sleep", "300"]),
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]),
        ]
        cls.pids = [c.pid for c in cls.children]
        cls.spec = f"0={cls.pids[0]}+{cls.pids[1]},3={cls.pids[1]}"
        cls.user = getpass.getuser()

    @classmethod
    def tearDownClass(cls):
        for c in cls.children:
            c.kill()
            c.wait()

    def comm(self, pid):
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()

    def test_nvidia_ml_py_lists_the_real_pids_and_names(self):
        code = r'''
import json, pynvml as N
N.nvmlInit(); out = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    ps = N.nvmlDeviceGetComputeRunningProcesses(h)
    out.append([[p.pid, p.usedGpuMemory, N.nvmlSystemGetProcessName(p.pid)] for p in ps])
print(json.dumps(out))
'''
        got = fakenvml.run_python(code, profile="h100x8", pids=self.spec)
        want = fakenvml.expected(profile="h100x8", pids=self.spec)["devices"]
        self.assertEqual([p[0] for p in got[0]], self.pids)
        self.assertEqual([p[0] for p in got[3]], [self.pids[1]])
        self.assertEqual([p[2] for p in got[0]], [self.comm(p) for p in self.pids])
        self.assertEqual([p[1] for p in got[0]], [p["used_memory"] for p in want[0]["processes"]])
        # The GPUs without real PIDs keep the model's (simulated) process list.
        self.assertEqual([p[0] for p in got[1]], [p["pid"] for p in want[1]["processes"]])

    def test_gpustat_shows_user_and_command(self):
        out = fakenvml.run([fakenvml.PYTHON, "-m", "gpustat", "--json"], profile="h100x8", pids=self.spec)
        self.assertEqual(out.returncode, 0, out.stderr)
        gpus = json.loads(out.stdout)["gpus"]
        procs = gpus[0]["processes"]
        self.assertEqual([p["pid"] for p in procs], self.pids)
        self.assertEqual([p["username"] for p in procs], [self.user, self.user])
        self.assertEqual([p["command"] for p in procs], [self.comm(p) for p in self.pids])
        self.assertIn("time.sleep(300)", " ".join(procs[1]["full_command"]))
        want = fakenvml.expected(profile="h100x8", pids=self.spec)["devices"][0]["processes"]
        self.assertEqual([p["gpu_memory_usage"] for p in procs], [p["used_memory"] // MIB for p in want])


if __name__ == "__main__":
    unittest.main()
