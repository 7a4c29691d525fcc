"""An XID stays in the kernel log until the node reboots (dmesg is the kernel's ring buffer; a GPU
reset does not clear it). One logged before the node's last passing sweep, or before Sweeper reset
its GPUs, was dealt with already and does not hold the node again. Several sweeps of the simulated
cluster, each reading the same kernel log."""

from __future__ import annotations

from dataclasses import replace

from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, held_then_released_by_a_person, run_sweep


def outcome(report: object, node: str) -> tuple[str, str]:
    o = {x.node: x for x in report.outcomes}[node]  # type: ignore[attr-defined]
    return o.verdict, o.action


def test_an_xid_a_gpu_reset_cleared_does_not_hold_the_node_again(make_sim, history: History) -> None:
    """XID 109 (context switch timeout) is RESET_GPU in NVIDIA's catalogue
    (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), and the device plugin does not mark
    the GPU unhealthy for it. After the reset the line is still in the kernel log: without --xid-since
    the next sweep would reset again, and the policy's second reboot verdict for the same cause
    would replace a healthy node."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-00": {"xids": [{"code": 109, "gpu": 5, "text": "Ctx switch timeout"}]}})
    cfg = replace(TEST_CONFIG, remediate_reboots=True, interval=0)
    first = run_sweep(sim, history, cfg)
    assert outcome(first, "gpu-00")[0] == "reboot"
    assert sim.core.read_node("gpu-00").metadata.annotations["sweeper.dev/remediation"] == "gpu-reset"
    reset_at = history.xids_cleared("gpu-00")
    assert reset_at is not None
    for _ in range(2):
        sim.cluster.clock.advance(600)
        again = run_sweep(sim, history, cfg)
        assert outcome(again, "gpu-00") == ("pass", "released")
    assert ": 109, " in sim.cluster.kernel_log("gpu-00", sim.cluster.clock.now()), "the line is still there"
    # A new XID after the reset holds the node as usual.
    at = sim.cluster.clock.now() - sim.cluster.started + 60
    sim.cluster.specs["gpu-00"].faults.xids.append({"code": 79, "gpu": 2, "at": at, "text": "GPU has fallen off the bus."})
    sim.cluster.clock.advance(600)
    assert outcome(run_sweep(sim, history, cfg), "gpu-00")[0] == "reboot"


def test_a_node_that_passed_is_not_held_again_by_the_same_old_xid(make_sim, history: History) -> None:
    """Held for XID 79, released by a person (the next sweep warns: dismissed), then swept again: the
    XID logged before that passing sweep is not judged again, so no finding of it is left at all."""
    sim, cfg, second = held_then_released_by_a_person(make_sim, history)
    assert outcome(second, "gpu-01") == ("warn", "released")
    for _ in range(2):
        sim.cluster.clock.advance(600)
        later = run_sweep(sim, history, cfg)
        o = {x.node: x for x in later.outcomes}["gpu-01"]
        assert not any("XID 79" in r for r in o.reasons), o.reasons
        # The device plugin still counts GPU 3 unhealthy until a reboot: that dismissed finding warns.
        assert outcome(later, "gpu-01") == ("warn", "released") and len(o.reasons) == 1, o.reasons
        assert o.reasons[0].startswith("gpu.allocatable")
