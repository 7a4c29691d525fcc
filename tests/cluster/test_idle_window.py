"""The test fits the idle window (issue 25, point 4): from the idle spells the history holds for a
node's pool at this hour, a sweep picks the deepest rung of `depth_ladder` that fits, says why in
`sweeper plan`, and falls back to the configured playbook when the history is thin.

Why depth matters: some faults show only under load. NVIDIA/DCGM#313 (a GPU whose HBM raised
thousands of correctable ECC errors a second under load and exactly none when idle) is the case:
a light check of the idle GPU sees nothing; DCGM's stress levels do. DCGM's levels and their usual
durations: level 1 seconds, 2 about two minutes, 3 about 15 minutes, 4 longer
(https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html);
`targeted_stress` runs from level 3 up (NVIDIA/DCGM nvvs/src/NvidiaValidationSuite.cpp, FillTestVectors),
which is where the simulator's load-only fault shows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sweeper.config import Config, load_config
from sweeper.errors import ConfigError
from sweeper.history import History
from sweeper.views import plan_view
from sweeper.window import Estimate, Rung, Spell, choose, estimate, ladder
from tests.conftest import TEST_CONFIG, Sim, run_sweep

POOL = "node.kubernetes.io/instance-type=p5.48xlarge"
LADDER = ({"name": "light", "playbook": "sweep-light.yaml", "duration": 300.0},
          {"name": "dcgm-r2", "playbook": "sweep-dcgm.yaml", "duration": 600.0, "dcgm_level": 2},
          {"name": "dcgm-r3", "playbook": "sweep-dcgm.yaml", "duration": 2700.0, "dcgm_level": 3})
CFG = replace(TEST_CONFIG, depth_ladder=LADDER, depth_min_samples=5, check_timeout=3000)
LOAD_ONLY = {"gpu-01": {"dcgm_fail": {3: "targeted_stress"}}}  # found under stress only (NVIDIA/DCGM#313)


def past_spells(history: History, now: float, lengths: list[float], pool: str = POOL) -> None:
    """Idle spells of other nodes of the pool on earlier days, one beginning in every hour of the
    day: whichever hour the sweep's clock has reached when it chooses (the simulated clock runs
    600x, so a sweep begun at 23:58 chooses at 00:0x), that hour holds one spell a day.

    A spell only in the hour the test began failed when the simulated clock crossed the hour
    between writing the spells and choosing the depth (about one run in twelve)."""
    with history.batch():
        for day, length in enumerate(lengths, start=1):
            for hour in range(-12, 12):
                start = now - day * 86400.0 + hour * 3600.0
                history.idle_seen(start, {f"old-{day}-{hour}": (pool, True)})
                history.idle_seen(start + length, {f"old-{day}-{hour}": (pool, False)})


def depths(history: History) -> dict[str, str]:
    return {r["node"]: r["detail"].split(":")[0] for r in history.query(
        "select node, detail from actions where action = 'depth'")}


def test_long_windows_get_the_deep_test_that_finds_a_load_only_fault(make_sim: Any, history: History) -> None:
    sim: Sim = make_sim(nodes=2, faults=LOAD_ONLY)
    clock = sim.cluster.clock
    clock.advance(3600.0 - clock.now() % 3600.0 - 20.0)  # 20 s before the hour: the choice falls after it
    past_spells(history, clock.now(), [3 * 3600.0] * 6)
    report = run_sweep(sim, history, CFG)
    got = {o.node: o for o in report.outcomes}
    assert got["gpu-00"].verdict == "pass" and got["gpu-01"].verdict != "pass", report.outcomes
    assert "targeted_stress" in " ".join(got["gpu-01"].reasons) or "stress" in " ".join(got["gpu-01"].reasons)
    assert depths(history) == {"gpu-00": "dcgm-r3", "gpu-01": "dcgm-r3"}


def test_short_windows_get_what_fits_and_the_deep_fault_waits(make_sim: Any, history: History) -> None:
    """20-minute windows: DCGM level 2 (10 min and its 25% margin) fits, level 3 does not."""
    sim: Sim = make_sim(nodes=2, faults=LOAD_ONLY)
    past_spells(history, sim.cluster.clock.now(), [1200.0] * 6)
    report = run_sweep(sim, history, replace(CFG, depth_deep_after=0))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "pass"}
    assert depths(history) == {"gpu-00": "dcgm-r2", "gpu-01": "dcgm-r2"}


def test_thin_history_runs_the_configured_playbook_and_plan_says_why(make_sim: Any, history: History) -> None:
    sim: Sim = make_sim(nodes=2)
    past_spells(history, sim.cluster.clock.now(), [3 * 3600.0] * 3)
    view = plan_view(sim.kube, CFG, history, now=sim.cluster.clock.now())
    rows = {r["node"]: r for r in view.doc["nodes"]}
    assert rows["gpu-00"]["depth"] is None and rows["gpu-00"]["rule"] == "fixed"
    assert "3 idle spell(s) in the history, fewer than 5" in rows["gpu-00"]["why"]
    report = run_sweep(sim, history, CFG)
    assert {o.verdict for o in report.outcomes} == {"pass"} and depths(history) == {}


def test_plan_shows_each_nodes_depth_window_and_samples(make_sim: Any, history: History) -> None:
    sim: Sim = make_sim(nodes=2)
    past_spells(history, sim.cluster.clock.now(), [3 * 3600.0] * 6)
    view = plan_view(sim.kube, CFG, history, now=sim.cluster.clock.now())
    row = {r["node"]: r for r in view.doc["nodes"]}["gpu-00"]
    assert (row["depth"], row["samples"], row["window_s"]) == ("dcgm-r3", 6, 3 * 3600.0)
    assert row["rule"] in ("fits", "deep-overdue") and "6 idle spells" in row["why"]


def test_a_run_records_when_its_nodes_were_idle_and_busy(make_sim: Any, history: History) -> None:
    sim: Sim = make_sim(nodes=3, workloads=[{"node": "gpu-02", "gpus": 8, "duration": None}])
    run_sweep(sim, history, TEST_CONFIG)
    now = sim.cluster.clock.now()
    spells = history.query("select node, pool, ended from idle_spells order by node")
    assert [(r["node"], r["pool"], r["ended"]) for r in spells] == [("gpu-00", POOL, None), ("gpu-01", POOL, None)]
    # Since the cluster started, not `now - 3600`: the spells began at the run's discovery, and an hour
    # of simulated time is 6 s of real time at 600x, which a loaded machine's sweep can outlast.
    assert len(history.idle_spells(POOL, sim.cluster.started, now)) == 2


# -- the estimator and the choice, alone ------------------------------------------------------
def test_the_estimate_is_a_low_quantile_of_the_spells_that_began_at_this_hour() -> None:
    now = 1_700_000_000.0
    spells = [Spell(now - d * 86400, 600.0 * d) for d in range(1, 11)] + [Spell(now - 86400 + 3 * 3600, 99999)]
    est = estimate(spells, "p", now, q=0.2, min_samples=8)
    assert (est.samples, est.seconds, est.median) == (10, 600.0 * 2, 600.0 * 5)
    assert estimate(spells, "p", now, q=0.2, min_samples=11).seconds is None


def test_the_deepest_rung_that_fits_and_the_overdue_deep_test() -> None:
    rungs = ladder(LADDER)
    est = Estimate("p", 0, seconds=1000.0, median=4000.0, samples=9, why="w")
    assert choose(rungs, est, 0.25, last_deep=0.0, now=86400.0, deep_after=0).rung == rungs[1]
    overdue = choose(rungs, est, 0.25, last_deep=None, now=86400.0, deep_after=14 * 86400.0)
    assert (overdue.rung, overdue.rule) == (rungs[2], "deep-overdue") and "never had one" in overdue.why
    recent = choose(rungs, est, 0.25, last_deep=86000.0, now=86400.0, deep_after=14 * 86400.0)
    assert recent.rung == rungs[1] and recent.rule == "fits"
    tiny = Estimate("p", 0, seconds=60.0, median=60.0, samples=9, why="w")
    assert choose(rungs, tiny, 0.25, None, 0.0, 0).rule == "nothing-fits"
    assert choose((Rung("a", "x", 1.0),), Estimate("p", 0, None, None, 2, "thin"), 0.25, None, 0.0, 0).rung is None


def test_a_ladder_out_of_order_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="light first"):
        ladder([LADDER[1], LADDER[0]])
    path = tmp_path / "c.yaml"
    path.write_text("depth_ladder:\n  - {name: light, playbook: sweep-light.yaml, duration: 5m, level: 2}\n")
    with pytest.raises(ConfigError):
        load_config(path)
    path.write_text("depth_ladder:\n  - {name: r3, playbook: sweep-dcgm.yaml, duration: 45m, dcgm_level: 3}\n")
    assert load_config(path).depth_ladder[0]["duration"] == 2700.0
    assert Config().depth_ladder == ()


def test_lint_names_a_ladder_out_of_order_and_a_rung_with_no_playbook(tmp_path: Any) -> None:
    from pathlib import Path

    from sweeper.lint import lint_paths

    path = Path(tmp_path) / "c.yaml"
    path.write_text("depth_ladder:\n  - {name: deep, playbook: sweep-dcgm.yaml, duration: 45m}\n"
                    "  - {name: light, playbook: sweep-light.yaml, duration: 5m}\n")
    assert any("light first" in p for p in lint_paths([], Config(), path).problems)
    path.write_text("depth_ladder:\n  - {name: light, playbook: sweep-light.yaml, duration: 5m}\n"
                    "  - {name: deep, playbook: nowhere.yaml, duration: 45m}\n")
    assert lint_paths([], Config(), path).problems == [f"{path}: depth_ladder: 'deep': no playbook 'nowhere.yaml' "
                                                       "(playbook_dir, then the shipped ones)"]


def test_the_plan_command_prints_each_nodes_depth_and_why(make_sim: Any, tmp_path: Any) -> None:
    """`sweeper plan` (wall-clock now): a depth column, and the window behind it in the detail."""
    import time
    from pathlib import Path

    import yaml
    from click.testing import CliRunner

    from sweeper.cli import main

    sim: Sim = make_sim(nodes=2)
    state = Path(tmp_path) / "h.db"
    h = History(state)
    past_spells(h, time.time(), [3 * 3600.0] * 6)
    h.close()
    cfg = Path(tmp_path) / "config.yaml"
    cfg.write_text(yaml.safe_dump({"depth_ladder": [dict(r) for r in LADDER], "depth_min_samples": 5}))
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(state), "--config", str(cfg)]
    res = CliRunner().invoke(main, ["plan", *base, "-o", "wide"])
    assert res.exit_code == 0, res.output
    assert "depth" in res.output and "dcgm-r3" in res.output and "6 idle spells" in res.output, res.output


def test_a_serve_schedule_with_its_own_playbook_or_level_runs_that_not_the_ladder(make_sim: Any,
                                                                                   history: History) -> None:
    from sweeper.serve import Server

    sim: Sim = make_sim(nodes=1)
    cfg = replace(CFG, schedules=({"name": "rolling", "cron": "0 0 1 1 *", "playbook": CFG.playbook},
                                  {"name": "weekly", "cron": "0 0 1 1 *", "playbook": "sweep-dcgm.yaml"},
                                  {"name": "level", "cron": "0 0 1 1 *", "dcgm_level": 4}))
    server = Server(cfg, sim.kube, history, port=0, host="127.0.0.1", log=lambda m: None)
    try:
        ladders = {job.id: len(job.args[1].depth_ladder) for job in server.scheduler.get_jobs()}
    finally:
        server.httpd.server_close()
    assert ladders == {"rolling": 3, "weekly": 0, "level": 0}
