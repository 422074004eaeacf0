"""Table-driven: every NVML function the fake implements, called through nvidia-ml-py
(versioned calls included), returns the mock's value — or NotSupported exactly where the model
has no value (fan on SXM parts, NVLink on PCIe cards). A function the fake implements that is
neither in the table nor listed in COVERED_ELSEWHERE fails the test, so a new export cannot
silently answer NOT_SUPPORTED by accident."""
import glob
import json
import os
import re
import unittest

import fakenvml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (python expression on handle `h`, link `L`, pynvml `N`; path into the expected JSON of
# the device, or a lambda on it). Expected None = the call must raise NotSupported.
TABLE = {
    "nvmlDeviceGetName": ("N.nvmlDeviceGetName(h)", "name"),
    "nvmlDeviceGetUUID": ("N.nvmlDeviceGetUUID(h)", "uuid"),
    "nvmlDeviceGetSerial": ("N.nvmlDeviceGetSerial(h)", "serial"),
    "nvmlDeviceGetIndex": ("N.nvmlDeviceGetIndex(h)", "index"),
    "nvmlDeviceGetMinorNumber": ("N.nvmlDeviceGetMinorNumber(h)", "index"),
    "nvmlDeviceGetPciInfo_v3": ("N.nvmlDeviceGetPciInfo(h).busId", "pci_bus_id"),
    "nvmlDeviceGetArchitecture": ("N.nvmlDeviceGetArchitecture(h)", "architecture"),
    "nvmlDeviceGetCudaComputeCapability": ("list(N.nvmlDeviceGetCudaComputeCapability(h))", "compute_capability"),
    "nvmlDeviceGetUtilizationRates": ("(lambda u: {'gpu': u.gpu, 'memory': u.memory})(N.nvmlDeviceGetUtilizationRates(h))", "utilization"),
    "nvmlDeviceGetEncoderUtilization": ("N.nvmlDeviceGetEncoderUtilization(h)[0]", "encoder"),
    "nvmlDeviceGetDecoderUtilization": ("N.nvmlDeviceGetDecoderUtilization(h)[0]", "decoder"),
    "nvmlDeviceGetMemoryInfo": ("(lambda m: [m.total, m.free, m.used])(N.nvmlDeviceGetMemoryInfo(h))",
                                lambda w: [w["memory"]["total"], w["memory"]["free"], w["memory"]["v1_used"]]),
    "nvmlDeviceGetMemoryInfo_v2": ("(lambda m: [m.total, m.reserved, m.free, m.used])(N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2))",
                                   lambda w: [w["memory"][k] for k in ("total", "reserved", "free", "used")]),
    "nvmlDeviceGetTemperature": ("N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)", "temperature"),
    "nvmlDeviceGetTemperatureV": ("N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU)", "temperature"),
    "nvmlDeviceGetTemperatureThreshold": ("[N.nvmlDeviceGetTemperatureThreshold(h, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), N.nvmlDeviceGetTemperatureThreshold(h, N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)]",
                                          lambda w: [w["thresholds"]["slowdown"], w["thresholds"]["shutdown"]]),
    "nvmlDeviceGetPowerUsage": ("N.nvmlDeviceGetPowerUsage(h)", "power_mw"),
    "nvmlDeviceGetEnforcedPowerLimit": ("N.nvmlDeviceGetEnforcedPowerLimit(h)", "power_limit_mw"),
    "nvmlDeviceGetPowerManagementLimit": ("N.nvmlDeviceGetPowerManagementLimit(h)", "power_limit_mw"),
    "nvmlDeviceGetPowerManagementDefaultLimit": ("N.nvmlDeviceGetPowerManagementDefaultLimit(h)", "limits_mw.default"),
    "nvmlDeviceGetPowerManagementLimitConstraints": ("list(N.nvmlDeviceGetPowerManagementLimitConstraints(h))",
                                                     lambda w: [w["limits_mw"]["min"], w["limits_mw"]["max"]]),
    "nvmlDeviceGetTotalEnergyConsumption": ("N.nvmlDeviceGetTotalEnergyConsumption(h)", "energy_mj"),
    "nvmlDeviceGetClockInfo": ("N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)", "clocks_mhz.sm"),
    "nvmlDeviceGetMaxClockInfo": ("N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_MEM)", "max_clocks_mhz.memory"),
    "nvmlDeviceGetClock": ("N.nvmlDeviceGetClock(h, N.NVML_CLOCK_GRAPHICS, N.NVML_CLOCK_ID_CURRENT)", "clocks_mhz.graphics"),
    "nvmlDeviceGetFanSpeed": ("N.nvmlDeviceGetFanSpeed(h)", "fan"),
    "nvmlDeviceGetFanSpeed_v2": ("N.nvmlDeviceGetFanSpeed_v2(h, 0)", "fan"),
    "nvmlDeviceGetNumFans": ("N.nvmlDeviceGetNumFans(h)", lambda w: None if w["fan"] is None else 1),
    "nvmlDeviceGetPerformanceState": ("N.nvmlDeviceGetPerformanceState(h)", "pstate"),
    "nvmlDeviceGetPowerState": ("N.nvmlDeviceGetPowerState(h)", "pstate"),
    "nvmlDeviceGetCurrentClocksEventReasons": ("N.nvmlDeviceGetCurrentClocksEventReasons(h)", "clock_event_reasons"),
    "nvmlDeviceGetCurrentClocksThrottleReasons": ("N.nvmlDeviceGetCurrentClocksThrottleReasons(h)", "clock_event_reasons"),
    "nvmlDeviceGetSupportedClocksEventReasons": ("N.nvmlDeviceGetSupportedClocksEventReasons(h)", lambda w: 0x1FF),
    "nvmlDeviceGetSupportedClocksThrottleReasons": ("N.nvmlDeviceGetSupportedClocksThrottleReasons(h)", lambda w: 0x1FF),
    "nvmlDeviceGetCurrPcieLinkGeneration": ("N.nvmlDeviceGetCurrPcieLinkGeneration(h)", "pcie.generation"),
    "nvmlDeviceGetCurrPcieLinkWidth": ("N.nvmlDeviceGetCurrPcieLinkWidth(h)", "pcie.width"),
    "nvmlDeviceGetMaxPcieLinkGeneration": ("N.nvmlDeviceGetMaxPcieLinkGeneration(h)", "pcie.max_generation"),
    "nvmlDeviceGetMaxPcieLinkWidth": ("N.nvmlDeviceGetMaxPcieLinkWidth(h)", "pcie.max_width"),
    "nvmlDeviceGetPcieReplayCounter": ("N.nvmlDeviceGetPcieReplayCounter(h)", "pcie.replays"),
    "nvmlDeviceGetPcieThroughput": ("N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES)", "pcie.rx_kbps"),
    "nvmlDeviceGetEccMode": ("list(N.nvmlDeviceGetEccMode(h))", lambda w: None if w["ecc"]["corrected"] is None else [1, 1]),
    "nvmlDeviceGetTotalEccErrors": ("N.nvmlDeviceGetTotalEccErrors(h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC)", "ecc.uncorrected"),
    "nvmlDeviceGetRetiredPages": ("len(N.nvmlDeviceGetRetiredPages(h, N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))", "ecc.retired_double_bit"),
    "nvmlDeviceGetRetiredPages_v2": ("len(N.nvmlDeviceGetRetiredPages_v2(h, N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))", "ecc.retired_double_bit"),
    "nvmlDeviceGetRetiredPagesPendingStatus": ("bool(N.nvmlDeviceGetRetiredPagesPendingStatus(h))", "ecc.retired_pending"),
    "nvmlDeviceGetRemappedRows": ("(lambda r: [r[0], r[1], bool(r[2]), bool(r[3])])(N.nvmlDeviceGetRemappedRows(h))", "ecc.remapped"),
    "nvmlDeviceGetPersistenceMode": ("N.nvmlDeviceGetPersistenceMode(h)", "modes.persistence"),
    "nvmlDeviceGetDisplayMode": ("N.nvmlDeviceGetDisplayMode(h)", "modes.display_mode"),
    "nvmlDeviceGetDisplayActive": ("N.nvmlDeviceGetDisplayActive(h)", "modes.display_active"),
    "nvmlDeviceGetComputeMode": ("N.nvmlDeviceGetComputeMode(h)", "modes.compute_mode"),
    "nvmlDeviceGetMigMode": ("N.nvmlDeviceGetMigMode(h)[0]", "modes.mig_mode"),
    "nvmlDeviceGetMaxMigDeviceCount": ("N.nvmlDeviceGetMaxMigDeviceCount(h)", lambda w: 7 if w["modes"]["mig_mode"] == 1 else 0),
    # The batched call itself succeeds; a field the GPU lacks carries NOT_SUPPORTED (3).
    "nvmlDeviceGetFieldValues": ("(lambda v: [v.nvmlReturn, None if v.nvmlReturn else v.value.uiVal])(N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_MEMORY_TEMP])[0])",
                                 lambda w: [3, None] if w["memory_temperature"] is None else [0, w["memory_temperature"]]),
    "nvmlGpmQueryDeviceSupport": ("N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice", lambda w: int(w["architecture"] == 9)),
    # NVLink: per link L (every link of the GPU is checked), NotSupported on GPUs without links.
    "nvmlDeviceGetNvLinkState": ("N.nvmlDeviceGetNvLinkState(h, L)", "link.up"),
    "nvmlDeviceGetNvLinkVersion": ("N.nvmlDeviceGetNvLinkVersion(h, L)", "link.version"),
    "nvmlDeviceGetNvLinkRemotePciInfo_v2": ("N.nvmlDeviceGetNvLinkRemotePciInfo(h, L).busId", "link.remote_pci_bus_id"),
    "nvmlDeviceGetNvLinkRemoteDeviceType": ("N.nvmlDeviceGetNvLinkRemoteDeviceType(h, L)", "link.remote_type"),
    "nvmlDeviceGetNvLinkErrorCounter": ("[N.nvmlDeviceGetNvLinkErrorCounter(h, L, c) for c in (N.NVML_NVLINK_ERROR_DL_CRC_FLIT, N.NVML_NVLINK_ERROR_DL_REPLAY, N.NVML_NVLINK_ERROR_DL_RECOVERY)]",
                                        lambda l: [l["crc"], l["replay"], l["recovery"]]),
    "nvmlDeviceGetNvLinkCapability": ("N.nvmlDeviceGetNvLinkCapability(h, L, N.NVML_NVLINK_CAP_P2P_SUPPORTED)", lambda l: 1),
    "nvmlDeviceGetFieldValues/nvlink": ("[[v.nvmlReturn, None if v.nvmlReturn else (v.value.ullVal if v.valueType == 3 else v.value.uiVal)] for v in N.nvmlDeviceGetFieldValues(h, [(N.NVML_FI_DEV_NVLINK_GET_STATE, L), (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, L), (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, L), (N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, L)])]",
                                        lambda l: [[0, l["up"]], [0, l["tx_kib"]], [0, l["rx_kib"]], [0, l["crc"]]]),
}

# Implemented functions whose values another test compares, or that are not per-device values.
COVERED_ELSEWHERE = {
    **dict.fromkeys(["nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
                     "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
                     "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2",
                     "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2"],
                    "init, system and enumeration: every test calls them (test_pynvml)"),
    **dict.fromkeys(["nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2",
                     "nvmlDeviceGetHandleBySerial"], "lookups: test_lookups_find_the_same_device below"),
    **dict.fromkeys(["nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"],
                    "older names of rows above (same body); C layout check in tests/layout.rs"),
    **dict.fromkeys(["nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
                     "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses",
                     "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
                     "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
                     "nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization",
                     "nvmlSystemGetProcessName"], "processes: test_pynvml + test_processes (real PIDs)"),
    **dict.fromkeys(["nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                     "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"],
                    "MIG handles: gpumon-fake-nvml tests/nvml_sampler.rs (a100x8-mig) and gpustat"),
    **dict.fromkeys(["nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes",
                     "nvmlEventSetWait", "nvmlEventSetWait_v2", "nvmlEventSetFree"],
                    "events: gpumon-fake-nvml tests/nvml_faults.rs (XID delivery)"),
    **dict.fromkeys(["nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmSampleFree", "nvmlGpmMetricsGet",
                     "nvmlGpmMigSampleGet", "nvmlGpmQueryIfStreamingEnabled", "nvmlDeviceGetSamples"],
                    "two-sample protocols: gpumon-fake-nvml tests/nvml_sampler.rs (gpm, high_resolution)"),
}

PER_LINK = {name for name, (expr, _) in TABLE.items() if re.search(r"\bL\b", expr)}

READ = r'''
import json, pynvml as N
N.nvmlInit()
TABLE = json.loads(%r)
PER_LINK = set(json.loads(%r))
out = []
def call(expr, h, L=None):
    try:
        return ["ok", eval(expr, {"N": N, "h": h, "L": L})]
    except N.NVMLError as e:
        return ["err", e.value]
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    row = {}
    for name, expr in TABLE.items():
        if name in PER_LINK:
            n = call("N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal", h)
            links = range(n[1]) if n[0] == "ok" and n[1] else [0]
            row[name] = [call(expr, h, l) for l in links]
        else:
            row[name] = call(expr, h)
    out.append(row)
print(json.dumps(out))
'''


def lookup(w, path):
    if callable(path):
        return path(w)
    for k in path.split("."):
        w = w[k] if w is not None else None
    return w


def implemented():
    names = set()
    for f in glob.glob(os.path.join(REPO, "fake-nvml/src/exports/*.rs")):
        with open(f, encoding="utf-8") as src:
            # One export may answer under several NVML names: `fn nvmlA | nvmlA_v2(...)` (the
            # rule tools/gen_stubs.py reads too).
            for group in re.findall(r"\bfn\s+(nvml\w+(?:\s*\|\s*nvml\w+)*)\s*\(", src.read()):
                names |= set(re.findall(r"nvml\w+", group))
    return names


class EveryImplementedCallReturnsTheModel(unittest.TestCase):
    def test_table_covers_the_implemented_surface(self):
        covered = {n.split("/")[0] for n in TABLE} | set(COVERED_ELSEWHERE)
        missing = sorted(implemented() - covered)
        self.assertEqual(missing, [], "implemented but neither in TABLE nor in COVERED_ELSEWHERE")
        stale = sorted(covered - implemented())
        self.assertEqual(stale, [], "listed but not implemented")

    def check(self, profile, faults=None, tick=0):
        exprs = {name: expr for name, (expr, _) in TABLE.items()}
        got = fakenvml.run_python(READ % (json.dumps(exprs), json.dumps(sorted(PER_LINK))), profile=profile, faults=faults, tick=tick)
        want = fakenvml.expected(profile=profile, faults=faults, tick=tick)
        gpus = fakenvml.physical_gpus(want)
        self.assertEqual(len(got), len(gpus))
        for g, w in zip(got, gpus):
            for name, (_, path) in TABLE.items():
                with self.subTest(profile=profile, gpu=w["index"], function=name):
                    if name in PER_LINK:
                        links = w["nvlink"]
                        if links is None:
                            # No NVLink: NotSupported (per field, for the batched call).
                            no = ["ok", [[3, None]] * 4] if name.startswith("nvmlDeviceGetFieldValues") else ["err", 3]
                            self.assertEqual(g[name], [no], "no NVLink: NotSupported")
                            continue
                        self.assertEqual(len(g[name]), len(links))
                        for link, result in zip(links, g[name]):
                            p = path if callable(path) else (lambda l, k=path.split(".", 1)[1]: l[k])
                            self.assertEqual(result, ["ok", p(link)], f"link {link['link']}")
                        continue
                    expect = lookup(w, path)
                    if expect is None:
                        self.assertEqual(g[name], ["err", 3], "the model has no value: NotSupported")
                    else:
                        self.assertEqual(g[name], ["ok", expect])

    def test_h100x8(self):
        self.check("h100x8")

    def test_a100x4_direct_links(self):
        self.check("a100x4", tick=5)

    def test_rtx4090x2_pcie_cards(self):
        self.check("rtx4090x2")

    def test_a100x8_mig(self):
        self.check("a100x8-mig")

    def test_link_faults(self):
        self.check("h100x8", faults="nvlink-down:1:3@2,nvlink-errors:4:0@1:5", tick=4)

    def test_lookups_find_the_same_device(self):
        code = r'''
import json, pynvml as N
N.nvmlInit(); out = []
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    by = [N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h)), N.nvmlDeviceGetHandleByPciBusId(N.nvmlDeviceGetPciInfo(h).busId)]
    out.append([N.nvmlDeviceGetIndex(x) for x in by])
print(json.dumps(out))
'''
        self.assertEqual(fakenvml.run_python(code, profile="h100x8"), [[i, i] for i in range(8)])


if __name__ == "__main__":
    unittest.main()
