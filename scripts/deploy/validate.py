#!/usr/bin/env python3
"""Checks everything under deploy/ and the dashboards Grafana provisions from it.

Run by scripts/validate-deploy.sh (which installs the tools into a throw-away virtualenv):

  validate.py --agent BIN --hadolint BIN --kubernetes-validate BIN [--self-test]

* systemd: `systemd-analyze verify` (any message fails: it only warns, exit 0, on unknown keys
  and bad values) and `systemd-analyze security --threshold`, in a scratch root holding the unit,
  systemd's own units and the agent binary at ExecStart's path; the sysusers file applied with
  `systemd-sysusers --root`; the sandbox the issue asks for (policy below).
* container: hadolint, and the recipe's structure (multi-stage, `--locked`, non-root USER).
* Kubernetes: `kubernetes-validate --strict` against the oldest and newest Kubernetes it ships;
  the ServiceMonitor against the prometheus-operator CRD's schema (from the
  cloudcoil-models-prometheus-operator package, with every object closed to unknown fields, as
  the API server's strict field validation does); the cross-references no schema sees (selectors,
  port names, volumes, probes, the config's paths inside the pod).
* Grafana: the provisioning files parse, the provider's path is where compose.yaml mounts the
  repository's dashboards, every dashboard's data-source references resolve to a provisioned type,
  panel ids are unique and panels do not overlap.
* The agent configs shipped in deploy/ load in the agent, and every flag used on a command line
  (ExecStart, CMD, args) exists in `gpumon-agent --help`.

--self-test then breaks a copy of deploy/ and dashboards/ in known ways and asserts that each
break is reported, so no check can pass vacuously.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]


class Tools:
    def __init__(self, args):
        self.agent = args.agent
        self.hadolint = args.hadolint
        self.kubernetes_validate = args.kubernetes_validate
        self._help = None

    def agent_flags(self):
        """The long flags `gpumon-agent --help` lists."""
        if self._help is None:
            out = subprocess.run([self.agent, "--help"], capture_output=True, text=True, check=True).stdout
            self._help = set(re.findall(r"(?m)^\s+(?:-\w, )?(--[a-z0-9-]+)", out))
        return self._help


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def unknown_flags(tools, argv, where):
    """Problems for every `--flag` in argv that the agent does not have."""
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return [f"{where}: `{f}` is not a gpumon-agent flag" for f in sorted(flags - tools.agent_flags())]


def load_config_in_agent(tools, text, where, rewrite=None):
    """Problems if the agent refuses the config `text` (mock backend, one sample, loopback)."""
    if rewrite:
        text = rewrite(text)
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return [f"{where}: not TOML: {e}"]
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        env = dict(os.environ, GPUMON_LOG="warn")
        env.pop("GPUMON_PROC_ROOT", None)
        r = run(
            [tools.agent, "--config", path, "--backend", "mock", "--once", "--prometheus-listen", "127.0.0.1:0"],
            env=env,
            timeout=60,
        )
    finally:
        os.unlink(path)
    if r.returncode != 0:
        return [f"{where}: the agent refuses it (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-600:]}"]
    return []


# ----------------------------------------------------------------------------------- systemd

def unit_keys(text):
    """{(section, key): [values]} of a unit file, continuation lines joined."""
    keys, section, pending = {}, None, ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        k, _, v = line.partition("=")
        keys.setdefault((section, k.strip()), []).append(v.strip())
    return keys


def last(keys, key):
    values = keys.get(("Service", key))
    return values[-1] if values else None


def truthy(v):
    return v is not None and v.lower() in ("1", "yes", "true", "on")


def systemd_policy(keys):
    """What issue #14 asks of the unit and the tools do not check."""
    p = []
    want = {
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "DevicePolicy": "closed",
        "Restart": "on-failure",
    }
    for k, v in want.items():
        if last(keys, k) != v:
            p.append(f"{k}= must be {v} (is {last(keys, k)})")
    if last(keys, "ProtectHome") not in ("yes", "read-only", "tmpfs"):
        p.append("ProtectHome= must be set")
    user = last(keys, "User")
    if not user or user in ("root", "0"):
        if not truthy(last(keys, "DynamicUser")):
            p.append("a dedicated user is required (User= or DynamicUser=yes), not root")
    # An empty assignment resets the set; the last one must be empty.
    if keys.get(("Service", "CapabilityBoundingSet")) is None or last(keys, "CapabilityBoundingSet") != "":
        p.append("CapabilityBoundingSet= must be empty")
    if last(keys, "ProtectProc") in ("invisible", "noaccess", "ptraceable"):
        p.append("ProtectProc= hides other users' /proc/<pid>: attribution needs them")
    if last(keys, "ProcSubset") == "pid":
        p.append("ProcSubset=pid hides /proc/driver/nvidia, which NVML reads")
    if truthy(last(keys, "PrivateUsers")):
        p.append("PrivateUsers= maps other users' UIDs to nobody: attribution's user labels would be wrong")
    if truthy(last(keys, "PrivateDevices")):
        p.append("PrivateDevices= hides the NVIDIA device nodes")
    allow = keys.get(("Service", "DeviceAllow"), [])
    specs = [a.split()[0] for a in allow if a]
    for s in specs:
        if s.startswith("/dev/") and any(c in s for c in "*?["):
            p.append(f"DeviceAllow={s}: a device path takes no glob (systemd silently skips it); use char-<group>")
    for node in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        if node not in specs:
            p.append(f"DeviceAllow= must list {node}")
    if not any(s in ("char-nvidia-frontend", "/dev/nvidia0") for s in specs):
        p.append("DeviceAllow= must allow the GPU nodes (char-nvidia-frontend or /dev/nvidia0 ...)")
    families = set((last(keys, "RestrictAddressFamilies") or "").split())
    if not {"AF_UNIX", "AF_INET", "AF_INET6"} <= families or families - {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}:
        p.append(f"RestrictAddressFamilies= must be AF_UNIX AF_INET AF_INET6 [AF_NETLINK], is {sorted(families)}")
    return p


