"""What a node's own object says is data, read by a parser that cannot be made to throw past it:
attacks through the node's annotations, against the simulated cluster over HTTP.

The kubelet may update its own Node object (its annotations included: the NodeRestriction admission
plugin limits its labels, not its annotations,
https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction), so a
node taken over can write any annotation it likes on itself."""

from __future__ import annotations

from dataclasses import replace

from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

# json.loads raises RecursionError, not ValueError, on arrays nested past the interpreter's recursion
# limit (1000 by default): 5000 `[` are 5 kB of annotation, well under the object's 256 KiB.
DEEP = "[" * 5000


def test_a_gke_node_whose_north_interfaces_nest_too_deep_lists_no_network_and_the_run_goes_on(make_sim, history: History) -> None:
    spec = fleet_spec(nodes=0)
    spec["node_groups"] = [{"name_prefix": "a3-", "count": 2, "instance_type": "a3-highgpu-8g"}]
    sim: Sim = make_sim(spec)
    sim.core.patch_node("a3-01", {"metadata": {"annotations": {"networking.gke.io/north-interfaces": DEEP}}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, interval=0))
    verdicts = {o.node: o.verdict for o in report.outcomes}
    assert verdicts["a3-00"] == "pass", "the other node's sweep is untouched"
    assert "a3-01" in verdicts, "the node is swept: its unreadable annotation lists no network, as `not json` does"


def test_a_last_result_annotation_nested_too_deep_reads_as_none(make_sim) -> None:
    """`sweeper nodes` without a history reads each node's `<prefix>/last-result` annotation
    (sweeper.remote.LabelHistory); a node that rewrote its own into 5 kB of `[` is a row without
    rules, not a RecursionError out of the command."""
    from sweeper.remote import LabelHistory

    sim: Sim = make_sim(nodes=2)
    p = TEST_CONFIG.prefix
    sim.core.patch_node("gpu-01", {"metadata": {"labels": {f"{p}/status": "pass", f"{p}/last-sweep": "1700000000"},
                                                "annotations": {f"{p}/last-result": DEEP}}})
    rows = LabelHistory(sim.kube.list_nodes(TEST_CONFIG.gpu_node_selector, devices=False), TEST_CONFIG).fleet()
    assert [(r["node"], r["verdict"], r["rules"]) for r in rows] == [("gpu-01", "pass", [])]


def test_a_check_log_nested_past_the_json_parsers_depth_is_an_error_result_not_a_crash(make_sim,
                                                                                      history: History) -> None:
    """A hostile node prints its own check log: a JSON object whose value nests 5000 arrays deep.
    json's decoder raises RecursionError, not ValueError, there; the parser makes it an `error`
    result of that node (input we cannot read is never a pass), and the run goes on."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"forged_output": '{"schema": ' + DEEP}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, light_playbook=""))
    verdicts = {o.node: o.verdict for o in report.outcomes}
    assert verdicts == {"gpu-00": "pass", "gpu-01": "error"}, report.outcomes
    said = [r["message"] for r in history.db.query("select message from checks where node = 'gpu-01'")]
    assert any("unreadable JSON" in m and "nested" in m for m in said), said
