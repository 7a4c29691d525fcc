"""`sweeper cohorts` (issue 26, point 3): failures read by a fact the nodes share. The statistics
against known values; a simulated rollout of a driver that fails 5% of its node-days stands apart
from a fleet whose baseline is 0.5%, and a random 5% of bad nodes that share no fact does not
(over several seeds); the history's rows on SQLite and PostgreSQL; the CLI.

The fleets are seeded and large (400 nodes, 30 days: about 12,000 node-days, 60 baseline failures)
so that the power is near 1: the rollout's cohort holds 100 nodes and about 150 failed node-days
against 45 for the other 300."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from math import comb
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.cohort_stats import binom_sf, holm, hypergeom_sf, wilson
from sweeper.cohorts import UNKNOWN, analyse, backtest_rollout, cohort_report, label_facts, node_days

DAY = 86400.0
T0 = 1_780_000_000.0
BASE_DRIVER, NEW_DRIVER = "570.133.20", "580.65.06"


def fleet(seed: int, nodes: int = 400, days: int = 30, rollout: float = 0.0, start: int = 0, per_day: int = 0,
          bad_share: float = 0.0) -> list[dict[str, Any]]:
    """One sweep a node a day: facts (driver, zone, rack, vbios) and a verdict. A node fails a day with
    probability 0.5%, or 5% while it runs the new driver (`rollout` of the fleet, all from day `start`,
    or `per_day` nodes a day from `start`), or 5% always when it is one of a random `bad_share`."""
    rng = random.Random(seed)
    names = [f"gpu-{i:04d}" for i in range(nodes)]
    movers = rng.sample(names, int(rollout * nodes))
    moved = {n: start + (i // per_day if per_day else 0) for i, n in enumerate(movers)}
    bad = set(rng.sample(names, int(bad_share * nodes)))
    static = {n: {"zone": f"us-east-1{'abcd'[i % 4]}", "rack": f"rack-{i // 16:02d}", "vbios": rng.choice(
        ["96.00.DA.00.0C", "96.00.99.00.01"])} for i, n in enumerate(names)}
    out = []
    for day in range(days):
        for n in names:
            new = n in moved and day >= moved[n]
            rate = 0.05 if new or n in bad else 0.005
            failed = rng.random() < rate
            cause = rng.choice(["dcgm.pcie|DCGM_FR_PCIE_REPLAY", "xid|79"]) if new else rng.choice(
                ["ecc.uncorrected|", "xid|79", "nvlink.down|"])
            out.append({"node": n, "day": day, "facts": {**static[n], "driver": NEW_DRIVER if new else BASE_DRIVER},
                        "verdict": "replace" if failed else "pass", "causes": [cause] if failed else []})
    return out


Sweeps = list[tuple[str, float, str, str, dict[str, str]]]


def sweeps(records: list[dict[str, Any]]) -> Sweeps:
    """Each record as the history's row for it reads, its facts still whole: (node, time, verdict,
    causes JSON, facts). Made once a fleet and read for each key (a fleet's few distinct causes
    lists are each turned into JSON once)."""
    text: dict[tuple[str, ...], str] = {}
    out: Sweeps = []
    for r in records:
        causes = tuple(r["causes"])
        if causes not in text:
            text[causes] = json.dumps(r["causes"])
        out.append((r["node"], T0 + r["day"] * DAY + 3600, r["verdict"], text[causes], r["facts"]))
    return out


def rows(records: list[dict[str, Any]] | Sweeps, key: str) -> list[tuple[Any, ...]]:
    """The history's rows for fact `key` (sweeper.history `cohort_rows`): node, time, verdict, causes, value."""
    swept = sweeps(records) if records and isinstance(records[0], dict) else records
    return [(node, t, verdict, causes, facts.get(key)) for node, t, verdict, causes, facts in swept]


def flagged(records: list[dict[str, Any]] | Sweeps, key: str) -> list[str]:
    return [c.value for c in analyse(node_days(rows(records, key), T0)) if c.flagged]


# -- the statistics ------------------------------------------------------------------------------