def check_systemd(root, tools):
    d = root / "deploy/systemd"
    unit = d / "gpumon-agent.service"
    text = unit.read_text()
    keys = unit_keys(text)
    problems = [f"{unit.name}: {x}" for x in systemd_policy(keys)]

    exec_start = shlex.split(last(keys, "ExecStart") or "")
    if not exec_start or not exec_start[0].startswith("/"):
        return problems + [f"{unit.name}: ExecStart= needs an absolute path"]
    problems += unknown_flags(tools, exec_start[1:], f"{unit.name} ExecStart")

    with tempfile.TemporaryDirectory(prefix="gpumon-unit-") as scratch:
        scratch = Path(scratch)
        # verify resolves the unit's dependencies (multi-user.target, sysinit.target, ...) and
        # checks that ExecStart's binary is executable, both inside --root.
        shutil.copytree("/usr/lib/systemd/system", scratch / "usr/lib/systemd/system", symlinks=True)
        (scratch / "etc/systemd/system").mkdir(parents=True)
        shutil.copy(unit, scratch / "etc/systemd/system" / unit.name)
        exe = scratch / exec_start[0].lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(tools.agent, exe)  # the debug agent is ~70 MB: link it where possible
        except OSError:
            shutil.copy(tools.agent, exe)
        r = run(["systemd-analyze", "verify", f"--root={scratch}", unit.name])
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or out:
            problems.append(f"{unit.name}: systemd-analyze verify: {out or f'exit {r.returncode}'}")
        # The exposure score of this unit is 1.9 ("OK"); 2.0 is the ceiling, so loosening the
        # sandbox fails here until it is argued for in the unit and the threshold moved.
        r = run(["systemd-analyze", "security", "--offline=yes", f"--root={scratch}", "--threshold=20", unit.name])
        if r.returncode != 0:
            overall = [l for l in r.stdout.splitlines() if "Overall exposure" in l]
            problems.append(f"{unit.name}: systemd-analyze security above 2.0: {overall or r.stderr.strip()}")

    sysusers = d / "gpumon.sysusers.conf"
    with tempfile.TemporaryDirectory(prefix="gpumon-sysusers-") as sroot:
        (Path(sroot) / "etc").mkdir()
        r = run(["systemd-sysusers", f"--root={sroot}", str(sysusers)])
        if r.returncode != 0:
            problems.append(f"{sysusers.name}: systemd-sysusers: {r.stderr.strip()}")
        else:
            users = [l.split(":")[0] for l in (Path(sroot) / "etc/passwd").read_text().splitlines()]
            if last(keys, "User") not in users:
                problems.append(f"{sysusers.name} does not create User={last(keys, 'User')} ({users})")

    problems += load_config_in_agent(tools, (d / "gpumon-agent.toml").read_text(), "deploy/systemd/gpumon-agent.toml")
    return problems


