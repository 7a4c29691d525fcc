"""What a node's own object says is data, read by a parser that cannot be made to throw past it:
attacks through the node's annotations, against the simulated cluster over HTTP.

The kubelet may update its own Node object (its annotations included: the NodeRestriction admission
plugin limits its labels, not its annotations,
https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction), so a
node taken over can write any annotation it likes on itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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


def _pass_document(node: str, checks: int = 3, message: str = "ok") -> str:
    """A well-formed result document that says pass, as a node taken over would print it."""
    from sweeper.result import CheckResult, Result

    return Result(node=node, source="sweeper", started=T, finished=T, checks=tuple(
        CheckResult(f"gpu.ok.{i}", "pass", message) for i in range(checks))).to_json() + "\n"


T = 1_800_000_000.0


def _stored(history: History, node: str) -> list[dict[str, Any]]:
    return list(history.db.query("select status, code, message from checks where node = :n", {"n": node}))


def test_a_result_document_over_its_limit_is_an_error_and_none_of_it_is_stored(make_sim, history: History) -> None:
    """2 MiB of a pass document (30,000 checks that each say pass, under the log's 8 MiB read
    limit): a node taken over could fill the history this way. Over the document limit (1 MiB) it
    is not read: the node's verdict is `error` (output no check prints, never a pass, no node fault
    either), and what is stored of it is one short row."""
    from sweeper.parsers.sweeper_result import DOCUMENT_LIMIT, OVERSIZE

    doc = _pass_document("gpu-01", checks=30_000)
    assert DOCUMENT_LIMIT < len(doc) < 8 * 1024 * 1024
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"forged_output": doc}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, light_playbook=""))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "error"}, report.outcomes
    rows = _stored(history, "gpu-01")
    assert [(r["status"], r["code"]) for r in rows] == [("error", OVERSIZE)], rows[:3]
    assert sum(len(r["message"]) for r in rows) < 1000


def test_a_log_cut_at_its_read_limit_is_an_error_even_after_a_whole_pass_document(make_sim, history: History) -> None:
    """A whole pass document, then 9 MiB more: the log is read to its limit (limitBytes, 8 MiB) and
    no further, so its end is never seen. What was read is no verdict: `error`, never the pass in it."""
    from sweeper.actions.podstate import LOG_CUT

    doc = _pass_document("gpu-01") + ("progress: still going\n" * 450_000)
    assert len(doc) > 9 * 1024 * 1024
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"forged_output": doc}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, light_playbook=""))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "error"}, report.outcomes
    rows = _stored(history, "gpu-01")
    assert [(r["status"], r["code"]) for r in rows] == [("error", LOG_CUT)], rows[:3]


def test_a_long_message_in_a_result_document_is_stored_capped(make_sim, history: History) -> None:
    """Under the document limit, each check's message is still kept to MESSAGE_MAX characters."""
    from sweeper.parsers.sweeper_result import MESSAGE_MAX

    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"forged_output": _pass_document("gpu-01", 2, "m" * 500_000)}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, light_playbook=""))
    assert {o.node: o.verdict for o in report.outcomes}["gpu-01"] == "pass"
    assert [len(r["message"]) for r in _stored(history, "gpu-01")] == [MESSAGE_MAX, MESSAGE_MAX]


def _summary(node: str, status: str) -> str:
    """The termination message `sweeper check` writes (Result.summary), saying `status`."""
    from sweeper.result import CheckResult, Result

    check = CheckResult("gpu.ecc", status, "volatile DBE 3 on GPU 2" if status == "fail" else "ok", gpu=2)
    return Result(node=node, source="sweeper", started=T, finished=T, checks=(check,)).summary()


GARBAGE = "NVRM: API mismatch ]]} <<not a result>>\n"


def test_an_unreadable_log_with_a_pass_in_its_termination_message_is_an_error(make_sim, history: History) -> None:
    """The container's termination message (4 KiB at most, written to terminationMessagePath by the
    container itself, https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/)
    is the check's short form, read when its log cannot be. A node taken over prints a log no reader
    recognises and writes a pass beside it: the log decides, and what it holds is no verdict, so
    `error`, never the pass the message claims."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"forged_output": GARBAGE,
                                                    "forged_summary": _summary("gpu-01", "pass")}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, light_playbook=""))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "error"}, report.outcomes
    [row] = _stored(history, "gpu-01")
    assert row["status"] == "error" and "termination message says pass" in row["message"], row


def test_a_termination_message_may_still_say_a_node_failed_or_stand_for_a_log_that_is_gone(
        make_sim, history: History) -> None:
    """What the short form is for: a log that is gone (empty: its node's log files rotated or lost)
    is replaced by the summary, pass or fail; beside an unreadable log a summary that says the node
    failed is kept, since it can only make the verdict worse."""
    sim: Sim = make_sim(nodes=3, faults={"gpu-00": {"forged_output": GARBAGE,
                                                    "forged_summary": _summary("gpu-00", "fail")},
                                         "gpu-01": {"forged_summary": _summary("gpu-01", "pass")},
                                         "gpu-02": {"forged_summary": _summary("gpu-02", "fail")}})
    run_sweep(sim, history, replace(TEST_CONFIG, light_playbook=""))
    said = {n: [(r["status"], r["message"]) for r in _stored(history, n)] for n in ("gpu-00", "gpu-01", "gpu-02")}
    assert said["gpu-00"] == [("fail", "volatile DBE 3 on GPU 2")], said
    assert said["gpu-01"] == [("pass", "1 checks passed")], said
    assert said["gpu-02"] == [("fail", "volatile DBE 3 on GPU 2")], said