def test_hypergeometric_tail_is_exact() -> None:
    """Fisher's tea-tasting table (4 of 8 cups, 3 right: p = 17/70) and 300 random small cases against
    exact rational sums of math.comb."""
    assert hypergeom_sf(3, 8, 4, 4) == pytest.approx(17 / 70, rel=1e-12)
    assert hypergeom_sf(4, 8, 4, 4) == pytest.approx(1 / 70, rel=1e-12)
    r = random.Random(3)
    for _ in range(300):
        total = r.randint(1, 80)
        succ, draws = r.randint(0, total), r.randint(0, total)
        k = r.randint(0, draws)
        exact = sum(Fraction(comb(succ, i) * comb(total - succ, draws - i), comb(total, draws))
                    for i in range(k, min(succ, draws) + 1))
        assert hypergeom_sf(k, total, succ, draws) == pytest.approx(float(exact), rel=1e-9, abs=1e-15)
    # a fleet's size: 12,000 node-days, a far tail still a positive number, not 0 or nan
    assert 0 < hypergeom_sf(120, 12000, 180, 2400) < 1e-30
    with pytest.raises(ValueError):
        hypergeom_sf(1, 10, 11, 2)


def test_binomial_wilson_and_holm_known_values() -> None:
    assert binom_sf(8, 10, 0.5) == pytest.approx(56 / 1024, rel=1e-12)
    assert binom_sf(0, 10, 0.3) == 1.0 and binom_sf(11, 10, 0.3) == 0.0
    lo, hi = wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


# -- the fleet -----------------------------------------------------------------------------------

def test_a_rollout_failing_5_percent_stands_apart_from_a_baseline_of_half_a_percent() -> None:
    for seed in range(3):
        swept = sweeps(fleet(seed, rollout=0.25))
        cohorts = analyse(node_days(rows(swept, "driver"), T0))
        assert [c.value for c in cohorts if c.flagged] == [NEW_DRIVER], seed
        cohort = next(c for c in cohorts if c.value == NEW_DRIVER)
        assert cohort.low > 0.03 and cohort.p_adjusted < 1e-20
        assert {c["check"] for c in cohort.causes} == {"dcgm.pcie", "xid"}  # the checks that drive it
        for key in ("zone", "rack", "vbios"):  # facts the rollout does not follow
            assert flagged(swept, key) == [], (seed, key)


def test_a_random_5_percent_of_bad_nodes_sharing_no_fact_is_not_flagged() -> None:
    """Twenty nodes that fail ten times as often, spread at random: no cohort of any fact stands
    apart, on any of ten seeds (and no cohort of a fleet with no bad nodes at all). Measured wider
    when the level was chosen: 0 of 160 families (40 seeds, 4 facts) flagged, with and without bad nodes."""
    for seed in range(10):
        swept = sweeps(fleet(100 + seed, bad_share=0.05))
        for key in ("driver", "zone", "rack", "vbios"):
            assert flagged(swept, key) == [], (seed, key)
        clean = sweeps(fleet(200 + seed))  # one fleet, read by each key
        assert all(flagged(clean, key) == [] for key in ("zone", "rack"))


def test_backtest_counts_the_nodes_a_stopped_rollout_would_have_spared() -> None:
    """Five nodes a day move to the new driver from day 3: it stands apart within days, and the
    nodes that moved after that day and failed are the ones a stop would have spared."""
    records = fleet(7, rollout=0.25, start=3, per_day=5)
    days = node_days(rows(records, "driver"), T0)
    bt = backtest_rollout(days, NEW_DRIVER)
    assert bt["flagged_day"] is not None and 3 < bt["flagged_day"] < 15
    moved_after = {r["node"] for r in records if r["facts"]["driver"] == NEW_DRIVER} - {
        r["node"] for r in records if r["facts"]["driver"] == NEW_DRIVER and r["day"] <= bt["flagged_day"]}
    failed_new = {r["node"] for r in records if r["facts"]["driver"] == NEW_DRIVER and r["verdict"] != "pass"}
    assert bt["joined_after"] == len(moved_after) and bt["spared"] == len(moved_after & failed_new) > 0
    assert bt["failed_anyway"] == len(failed_new - moved_after)
    assert backtest_rollout(days, BASE_DRIVER)["flagged_day"] is None


