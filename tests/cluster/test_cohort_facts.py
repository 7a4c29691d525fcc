"""A sweep of the simulated cluster records each node's facts, as a real one would: NVML's driver,
CUDA version, VBIOS, serials and board part number from the check (the fake NVML answers as an
H100 80GB HBM3 did: VBIOS 96.00.DA.00.0C, board 692-2G520-0200-000), and the node's zone, instance
type and topology labels (EKS's network node layers,
https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html). A fleet file's
`rollouts` moves part of the fleet to a driver that fails more often; `sweeper cohorts` reads it."""

from __future__ import annotations

from sweeper.cohorts import cohort_report
from sweeper.history import History
from tests.conftest import fleet_spec, run_sweep

NEW = "580.65.06"


def test_a_sweep_records_facts_and_a_rollout_fails_its_nodes(make_sim, history: History) -> None:
    sim = make_sim(fleet_spec(nodes=8, platform="eks", rollouts=[{"driver": NEW, "share": 0.5, "fail_rate": 1.0}]))
    rolled = {n.name for n in sim.cluster.fleet.nodes if n.driver == NEW}
    assert len(rolled) == 4
    report = run_sweep(sim, history)
    verdicts = {o.node: o.verdict for o in report.outcomes}
    assert {n for n, v in verdicts.items() if v not in ("pass", "warn")} == rolled, verdicts
    facts = {(r["node"], r["key"]): r["value"] for r in history.query("select node, key, value from facts")}
    for node in verdicts:
        assert facts[(node, "driver")] == (NEW if node in rolled else "570.133.20")
        assert facts[(node, "cuda")] == ("13.0" if node in rolled else "12.8")
        assert facts[(node, "vbios")] == "96.00.DA.00.0C" and facts[(node, "board")] == "692-2G520-0200-000"
        assert facts[(node, "gpu.7.serial")].startswith("165")
        assert facts[(node, "zone")] == "us-east-1a" and facts[(node, "instance-type")] == "p5.48xlarge"
        assert facts[(node, "rack")].startswith("nn-")
    assert len({facts[(n, "gpu.0.serial")] for n in verdicts}) == 8
    doc = cohort_report(history, "driver", 0.0, min_days=1)
    by = {c["value"]: c for c in doc["cohorts"]}
    assert by[NEW]["failures"] == 4 and by["570.133.20"]["failures"] == 0
    causes = {r["node"]: r["causes"] for r in history.query("select node, causes from node_sweeps")}
    assert all("pcie" in causes[n] for n in rolled), causes  # the rollout's fault: PCIe replays on GPU 0
