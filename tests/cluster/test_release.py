"""`sweeper release` is no judgement of a verdict. A person hands nodes back (an incident, a
rollout stopped, a job owner who needs the node today), often from a laptop that has none of the
CronJob's history: the next sweep must check each node again, and the findings that held it
must hold it again. Only `--false-positive` says the verdicts were wrong and dismisses their
findings, as taking Sweeper's taint off by hand (kubectl) always has."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, run_sweep

FAULTY = {"gpu-01": {"xids": [{"code": 79, "gpu": 3}]}, "gpu-02": {"missing_gpus": 1}}


def _release(sim: Sim, tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """`sweeper release` as a person runs it from another machine: no history there."""
    res = CliRunner().invoke(main, ["release", *args, "--kubeconfig", str(sim.kubeconfig),
                                    "--state", str(tmp_path / "laptop.db"), "--json"])
    assert res.exit_code == 0, res.output
    return list(json.loads(res.stdout))


def _controls(sim: Sim) -> dict[str, str]:
    """The control ConfigMap's keys (none until a switch is first set)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return dict(sim.core.read_namespaced_config_map(TEST_CONFIG.control_name, TEST_CONFIG.namespace).data or {})
    except ApiException as exc:
        assert exc.status == 404
        return {}


def _held(report: Any) -> dict[str, str]:
    return {o.node: o.verdict for o in report.outcomes if o.action == "held"}


def test_a_release_from_another_machine_is_no_dismissal(make_sim, history: History, tmp_path: Path) -> None:
    """The case a new user found: `release --all --reason 'stopping the rollout'` from a laptop, and
    the CronJob's next run took every released node for a false positive (a node untainted with no
    record in its history) and dismissed its XID 79 and missing GPU cluster-wide, for good."""
    sim: Sim = make_sim(nodes=3, faults=FAULTY)
    cfg = replace(TEST_CONFIG, interval=0)
    assert _held(run_sweep(sim, history, cfg)).keys() == {"gpu-01", "gpu-02"}
    rows = _release(sim, tmp_path, "--all", "--reason", "stopping the rollout")
    assert {r["node"] for r in rows if r["action"] == "released"} == {"gpu-01", "gpu-02"}
    mark = sim.core.read_node("gpu-01").metadata.annotations["sweeper.dev/released"]
    assert "stopping the rollout" in mark

    assert sim.core.read_node("gpu-02").metadata.labels.get("sweeper.dev/suspect") == "true"
    # interval 20h: only as suspects are the released nodes due at once
    again = run_sweep(sim, history, replace(cfg, interval=20 * 3600))
    assert not [d for d in again.reconciled if d.get("action") == "marked a false positive"], again.reconciled
    assert _held(again).keys() == {"gpu-01", "gpu-02"}, "the same findings hold them again"
    assert "released by hand after verdict" in {d.node.name: d.detail for d in again.plan.take}["gpu-02"]
    assert not [k for k in _controls(sim) if k.startswith("dismissed.")], _controls(sim)
    # the release is in the CronJob's history now, and its mark is off the node (read once)
    said = [a["detail"] for a in history.db.query("select detail from actions where node = 'gpu-01' and "
                                                   "action = 'release'")]
    assert any("stopping the rollout" in d for d in said), said
    assert "sweeper.dev/released" not in (sim.core.read_node("gpu-02").metadata.annotations or {})


def test_false_positive_dismisses_the_findings_that_held_the_node(make_sim, history: History,
                                                                  tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=3, faults=FAULTY)
    cfg = replace(TEST_CONFIG, interval=0)
    run_sweep(sim, history, cfg)
    rows = _release(sim, tmp_path, "gpu-01", "--false-positive", "--reason", "XID 79 was a driver bug")
    assert [r["action"] for r in rows if r["node"] == "gpu-01"][0] == "released"
    node = sim.core.read_node("gpu-01").metadata
    assert '"false_positive":true' in node.annotations["sweeper.dev/released"]
    assert "sweeper.dev/suspect" not in (node.labels or {}), "a false positive is no suspect"
    again = run_sweep(sim, history, cfg)
    assert [d["node"] for d in again.reconciled if d.get("action") == "marked a false positive"] == ["gpu-01"]
    o = {x.node: x for x in again.outcomes}["gpu-01"]
    assert (o.verdict, o.action) == ("warn", "released") and "dismissed by a person" in " ".join(o.reasons)
    assert "dismissed.gpu-01" in _controls(sim)
    said = [a["detail"] for a in history.db.query("select detail from actions where action = 'false-positive'")]
    assert len(said) == 1 and "XID 79 was a driver bug" in said[0], said


def test_a_forged_or_stale_release_mark_never_dismisses_and_never_spares_a_later_verdict(
        make_sim, history: History, tmp_path: Path) -> None:
    """A node may write its own annotations (its kubelet may update its Node object), so the mark
    is read as data that can only spare findings a dismissal. One that does not read is taken off
    and ignored; one older than the verdict that held the node (a release before that sweep) does
    not count against it: taking the taint off by hand then is still a person's false positive."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"xids": [{"code": 79, "gpu": 3}]}})
    cfg = replace(TEST_CONFIG, interval=0)
    sim.core.patch_node("gpu-01", {"metadata": {"annotations": {
        "sweeper.dev/released": json.dumps({"at": "2001-01-01T00:00:00Z", "reason": "old", "by": "x"})}}})
    run_sweep(sim, history, cfg)  # held: the old mark is read (an action long before) and taken off
    node = sim.core.read_node("gpu-01")
    sim.core.patch_node("gpu-01", {"metadata": {"annotations": {"sweeper.dev/released": "{not json"}},
                                   "spec": {"taints": [t.to_dict() for t in node.spec.taints
                                                       if t.key != TEST_CONFIG.taint_key]}})
    again = run_sweep(sim, history, cfg)
    assert [d["node"] for d in again.reconciled if d.get("action") == "marked a false positive"] == ["gpu-01"]
    assert "sweeper.dev/released" not in (sim.core.read_node("gpu-01").metadata.annotations or {})


def test_a_hold_takes_an_older_release_mark_off(make_sim, history: History, tmp_path: Path) -> None:
    """A node released, then held again before any run's reconcile read the mark (`sweeper run`, or a
    run already in flight taking it): the hold takes the mark off, so a later `--false-positive`, or
    a taint taken off by hand, dismisses as it says."""
    from sweeper.actions.holding import hold, keep_held

    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"xids": [{"code": 79, "gpu": 3}]}})
    cfg = replace(TEST_CONFIG, interval=0)
    run_sweep(sim, history, cfg)
    _release(sim, tmp_path, "gpu-01", "--reason", "need it")
    assert "sweeper.dev/released" in (sim.core.read_node("gpu-01").metadata.annotations or {})
    hold(sim.kube, cfg, sim.kube.get_node("gpu-01"), "adhoc-run", sim.cluster.clock.now())
    keep_held(sim.kube, cfg, "gpu-01", "reboot", "xid 79", "adhoc-run")
    assert "sweeper.dev/released" not in (sim.core.read_node("gpu-01").metadata.annotations or {})
    _release(sim, tmp_path, "gpu-01", "--false-positive", "--reason", "a driver bug")
    again = run_sweep(sim, history, cfg)
    assert [d["node"] for d in again.reconciled if d.get("action") == "marked a false positive"] == ["gpu-01"]