# --------------------------------------------------------------------------------- container

def instructions(text):
    """[(INSTRUCTION, arguments)] of a Containerfile, continuations joined, comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not pending and (not s or s.startswith("#")):
            continue
        if pending and s.startswith("#"):
            continue
        line = pending + s
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def check_container(root, tools):
    d = root / "deploy/container"
    cf = d / "Containerfile"
    problems = []
    r = run([tools.hadolint, "--no-color", str(cf)])
    if r.returncode != 0:
        problems.append(f"Containerfile: hadolint:\n{(r.stdout + r.stderr).strip()}")
    ins = instructions(cf.read_text())
    stages, current = [], None
    for word, rest in ins:
        if word == "FROM":
            parts = rest.split()
            current = {"from": parts, "ins": []}
            stages.append(current)
        elif current is not None:
            current["ins"].append((word, rest))
    if len(stages) < 2:
        return problems + ["Containerfile: a multi-stage build is required (builder + runtime)"]
    builder, final = stages[0], stages[-1]
    name = builder["from"][-1] if len(builder["from"]) >= 3 and builder["from"][-2].upper() == "AS" else None
    builds = [rest for w, rest in builder["ins"] if w == "RUN" and "cargo build" in rest]
    if not builds:
        problems.append("Containerfile: the first stage must `cargo build` the agent")
    for flag in ("--locked", "--profile dist", "--bin gpumon-agent"):
        if builds and not all(flag in b for b in builds):
            problems.append(f"Containerfile: `cargo build` without {flag}")
    users = [rest for w, rest in final["ins"] if w == "USER"]
    uid = users[-1].split(":")[0] if users else "0"
    if not uid.isdigit() or int(uid) == 0:
        problems.append(f"Containerfile: the runtime stage must end with a numeric non-root USER (is {uid!r})")
    copies = [rest for w, rest in final["ins"] if w == "COPY"]
    if not name or not any(c.startswith(f"--from={name}") and "gpumon-agent" in c for c in copies):
        problems.append("Containerfile: the runtime stage must COPY the agent from the build stage")
    if any(w == "RUN" and re.search(r"nvidia|cuda|libnvidia-ml", rest) for w, rest in final["ins"]):
        problems.append("Containerfile: no NVIDIA library in the image (the container runtime mounts the host's)")
    if not any(w == "EXPOSE" and "9400" in rest.split() for w, rest in final["ins"]):
        problems.append("Containerfile: EXPOSE 9400 (the scrape endpoint)")
    for w, rest in final["ins"]:
        if w in ("ENTRYPOINT", "CMD"):
            try:
                argv = json.loads(rest)
            except json.JSONDecodeError:
                problems.append(f"Containerfile: {w} must be in exec (JSON) form")
                continue
            problems += unknown_flags(tools, argv, f"Containerfile {w}")
    ignore = d / "Containerfile.dockerignore"
    if not ignore.is_file() or not re.search(r"(?m)^(\*\*/)?target/?$", ignore.read_text()):
        problems.append("Containerfile.dockerignore must keep target/ out of the build context")
    return problems


# -------------------------------------------------------------------------------- kubernetes

def servicemonitor_schema():
    """The prometheus-operator CRD's ServiceMonitor schema, every object closed to unknown keys."""
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    schema = ServiceMonitor.model_json_schema(by_alias=True, mode="validation")

    def close(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for v in node.values():
                close(v)
        elif isinstance(node, list):
            for v in node:
                close(v)

    close(schema)
    return schema


def subset(small, big):
    return all(big.get(k) == v for k, v in (small or {}).items())


def check_kubernetes(root, tools):
    d = root / "deploy/kubernetes"
    problems = []
    kust = yaml.safe_load((d / "kustomization.yaml").read_text())
    resources = kust.get("resources", [])
    on_disk = sorted(p.name for p in d.glob("*.yaml") if p.name != "kustomization.yaml")
    if sorted(resources) != on_disk:
        problems.append(f"kustomization.yaml resources {sorted(resources)} != the manifests {on_disk}")
    docs = []
    for name in resources:
        path = d / name
        if not path.is_file():
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((name, doc))

    core = [n for n in resources if (d / n).is_file() and all(doc.get("apiVersion") != "monitoring.coreos.com/v1" for f, doc in docs if f == n)]
    for version in ("1.25.0", "1.37.0"):
        r = run([tools.kubernetes_validate, "--strict", "--quiet", "-k", version, *[str(d / n) for n in core]])
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or out:
            problems.append(f"kubernetes-validate --strict (Kubernetes {version}):\n{out}")

    validator = jsonschema.Draft202012Validator(servicemonitor_schema())
    for name, doc in docs:
        if doc.get("kind") == "ServiceMonitor":
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
                path = "/".join(str(x) for x in e.absolute_path)
                problems.append(f"{name}: ServiceMonitor CRD schema: {path}: {e.message[:200]}")

    by_kind = {}
    for name, doc in docs:
        by_kind.setdefault(doc.get("kind"), []).append(doc)
    one = lambda kind: (by_kind.get(kind) or [None])[0]
    ns, ds, svc, sm, cm, sa = (one(k) for k in ("Namespace", "DaemonSet", "Service", "ServiceMonitor", "ConfigMap", "ServiceAccount"))
    if not all((ns, ds, svc, sm, cm, sa)):
        return problems + ["deploy/kubernetes needs a Namespace, DaemonSet, Service, ServiceMonitor, ConfigMap and ServiceAccount"]
    namespace = ns["metadata"]["name"]
    for name, doc in docs:
        if doc["kind"] not in ("Namespace",) and doc["metadata"].get("namespace") != namespace:
            problems.append(f"{name}: {doc['kind']} {doc['metadata']['name']} is not in namespace {namespace}")

    spec = ds["spec"]["template"]["spec"]
    pod_labels = ds["spec"]["template"]["metadata"].get("labels", {})
    if not subset(ds["spec"]["selector"].get("matchLabels"), pod_labels):
        problems.append("DaemonSet selector does not match its pod labels")
    if not subset(svc["spec"].get("selector"), pod_labels) or not svc["spec"].get("selector"):
        problems.append("Service selector does not match the DaemonSet's pods")
    if not subset(sm["spec"]["selector"].get("matchLabels"), svc["metadata"].get("labels", {})):
        problems.append("ServiceMonitor selector does not match the Service's labels")
    if namespace not in sm["spec"].get("namespaceSelector", {}).get("matchNames", []):
        problems.append(f"ServiceMonitor namespaceSelector does not include {namespace}")
    if spec.get("serviceAccountName") != sa["metadata"]["name"]:
        problems.append("DaemonSet serviceAccountName is not the ServiceAccount")
    if spec.get("runtimeClassName") != "nvidia":
        problems.append("DaemonSet needs runtimeClassName: nvidia")
    if "nvidia.com/gpu.present" not in (spec.get("nodeSelector") or {}):
        problems.append("DaemonSet needs the GPU node selector nvidia.com/gpu.present")
    if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
        problems.append("DaemonSet needs a toleration for nvidia.com/gpu")

    containers = spec.get("containers", [])
    if len(containers) != 1:
        return problems + ["DaemonSet: one container expected"]
    c = containers[0]
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    svc_ports = {p.get("name"): p for p in svc["spec"].get("ports", [])}
    for p in svc_ports.values():
        if p.get("targetPort") not in ports and p.get("targetPort") not in ports.values():
            problems.append(f"Service targetPort {p.get('targetPort')} is not a container port")
    for ep in sm["spec"].get("endpoints", []):
        if ep.get("port") not in svc_ports:
            problems.append(f"ServiceMonitor endpoint port {ep.get('port')!r} is not a Service port name")
        if ep.get("honorLabels") is not True:
            problems.append("ServiceMonitor: honorLabels: true keeps the agent's namespace/pod/container labels")
    for probe, path in (("livenessProbe", "/live"), ("readinessProbe", "/health")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or (get.get("port") not in ports and get.get("port") not in ports.values()):
            problems.append(f"{probe} must GET {path} on the metrics port (is {get})")
    env = {e["name"]: e for e in c.get("env", [])}
    if (env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) != "spec.nodeName":
        problems.append("env NODE_NAME must come from fieldRef spec.nodeName")
    for k in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"):
        if k not in env:
            problems.append(f"env {k} is missing")
    sc = c.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True:
        problems.append("securityContext: allowPrivilegeEscalation false and readOnlyRootFilesystem true")
    if sc.get("privileged") or (sc.get("capabilities") or {}).get("add") or (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
        problems.append("securityContext: not privileged, capabilities drop [ALL] and add none")
    if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append("securityContext: seccompProfile RuntimeDefault")
    res = c.get("resources") or {}
    if not {"cpu", "memory"} <= set(res.get("requests", {})) or "memory" not in res.get("limits", {}):
        problems.append("resources: cpu and memory requests and a memory limit")

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for m in c.get("volumeMounts", []):
        v = volumes.get(m["name"])
        if v is None:
            problems.append(f"volumeMount {m['name']} has no volume")
            continue
        mounts[m["mountPath"]] = (m, v)
        if "hostPath" in v and not m.get("readOnly"):
            problems.append(f"hostPath volume {m['name']} must be mounted readOnly")
    mounted = lambda path: any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in mounts)

    args = c.get("args", [])
    problems += unknown_flags(tools, args, "DaemonSet args")
    config_path = args[args.index("--config") + 1] if "--config" in args[:-1] else None
    cm_key = None
    for mp, (m, v) in mounts.items():
        if config_path and "configMap" in v and config_path.startswith(mp.rstrip("/") + "/"):
            if v["configMap"].get("name") != cm["metadata"]["name"]:
                problems.append("the config volume is not the ConfigMap")
            cm_key = config_path[len(mp.rstrip("/")) + 1:]
    if cm_key not in (cm.get("data") or {}):
        return problems + [f"--config {config_path} is not a key of the mounted ConfigMap"]
    text = cm["data"][cm_key]
    try:
        conf = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return problems + [f"ConfigMap {cm_key}: not TOML: {e}"]
    attribution = conf.get("attribution", {})
    proc_root = env.get("GPUMON_PROC_ROOT", {}).get("value") or attribution.get("proc_root")
    for what, path in (("proc root", proc_root), ("passwd_file", attribution.get("passwd_file")),
                       ("kubelet_socket", attribution.get("kubelet_socket") if attribution.get("kubelet") else None)):
        if path and not mounted(path):
            problems.append(f"the config's {what} {path} is not inside a volume mounted in the pod")
    sock = attribution.get("kubelet_socket", "")
    if attribution.get("kubelet") and not any(
        (v.get("hostPath") or {}).get("path") == "/var/lib/kubelet/pod-resources" and sock.startswith(mp)
        for mp, (m, v) in mounts.items()
    ):
        problems.append("kubelet = true needs the host's /var/lib/kubelet/pod-resources mounted where kubelet_socket points")
    # Paths inside the pod (/host/...) do not exist here: load the config with the host's own.
    problems += load_config_in_agent(tools, text, f"ConfigMap {cm_key}", rewrite=lambda t: t.replace('"/host/', '"/'))

    images = {i.get("name") for i in kust.get("images", [])}
    if c["image"].rsplit(":", 1)[0] not in images:
        problems.append("kustomization.yaml images: does not name the DaemonSet's image")
    return problems


# ----------------------------------------------------------------------------------- grafana

def panels(dashboard):
    for p in dashboard.get("panels", []):
        yield p
        yield from panels(p)


def overlaps(top_level_panels):
    """Panels of the grid that cover the same cell (Grafana would push one down, silently)."""
    owner, found = {}, []
    for p in top_level_panels:
        g = p.get("gridPos")
        if not g:
            continue
        cells = {(x, y) for y in range(g["y"], g["y"] + g["h"]) for x in range(g["x"], g["x"] + g["w"])}
        hit = sorted({owner[c] for c in cells if c in owner})
        if hit:
            found.append(f"panel {p.get('title')!r} overlaps {hit}")
        owner.update((c, p.get("title")) for c in cells)
    return found


def datasource_refs(node):
    if isinstance(node, dict):
        ds = node.get("datasource")
        if isinstance(ds, dict) and "uid" in ds:
            yield ds
        for v in node.values():
            yield from datasource_refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from datasource_refs(v)


def check_grafana(root, tools):
    g = root / "deploy/grafana"
    problems = []
    sources = yaml.safe_load((g / "provisioning/datasources/gpumon.yaml").read_text())
    if sources.get("apiVersion") != 1:
        problems.append("datasources: apiVersion 1")
    types = set()
    uids = []
    for s in sources.get("datasources", []):
        missing = {"name", "type", "url", "access", "uid"} - set(s)
        if missing:
            problems.append(f"datasource {s.get('name')}: missing {sorted(missing)}")
        types.add(s.get("type"))
        uids.append(s.get("uid"))
    if len(uids) != len(set(uids)):
        problems.append("datasource uids must be unique")
    if sum(1 for s in sources.get("datasources", []) if s.get("isDefault")) > 0:
        problems.append("no provisioned datasource may be the default (a Grafana with a default refuses a second)")

    provider_file = yaml.safe_load((g / "provisioning/dashboards/gpumon.yaml").read_text())
    providers = provider_file.get("providers", [])
    if provider_file.get("apiVersion") != 1 or len(providers) != 1 or providers[0].get("type") != "file":
        return problems + ["dashboards provider: apiVersion 1, one provider of type file"]
    provider_path = providers[0].get("options", {}).get("path")

    compose = yaml.safe_load((g / "compose.yaml").read_text())
    volumes = compose["services"]["grafana"].get("volumes", [])
    mounts = {}
    for v in volumes:
        src, dst = v.split(":")[:2]
        mounts[dst] = (g / src).resolve()
    if mounts.get("/etc/grafana/provisioning") != (g / "provisioning").resolve():
        problems.append("compose.yaml must mount ./provisioning at /etc/grafana/provisioning")
    dash_dir = mounts.get(provider_path)
    if dash_dir != (root / "dashboards").resolve():
        return problems + [f"compose.yaml must mount the repository's dashboards/ at the provider path {provider_path}"]

    files = sorted(dash_dir.glob("*.json"))
    if len(files) < 2:
        problems.append(f"no dashboards in {dash_dir}")
    seen_uids = set()
    for f in files:
        try:
            dash = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            problems.append(f"{f.name}: {e}")
            continue
        uid = dash.get("uid")
        if not uid or uid in seen_uids:
            problems.append(f"{f.name}: missing or duplicate uid {uid!r}")
        seen_uids.add(uid)
        if dash.get("id") is not None:
            problems.append(f"{f.name}: a provisioned dashboard must not carry a database id")
        if "__inputs" in dash:
            problems.append(f"{f.name}: __inputs are resolved only by the import dialog, never by provisioning")
        variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
        for ref in datasource_refs(dash):
            if ref.get("type") == "grafana":
                continue  # Grafana's built-in annotation source, always there
            m = re.fullmatch(r"\$\{(\w+)\}|\$(\w+)", ref["uid"])
            if not m:
                problems.append(f"{f.name}: datasource uid {ref['uid']!r} is fixed; use the datasource variable")
                continue
            var = variables.get(m.group(1) or m.group(2))
            if not var or var.get("type") != "datasource":
                problems.append(f"{f.name}: datasource {ref['uid']} is not a datasource variable")
            elif var.get("query") not in types:
                problems.append(f"{f.name}: needs a {var.get('query')} data source; provisioned: {sorted(types)}")
        ids = [p.get("id") for p in panels(dash)]
        problems += [f"{f.name}: {o}" for o in overlaps(dash.get("panels", []))]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            problems.append(f"{f.name}: duplicate panel ids {dupes}")
    return problems


CHECKS = {
    "systemd": check_systemd,
    "container": check_container,
    "kubernetes": check_kubernetes,
    "grafana": check_grafana,
}

# (check, file, old, new, a word the report must contain): each must be caught.
MUTATIONS = [
    ("systemd", "deploy/systemd/gpumon-agent.service", "ProtectSystem=strict", "ProtectSytem=strict", "ProtectSytem"),
    ("systemd", "deploy/systemd/gpumon-agent.service", "ProtectProc=default", "ProtectProc=invisible", "ProtectProc"),
    ("systemd", "deploy/systemd/gpumon-agent.service", "DeviceAllow=char-nvidia-frontend rw", "DeviceAllow=/dev/nvidia* rw", "glob"),
    ("systemd", "deploy/systemd/gpumon-agent.service", "--config /etc", "--konfig /etc", "--konfig"),
    ("systemd", "deploy/systemd/gpumon-agent.service", "MemoryDenyWriteExecute=yes", "MemoryDenyWriteExecute=no\nPrivateTmp=no", "PrivateTmp"),
    ("systemd", "deploy/systemd/gpumon.sysusers.conf", "u gpumon", "u gpumom", "User=gpumon"),
    ("systemd", "deploy/systemd/gpumon-agent.toml", "[prometheus]", "[promethus]", "promethus"),
    ("container", "deploy/container/Containerfile", "USER 65532:65532", "USER root", "USER"),
    ("container", "deploy/container/Containerfile", "--profile dist --locked", "--profile dist", "--locked"),
    ("container", "deploy/container/Containerfile", '"--prometheus-listen", "0.0.0.0:9400"', '"--prom-listen", "0.0.0.0:9400"', "--prom-listen"),
    ("kubernetes", "deploy/kubernetes/daemonset.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesytem: true", "readOnlyRootFilesytem"),
    ("kubernetes", "deploy/kubernetes/daemonset.yaml", "path: /live", "path: /health", "livenessProbe"),
    ("kubernetes", "deploy/kubernetes/daemonset.yaml", "mountPath: /host/proc", "mountPath: /hostproc", "proc root"),
    ("kubernetes", "deploy/kubernetes/service.yaml", "- name: metrics", "- name: metric", "port"),
    ("kubernetes", "deploy/kubernetes/servicemonitor.yaml", "honorLabels: true", "honorLabel: true", "honorLabel"),
    ("kubernetes", "deploy/kubernetes/servicemonitor.yaml", "interval: 15s", "interval: 15", "interval"),
    ("kubernetes", "deploy/kubernetes/configmap.yaml", "    [prometheus]", "    [promethus]", "promethus"),
    ("grafana", "deploy/grafana/provisioning/dashboards/gpumon.yaml", "path: /var/lib/grafana/dashboards/gpumon", "path: /var/lib/grafana/dashboards", "provider path"),
    ("grafana", "deploy/grafana/provisioning/datasources/gpumon.yaml", "type: prometheus", "type: prometheus-x", "needs a prometheus data source"),
    ("grafana", "dashboards/prometheus-native.json", '"id": 62,', '"id": 61,', "duplicate panel ids"),
]


def copy_tree(dst):
    for sub in ("deploy", "dashboards"):
        shutil.copytree(REPO / sub, dst / sub, symlinks=True)


def self_test(tools):
    """Each mutation of a copy must be reported by its check; the unmutated copy must pass."""
    failures = 0
    for check, rel, old, new, word in MUTATIONS:
        with tempfile.TemporaryDirectory(prefix="gpumon-deploy-selftest-") as tmp:
            tmp = Path(tmp)
            copy_tree(tmp)
            path = tmp / rel
            text = path.read_text()
            if old not in text:
                print(f"self-test: {rel} no longer contains {old!r}: update MUTATIONS", file=sys.stderr)
                failures += 1
                continue
            path.write_text(text.replace(old, new, 1))
            problems = CHECKS[check](tmp, tools)
            caught = [p for p in problems if word in p]
            verdict = "caught" if caught else "MISSED"
            print(f"self-test: {check}: {rel}: {old!r} -> {new!r}: {verdict}")
            if not caught:
                failures += 1
                print(f"  reported instead: {problems}", file=sys.stderr)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", required=True, help="gpumon-agent binary (with the mock backend)")
    ap.add_argument("--hadolint", required=True)
    ap.add_argument("--kubernetes-validate", required=True)
    ap.add_argument("--self-test", action="store_true", help="also check that broken copies are rejected")
    args = ap.parse_args()
    tools = Tools(args)

    passed = failed = 0
    for name, check in CHECKS.items():
        problems = check(REPO, tools)
        if problems:
            failed += 1
            print(f"FAIL {name}:")
            for p in problems:
                print(f"  - {p}")
        else:
            passed += 1
            print(f"ok   {name}")
    if args.self_test:
        missed = self_test(tools)
        failed += missed
        passed += len(MUTATIONS) - missed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
