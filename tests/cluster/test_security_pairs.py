"""A pair's two pod logs each blame only the node they ran on: attacks by a node taken over that has
become known-good, against the simulated cluster over HTTP.

A node's kubelet serves its pods' logs and reports their exit codes, and its container runtime runs
whatever the node's owner put there: a node taken over prints what it likes as its own rank's log
(the simulator's `forged_output` and `forged_exit`). As the known-good partner of a suspect's
re-pair, it must not be able to have the healthy suspect held with a forged abort or path-MTU
failure of its own rank. A real fault of the suspect still shows in the suspect's own rank: rank 0
(the suspect in a re-pair) prints the all-reduce table, NCCL's own abort and each rank's own
path-MTU probe.

The abort's words are NCCL's NET/IB completion error (transport/net_ib.cc, as
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html shows such lines) and
torch's DistBackendError around it; the probe is iputils' ping with don't-fragment
(`ping -M do -s MTU-28`, ping/ping_common.c), as images/nccl-pair's `pair-allreduce` frames it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sweeper.history import History
from sweeper.policy import HOLDING
from tests.conftest import TEST_CONFIG, Sim, run_sweep

SUSPECT, FIRST, HOSTILE, GOOD = "gpu-00", "gpu-01", "gpu-02", "gpu-03"
TAINT = TEST_CONFIG.taint_key

ABORT = ("gpu-02:412:977 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.0.2<41870> "
         "with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.0.2\n"
         "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process "
         "exited or there was a network error, NCCL version 2.23.4\n")
MTU_LIE = ("# pair-mtu iface=eth0 mtu=9001 peer=sweep-pair-peer\n"
           "PING sweep-pair-peer (10.1.0.2) 8973(9001) bytes of data.\n\n"
           "--- sweep-pair-peer ping statistics ---\n"
           "3 packets transmitted, 0 received, 100% packet loss, time 2035ms\n"
           "# pair-mtu-end iface=eth0 rc=1\n"
           "# pair-allreduce rank 1 done\n")


def fabric(**kw: Any) -> Any:
    return replace(TEST_CONFIG, playbook="pair-fabric.yaml", light_playbook="", **kw)


def seeded(sim: Sim, history: History) -> None:
    """The history an earlier run left: SUSPECT and FIRST failed their pair (both suspects, let go
    for want of a known-good partner), HOSTILE and GOOD passed theirs (both known-good)."""
    now = sim.cluster.clock.now()
    history.pair_result("sw-old", now - 7200, SUSPECT, FIRST, "fail", "sweep", 190.0, "low")
    history.pair_result("sw-old", now - 7000, HOSTILE, GOOD, "pass", "sweep", 440.0, "")


def outcomes(report: Any) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for o in report.outcomes:
        out.setdefault(o.node, []).append((o.verdict, o.action))
    return out


def pair_rows(history: History) -> list[tuple[str, str, str, str]]:
    return [(r["node"], r["partner"], r["status"], r["mode"])
            for r in history.db.query("select * from pairs where run_id != 'sw-old' order by id")]


def tainted(sim: Sim) -> set[str]:
    with sim.cluster.store.lock:
        return {n["metadata"]["name"] for n in sim.cluster.store.iter("nodes")
                if any(t.get("key") == TAINT for t in n["spec"].get("taints") or [])}


@pytest.mark.parametrize("forged,exit_code", [(ABORT, 1), (MTU_LIE, 0)], ids=["abort", "path-mtu"])
def test_a_known_good_partner_that_forges_a_failure_of_its_own_rank_gets_no_healthy_suspect_held(
        make_sim, history: History, forged: str, exit_code: int) -> None:
    """HOSTILE passed its pairs and is known-good; as the partner of SUSPECT's re-pair it prints an
    abort (and exits 1), or a path-MTU probe that never came back, as its own rank's log. SUSPECT's
    own rank shows a full table at the healthy rate and its own probe fine: the re-pair blames no
    one, both are re-paired, SUSPECT passes with another known-good partner and goes back, and
    HOSTILE, re-paired as a suspect (rank 0, its own log), is held on its own word."""
    sim: Sim = make_sim(nodes=4, faults={HOSTILE: {"forged_output": forged, "forged_exit": exit_code}})
    seeded(sim, history)
    report = run_sweep(sim, history, fabric())
    got = outcomes(report)
    assert got[SUSPECT][-1] == ("pass", "released"), got
    assert not any(v in HOLDING for v, _ in got[SUSPECT]), got
    rows = pair_rows(history)
    assert (SUSPECT, HOSTILE, "fail", "sweep") in rows, "recorded as a pair that blames no one"
    first = next(o for o in report.outcomes if o.node == SUSPECT)
    assert first.action == "suspect" and f"failed on {HOSTILE}'s own log alone" in first.reasons[0], first
    assert f"{SUSPECT} is not blamed" in first.reasons[0]
    assert got[HOSTILE][0] == ("inconclusive", "suspect"), "known-good no more: a suspect itself"
    assert got[HOSTILE][-1][0] in HOLDING and got[HOSTILE][-1][1] == "held", got
    assert any(r[0] == HOSTILE and r[2:] == ("fail", "repair") for r in rows), "re-paired as the suspect"
    assert tainted(sim) == {HOSTILE}
    assert HOSTILE not in history.known_good(0) and SUSPECT in history.known_good(0)


@pytest.mark.parametrize("fault,code", [
    ({"link_degraded": 0.4}, "LOW_BANDWIDTH"),
    ({"path_mtu": {"eth0": 1500}}, "PATH_MTU"),
    ({"fabric_corrupt": True}, "NCCL_WRONG"),
    ({"port_flapping": True}, None),  # NET/IB or NET/OFI aborts, or a rate far under the floor
], ids=["degraded-link", "path-mtu", "corrupt", "flapping-port"])
def test_a_real_fabric_fault_of_the_suspect_still_names_it_with_a_good_partner(
        make_sim, history: History, fault: dict[str, Any], code: str | None) -> None:
    """The same re-pair with an honest known-good partner and a real fault on SUSPECT: its own rank
    shows it (rank 0's table, its own probe, its own NCCL abort), so the failure is SUSPECT's and it
    is held; the known-good partner goes back inconclusive, as before."""
    sim: Sim = make_sim(nodes=4, faults={SUSPECT: fault})
    seeded(sim, history)
    report = run_sweep(sim, history, fabric())
    got = outcomes(report)
    assert got[SUSPECT][-1][0] in HOLDING and got[SUSPECT][-1][1] == "held", got
    assert (SUSPECT, HOSTILE, "fail", "repair") in pair_rows(history)
    assert got[HOSTILE] == [("inconclusive", "released")], got
    reasons = history.node_history(SUSPECT)["sweeps"][0]["reasons"]
    assert f"failed again with known-good partner {HOSTILE}" in reasons, reasons
    if code is not None:
        found = {r["code"] for r in history.db.query(
            "select code from checks where node = ? and status = 'fail'", [SUSPECT])}
        assert code in found, found
    assert tainted(sim) == {SUSPECT}


def test_a_claims_pair_with_a_forging_known_good_partner_settles_the_claim_inconclusive(
        make_sim, history: History) -> None:
    """An NVLink claim (node-problem-detector's GpuNvlink condition) on a healthy node is tested by
    a pair with an idle known-good partner (tests/cluster/test_claims.py). Both known-good nodes are
    taken over and print an abort as their own rank's log: the claim is not confirmed on the
    partner's word, the node is not held, and the partner is known-good no more."""
    from tests.cluster.test_claims import NVLINK, NVLINK_CODE, judged, with_pairs
    from tests.conftest import fleet_spec

    hostile = {"forged_output": ABORT, "forged_exit": 1}
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={SUSPECT: {"outside_claims": [NVLINK]}, HOSTILE: hostile,
                                                    GOOD: hostile}))
    history.pair_result("sw-old", sim.cluster.clock.now() - 3600, HOSTILE, GOOD, "pass", "sweep", 380.0, "")
    report = run_sweep(sim, history, with_pairs())
    assert judged(history) == {(SUSPECT, "node-problem-detector", NVLINK_CODE): "inconclusive"}
    [row] = [r for r in pair_rows(history)]
    assert row[0] == SUSPECT and row[1] in (HOSTILE, GOOD) and row[2:] == ("fail", "sweep"), row
    assert not [o for o in report.outcomes if o.node == SUSPECT and o.verdict in HOLDING], report.outcomes
    assert row[1] not in history.known_good(0)
    assert SUSPECT not in tainted(sim)
