"""Node-local checks that read what the platform keeps on the node: the kernel's journal beside the
ring buffer, and the host's own EFA tools, through the simulated kubelet."""

from __future__ import annotations

from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, run_sweep

# XID 109 (context switch timeout): the driver asks for a GPU reset, and NVIDIA's device plugin does
# not mark the GPU unhealthy for it (an application XID), so only the kernel log tells.
XID_109 = {"xids": [{"code": 109, "gpu": 3, "at": "0s", "text": "Ctx switch timeout"}], "ring_buffer_span": "10m"}


def test_an_xid_the_ring_buffer_lost_is_found_in_the_journal(make_sim, history: History) -> None:
    """A noisy driver overwrites the few MiB of the kernel ring buffer within hours, and `dmesg`
    then no longer shows an XID of this morning; journald read it from /dev/kmsg and keeps it
    (https://www.freedesktop.org/software/systemd/man/latest/systemd-journald.service.html). The
    check reads both, so the XID is judged within its window; a node whose host keeps no journal is
    judged on the ring buffer alone, as before."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-00": XID_109, "gpu-01": {**XID_109, "no_journal": True}})
    sim.cluster.clock.advance(3600)  # the XID is an hour old: past the ring buffer's 10 minutes
    assert "Xid" not in sim.cluster.kernel_log("gpu-00", sim.cluster.clock.now())
    report = run_sweep(sim, history, TEST_CONFIG)
    got = {o.node: o.verdict for o in report.outcomes}
    assert got["gpu-01"] == "pass", report.outcomes
    assert got["gpu-00"] not in ("pass", "warn", "error", "inconclusive"), report.outcomes
    reasons = next(o.reasons for o in report.outcomes if o.node == "gpu-00")
    assert any("XID 109" in r for r in reasons), reasons


def test_a_p5_sweep_reads_efa_through_the_hosts_own_fi_info(make_sim, history: History) -> None:
    """The EFA installer's fi_info, run in the host's root, sees the node's 32 EFA devices; the
    sweep passes on it, and a host without it is a `check.tool` finding, not a failing node."""
    from dataclasses import replace

    from sweeper.profiles import load_profile

    sim: Sim = make_sim(nodes=1)
    assert load_profile(TEST_CONFIG.path("profiles") / "p5.48xlarge.yaml").nic == "efa"
    report = run_sweep(sim, history, replace(TEST_CONFIG, interval=0))
    assert [(o.node, o.verdict) for o in report.outcomes] == [("gpu-00", "pass")]
    checks = {c["name"]: c for c in history.db.query("select name, status, message from checks")}
    assert checks["efa.fi_info"]["status"] == "pass" and "32 EFA devices" in checks["efa.fi_info"]["message"]
