"""Pair results in the history: who is known-good, who is a suspect waiting for a re-pair, what
a pair sweep counts for; the policy's pair rule; the backtest of pair decisions; the pairs
section of `sweeper history` and of the report."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sweeper.backtest import backtest
from sweeper.cli import main
from sweeper.history import History
from sweeper.policy import Policy, decide, load_policy, pair_rule, parse_policy
from sweeper.report import gather, render
from sweeper.result import CheckResult, Metric, Result
from tests.weeks import ROOT, record_pair

SHIPPED = load_policy(ROOT / "policies" / "default.yaml")

T0 = 1_750_000_000.0
HOUR = 3600.0
DAY = 86400.0


@pytest.fixture
def h(new_state: Callable[[str], str]) -> Iterator[History]:
    """An empty history on each backend: a SQLite file, a PostgreSQL schema."""
    hist = History(new_state("pairs.db"))
    yield hist
    hist.close()


def pair(h: History, ts: float, a: str, b: str, status: str, mode: str = "sweep", busbw: float | None = 180.0,
         detail: str = "", run: str = "r1") -> int:
    """One pair run recorded at `ts` (tests/weeks.py: the pair's row a minute before its sweeps end)."""
    return record_pair(h, ts + 60, a, b, status, mode, busbw, detail, run)


def test_pair_results_are_read_from_either_side_oldest_first(h: History) -> None:
    pair(h, T0 + 2 * HOUR, "n2", "n1", "fail", busbw=40.0, detail="pair.nccl: 40 GB/s below 150")
    pair(h, T0, "n1", "n3", "pass", busbw=181.5)
    pair(h, T0 + HOUR, "n4", "n5", "pass")
    rows = h.pair_results("n1", T0 - 1, T0 + DAY)
    assert [(r["partner"], r["status"], r["role"], r["busbw"]) for r in rows] == [
        ("n3", "pass", "node", 181.5), ("n2", "fail", "partner", 40.0)]
    assert rows[1]["mode"] == "sweep" and rows[1]["detail"].startswith("pair.nccl") and rows[1]["run_id"] == "r1"
    assert rows[0]["sweep_id"] is not None and rows[0]["sweep_id"] != rows[1]["sweep_id"]
    assert h.pair_results("n1", T0 + 1, T0 + HOUR) == [], "the window bounds the rows"
    assert [r["ts"] for r in h.pair_results("n1", T0, T0 + 2 * HOUR)] == [T0, T0 + 2 * HOUR], "bounds inclusive"


def test_known_good_is_the_latest_conclusive_result_either_side(h: History) -> None:
    pair(h, T0, "a", "b", "pass")
    pair(h, T0 + HOUR, "c", "a", "fail")  # a's latest: failed as the partner side
    pair(h, T0 + HOUR, "d", "e", "warn")
    pair(h, T0 + 2 * HOUR, "b", "f", "error")  # a fault of the tool: says nothing of b or f
    pair(h, T0 + 2 * HOUR, "e", "g", "inconclusive")
    assert h.known_good(T0 - 1) == {"b", "d", "e"}
    assert h.known_good(T0 + 1) == {"d", "e"}, "b's pass is older than the window"
    pair(h, T0 + 3 * HOUR, "a", "g", "pass")
    assert h.known_good(T0 - 1) == {"a", "b", "d", "e", "g"}


def test_a_failed_sweep_pair_makes_both_suspects_until_a_repair_clears_them(h: History) -> None:
    pair(h, T0, "k", "x", "pass")
    pair(h, T0 + HOUR, "s", "t", "fail", detail="pair.nccl: 52 GB/s below the floor")
    assert h.pair_suspects(T0 - 1) == {"s": "t", "t": "s"}
    assert "s" not in h.known_good(T0 - 1) and "t" not in h.known_good(T0 - 1)
    # the run re-pairs each with a known-good partner: s fails again (the culprit), t passes
    pair(h, T0 + 2 * HOUR, "s", "k", "fail", mode="repair")
    pair(h, T0 + 2 * HOUR + 60, "t", "x", "pass", mode="repair")
    assert h.pair_suspects(T0 - 1) == {}, "a re-pair, failed or passed, is a decision: no longer waiting"
    assert h.known_good(T0 - 1) == {"t", "x"}, "k failed with the suspect: its latest result is no pass"


def test_an_inconclusive_repair_leaves_the_suspect_waiting(h: History) -> None:
    pair(h, T0, "s", "t", "fail")
    pair(h, T0 + HOUR, "s", "k", "inconclusive", mode="repair")  # k was taken by a workload
    assert h.pair_suspects(T0 - 1) == {"s": "t", "t": "s"}
    assert h.pair_suspects(T0 + 1) == {}, "a failure older than the window is forgotten"


def test_known_good_and_suspects_agree_with_every_pair_read_in_order(h: History) -> None:
    """What is kept as pairs are written (each node's latest conclusive result) is what reading
    every pair of the window in time order gives, whatever order they were written in and with
    pairs that end at the same second (the one written later is the later)."""
    rng = random.Random(7)
    nodes = [f"n{i}" for i in range(12)]
    written = []
    for i in range(400):
        a, b = rng.sample(nodes, 2)
        ts = T0 + rng.randrange(0, 200) * 60.0  # out of order, and many at the same minute
        status = rng.choice(["pass", "pass", "warn", "fail", "fail", "error", "inconclusive"])
        mode = rng.choice(["sweep", "sweep", "repair"])
        h.pair_result("r", ts, a, b, status, mode, None, "")
        written.append((ts, i, a, b, status, mode))
    for since in (T0, T0 + 100 * 60.0, T0 + 190 * 60.0):
        latest: dict[str, tuple[str, str, str]] = {}
        for ts, _i, a, b, status, mode in sorted(written):
            if ts >= since and status in ("pass", "warn", "fail"):
                latest[a], latest[b] = (status, mode, b), (status, mode, a)
        assert h.known_good(since) == {n for n, (st, _, _) in latest.items() if st in ("pass", "warn")}
        assert h.pair_suspects(since) == {n: p for n, (st, m, p) in latest.items() if st == "fail" and m == "sweep"}


def test_pair_sweeps_count_as_sweeps_of_the_node(h: History) -> None:
    """A conclusive pair sweep is a sweep of both nodes (for when a node is next due a pair sweep,
    the breaker and the history rules); the inconclusive rows of a failed pair, waiting for its
    re-pair, are not. A pair sweep and a node sweep keep separate cadences: a daily node sweep
    must not keep a node from its pair sweep every few days, nor a pair sweep, which checks no
    GPU counter, put off the node's own checks."""
    pair(h, T0, "a", "b", "pass")
    pair(h, T0 + HOUR, "c", "d", "fail")
    assert h.last_swept("pair") == {"a": T0 - 540, "b": T0 - 540}
    assert h.last_swept() == {}, "a pair sweep does not make a node's own sweep less due"
    assert [s["verdict"] for s in h.sweeps("a", T0 - DAY, T0 + DAY)] == ["pass"]
    assert h.sweeps("c", T0 - DAY, T0 + DAY) == []
    assert {r["node"] for r in h.fleet()} == {"a", "b", "c", "d"}
    # c, the culprit of its re-pair, is held: the breaker counts it, and a person who lets it go
    # has dismissed the pair's findings
    record_pair(h, T0 + 2 * HOUR, "c", "a", "fail", "repair", verdicts=("quarantine", "inconclusive"))
    assert h.failures_since(T0, ("quarantine",)) == {"c": 1}
    assert [r["node"] for r in h.released_by_people(["a", "c"], ("quarantine",))] == ["c"]
    assert h.last_swept("pair")["c"] == T0 + 2 * HOUR - 600


def test_prune_deletes_old_pair_results(h: History) -> None:
    pair(h, T0, "a", "b", "pass")
    pair(h, T0 + 2 * DAY, "a", "c", "pass")
    counts = h.prune(T0 + DAY)
    assert counts["pairs"] == 1 and h.counts()["pairs"] == 1
    assert [r["partner"] for r in h.pair_results("a", 0, T0 + 3 * DAY)] == ["c"]


# -- the policy's pair rule ------------------------------------------------------------------

def rule(partners: int = 3, window: str = "7d", then: str = "quarantine") -> Policy:
    return parse_policy({"name": "pairs", "pair_failures": [
        {"name": "fails-with-many", "partners": partners, "window": window, "then": then}]}, "pairs.yaml")


def test_the_shipped_policy_holds_a_node_that_failed_with_three_partners() -> None:
    (pf,) = SHIPPED.pair_failures
    assert (pf.partners, pf.window, pf.then) == (3, 7 * DAY, "quarantine")


def test_the_pair_rule_counts_different_partners_not_failures(h: History) -> None:
    for i in range(4):  # four failures, one partner: the partner may be the broken one
        pair(h, T0 + i * HOUR, "n", "bad", "fail")
    passing = [{"source": "nccl-pair", "checks": [{"name": "pair.nccl", "status": "pass"}]}]
    assert decide(passing, policy=rule(), node="n", now=T0 + DAY, past=h).verdict == "pass"
    assert pair_rule(rule(), h, "n", T0 + DAY) is None
    pair(h, T0 + 5 * HOUR, "m2", "n", "fail")  # n the partner side: still n's failure
    assert pair_rule(rule(), h, "n", T0 + DAY) is None, "two different partners of three"
    pair(h, T0 + 6 * HOUR, "n", "m3", "fail", mode="repair")  # n the suspect of a failed re-pair
    v = pair_rule(rule(), h, "n", T0 + DAY)
    assert v is not None and v.verdict == "quarantine" and v.rules == ("fails-with-many",)
    assert "failed pairs with 3 different partners within 7d (bad, m2, m3; limit 3)" in v.reasons[0]
    got = decide(passing, policy=rule(), node="n", now=T0 + DAY, past=h)
    assert (got.verdict, got.rules) == ("quarantine", ("fails-with-many",)), "the rule is one of decide's"
    assert pair_rule(rule(then="replace"), h, "n", T0 + DAY).verdict == "replace"  # type: ignore[union-attr]


def test_the_pair_rule_looks_only_inside_its_window_and_at_failures(h: History) -> None:
    pair(h, T0, "n", "a", "fail")
    pair(h, T0 + DAY, "n", "b", "fail")
    pair(h, T0 + DAY, "n", "c", "error")  # a fault of the tool is no failure of the pair
    pair(h, T0 + DAY, "n", "d", "inconclusive")
    pair(h, T0 + DAY, "n", "e", "warn")
    assert pair_rule(rule(2, "2d"), h, "n", T0 + DAY) is not None
    assert pair_rule(rule(2, "12h"), h, "n", T0 + DAY) is None, "a's failure is older than the window"
    assert pair_rule(rule(2, "2d"), h, "n", T0 + 0.5 * DAY) is None, "b's failure is later than the decision"


def test_a_known_good_partner_is_not_blamed_for_the_suspects_it_judged(h: History) -> None:
    """A re-pair that fails is the suspect's failure: the known-good partner was chosen to judge
    it, so three failed suspects do not make the known-good node a culprit."""
    for i, s in enumerate(("s1", "s2", "s3")):
        pair(h, T0 + i * HOUR, s, "k", "fail", mode="repair")
    assert pair_rule(rule(), h, "k", T0 + DAY) is None
    assert pair_rule(rule(1), h, "s2", T0 + DAY) is not None


# -- backtest of pair decisions --------------------------------------------------------------

def culprit(h: History, ts: float, suspect: str, good: str, code: str | None = None) -> None:
    """A failed re-pair as the engine records it: the suspect held with the play's verdict from
    the pair's findings, the known-good partner released inconclusive."""
    sid = h.sweep_started("r2", suspect, ts - 600, "pair-fabric", "p5.48xlarge", kind="pair")
    h.result(sid, Result(suspect, "nccl-pair", ts - 600, ts - 60,
                         (CheckResult("pair.nccl", "fail", "busbw 61.2 GB/s below the floor 150", "error",
                                      code=code),),
                         (Metric("nccl.pair_busbw", 61.2, "GB/s"),)))
    v = decide([{"source": "nccl-pair", "checks": [{"name": "pair.nccl", "status": "fail", "code": code}]}],
               policy=SHIPPED, node=suspect, now=ts - 30, past=h)
    h.sweep_finished(sid, ts, v.verdict, list(v.reasons), {"verdict": v.verdict, "causes": list(v.causes),
                                                          "rules": list(v.rules), "decided": ts - 30,
                                                          "policy": "default"})
    kid = h.sweep_started("r2", good, ts - 600, "pair-fabric", "p5.48xlarge", kind="pair")
    h.sweep_finished(kid, ts, "inconclusive", [f"failed with suspect {suspect}"])
    h.pair_result("r2", ts - 60, suspect, good, "fail", "repair", 61.2, "pair.nccl: busbw 61.2 GB/s", (sid, kid))


def waiting(h: History, ts: float, a: str, b: str) -> None:
    """A failed sweep pair whose nodes wait for a re-pair (recorded inconclusive), as the live
    policy let them: the pair result is recorded before the nodes are decided."""
    ids = [h.sweep_started("r1", n, ts - 600, "pair-fabric", "p5.48xlarge", kind="pair") for n in (a, b)]
    h.pair_result("r1", ts - 60, a, b, "fail", "sweep", 40.0, "pair.nccl: busbw 40 GB/s", (ids[0], ids[1]))
    for n, sid in zip((a, b), ids, strict=True):
        assert pair_rule(SHIPPED, h, n, ts - 30) is None
        h.sweep_finished(sid, ts, "inconclusive", ["re-pairing with a known-good partner"],
                         {"verdict": "inconclusive", "decided": ts - 30, "policy": "default"})


def test_backtest_replays_pair_decisions(h: History, tmp_path: Path) -> None:
    pair(h, T0, "k", "x", "pass")
    waiting(h, T0 + HOUR, "s", "p1")
    waiting(h, T0 + 2 * HOUR, "p2", "s")
    culprit(h, T0 + 3 * HOUR, "s", "k")
    assert backtest(h, SHIPPED, 0.0).pair_changes() == [], "the shipped policy decides as it did"
    stricter = parse_policy({**yaml.safe_load((ROOT / "policies" / "default.yaml").read_text()),
                             "pair_failures": [{"name": "two-partners", "partners": 2, "window": "1d",
                                                "then": "quarantine"}],
                             }, "stricter")
    stricter = replace(stricter, findings=replace(stricter.findings, checks={**stricter.findings.checks,
                                                                             "pair.nccl": "replace"}))
    bt = backtest(h, stricter, 0.0)
    got = [(d.node, d.partner, d.mode, d.recorded, d.replayed, tuple(d.rules)) for d in bt.pair_changes()]
    assert got == [("s", "p2", "sweep", "inconclusive", "quarantine", ("two-partners",)),
                   ("s", "k", "repair", "quarantine", "replace", ("two-partners",))]
    warn = replace(stricter, pair_failures=(replace(stricter.pair_failures[0], then="warn"),))
    assert [(d.node, d.mode, d.replayed) for d in backtest(h, warn, 0.0).pair_changes()] == [
        ("s", "repair", "replace")], "a rule that only warns leaves a failed pair waiting for its re-pair"
    # p1 and p2 failed with s alone: they waited for their re-pair under either policy
    assert {d.node: d.replayed for d in bt.decisions if d.node in ("p1", "p2")} == {
        "p1": "inconclusive", "p2": "inconclusive"}
    pfile = tmp_path / "stricter.yaml"
    raw = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    raw["pair_failures"] = [{"name": "two-partners", "partners": 2, "window": "1d", "then": "quarantine"}]
    raw["findings"]["checks"]["pair.nccl"] = "replace"
    pfile.write_text(yaml.safe_dump(raw))
    args = ["backtest", "--state", h.state, "--policy", str(pfile), "--since", "3650d"]
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["pair_changes"] == 2
    assert [(d["node"], d["pair"], d["replayed"]) for d in doc["decisions"] if "pair" in d] == [
        ("s", {"partner": "p2", "mode": "sweep"}, "quarantine"), ("s", {"partner": "k", "mode": "repair"}, "replace")]
    res = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "2 decisions on pairs differ" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if " k " in f" {ln} " and "repair" in ln)
    assert line.split()[0] == "s" and "replace" in line and "quarantine" in line