def test_unknown_cohort_is_shown_not_tested_and_facts_carry_forward() -> None:
    rs = [("a", T0 + 10, "pass", "[]", "x"), ("a", T0 + DAY + 10, "replace", '["xid|79"]', None),
          ("b", T0 + 10, "pass", "[]", None), ("c", T0 + 10, "inconclusive", "[]", "y")]
    days = node_days(rs, T0)
    assert [(d.node, d.day, d.cohort, d.failed) for d in days] == [
        ("a", 0, "x", False), ("b", 0, UNKNOWN, False), ("a", 1, "x", True)]
    assert not any(c.tested for c in analyse(days) if c.value == UNKNOWN)


def test_label_facts_read_each_clouds_topology() -> None:
    """EKS's network node layers (https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html),
    GKE's physical topology, NVIDIA Topograph's leaf/spine, GFD's driver labels."""
    eks = label_facts({"topology.k8s.aws/network-node-layer-1": "nn-1", "topology.k8s.aws/network-node-layer-2": "nn-2",
                       "topology.k8s.aws/network-node-layer-3": "nn-3", "node.kubernetes.io/instance-type": "p5.48xlarge",
                       "topology.kubernetes.io/zone": "us-east-1a"})
    assert eks == {"rack": "nn-3", "block": "nn-2", "spine": "nn-1", "instance-type": "p5.48xlarge",
                   "zone": "us-east-1a"}
    gke = label_facts({"cloud.google.com/gce-topology-block": "b1", "cloud.google.com/gce-topology-subblock": "s1",
                       "cloud.google.com/gce-topology-host": "h1"})
    assert gke == {"rack": "s1", "block": "b1", "host": "h1"}
    assert label_facts({"network.topology.nvidia.com/leaf": "sw1"}) == {"rack": "sw1"}
    assert label_facts({"nvidia.com/cuda.driver.major": "570", "nvidia.com/cuda.driver.minor": "133",
                        "nvidia.com/cuda.driver.rev": "20"})["driver"] == "570.133.20"


# -- the history, both backends ------------------------------------------------------------------

def record(h: Any, records: list[dict[str, Any]]) -> None:
    """The records as the sweep writes them: a run a day, a sweep a node, its facts, its verdict (the
    same calls a sweep makes; a day's in one transaction, as tests/weeks.py writes a step's, rather
    than a commit each)."""
    from sweeper.result import CheckResult, Result

    by_day: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_day.setdefault(r["day"], []).append(r)
    for day in sorted(by_day):
        run = f"sw-{day:03d}"
        with h.batch():
            h.run_started(run, T0 + day * DAY, "sweep")
            for r in by_day[day]:
                t = T0 + day * DAY + 3600
                sid = h.sweep_started(run, r["node"], t, "sweep-light.yaml", "p5")
                h.facts(sid, r["node"], t, {k: v for k, v in r["facts"].items() if k != "driver"})
                h.result(sid, Result(r["node"], "sweeper-check", t, t, (CheckResult("gpu.count", "pass"),),
                                     facts={"driver": r["facts"]["driver"]}))
                h.sweep_finished(sid, t + 60, r["verdict"], [], {"causes": r["causes"], "decided": t + 60})
            h.run_finished(run, T0 + day * DAY + 7200, "done", 0, {})


def test_history_cohorts_on_both_backends(new_state: Any) -> None:
    """The same cohorts from the history (facts keyed by cluster, node and run) as from the records."""
    from sweeper.history import History

    records = fleet(11, nodes=60, days=20, rollout=0.3)
    h = History(new_state("h.db"), cluster="east")
    record(h, records)
    doc = cohort_report(h, "driver", T0, min_days=30)
    expected = analyse(node_days(rows(records, "driver"), T0))
    assert [(c["value"], c["node_days"], c["failures"]) for c in doc["cohorts"]] == \
        [(c.value, c.node_days, c.failures) for c in expected]
    assert doc["flagged"] == [c.value for c in expected if c.flagged] == [NEW_DRIVER]
    assert {c["value"] for c in cohort_report(h, "rack", T0)["cohorts"]} == {f"rack-{i:02d}" for i in range(4)}
    assert cohort_report(h.for_cluster("west"), "driver", T0)["node_days"] == 0
    h.close()


