"""The fleet file: nodes by instance type and labels, training pods that come and go, and
per-node faults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweeper.clock import parse_duration
from sweeper.errors import ConfigError

# What each instance type *is* (the simulated hardware), not what Sweeper expects of it.
_H100 = {"gpus": 8, "model": "NVIDIA H100 80GB HBM3", "cpu": "192", "memory": "2097152Mi", "device_id": "2330",
         "nccl_peak": 480.0, "nvlinks": 18, "pcie_gen": 5, "arch": "x86_64", "memory_mib": 81559}
HARDWARE: dict[str, dict[str, Any]] = {
    "p5.48xlarge": {**_H100, "nic": "efa", "nics": 32, "nic_rate": 100},
    "p5e.48xlarge": {**_H100, "model": "NVIDIA H200", "device_id": "2335", "memory_mib": 143771, "nic": "efa", "nics": 32, "nic_rate": 100},
    "p5en.48xlarge": {**_H100, "model": "NVIDIA H200", "device_id": "2335", "memory_mib": 143771, "nic": "efa", "nics": 16,
                      "nic_rate": 200},
    "p4d.24xlarge": {**_H100, "model": "NVIDIA A100-SXM4-40GB", "cpu": "96", "memory": "1179648Mi", "memory_mib": 40960,
                     "device_id": "20b0", "nccl_peak": 235.0, "nvlinks": 12, "pcie_gen": 4, "nic": "efa", "nics": 4,
                     "nic_rate": 100},
    "p4de.24xlarge": {**_H100, "model": "NVIDIA A100-SXM4-80GB", "cpu": "96", "memory": "1179648Mi", "memory_mib": 81920,
                      "device_id": "20b2", "nccl_peak": 235.0, "nvlinks": 12, "pcie_gen": 4, "nic": "efa", "nics": 4,
                      "nic_rate": 100},
    "p6-b200.48xlarge": {**_H100, "model": "NVIDIA B200", "device_id": "2901", "memory_mib": 183359, "nccl_peak": 800.0, "nic": "efa",
                         "nics": 8, "nic_rate": 400},
    "Standard_ND96isr_H100_v5": {**_H100, "cpu": "96", "memory": "1900Gi", "nic": "ib", "nics": 8, "nic_rate": 400},
    "a3-highgpu-8g": {**_H100, "cpu": "208", "memory": "1872Gi", "nic": "gve", "nics": 5, "nic_rate": 200},
    "m7i.4xlarge": {"gpus": 0, "model": "", "cpu": "16", "memory": "65536Mi", "device_id": "", "nccl_peak": 0.0,
                    "nvlinks": 0, "pcie_gen": 0, "nic": "ena", "nics": 1, "nic_rate": 0, "arch": "x86_64", "memory_mib": 0},
}

FAULT_KEYS = {"xids", "missing_gpus", "hung_check", "garbage_output", "ecc_dbe", "remap_pending",
              "remap_failure", "pod_lands_on_taint", "check_crash", "not_ready", "pcie_replay", "nvlink_down",
              "low_bandwidth", "dcgm_runtime_error", "checks_never_schedule", "lose_check_pod", "ecc_growth",
              "remap_growth", "pcie_downtrained", "nic_port_down", "nics_missing", "mtu", "poor_affinity",
              "xid_storm", "sxids", "thermal", "throttle", "recovery_action", "gpu_lost", "persistence_off", "dcgm_fail", "ecc_fail_at"}


@dataclass
class Faults:
    xids: list[dict[str, Any]] = field(default_factory=list)  # {code, gpu, at: seconds after start, text}
    missing_gpus: int = 0
    hung_check: bool = False
    garbage_output: bool = False
    check_crash: bool = False
    ecc_dbe: dict[int, int] = field(default_factory=dict)
    remap_pending: list[int] = field(default_factory=list)
    remap_failure: list[int] = field(default_factory=list)
    pod_lands_on_taint: int = 0  # times a GPU pod is bound just as Sweeper's taint lands
    not_ready: bool = False
    pcie_replay: list[int] = field(default_factory=list)  # GPUs whose PCIe link replays too often
    nvlink_down: list[int] = field(default_factory=list)  # GPUs with an NVLink link down
    low_bandwidth: float = 1.0  # NCCL bus bandwidth as a share of the healthy figure
    dcgm_runtime_error: bool = False  # dcgmi cannot run at all
    checks_never_schedule: bool = False  # the scheduler never binds Sweeper's check pods here
    lose_check_pod: int = 0  # times the kubelet loses a running check pod (it vanishes)
    ecc_growth: dict[int, float] = field(default_factory=dict)  # GPU -> corrected ECC errors per simulated day
    ecc_fail_at: float | None = None  # when the growing GPUs start reporting uncorrectable errors
    remap_growth: dict[int, float] = field(default_factory=dict)  # GPU -> remapped rows per simulated day
    pcie_downtrained: list[int] = field(default_factory=list)  # GPUs whose link trained at x8
    nic_port_down: list[int] = field(default_factory=list)  # fabric devices (by index) whose port is down
    nics_missing: int = 0
    mtu: int = 0  # the ENA/primary interface MTU (0: the healthy 9001)
    poor_affinity: bool = False  # every NIC across the CPU socket from every GPU
    xid_storm: dict[str, Any] = field(default_factory=dict)  # {code, gpu, count, at}
    sxids: list[dict[str, Any]] = field(default_factory=list)  # NVSwitch errors: {code, switch, fatal, at}
    thermal: list[int] = field(default_factory=list)  # GPUs past their thermal limit
    throttle: list[int] = field(default_factory=list)  # GPUs held down by HW slowdown
    recovery_action: dict[int, int] = field(default_factory=dict)  # GPU -> NVML recovery action
    gpu_lost: list[int] = field(default_factory=list)
    persistence_off: bool = False
    dcgm_fail: dict[int, str] = field(default_factory=dict)  # GPU -> DCGM test that fails on it

    @classmethod
    def from_dict(cls, node: str, raw: dict[str, Any]) -> Faults:
        unknown = set(raw) - FAULT_KEYS
        if unknown:
            raise ConfigError(f"fleet: node {node}: unknown fault(s) {sorted(unknown)}; known: {sorted(FAULT_KEYS)}")
        xids = []
        for x in raw.get("xids", []):
            if "code" not in x:
                raise ConfigError(f"fleet: node {node}: each XID needs a code")
            xids.append({"code": int(x["code"]), "gpu": int(x.get("gpu", 0)),
                         "at": parse_duration(x.get("at", 0)), "text": str(x.get("text", ""))})
        return cls(xids=xids, missing_gpus=int(raw.get("missing_gpus", 0)),
                   hung_check=bool(raw.get("hung_check", False)),
                   garbage_output=bool(raw.get("garbage_output", False)),
                   check_crash=bool(raw.get("check_crash", False)),
                   ecc_dbe={int(k): int(v) for k, v in (raw.get("ecc_dbe") or {}).items()},
                   remap_pending=[int(g) for g in raw.get("remap_pending", [])],
                   remap_failure=[int(g) for g in raw.get("remap_failure", [])],
                   pod_lands_on_taint=int(raw.get("pod_lands_on_taint", 0)),
                   not_ready=bool(raw.get("not_ready", False)),
                   pcie_replay=[int(g) for g in raw.get("pcie_replay", [])],
                   nvlink_down=[int(g) for g in raw.get("nvlink_down", [])],
                   low_bandwidth=float(raw.get("low_bandwidth", 1.0)),
                   dcgm_runtime_error=bool(raw.get("dcgm_runtime_error", False)),
                   checks_never_schedule=bool(raw.get("checks_never_schedule", False)),
                   lose_check_pod=int(raw.get("lose_check_pod", 0)),
                   ecc_growth={int(k): float(v) for k, v in (raw.get("ecc_growth") or {}).items()},
                   remap_growth={int(k): float(v) for k, v in (raw.get("remap_growth") or {}).items()},
                   ecc_fail_at=None if raw.get("ecc_fail_at") is None else parse_duration(raw["ecc_fail_at"]),
                   pcie_downtrained=[int(g) for g in raw.get("pcie_downtrained", [])],
                   nic_port_down=[int(g) for g in raw.get("nic_port_down", [])],
                   nics_missing=int(raw.get("nics_missing", 0)), mtu=int(raw.get("mtu", 0)),
                   poor_affinity=bool(raw.get("poor_affinity", False)),
                   xid_storm=_storm(node, raw.get("xid_storm")),
                   sxids=[_sxid(node, x) for x in raw.get("sxids") or []],
                   thermal=[int(g) for g in raw.get("thermal", [])],
                   throttle=[int(g) for g in raw.get("throttle", [])],
                   recovery_action={int(k): int(v) for k, v in (raw.get("recovery_action") or {}).items()},
                   gpu_lost=[int(g) for g in raw.get("gpu_lost", [])],
                   persistence_off=bool(raw.get("persistence_off", False)),
                   dcgm_fail={int(k): str(v) for k, v in (raw.get("dcgm_fail") or {}).items()})


def _sxid(node: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict) or "code" not in raw:
        raise ConfigError(f"fleet: node {node}: each SXID needs a code (and switch, fatal, at)")
    return {"code": int(raw["code"]), "switch": int(raw.get("switch", 0)), "fatal": bool(raw.get("fatal", False)),
            "at": parse_duration(raw.get("at", 0))}


def _storm(node: str, raw: Any) -> dict[str, Any]:
    if not raw:
        return {}
    if not isinstance(raw, dict) or "code" not in raw:
        raise ConfigError(f"fleet: node {node}: xid_storm needs a code (and gpu, count, at)")
    return {"code": int(raw["code"]), "gpu": int(raw.get("gpu", 0)), "count": int(raw.get("count", 1000)),
            "at": parse_duration(raw.get("at", 0))}


@dataclass
class NodeSpec:
    name: str
    instance_type: str
    zone: str
    labels: dict[str, str]
    age: float
    faults: Faults


@dataclass
class Workload:
    node: str | None  # None: let the scheduler choose
    gpus: int
    duration: float | None  # None: runs until deleted


@dataclass
class Fleet:
    name: str = "fleet"
    seed: int = 1
    speed: float = 600.0
    namespace: str = "sweeper"
    nodes: list[NodeSpec] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    arrivals_per_hour: float = 0.0
    arrival_gpus: int = 8
    arrival_duration: tuple[float, float] = (3600.0, 6 * 3600.0)
    check_seconds: float = 45.0
    api_fault_rate: float = 0.0
    api_lost_reply_rate: float = 0.0
    api_latency: float = 0.0  # seconds of real time added to a share of requests (api_faults.slow_rate)
    api_slow_rate: float = 0.0
    api_drop_rate: float = 0.0  # share of requests whose connection is dropped without an answer
    missing_images: list[str] = field(default_factory=list)  # registry.missing: references that do not exist
    image_lacks: dict[str, list[str]] = field(default_factory=dict)  # registry.lacking: image -> absent programs


def load_fleet(path: Path) -> Fleet:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read fleet file {path}: {exc}") from exc
    return parse_fleet(raw, str(path))


def parse_fleet(raw: Any, origin: str = "fleet") -> Fleet:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: a fleet file is a mapping")
    known = {"name", "seed", "speed", "namespace", "node_groups", "workloads", "arrivals", "faults",
             "check_seconds", "api_faults", "registry"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{origin}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    fleet = Fleet(name=str(raw.get("name", "fleet")), seed=int(raw.get("seed", 1)),
                  speed=float(raw.get("speed", 600)), namespace=str(raw.get("namespace", "sweeper")),
                  check_seconds=parse_duration(raw.get("check_seconds", 45)),
                  api_fault_rate=float((raw.get("api_faults") or {}).get("rate", 0.0)),
                  api_lost_reply_rate=float((raw.get("api_faults") or {}).get("lost_reply_rate", 0.0)),
                  api_latency=float((raw.get("api_faults") or {}).get("latency", 0.0)),
                  api_slow_rate=float((raw.get("api_faults") or {}).get("slow_rate", 0.0)),
                  api_drop_rate=float((raw.get("api_faults") or {}).get("drop_rate", 0.0)))
    registry = raw.get("registry") or {}
    if not isinstance(registry, dict) or set(registry) - {"missing", "lacking"} \
            or not isinstance(registry.get("lacking") or {}, dict):
        raise ConfigError(f"{origin}: registry has two keys: missing (a list of images) and lacking "
                          "(image: [programs])")
    fleet.missing_images = [str(i) for i in registry.get("missing") or []]
    fleet.image_lacks = {str(k): [str(p) for p in v or []] for k, v in (registry.get("lacking") or {}).items()}
    faults = raw.get("faults") or {}
    for group in raw.get("node_groups") or []:
        itype = group.get("instance_type", "p5.48xlarge")
        if itype not in HARDWARE:
            raise ConfigError(f"{origin}: unknown instance type {itype!r}; known: {sorted(HARDWARE)}")
        prefix = group.get("name_prefix", itype.split(".")[0] + "-")
        for i in range(int(group.get("count", 1))):
            name = f"{prefix}{i:0{max(2, len(str(group.get('count', 1))))}d}"
            fleet.nodes.append(NodeSpec(name=name, instance_type=itype, zone=group.get("zone", "us-east-1a"),
                                        labels=dict(group.get("labels") or {}),
                                        age=parse_duration(group.get("age", "2d")), faults=Faults()))
    names = {n.name for n in fleet.nodes}
    for node, spec in faults.items():
        if node not in names:
            raise ConfigError(f"{origin}: faults name node {node!r}, which the fleet does not have")
        next(n for n in fleet.nodes if n.name == node).faults = Faults.from_dict(node, spec or {})
    for w in raw.get("workloads") or []:
        dur = w.get("duration")
        for _ in range(int(w.get("count", 1))):
            fleet.workloads.append(Workload(node=w.get("node"), gpus=int(w.get("gpus", 8)),
                                            duration=None if dur is None else parse_duration(dur)))
    arr = raw.get("arrivals") or {}
    fleet.arrivals_per_hour = float(arr.get("per_hour", 0.0))
    fleet.arrival_gpus = int(arr.get("gpus", 8))
    if "duration" in arr:
        lo, hi = arr["duration"]
        fleet.arrival_duration = (parse_duration(lo), parse_duration(hi))
    return fleet


DEMO_FLEET: dict[str, Any] = {
    "name": "demo",
    "seed": 7,
    "speed": 600,
    "node_groups": [{"name_prefix": "gpu-p5-", "count": 16, "instance_type": "p5.48xlarge",
                     "zone": "us-east-1a", "labels": {"karpenter.sh/nodepool": "gpu"}, "age": "3d"}],
    "workloads": [{"node": "gpu-p5-02", "gpus": 8, "duration": None},
                  {"node": "gpu-p5-06", "gpus": 8, "duration": "20h"},
                  {"node": "gpu-p5-11", "gpus": 4, "duration": "2d"}],
    "arrivals": {"per_hour": 0.15, "gpus": 8, "duration": ["2h", "8h"]},
    "faults": {
        "gpu-p5-04": {"xids": [{"code": 79, "gpu": 3, "text": "GPU has fallen off the bus."}]},
        "gpu-p5-09": {"missing_gpus": 1},
        "gpu-p5-13": {"hung_check": True},
        "gpu-p5-14": {"remap_pending": [5]},
    },
}