# -- sweeper history NODE ----------------------------------------------------------------------

def test_the_history_command_lists_the_node_s_pair_runs(h: History) -> None:
    pair(h, T0, "n1", "n2", "pass", busbw=181.46, run="run-a")
    pair(h, T0 + HOUR, "n3", "n1", "fail", busbw=52.0, detail="pair.nccl: busbw 52.0 GB/s below the floor 150",
         run="run-b")
    pair(h, T0 + 2 * HOUR, "n1", "n4", "fail", mode="repair", busbw=None, detail="pair.mtu: eth0 path MTU",
         run="run-b")
    pair(h, T0 + 3 * HOUR, "n5", "n6", "pass")
    assert [(p["partner"], p["role"], p["status"]) for p in h.node_history("n1")["pairs"]] == [
        ("n4", "node", "fail"), ("n3", "partner", "fail"), ("n2", "node", "pass")]
    res = CliRunner().invoke(main, ["history", "n1", "--state", h.state, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [(p["partner"], p["mode"], p["role"], p["busbw"], p["status"]) for p in doc["pairs"]] == [
        ("n4", "repair", "node", None, "fail"), ("n3", "sweep", "partner", 52.0, "fail"),
        ("n2", "sweep", "node", 181.46, "pass")], "newest first, from either side"
    assert doc["pairs"][2]["ts"] == "2025-06-15T15:06:40Z" and doc["pairs"][1]["run_id"] == "run-b"
    res = CliRunner().invoke(main, ["history", "n1", "--state", h.state], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    head = lines.index("pairs")
    assert lines[head + 1].split() == ["WHEN", "PARTNER", "MODE", "BUSBW", "GB/S", "STATUS", "DETAIL"]
    rows = [ln.split() for ln in lines[head + 2: head + 5]]
    assert [r[2:] for r in rows] == [
        ["n4", "re-pair", "(suspect)", "fail", "pair.mtu:", "eth0", "path", "MTU"],
        ["n3", "sweep", "52.0", "fail", "pair.nccl:", "busbw", "52.0", "GB/s", "below", "the", "floor", "150"],
        ["n2", "sweep", "181.5", "pass"]]
    res = CliRunner().invoke(main, ["history", "n4", "--state", h.state], env={"COLUMNS": "200"})
    assert "re-pair (known-good)" in res.stdout
    res = CliRunner().invoke(main, ["history", "n1", "--state", h.state, "--since", "3650d", "--json"])
    assert len(json.loads(res.stdout)["pairs"]) == 3


# -- a pair sweep over the simulated fabric, then what the history, report and backtest make of it -----

def test_a_degraded_link_in_the_history_the_report_and_the_backtest(make_sim, history: History,
                                                                      tmp_path: Path) -> None:
    """gpu-00's fabric runs at 40%: its pair fails, the re-pairs name it, and the history tells
    the story from either side, the report names the culprit, and the backtest of the shipped
    policy decides every pair sweep as the sweep did."""
    from tests.conftest import TEST_CONFIG, run_sweep

    sim = make_sim(nodes=4, faults={"gpu-00": {"link_degraded": 0.4}})
    run_sweep(sim, history, replace(TEST_CONFIG, playbook="pair-fabric.yaml", light_playbook=""))
    state = str(history.path)
    res = CliRunner().invoke(main, ["history", "gpu-00", "--state", state, "--json"])
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout)["pairs"]
    assert [(p["mode"], p["role"], p["status"]) for p in runs] == [("repair", "node", "fail"),
                                                                   ("sweep", runs[1]["role"], "fail")]
    good = runs[0]["partner"]
    assert runs[1]["partner"] == "gpu-01" and good in ("gpu-02", "gpu-03")
    assert all(p["busbw"] is not None and p["busbw"] < 300 for p in runs), "the degraded side's bandwidth"
    res = CliRunner().invoke(main, ["history", good, "--state", state], env={"COLUMNS": "200"})
    assert "re-pair (known-good)" in res.stdout and "gpu-00" in res.stdout
    assert history.pair_suspects(0.0) == {}, "both nodes of the failed pair were re-paired"
    assert "gpu-00" not in history.known_good(0.0) and "gpu-01" in history.known_good(0.0)

    page = render(gather(history, SHIPPED, 0.0, sim.cluster.clock.now(), 86400.0))
    culprits = page[page.index("<table class=pair-culprits>"):]
    assert re.findall(r"<tr data-node='([\w-]+)'>", culprits[:culprits.index("</table>")]) == ["gpu-00"]

    bt = backtest(history, SHIPPED, 0.0)
    assert [d for d in bt.decisions if d.differs] == [], "the shipped policy decides the pair sweeps as they were"
    assert {(d.node, d.mode) for d in bt.decisions if d.partner is not None} >= {("gpu-00", "repair"),
                                                                                  ("gpu-00", "sweep")}
    harsher = replace(SHIPPED, findings=replace(SHIPPED.findings, checks={**SHIPPED.findings.checks,
                                                                          "pair.nccl": "replace"}))
    changed = backtest(history, harsher, 0.0).pair_changes()
    assert [(d.node, d.partner, d.mode, d.replayed) for d in changed] == [("gpu-00", good, "repair", "replace")]