def test_ingest_of_a_document_without_facts_still_works(new_state: Any) -> None:
    from sweeper.history import History
    from sweeper.parsers.sweeper_result import parse

    doc = {"schema": "sweeper.dev/result/v1", "node": "n", "source": "sweeper-check", "started": "2026-01-01T00:00:00Z",
           "finished": "2026-01-01T00:00:00Z", "status": "pass", "checks": [{"name": "x", "status": "pass"}]}
    r = parse(json.dumps(doc), "n", 0)
    assert r.status == "pass" and r.facts == ()
    h = History(new_state("h.db"))
    h.run_started("r", 1.0, "ingest")
    h.result(h.sweep_started("r", "n", 1.0, "ingest:sweeper", ""), r)
    assert h.query("select count(*) as n from facts")[0]["n"] == 0
    h.close()


def test_facts_are_data_capped_and_checked() -> None:
    from sweeper.parsers.sweeper_result import parse
    from sweeper.result import FACT_VALUE_MAX, Result

    r = Result("n", "s", 0, 0, facts={"driver": "<script>x</script>\x00" + "9" * 500, "bad key!": "v", "ok": 5})
    assert dict(r.facts) == {"driver": ("<script>x</script>" + "9" * 500)[:FACT_VALUE_MAX], "ok": "5"}
    doc = json.loads(r.to_json())
    doc["facts"] = ["not", "a", "map"]
    assert parse(json.dumps({**doc, "checks": [{"name": "x", "status": "pass"}], "status": "pass"}), "n", 0).status \
        == "error"


def test_cli_cohorts(tmp_path: Any) -> None:
    from sweeper.cli import main
    from sweeper.history import History

    state = str(tmp_path / "h.db")
    h = History(state, cluster="east")
    record(h, fleet(5, nodes=40, days=12, rollout=0.5))
    h.close()
    runner = CliRunner()
    res = runner.invoke(main, ["cohorts", "--state", state, "--by", "driver", "--since", "100000d", "-o", "json",
                               "--backtest", NEW_DRIVER])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["by"] == "driver" and {c["value"] for c in doc["cohorts"]} == {BASE_DRIVER, NEW_DRIVER}
    assert "Fisher" in doc["test"] and "backtest" in doc
    table = runner.invoke(main, ["cohorts", "--state", state, "--by", "zone", "--since", "100000d"])
    assert table.exit_code == 0 and "us-east-1a" in table.output and "95% CI" in table.output
    bad = runner.invoke(main, ["cohorts", "--state", state, "--by", "no such key;"])
    assert bad.exit_code == 2 and "--by" in bad.output
    assert "Fisher exact" in runner.invoke(main, ["cohorts", "--help"]).output


def test_report_shows_the_flagged_cohort_and_escapes_the_facts(tmp_path: Any) -> None:
    """The fleet report's section: the cohort that stands apart, its failing checks, the tables; a
    fact written by someone else (a label) is shown as text under the page's CSP, never as markup."""
    from sweeper.history import History
    from sweeper.policy import load_policy
    from sweeper.report import gather as gather_report
    from sweeper.report import render
    from tests.weeks import ROOT

    records = fleet(3, nodes=60, days=20, rollout=0.4)
    for r in records:
        r["facts"]["zone"] = '<script>alert(1)</script>"' if r["node"].endswith("7") else r["facts"]["zone"]
    h = History(tmp_path / "h.db")
    record(h, records)
    page = render(gather_report(h, load_policy(ROOT / "policies" / "default.yaml"), T0, T0 + 20 * DAY, DAY))
    section = page[page.index("<h2>Failures by cohort</h2>"):]
    assert f"<b>driver {NEW_DRIVER}</b> stands apart" in section and "dcgm.pcie (" in section
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    h.close()


