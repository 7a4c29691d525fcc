"""Pair results in the history: who is known-good, who is a suspect waiting for a re-pair, what
a pair sweep counts for; the policy's pair rule; the backtest of pair decisions; the pairs
section of `sweeper history` and of the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.history import History

T0 = 1_750_000_000.0
HOUR = 3600.0
DAY = 86400.0


@pytest.fixture
def h(tmp_path: Path) -> History:
    return History(tmp_path / "pairs.db")


def pair(h: History, ts: float, a: str, b: str, status: str, mode: str = "sweep", busbw: float | None = 180.0,
         detail: str = "", run: str = "r1") -> int:
    """One pair run as the engine records it: a sweep row each side (kind pair), then the pair row."""
    verdicts = {"pass": "pass", "warn": "warn", "error": "error"}
    ids = []
    for n in (a, b):
        sid = h.sweep_started(run, n, ts - 600, "pair-fabric", "p5.48xlarge", kind="pair")
        h.sweep_finished(sid, ts, verdicts.get(status, "inconclusive"), [detail or status])
        ids.append(sid)
    return h.pair_result(run, ts, a, b, status, mode, busbw, detail, (ids[0], ids[1]))


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


def test_pair_sweeps_count_as_sweeps_of_the_node(h: History) -> None:
    """A conclusive pair sweep is a sweep of both nodes (for when a node is due, the breaker and
    the history rules); the inconclusive rows of a failed pair, waiting for its re-pair, are not."""
    pair(h, T0, "a", "b", "pass")
    pair(h, T0 + HOUR, "c", "d", "fail")
    assert h.last_swept() == {"a": T0 - 600, "b": T0 - 600}
    assert [s["verdict"] for s in h.sweeps("a", T0 - DAY, T0 + DAY)] == ["pass"]
    assert h.sweeps("c", T0 - DAY, T0 + DAY) == []
    assert {r["node"] for r in h.fleet()} == {"a", "b", "c", "d"}


def test_prune_deletes_old_pair_results(h: History) -> None:
    pair(h, T0, "a", "b", "pass")
    pair(h, T0 + 2 * DAY, "a", "c", "pass")
    counts = h.prune(T0 + DAY)
    assert counts["pairs"] == 1 and h.counts()["pairs"] == 1
    assert [r["partner"] for r in h.pair_results("a", 0, T0 + 3 * DAY)] == ["c"]
