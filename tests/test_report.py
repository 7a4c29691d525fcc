"""The fleet report: coverage over every GPU node (never swept counted), nodes that left the
cluster shown as replaced, a page per node; and the demo's report opened in headless Chromium,
its DOM read back: nothing fetched, every sweep placed at its time, the trend that replaced a
node, NCCL bandwidth, and every in-page link landing on a node's page."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History
from sweeper.policy import load_policy
from sweeper.report import gather, render
from sweeper.result import Metric, Result
from tests.weeks import ROOT, record_pair

POLICY = load_policy(ROOT / "policies" / "default.yaml")
T0 = 1_800_000_000.0
HOUR = 3600.0


def _sweep(h: History, run: str, node: str, at: float, verdict: str, reasons: list[str] | None = None,
           rules: list[str] | None = None, ecc: float | None = None) -> None:
    sid = h.sweep_started(run, node, at, "sweep-light", "p5.48xlarge")
    if ecc is not None:
        h.result(sid, Result(node=node, source="sweeper", started=at, finished=at + 60,
                             metrics=(Metric("ecc.aggregate_corrected", ecc, "", gpu=2),)))
    h.sweep_finished(sid, at + 120, verdict, reasons or [], {"verdict": verdict, "rules": rules or [],
                                                            "causes": [], "decided": at + 100, "policy": "default"})


@pytest.fixture
def plan_history(new_state: Callable[[str], str]) -> History:
    """16 GPU nodes in the last run's plan, 8 of them ever swept; gpu-07 replaced and gone (on
    each backend)."""
    h = History(new_state("h.db"))
    h.run_started("run-1", T0, "sweep")
    for i in range(8):
        _sweep(h, "run-1", f"gpu-{i:02d}", T0 + i * 60, "pass", ecc=float(i))
    _sweep(h, "run-1", "gpu-07", T0 + 600, "replace", ["corrected-ecc-rising: GPU 2 rising"], ["corrected-ecc-rising"])
    h.action("run-1", "gpu-07", T0 + 700, "replaced", "karpenter: NodeClaim deleted; node terminated")
    plan = {f"gpu-{i:02d}": "p5.48xlarge" for i in range(16) if i != 7} | {"gpu-new": "p5.48xlarge"}
    h.run_finished("run-1", T0 + 800, "done", 8, {"gpu_node_profiles": plan})
    return h


def test_coverage_counts_the_never_swept_gpu_nodes_of_the_last_plan(plan_history: History) -> None:
    data = gather(plan_history, POLICY, 0.0, T0 + HOUR, 20 * HOUR)
    page = render(data)
    # 7 of the 16 GPU nodes in the plan were swept (gpu-07 left): 44%, not the 100% of the history alone
    assert re.search(r"<b>16</b>GPU nodes", page) and re.search(r"<b>7 \(44%\)</b>swept within interval", page)
    assert re.search(r"<b>9</b>never swept", page)
    assert "GPU nodes from the plan of run run-1" in page
    assert "sweeps since the start of the history" in page and "sweeps since -" not in page


def test_a_replaced_node_that_left_is_shown_as_replaced_not_held(plan_history: History) -> None:
    page = render(gather(plan_history, POLICY, 0.0, T0 + HOUR, 20 * HOUR))
    held = page[page.index("<h2>Nodes held, and why</h2>"):page.index("<h2>Nodes that left the cluster</h2>")]
    assert "No node is held." in held and "gpu-07" not in held
    left = page[page.index("<h2>Nodes that left the cluster</h2>"):page.index("<h2>Sweeps over time</h2>")]
    assert "gpu-07" in left and "<td>replaced</td>" in left and "corrected-ecc-rising" in left


def test_without_a_plan_or_cluster_a_replaced_node_is_still_not_held(new_state: Callable[[str], str]) -> None:
    h = History(new_state("h.db"))
    h.run_started("run-1", T0, "sweep")
    _sweep(h, "run-1", "gpu-00", T0, "replace", ["second-reboot-same-cause"], ["second-reboot-same-cause"])
    h.action("run-1", "gpu-00", T0 + 60, "replaced", "karpenter: NodeClaim deleted; node terminated")
    page = render(gather(h, POLICY, 0.0, T0 + HOUR, 20 * HOUR))
    assert "No node is held." in page and "from the history alone" in page


def test_report_node_writes_one_node_page_with_its_metric_per_gpu(plan_history: History, tmp_path: Path) -> None:
    page = render(gather(plan_history, POLICY, 0.0, T0 + HOUR, 20 * HOUR, node="gpu-03"))
    assert 'id="node-gpu-03"' in page and page.count("<section class=node") == 1
    out = tmp_path / "gpu-03.html"
    res = CliRunner().invoke(main, ["report", "--state", plan_history.state, "--node", "gpu-03", "--since",
                                    "3650d", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert 'id="node-gpu-03"' in page and page.count("<section class=node") == 1
    assert "sweeper history gpu-03" in page
    res = CliRunner().invoke(main, ["report", "--state", plan_history.state, "--node", "nope", "-o", "-"])
    assert res.exit_code == 2 and "no sweep of 'nope'" in res.stderr


def test_the_cluster_s_gpu_nodes_win_over_the_recorded_plan(make_sim, tmp_path: Path) -> None:
    """With a kubeconfig the report asks the cluster (one paged LIST of nodes) for its GPU nodes."""
    sim = make_sim(nodes=3)
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    _sweep(h, "run-1", "gpu-00", T0, "pass")
    h.run_finished("run-1", T0 + 60, "done", 1, {"gpu_node_profiles": {"gpu-00": "p5.48xlarge"}})
    h.close()
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--state", str(tmp_path / "h.db"), "--kubeconfig", str(sim.kubeconfig),
                                    "--since", "3650d", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "GPU nodes from the cluster" in page and re.search(r"<b>3</b>GPU nodes", page)
    assert re.search(r"<b>2</b>never swept", page)


# -- the demo's report in a real browser ------------------------------------------------------------
# `demo`: the demo, run once in a process by tests/conftest.py


def test_the_demo_replaces_a_node_on_its_trend_before_it_fails(demo: dict[str, Any]) -> None:
    out = demo["out"]
    assert "sweeper history gpu-p5-06 --check ecc: replaced on its trend, before it failed" in out
    assert re.search(r"\s+replace\s+corrected-ecc-rising\s", out), "the rule beside the verdict"
    assert re.search(r"ecc\.aggregate_corrected\s+[▁▂▃▄▅▆▇█]{4,}\s", out), "the climb as a sparkline"
    assert re.search(r"ecc\.aggregate_uncorrected\s+▁+\s+0\n", out), "replaced before a single uncorrectable error"
    assert "fleet report: " in out and "a page per node" in out
    h = History(demo["state"])
    assert h.replaced().keys() >= {"gpu-p5-06"}
    assert h.metric_latest("nccl.busbw_largest", 0.0), "the demo records NCCL bandwidth for the report"


def test_the_demo_report_shows_each_outside_sources_precision(demo: dict[str, Any]) -> None:
    """The EKS node monitoring agent claimed AcceleratedHardwareReady=False on two demo nodes; one
    was refuted by the kernel log, one confirmed (issue 25, point 2)."""
    page = demo["page"].read_text()
    section = page[page.index("<h2>Other tools' claims, tested</h2>"):]
    row = re.search(r'<tr class=source data-source="eks-node-monitoring-agent">(.*?)</tr>', section)
    assert row and re.findall(r"<td>(?:<b>)?([^<]*)", row.group(1))[2:6] == ["1", "1", "0", "50%"], row


def _browser() -> Any:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("headless Chromium and chromedriver are not installed (Debian: apt-get install chromium "
                    "chromium-driver); .ci/run installs them")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_the_demo_report_in_headless_chromium(demo: dict[str, Any]) -> None:
    browser = _browser()
    try:
        browser.get(demo["page"].as_uri())
        js = browser.execute_script
        # one self-contained file: the browser fetched nothing for it
        assert js("return performance.getEntriesByType('resource').length") == 0
        assert js("return document.querySelectorAll('script, link, img, iframe').length") == 0
        tiles = js("return Object.fromEntries([...document.querySelectorAll('[data-tile]')]"
                   ".map(t => [t.dataset.tile, t.querySelector('b').textContent]))")
        cluster_gpu_nodes = sum(1 for s in demo["summary"].values())
        assert tiles["GPU nodes"] == str(cluster_gpu_nodes), "coverage over the cluster's GPU nodes"
        assert tiles["never swept"] == str(sum(1 for s in demo["summary"].values() if s["sweeps"] == 0))
        assert tiles["replaced"] == "2"
        row = js("return [...document.querySelectorAll('table.coverage tbody tr')].map(r => "
                 "[...r.cells].map(c => c.textContent))")
        assert row[0][:2] == ["p5.48xlarge", str(cluster_gpu_nodes)]

        # every recorded sweep is a dot placed by its time, coloured by its verdict, with its reason
        h = History(demo["state"])
        timeline = h.sweep_timeline(0.0)
        dots = js("return [...document.querySelectorAll('svg.timeline circle.sweep')].map(c => ({node: "
                  "c.dataset.node, ts: +c.dataset.ts, verdict: c.dataset.verdict, x: c.getBoundingClientRect().x + c.getBoundingClientRect().width / 2, "
                  "fill: c.getAttribute('fill'), tip: c.querySelector('title').textContent}))")
        assert len(dots) == len(timeline)
        by_time = sorted(dots, key=lambda d: d["ts"])
        # cx is written to 0.1 px, and the browser's box of a dot (r 3 or 5) is a float of its own:
        # two sweeps started within a second (a pair's two nodes) may differ by that rounding only
        xs = [d["x"] for d in by_time]
        assert all(b >= a - 0.15 for a, b in zip(xs, xs[1:], strict=False)), "later sweeps lie further right"
        assert by_time[-1]["x"] - by_time[0]["x"] > 500, "the axis spans the simulated day"
        replaced = [d for d in dots if d["node"] == "gpu-p5-06" and d["verdict"] == "replace"]
        assert replaced and all(d["fill"] == "#d03b3b" and "corrected-ecc-rising" in d["tip"] and
                                "rising" in d["tip"] for d in replaced)

        # held only what is still held; the replaced nodes under their own heading
        held = js("return [...document.querySelectorAll('table.held tbody tr')].map(r => r.cells[0].textContent)")
        assert held == ["gpu-p5-08", "gpu-p5-13"], "the degraded fabric link's culprit and the hung check"
        left = js("return Object.fromEntries([...document.querySelectorAll('table.left tbody tr')]"
                  ".map(r => [r.cells[0].textContent, r.cells[2].textContent]))")
        assert left == {"gpu-p5-06": "replaced", "gpu-p5-09": "replaced"}
        broken = js("return [...document.querySelectorAll('td a')].filter(a => a.getClientRects().length > 1)"
                    ".map(a => a.textContent)")
        assert not broken, f"a node's name is broken over two lines in a narrow column: {broken}"

        # the trend that replaced gpu-p5-06, and the NCCL bandwidth per profile
        trend = js("let f = document.querySelector('figure.trend[data-node=\"gpu-p5-06\"]'); "
                   "return f && [f.dataset.rule, f.querySelector('figcaption').textContent, "
                   "f.querySelectorAll('polyline').length]")
        assert trend and trend[0] == "corrected-ecc-rising" and "fired: replace" in trend[1] and trend[2] == 2
        assert js("return document.querySelectorAll('figure.nccl[data-profile=\"p5.48xlarge\"] rect').length") >= 1

        # every in-page link lands on a node's page; gpu-p5-06's tells its story per GPU
        links = js("return [...document.querySelectorAll('a[href^=\"#\"]')].map(a => a.getAttribute('href'))")
        assert links and all(js("return !!document.getElementById(arguments[0])", href[1:]) for href in links)
        browser.find_element("css selector", 'table.left a[href="#node-gpu-p5-06"]').click()
        assert browser.current_url.endswith("#node-gpu-p5-06")
        section = js("let s = document.getElementById('node-gpu-p5-06'); return [s.querySelector('.state')"
                     ".textContent, s.querySelector('p.rule').textContent, [...s.querySelectorAll("
                     "'figure.metric[data-metric=\"ecc.aggregate_corrected\"] polyline')].map(p => "
                     "p.querySelector('title').textContent), s.querySelectorAll('table.sweeps tbody tr').length, "
                     "s.getBoundingClientRect().top]")
        state, rule, gpus, sweeps, top = section
        assert state == "replaced" and rule.startswith("corrected-ecc-rising: ecc.aggregate_corrected rising")
        assert gpus == [f"GPU {i}" for i in range(8)], "one line per GPU"
        assert sweeps == len(h.node_history("gpu-p5-06")["sweeps"])
        assert abs(top) < 5, "the link scrolled the node's page into view"
    finally:
        browser.quit()


def test_the_report_command_on_the_demo_history_offline(demo: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--state", str(demo["state"]), "--offline", "--since", "3650d",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    last = History(demo["state"]).last_run()
    assert last is not None and f"GPU nodes from the plan of run {last['id']}" in page
    # gpu-p5-06 was in that plan, and replaced during that run: replaced, not held
    held = page[page.index("<table class=held>"):page.index("<h2>Nodes that left the cluster</h2>")]
    left = page[page.index("<table class=left>"):page.index("<h2>Sweeps over time</h2>")]
    assert "gpu-p5-06" not in held and "gpu-p5-13" in held
    assert re.search(r"gpu-p5-06</a></td><td>p5.48xlarge</td><td>replaced</td>", left)


def test_an_unreachable_cluster_falls_back_to_the_recorded_plan(plan_history: History, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--state", plan_history.state, "--kubeconfig", str(kubeconfig),
                                    "--since", "3650d", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "GPU nodes from the last run's plan: the cluster did not answer" in " ".join(res.stderr.split())
    assert "GPU nodes from the plan of run run-1" in out.read_text()


# -- pair sweeps ---------------------------------------------------------------------------------------
@pytest.fixture
def pair_history(new_state: Callable[[str], str]) -> History:
    """Six p5 nodes: g0+g1 passed; g2+g3 failed and were re-paired (g2 failed again with g0, the
    culprit, held; g3 passed with g1); g4+g5 failed with no known-good partner free, waiting."""
    h = History(new_state("pairs.db"))
    h.run_started("run-1", T0, "sweep")
    record_pair(h, T0 + 600, "g0", "g1", "pass", busbw=182.4, run="run-1")
    record_pair(h, T0 + 1200, "g2", "g3", "fail", busbw=61.0, detail="pair.nccl: busbw 61.0 GB/s below 150",
                run="run-1")
    record_pair(h, T0 + 1800, "g2", "g0", "fail", "repair", busbw=58.5, detail="pair.nccl: busbw 58.5 GB/s below 150",
                run="run-1", verdicts=("quarantine", "inconclusive"))
    record_pair(h, T0 + 1800, "g3", "g1", "pass", "repair", busbw=181.0, run="run-1")
    record_pair(h, T0 + 2400, "g4", "g5", "fail", busbw=None, detail="pair.mtu: eth0 path MTU 9001 lost",
                run="run-1")
    h.run_finished("run-1", T0 + 2500, "done", 6, {"gpu_node_profiles": {f"g{i}": "p5.48xlarge" for i in range(6)}})
    return h


def _section(page: str, start: str, end: str) -> str:
    at = page.index(start)
    return page[at:page.index(end, at)]


def test_the_report_shows_pair_runs_culprits_and_suspects(pair_history: History) -> None:
    page = render(gather(pair_history, POLICY, 0.0, T0 + HOUR, 20 * HOUR))
    pairs = _section(page, "<h2>Pair sweeps</h2>", "<h2>Nodes</h2>")
    counts = _section(pairs, "<table class=pair-counts>", "</table>")
    assert ("<tr data-mode='sweep'><td>sweep</td><td>3</td><td>1</td><td>2</td></tr>" in counts
            and "<tr data-mode='repair'><td>re-pair (suspect)</td><td>2</td><td>1</td><td>1</td></tr>" in counts), counts
    culprits = _section(pairs, "<table class=pair-culprits>", "</table>")
    assert re.findall(r"<tr data-node='(\w+)'>", culprits) == ["g2"]
    assert "58.5" in culprits and "quarantine" in culprits and 'href="#node-g0"' in culprits
    waiting = _section(pairs, "<table class=pair-suspects>", "</table>")
    assert re.findall(r"<tr data-node='(\w+)'>", waiting) == ["g4", "g5"], "g2 and g3 were re-paired"
    several = _section(pairs, "<table class=pair-partners>", "</table>")
    assert re.findall(r"<tr data-node='(\w+)'><td>.*?</td><td>(\d+)</td>", several) == [("g2", "2")]
    assert pairs.count("pair.mtu: eth0 path MTU 9001 lost") == 1, "the latest failed pairs, listed once"
    # a pair sweep is a sweep of the node: all six nodes were swept, the waiting two not yet
    assert re.search(r"<b>4 \(67%\)</b>swept within interval", page)
    # g2's page: its pair runs, each partner linked, and the bandwidth over time
    g2 = _section(page, '<section class=node id="node-g2">', "</section>")
    rows = re.findall(r"<tr><td>[^<]+</td><td>(?:<a [^>]+>)?(\w+)(?:</a>)?</td><td>([^<]+)</td><td>([^<]*)</td>", g2)
    assert rows == [("g0", "re-pair (suspect)", "58.5"), ("g3", "sweep", "61.0")]
    assert "<figure class=pair-busbw>" in g2
    g0 = _section(page, '<section class=node id="node-g0">', "</section>")
    assert "re-pair (known-good)" in g0


def test_a_node_held_by_the_pair_rule_says_what_the_rule_means(pair_history: History) -> None:
    _sweep(pair_history, "run-2", "g4", T0 + 3000, "quarantine",
           ["fails-with-three-partners: failed pairs with 3 different partners within 7d (g5, g6, g7; limit 3)"],
           ["fails-with-three-partners"])
    page = render(gather(pair_history, POLICY, 0.0, T0 + HOUR, 20 * HOUR))
    held = _section(page, "<table class=held>", "</table>")
    assert "g4" in held and "fails-with-three-partners" in held
    g4 = _section(page, '<section class=node id="node-g4">', "</section>")
    assert ("<p class=rule><b>fails-with-three-partners</b>: failed pairs with 3 or more different partners "
            "within 7d: quarantine</p>") in g4


def test_a_history_without_pairs_says_so(plan_history: History) -> None:
    page = render(gather(plan_history, POLICY, 0.0, T0 + HOUR, 20 * HOUR))
    assert "No pair sweep in this window." in _section(page, "<h2>Pair sweeps</h2>", "<h2>Nodes</h2>")


def test_the_pair_report_in_headless_chromium(pair_history: History, tmp_path: Path) -> None:
    out = tmp_path / "pairs.html"
    res = CliRunner().invoke(main, ["report", "--state", pair_history.state, "--offline", "--since", "3650d",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    browser = _browser()
    try:
        browser.get(out.as_uri())
        js = browser.execute_script
        assert js("return performance.getEntriesByType('resource').length") == 0
        culprits = js("return [...document.querySelectorAll('table.pair-culprits tbody tr')].map(r => "
                      "[...r.cells].map(c => c.textContent))")
        assert [c[:5] for c in culprits] == [["g2", "2027-01-15 08:29", "g0", "58.5", "quarantine"]]
        # the pair sweeps lie on the timeline too, each told as one
        tips = js("return [...document.querySelectorAll('svg.timeline circle.sweep')].map(c => "
                  "c.querySelector('title').textContent)")
        assert len(tips) == 10 and all("(pair sweep)" in t for t in tips)
        # the culprit's link lands on its page, where the bandwidth with each partner is drawn
        browser.find_element("css selector", 'table.pair-culprits a[href="#node-g2"]').click()
        assert browser.current_url.endswith("#node-g2")
        page = js("let s = document.getElementById('node-g2'); return [s.getBoundingClientRect().top, "
                  "[...s.querySelectorAll('table.pairs tbody tr')].map(r => r.cells[1].textContent), "
                  "s.querySelectorAll('figure.pair-busbw polyline').length, "
                  "[...s.querySelectorAll('figure.pair-busbw circle title')].map(t => t.textContent)]")
        top, partners, lines, dots = page
        # one line a partner: a line from g3's run to g0's would draw a drop that is a change of partner
        assert abs(top) < 5 and partners == ["g0", "g3"] and lines == 0
        assert [(d.split()[0], d.split(": ")[-1]) for d in dots] == [("g3", "61 GB/s"), ("g0", "58.5 GB/s")]
        assert js("return [...document.querySelectorAll('#node-g2 figure.pair-busbw .legend span')]"
                  ".map(s => s.textContent)") == ["g3", "g0"]
    finally:
        browser.quit()


# -- what issue 24 saw in the demo's report ----------------------------------------------------------
def _timeline_ticks(page: str) -> tuple[list[tuple[float, str]], float, float]:
    """The time axis's ticks (x, label) and its plot's ends (the earliest sweep's x, the right end)."""
    svg = _section(page, "<svg class=timeline", "</svg>")
    width = float(re.search(r'width="(\d+)"', svg).group(1))
    ticks = [(float(x), label) for x, label in re.findall(r'<text x="([\d.]+)"[^>]*class=tick[^>]*>([^<]+)</text>', svg)]
    left = min(float(x) for x in re.findall(r'<circle cx="([\d.]+)"', svg))
    return ticks, left, width - 20


@pytest.mark.parametrize("span", [HOUR, 3.5 * 86400, 29 * 86400, 400 * 86400])
def test_the_time_axis_ticks_lie_inside_its_window_with_distinct_labels(tmp_path: Path, span: float) -> None:
    """An hour that starts on the hour put its only tick on the axis's right end (its label cut off);
    three and a half days put two ticks a day under one date label. Now: two ticks or more, each clear
    of both ends (a centred label of 11 characters fits), no two with one label."""
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    _sweep(h, "run-1", "gpu-00", T0, "pass")
    _sweep(h, "run-1", "gpu-01", T0 + span - 300, "reboot", ["xid 79"], [])
    ticks, left, right = _timeline_ticks(render(gather(h, POLICY, 0.0, T0 + span, 20 * HOUR)))
    assert len(ticks) >= 2, ticks
    assert all(left + 30 <= x <= right - 30 for x, _ in ticks), (ticks, left, right)
    assert len({label for _, label in ticks}) == len(ticks), ticks


def test_nccl_bandwidth_charts_start_at_zero_and_draw_the_floor(tmp_path: Path) -> None:
    """A histogram of 470-480 GB/s drawn from 460 (the floor) made a 2% spread look like the whole
    chart; so did a node's bandwidth line drawn from its lowest reading. Both start at 0 now, and the
    node's chart draws its profile's floor."""
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    for i, value in enumerate((470.0, 475.0, 480.0, 478.0)):
        for k in range(2):
            at = T0 + k * 6 * HOUR + i * 60
            sid = h.sweep_started("run-1", f"gpu-{i:02d}", at, "sweep-nccl", "p5.48xlarge")
            h.result(sid, Result(node=f"gpu-{i:02d}", source="nccl", started=at, finished=at + 60,
                                 metrics=(Metric("nccl.busbw_largest", value - 5 * k, "GB/s"),)))
            h.sweep_finished(sid, at + 120, "pass", [], {"verdict": "pass", "rules": [], "causes": [],
                                                          "decided": at + 100, "policy": "default"})
    page = render(gather(h, POLICY, 0.0, T0 + 7 * HOUR, 20 * HOUR, {"p5.48xlarge": 460.0}))
    hist = _section(_section(page, "<figure class=nccl", "</figure>"), "<svg", "</svg>")
    assert re.search(r'<text x=10 y="\d+">0</text>', hist), hist
    assert "floor 460" in hist
    node = _section(page, '<section class=node id="node-gpu-00">', "</section>")
    chart = _section(node, '<figure class=metric data-metric="nccl.busbw_largest">', "</figure>")
    assert re.search(r'text-anchor=end>0</text>', chart), chart
    assert "<line class=floor" in chart and "floor 460" in chart


def test_a_node_page_names_the_rule_the_held_table_names(tmp_path: Path) -> None:
    """The held table names the rule of a node's latest verdict; its page named only the rules of
    the sweeps in the report's window, and said nothing of what a ladder, relapse or failure-rate
    rule means."""
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    _sweep(h, "run-1", "gpu-00", T0, "replace", ["second-reboot-same-cause: 2 reboots for xid|79 in 7d"],
           ["second-reboot-same-cause"])
    _sweep(h, "run-1", "gpu-01", T0 - 40 * 86400, "quarantine", ["three-of-five: 3 of the last 5 held it"],
           ["three-of-five"])
    _sweep(h, "run-1", "gpu-02", T0, "quarantine", ["gpu.count: 7 GPUs, expected 8"], [])
    page = render(gather(h, POLICY, T0 - 30 * 86400, T0 + HOUR, 20 * HOUR))
    held = _section(page, "<table class=held>", "</table>")
    for node, rule in (("gpu-00", "second-reboot-same-cause"), ("gpu-01", "three-of-five"), ("gpu-02", "findings")):
        assert rule in _section(held, f">{node}<", "</tr>"), (node, held)
        own = _section(page, f'<section class=node id="node-{node}">', "</section>")
        assert f'<p class=latest data-rule="{rule}">' in own and f"rule <b>{rule}</b>" in own, own
    gpu00 = _section(page, '<section class=node id="node-gpu-00">', "</section>")
    assert ("<p class=rule><b>second-reboot-same-cause</b>: more than 1 reboot verdict(s) for the same cause "
            "within 7d: replace</p>") in gpu00
    gpu01 = _section(page, '<section class=node id="node-gpu-01">', "</section>")
    assert "<p class=rule><b>three-of-five</b>: 3 of the last 5 conclusive sweeps held the node: quarantine</p>" in gpu01


def test_coverage_says_where_busy_nodes_went(tmp_path: Path) -> None:
    """Of 6 GPU nodes, 2 swept within the interval, 2 busy (only light checks: GPU pods kept them),
    1 last swept long ago with nothing since (overdue), 1 never swept. The table used to count the
    busy and overdue ones nowhere: 2 + 1 of 6, the rest unexplained."""
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    _sweep(h, "run-1", "gpu-00", T0, "pass")
    _sweep(h, "run-1", "gpu-01", T0, "pass")
    for node in ("gpu-02", "gpu-03"):
        _sweep(h, "run-1", node, T0 - 5 * 86400, "pass")
        sid = h.sweep_started("run-1", node, T0 + 60, "light-busy", "p5.48xlarge", kind="light")
        h.sweep_finished(sid, T0 + 90, "pass", [], {"verdict": "pass", "rules": [], "causes": [],
                                                    "decided": T0 + 80, "policy": "default"})
    _sweep(h, "run-1", "gpu-04", T0 - 5 * 86400, "pass")
    h.run_finished("run-1", T0 + 100, "done", 4, {"gpu_node_profiles": {f"gpu-{i:02d}": "p5.48xlarge"
                                                                         for i in range(6)}})
    page = render(gather(h, POLICY, 0.0, T0 + HOUR, 20 * HOUR))
    row = _section(page, '<tr data-profile="p5.48xlarge">', "</tr>")
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
    assert cells == ["p5.48xlarge", "6", "2", "2", "1", "1", "0", "33%"], cells
    assert "<th>busy: light checks only</th><th>overdue</th>" in page
    assert re.search(r"<b>2</b>busy: light checks only", page)
    assert "Busy now: 2, overdue: 1." in page