def test_facts_are_written_when_they_change_and_carry_into_the_window(new_state: Any) -> None:
    """A fleet's facts change at a rollout, not every day: one row a fact a node until it changes; a
    window that starts after the last change still knows each node's value, after a prune too."""
    from sweeper.history import History

    records = fleet(2, nodes=20, days=12, rollout=0.5, start=6)
    h = History(new_state("h.db"))
    record(h, records)
    rows = h.query("select node, key, run_id from facts")
    assert len(rows) == 20 * 4 + 10  # driver, zone, rack, vbios on day 0; the new driver on day 6 for 10 nodes
    assert {r["run_id"] for r in rows if r["key"] == "driver"} == {"sw-000", "sw-006"}
    since = T0 + 8 * DAY
    doc = cohort_report(h, "driver", since, min_days=1)
    assert {c["value"]: c["nodes"] for c in doc["cohorts"]} == {NEW_DRIVER: 10, BASE_DRIVER: 10}
    h.prune(T0 + 7 * DAY)
    assert {c["value"]: c["nodes"] for c in cohort_report(h, "driver", since, min_days=1)["cohorts"]} == \
        {NEW_DRIVER: 10, BASE_DRIVER: 10}
    assert len(h.query("select node from facts where key = 'driver'")) == 20  # the superseded 570 rows went
    h.close()


def test_the_dcgm_version_is_a_fact_of_every_layout() -> None:
    """DCGM 4.x JSON (metadata.version), 3.x JSON (version) and the printed table (DCGM Version)."""
    from pathlib import Path

    from sweeper.parsers import dcgm

    fixtures = Path(__file__).parent / "parsers" / "fixtures"
    for name, version in (("dcgm-4x-l2-pass.json", "4.2.3"), ("dcgm-3x-mixed.json", "3.3.9"),
                          ("real/dcgm-table-331-metadata-deployment-pass.txt", "3.3.1")):
        assert dict(dcgm.parse((fixtures / name).read_text(), "n", 0.0).facts)["dcgm"] == version, name


def test_nvml_facts_are_read_never_guessed() -> None:
    """The check's facts from NVML: a reading that fails is left out (no fact), and the node's VBIOS
    is every distinct value its GPUs report."""
    import pynvml

    from sweeper.checks import run_node_checks
    from sweeper.checks.fake import FakeGpu, FakeNvml
    from sweeper.checks.options import CheckOptions

    class NoVbios(FakeNvml):
        def nvmlDeviceGetVbiosVersion(self, h: FakeGpu) -> str:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    opts = CheckOptions(node="n", expect_gpus=2, skip_kernel_log="test")
    facts = dict(run_node_checks(opts, FakeNvml(gpus=[FakeGpu(0), FakeGpu(1, vbios="96.00.99.00.01")], cuda=13000),
                                 None, now=0.0).facts)
    assert facts["vbios"] == "96.00.99.00.01,96.00.DA.00.0C" and facts["cuda"] == "13.0"
    assert facts["gpu.1.serial"] != facts["gpu.0.serial"] and facts["board"] == "692-2G520-0200-000"
    facts = dict(run_node_checks(opts, NoVbios(gpus=[FakeGpu(0), FakeGpu(1)], cuda=None), None, now=0.0).facts)
    assert "vbios" not in facts and "gpu.0.vbios" not in facts and "cuda" not in facts and facts["driver"]


