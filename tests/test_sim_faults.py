"""Every fault of the simulated fleet is caught by the check meant for it, through the code path
of the simulated kubelet (fake NVML, fake host, the profile's flags), and a healthy node of
every simulated shape passes every check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweeper.checks import run_node_checks
from sweeper.checks.options import CheckOptions
from sweeper.policy import decide
from sweeper.profiles import load_profiles, match
from sweeper.result import Result
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import HARDWARE, parse_fleet

ROOT = Path(__file__).resolve().parent.parent
PROFILES = load_profiles(ROOT / "profiles")
DAY = 86400.0


def check_node(itype: str, faults: dict[str, Any] | None = None, after: float = 3600.0,
               uptime: float = 7200.0) -> Result:
    fleet = parse_fleet({"node_groups": [{"name_prefix": "n-", "count": 1, "instance_type": itype}],
                         "faults": {"n-00": faults} if faults else {}})
    sim = SimCluster(fleet)
    profile = match(PROFILES, {"node.kubernetes.io/instance-type": itype})
    opts = CheckOptions.from_argv(["--node", "n-00", *profile.check_args()])
    now = sim.started + after
    return run_node_checks(opts, sim.fake_nvml("n-00", now), sim.kernel_log("n-00", now), now=now, uptime=uptime,
                           host=sim.fake_host("n-00"))


GPU_TYPES = sorted(t for t, hw in HARDWARE.items() if hw["gpus"])


@pytest.mark.parametrize("itype", GPU_TYPES)
def test_a_healthy_node_of_every_shape_passes_every_check(itype: str) -> None:
    r = check_node(itype)
    assert r.status == "pass", [(c.name, c.gpu, c.status, c.message) for c in r.checks if c.status != "pass"]
    names = {c.name for c in r.checks}
    assert {"gpu.count", "gpu.model", "ecc.volatile_uncorrected", "row_remap", "nvlink.state", "pcie.link",
            "clocks.events", "thermal.margin", "gpu.recovery_action", "xid", "nic.devices"} <= names
    assert "xid.journal" not in names, "the simulated kubelet mounts the node's journal: it is read"
    if HARDWARE[itype]["nic"] == "efa":
        assert {"nic.port", "efa.fi_info", "net.mtu"} <= names
    if HARDWARE[itype]["nic"] == "ib":
        assert {"nic.port", "topology.gpu_nic"} <= names


# fault -> (instance type, the finding it must raise: check name, code, status)
FAULTS: dict[str, tuple[str, dict[str, Any], str, str | None, str]] = {
    "missing GPU": ("p5.48xlarge", {"missing_gpus": 1}, "gpu.count", None, "fail"),
    "XID 79": ("p5.48xlarge", {"xids": [{"code": 79, "gpu": 2}]}, "xid", "79", "fail"),
    "XID storm": ("p5.48xlarge", {"xid_storm": {"code": 94, "gpu": 1, "count": 5000}}, "xid", "94", "warn"),
    "fatal NVSwitch error": ("p5.48xlarge", {"sxids": [{"code": 24007, "switch": 2, "fatal": True}]}, "sxid",
                             "24007", "fail"),
    "non-fatal NVSwitch error": ("p5.48xlarge", {"sxids": [{"code": 12028, "switch": 1}]}, "sxid", "12028", "warn"),
    "volatile DBE": ("p5.48xlarge", {"ecc_dbe": {3: 2}}, "ecc.volatile_uncorrected", "DBE", "fail"),
    "remap pending": ("p5.48xlarge", {"remap_pending": [5]}, "row_remap", "REMAP_PENDING", "fail"),
    "remap failure": ("p5.48xlarge", {"remap_failure": [5]}, "row_remap", "REMAP_FAILURE", "fail"),
    "NVLink down": ("p5.48xlarge", {"nvlink_down": [4]}, "nvlink.state", "NVLINK_DOWN", "fail"),
    "PCIe downtrained": ("p5.48xlarge", {"pcie_downtrained": [6]}, "pcie.link", "PCIE_DOWNTRAINED", "fail"),
    "PCIe replays": ("p4d.24xlarge", {"pcie_replay": [1]}, "pcie.replay", "PCIE_REPLAY", "fail"),
    "thermal": ("p5en.48xlarge", {"thermal": [7]}, "thermal.margin", "THERMAL", "fail"),
    "HW slowdown": ("p5.48xlarge", {"throttle": [2]}, "clocks.events", None, "warn"),
    "recovery action": ("p6-b200.48xlarge", {"recovery_action": {0: 2}}, "gpu.recovery_action",
                        "RECOVERY_REBOOT", "fail"),
    "GPU lost": ("p5.48xlarge", {"gpu_lost": [3]}, "gpu.lost", "GPU_LOST", "fail"),
    "persistence off": ("p5.48xlarge", {"persistence_off": True}, "gpu.persistence", None, "warn"),
    "EFA device missing": ("p5en.48xlarge", {"nics_missing": 2}, "nic.devices", "NIC_COUNT", "fail"),
    "IB port down": ("Standard_ND96isr_H100_v5", {"nic_port_down": [0]}, "nic.port", "NIC_PORT_DOWN", "fail"),
    "gVNIC down": ("a3-highgpu-8g", {"nic_port_down": [2]}, "nic.port", "NIC_PORT_DOWN", "fail"),
    "MTU 1500": ("p5.48xlarge", {"mtu": 1500}, "net.mtu", "MTU", "fail"),
    "poor GPU-NIC affinity": ("Standard_ND96isr_H100_v5", {"poor_affinity": True}, "topology.gpu_nic",
                              "NIC_AFFINITY", "fail"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_caught_by_its_check(fault: str) -> None:
    itype, spec, name, code, status = FAULTS[fault]
    r = check_node(itype, spec)
    found = [c for c in r.checks if c.name == name and c.status == status and (code is None or c.code == code)]
    assert found, [(c.name, c.code, c.status, c.message) for c in r.checks if c.status != "pass"]
    assert decide([r.to_dict()]).verdict != "pass"


def test_an_xid_storm_is_one_finding_with_a_count() -> None:
    r = check_node("p5.48xlarge", {"xid_storm": {"code": 79, "gpu": 1, "count": 5000}})
    xids = [c for c in r.checks if c.name == "xid"]
    assert len(xids) == 1 and "x5000" in xids[0].message and xids[0].gpu == 1
    assert {(m.name, m.gpu, m.value) for m in r.metrics if m.name.startswith("xid.")} == {("xid.79", 1, 5000.0)}
    assert len(r.summary()) < 4096


def test_ecc_and_remap_counters_grow_with_simulated_time() -> None:
    faults = {"ecc_growth": {2: 50}, "remap_growth": {2: 4}}

    def reading(after: float) -> dict[str, float]:
        r = check_node("p5.48xlarge", faults, after=after)
        return {m.name: m.value for m in r.metrics if m.gpu == 2}

    d1, d10 = reading(1 * DAY), reading(10 * DAY)
    assert d10["ecc.aggregate_corrected"] - d1["ecc.aggregate_corrected"] == pytest.approx(450, abs=2)
    assert d10["row_remap.corrected"] - d1["row_remap.corrected"] == pytest.approx(36, abs=1)
    assert check_node("p5.48xlarge", faults, after=10 * DAY).status == "pass", "a trend, not a failure yet"


def test_dcgm_failure_per_gpu_reaches_the_dcgm_parser() -> None:
    from sweeper.parsers import dcgm
    from sweeper.sim.tools import dcgm_output

    fleet = parse_fleet({"node_groups": [{"name_prefix": "n-", "count": 1}],
                         "faults": {"n-00": {"dcgm_fail": {4: "memory_bandwidth"}}}})
    code, out = dcgm_output(fleet.nodes[0], 3)
    r = dcgm.parse(out, "n-00", 0.0, exit_code=code, expect_gpus=8)
    assert {(c.name, c.gpu) for c in r.checks if c.status == "fail"} == {("dcgm.memory_bandwidth", 4)}


FABRIC_FAULTS: list[dict[str, Any]] = [{"link_degraded": 0.4}, {"port_flapping": True}, {"path_mtu": {"eth0": 1500}},
                                       {"gpudirect_off": True}, {"fabric_corrupt": True},
                                       # an EFA link that is down: the EFA driver still reports its port ACTIVE
                                       # (amzn-drivers, kernel/linux/efa/src/efa_verbs.c, efa_query_port)
                                       {"nic_port_down": [9]}]


@pytest.mark.parametrize("faults", FABRIC_FAULTS, ids=lambda f: next(iter(f)))
def test_fabric_faults_are_invisible_to_single_node_checks(faults: dict[str, Any]) -> None:
    """What a pair sweep is for: these faults show only between two nodes (tests/test_sim_fabric.py)."""
    r = check_node("p5.48xlarge", faults)
    assert r.status == "pass", [(c.name, c.message) for c in r.checks if c.status != "pass"]


def test_fabric_fault_values_are_checked_by_the_fleet_loader() -> None:
    from sweeper.schema import ConfigProblems

    def problems(faults: dict[str, Any]) -> list[str]:
        with pytest.raises(ConfigProblems) as exc:
            parse_fleet({"node_groups": [{"name_prefix": "n-", "count": 1}], "faults": {"n-00": faults}})
        return exc.value.problems

    assert problems({"link_degraded": 1.5})[0].startswith("fleet:")
    assert "faults.n-00.link_degraded" in problems({"link_degraded": 1.5})[0]
    assert "faults.n-00.path_mtu" in problems({"path_mtu": {"eth0": 9}})[0]
    assert "faults.n-00.port_flapping" in problems({"port_flapping": "often"})[0]
    fleet = parse_fleet({"node_groups": [{"name_prefix": "n-", "count": 1}],
                         "faults": {"n-00": {"path_mtu": {"eth0": 1500}, "link_degraded": 0.5}}})
    assert fleet.nodes[0].faults.path_mtu == {"eth0": 1500} and fleet.nodes[0].faults.link_degraded == 0.5


def test_generated_names_do_not_collide_in_a_large_fleet() -> None:
    """Thousands of pods made from one generateName (a training fleet's workers) all get names: the
    apiserver draws five characters of k8s.io/apimachinery's rand alphabet (27 characters, 14.3M
    names) and draws again when the name is taken (KEP-4420). Five hex characters (1M names) drawn
    once collided in 98% of fleets of 3,000 pods."""
    from sweeper.clock import WallClock
    from sweeper.sim.store import NAME_ALPHABET, Store

    store = Store(WallClock())
    store.create("namespaces", None, {"metadata": {"name": "training"}})
    names = {store.create("pods", "training", {"metadata": {"generateName": "train-"}, "spec": {}})["metadata"]["name"]
             for _ in range(3000)}
    assert len(names) == 3000
    assert all(len(n) == len("train-") + 5 and set(n[len("train-"):]) <= set(NAME_ALPHABET) for n in names)