def test_the_report_reads_every_fact_at_once_into_the_same_node_days(new_state: Any) -> None:
    """node_days_by (the report's section: the sweeps read once, each fact looked up at each node-day)
    gives each fact the node-days node_days gives over cohort_rows: with several sweeps a day, verdicts
    that say nothing of the node, a value changed within a day, facts recorded outside any sweep of the
    window (before it and in it, some at a sweep's very moment), a node with no value, and two clusters
    read together, one of them alone too."""
    from sweeper.cohorts import node_days_by
    from sweeper.history import History
    from sweeper.result import CheckResult, Result

    rng = random.Random(7)
    h = History(new_state("h.db"), cluster="east")
    keys = ("driver", "rack", "zone")
    with h.batch():
        for cluster in ("east", "west"):
            w = h.for_cluster(cluster)
            for n in range(6):
                node = f"gpu-{n}"
                if n != 5:  # gpu-5 never records a driver or a zone
                    w.facts(None, node, T0 - 3 * DAY, {"driver": "550", "zone": f"z{n % 2}"})
            for day in range(8):
                run = f"{cluster}-{day}"
                w.run_started(run, T0 + day * DAY, "sweep")
                for n in range(6):
                    node = f"gpu-{n}"
                    for k in range(rng.choice((1, 1, 2))):
                        t = T0 + day * DAY + 600 * n + 3000 * k
                        sid = w.sweep_started(run, node, t, "sweep-light.yaml", "p5", kind=rng.choice(("sweep", "pair")))
                        facts = {"rack": f"r{rng.randrange(3)}"} if rng.random() < 0.3 else {}
                        if n != 5 and rng.random() < 0.15:
                            facts["driver"] = rng.choice(("570", "580"))
                        w.result(sid, Result(node, "sweeper-check", t, t, (CheckResult("gpu.count", "pass"),),
                                             facts=facts))
                        verdict = rng.choice(("pass", "pass", "pass", "replace", "reboot", "error", "inconclusive"))
                        w.sweep_finished(sid, t + 60, verdict, [], {"causes": [f"xid|{rng.randrange(3)}"]})
                        if n != 5 and rng.random() < 0.1:  # a change seen outside a sweep, at a sweep's moment
                            w.facts(None, node, t, {"driver": rng.choice(("570", "580", "590"))})
    since = T0 + DAY
    for view in (h.for_cluster(None), h.for_cluster("west")):
        fast = node_days_by(*view.cohort_tables(keys, since), keys, since)
        for key in keys:
            assert fast[key] == node_days(view.cohort_rows(key, since), since), key
        assert UNKNOWN in {d.cohort for d in fast["driver"]} and len({d.cohort for d in fast["driver"]}) >= 3
    h.close()


def test_cli_cohorts_by_a_fact_no_sweep_recorded_is_exit_2_naming_those_recorded(tmp_path: Any) -> None:
    """`--by nosuchfact` printed one `(unknown)` cohort with exit 0: a typo read as a fact no node has."""
    from sweeper.cli import main
    from sweeper.history import History

    state = str(tmp_path / "h.db")
    h = History(state)
    record(h, fleet(5, nodes=6, days=2))
    h.close()
    runner = CliRunner()
    for by in ("drvier", "nosuchfact", "gpu.0.vbios"):
        res = runner.invoke(main, ["cohorts", "--state", state, "--by", by, "--since", "100000d"])
        line = " ".join(res.stderr.split())
        assert res.exit_code == 2 and f"--by '{by}': no sweep in the history recorded this fact" in line, res.output
        assert "the facts recorded: driver, rack, vbios, zone" in line, line
    assert "did you mean driver" in " ".join(runner.invoke(main, ["cohorts", "--state", state, "--by", "drvier"])
                                             .stderr.split())
    for by in ("zone", "rack", "nvlink-domain"):  # recorded, or a name of its own (none recorded: an empty table)
        res = runner.invoke(main, ["cohorts", "--state", state, "--by", by, "--since", "100000d", "-o", "json"])
        assert res.exit_code == 0 and json.loads(res.stdout)["by"] == by, res.output


def test_fact_keys_and_node_names_on_both_backends(new_state: Any) -> None:
    """What `cohorts --by` and `ingest` name when a name is not there: the facts and nodes recorded."""
    from sweeper.history import History

    h = History(new_state("h.db"))
    records = fleet(5, nodes=3, days=1)
    record(h, records)
    assert h.fact_keys() == ["driver", "rack", "vbios", "zone"]
    assert h.node_names() == sorted({r["node"] for r in records})
    h.close()
