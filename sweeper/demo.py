"""`sweeper demo`: the whole product against the embedded simulated cluster."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sweeper.clock import ScaledClock
from sweeper.config import Config
from sweeper.files import write_atomic
from sweeper.history import History, is_url, redact
from sweeper.kube import Kube, RetryPolicy
from sweeper.output import clean
from sweeper.policy import load_policy
from sweeper.report import cluster_gpu_nodes, gather, render
from sweeper.report.claims import by_source
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import DEMO_FLEET, parse_fleet
from sweeper.sim.server import ApiServer
from sweeper.sweep import Sweep

# The light check every 5 hours, not the default 6: the cycles are 6 hours apart, and a 6-hour interval
# made a busy node's light check due or not at a cycle by the minutes the cycle before spent on it.
DEMO_CONFIG = Config(playbook="sweep-nccl.yaml", max_nodes=4, max_percent=25, min_node_age=600, interval=20 * 3600, poll_interval=5,
                     light_interval=5 * 3600, check_timeout=900, remediate_reboots=True, node_condition=True,
                     remediation={"default": "manual", "by_pool": {"gpu": "karpenter"}, "by_profile": {}})


def run_demo(console: Console, state: Path | str, *, cycles: int, hours_between: float,
             printer: Callable[[str, dict[str, Any]], None], print_history: Callable[[Console, dict[str, Any]], None],
             fleet_spec: dict[str, Any] | None = None, cluster_name: str | None = None,
             report_file: Path | None = None) -> dict[str, Any]:
    """`state`: a SQLite path or a postgresql:// URL; `cluster_name`: the name its rows carry (several demos
    share one database under different names); `report_file`: where the HTML goes (default: report.html
    beside a SQLite file, in a temporary directory beside a URL)."""
    t0 = time.monotonic()
    fleet = parse_fleet(fleet_spec or DEMO_FLEET, "demo fleet")
    # The simulated days end about now, not a day ahead of it: the history's times and the report's
    # "generated" read as the past they are (`sweeper history NODE` says "5h ago", not "in 19h").
    # The last cycle and the pair sweep take about an hour of it; a loaded machine, at the same speed, more.
    cluster = SimCluster(fleet, clock=ScaledClock(fleet.speed, start=time.time() - ((cycles - 1) * hours_between
                                                                                      + 6) * 3600))
    faults = {n.name: n.faults for n in fleet.nodes}
    _rule(console, "[bold]Sweeper demo")
    console.print(f"simulated cluster: {len(fleet.nodes)} x p5.48xlarge, clock at {fleet.speed:g}x real time")
    console.print("injected faults: " + ", ".join(
        f"{name} ({_describe(f)})" for name, f in faults.items() if _describe(f)), soft_wrap=True)
    with ApiServer(cluster) as server, tempfile.TemporaryDirectory() as tmp:
        kc = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        kube = Kube.from_config(str(kc), clock=cluster.clock)
        kube.retry = RetryPolicy(attempts=6, base=1.0)
        hist = History(state, cluster_name)
        for cycle in range(1, cycles + 1):
            _rule(console, f"cycle {cycle} of {cycles}  (simulated {time.strftime('%a %H:%M', time.gmtime(cluster.clock.now()))})")
            sweep = Sweep(kube, DEMO_CONFIG, hist, clock=cluster.clock, emit=printer)
            report = sweep.run()
            console.print(f"  {len(report.outcomes)} node(s) swept with {report.api_requests} API requests")
            # Each cycle (and the pair sweep after the last) starts at a fixed simulated time,
            # not a fixed time after the previous one ended: on a loaded machine a cycle takes
            # more simulated time at the same speed, and which nodes are due must not follow that.
            wait = cluster.started + cycle * hours_between * 3600 - cluster.clock.now()
            if cycle < cycles and wait > 0:
                cluster.clock.advance(wait)
                # The controllers catch up with the jump before the next run looks (a node due to join
                # in the hours skipped has joined), not whenever their thread next gets the CPU.
                cluster.step()
        culprits = pair_sweep(console, kube, hist, cluster, printer, print_history)
        _rule(console, "the fleet")
        summary = fleet_table(console, kube, hist, DEMO_CONFIG)
        failing = next((n for n, s in summary.items() if s["state"] == "held" and n not in culprits), None)
        if failing:
            _rule(console, f"why {failing} is held: sweeper history {failing}")
            print_history(console, hist.node_history(failing))
        outside_claims(console, hist)
        cfg = DEMO_CONFIG
        policy = load_policy(cfg.path("policies") / cfg.policy)
        trends = {t.name for t in policy.trends}
        trended = next((r for r in hist.fleet() if trends & set(r.get("rules") or [])), None)
        if trended:
            node, rule = trended["node"], next(r for r in trended["rules"] if r in trends)
            metric = next(t.metric for t in policy.trends if t.name == rule)
            _rule(console, f"sweeper history {node} --check {metric.split('.')[0]}: replaced on its trend, "
                         "before it failed")
            print_history(console, hist.node_history(node, check=metric.split(".")[0]))
        page = report_file or (Path(tempfile.mkdtemp(prefix="sweeper-demo-")) / "report.html" if is_url(state)
                          else Path(state).with_name("report.html"))
        data = gather(hist, policy, 0.0, cluster.clock.now(), cfg.interval, {"p5.48xlarge": 460.0},
                      gpu_nodes=cluster_gpu_nodes(kube, cfg), node_source="the cluster")
        write_atomic(page, render(data, "Sweeper demo fleet"))
        # a path is text (`--state 'runs[1].db'` is not markup), and a command stays on one line to copy;
        # a URL's password is never printed
        where = redact(str(state)) + (f" --cluster {cluster_name}" if cluster_name else "")
        console.print(f"\nhistory: {where}   (sweeper history NODE --state {where})", markup=False, soft_wrap=True)
        console.print(f"fleet report: {page}", markup=False, soft_wrap=True)
        console.print("  open it in a browser: coverage, every sweep on a time axis, the trend"
                      + (f" that replaced {trended['node']}" if trended else "")
                      + f", NCCL bandwidth, a page per node (sweeper report --state {where} --offline)",
                      markup=False, soft_wrap=True)
        console.print(f"demo finished in {time.monotonic() - t0:.1f}s of real time, "
                      f"{(cluster.clock.now() - cluster.started) / 3600:.1f}h of simulated time")
        kube.close()
        hist.close()
    return summary


def outside_claims(console: Console, hist: History) -> None:
    """Each claim another tool made and what Sweeper's checks found of it; each source's precision."""
    rows = hist.query("select node, source, code, outcome, evidence from claims order by node, id")
    if not rows:
        return
    _rule(console, "other tools' claims, tested when the node was idle")
    for r in rows:
        console.print(f"  {r['node']}: {r['source']} {r['code']}: {r['outcome']} ({r['evidence']})",
                      markup=False, soft_wrap=True, highlight=False)
    for s in by_source(hist.claim_precision()):
        pct = "-" if s["precision"] is None else f"{s['precision']:.0%}"
        console.print(f"  {s['source']}: precision {pct} ({s['confirmed']} confirmed, {s['refuted']} refuted, "
                      f"{s['inconclusive']} inconclusive)", markup=False, soft_wrap=True, highlight=False)


WHOLE = 1 << 16  # a width no row reaches: rich neither wraps nor crops a table printed to a pipe


def _rule(console: Console, title: str) -> None:
    """A heading: rich's rule on a terminal; in a pipe a plain line with the title whole (rich would cut a
    title longer than the width with an ellipsis)."""
    if console.is_terminal:
        console.rule(title)
        return
    plain = Text.from_markup(title).plain
    console.print(f"── {plain} " + "─" * max(3, console.width - len(plain) - 4), markup=False, soft_wrap=True,
                  highlight=False)


def pair_sweep(console: Console, kube: Kube, hist: History, cluster: SimCluster,
               printer: Callable[[str, dict[str, Any]], None],
               print_history: Callable[[Console, dict[str, Any]], None]) -> list[str]:
    """One run of the pair playbook: idle nodes two at a time across the fabric; a failed pair
    blames neither node until each is re-paired with a known-good partner."""
    _rule(console, "pair sweeps over the fabric (playbook pair-fabric.yaml, two nodes at a time)")
    # No run deadline: at the demo's speed a real second of a loaded machine is minutes of simulated
    # time, and a run whose refills stop at its hour would hand a suspect's first partner back unpaired.
    cfg = replace(DEMO_CONFIG, playbook="pair-fabric.yaml", max_nodes=8, max_percent=50, run_deadline=0.0)
    report = Sweep(kube, cfg, hist, clock=cluster.clock, emit=printer).run()
    console.print(f"  {sum(1 for o in report.outcomes if o.action in ('released', 'held'))} node hand-back(s) "
                  f"with {report.api_requests} API requests")
    culprits = sorted({o.node for o in report.outcomes if o.action == "held"})
    for node in culprits:
        _rule(console, f"why {node} is held: sweeper history {node} (its pair runs)")
        print_history(console, hist.node_history(node))
    return culprits


def _describe(f: Any) -> str:
    parts = []
    if f.xids:
        parts.append("XID " + ",".join(str(x["code"]) for x in f.xids))
    if f.missing_gpus:
        parts.append(f"{f.missing_gpus} GPU missing")
    if f.hung_check:
        parts.append("hangs the check")
    if f.garbage_output:
        parts.append("garbage output")
    if f.remap_pending:
        parts.append("row remap pending")
    if f.ecc_dbe:
        parts.append("double-bit ECC")
    if f.ecc_growth:
        parts.append("corrected ECC climbing on GPU " + ",".join(str(g) for g in f.ecc_growth))
    if f.remap_growth:
        parts.append("remapped rows climbing on GPU " + ",".join(str(g) for g in f.remap_growth))
    if f.link_degraded < 1.0:
        parts.append(f"fabric links at {f.link_degraded:.0%} of their rate")
    parts += [f"another tool claims {c.get('condition') or c.get('taint') or c.get('device_taint')}"
              f"{'=' + c['status'] if c.get('condition') else ''} {c.get('reason') or c.get('value') or ''}".rstrip()
              for c in f.outside_claims]
    return ", ".join(parts)


def fleet_table(console: Console, kube: Kube, hist: History, cfg: Config) -> dict[str, dict[str, Any]]:
    from sweeper.fleet import NodeView, gpu_pods_by_node

    nodes = [NodeView.from_obj(n) for n in kube.list_nodes(cfg.gpu_node_selector)]
    busy = gpu_pods_by_node(kube.active_pods(), cfg)
    t = Table()
    for col in ("node", "state", "last verdict", "sweeps", "reason"):
        t.add_column(col)
    summary: dict[str, dict[str, Any]] = {}
    for v in sorted(nodes, key=lambda n: n.name):
        h = hist.node_history(v.name)
        last = h["sweeps"][0] if h["sweeps"] else None
        state = "held" if v.sweep_taint(cfg.taint_key) else "busy" if v.name in busy else "in service"
        verdict = (last or {}).get("verdict") or "-"
        reason = v.annotations.get(f"{cfg.prefix}/reason", "") if state == "held" else ""
        style = {"held": "red", "busy": "cyan"}.get(state, "green")
        # the reason is a node's annotation: text (Text, never markup), control characters escaped
        t.add_row(Text(v.name), Text(state, style=style), Text(verdict), str(len(h["sweeps"])),
                  Text(clean(reason)[:90] if console.is_terminal else clean(reason)))
        summary[v.name] = {"state": state, "verdict": verdict, "sweeps": len(h["sweeps"])}
    if console.is_terminal:
        console.print(t)
        return summary
    width, console.width = console.width, WHOLE  # in a pipe, each row whole on one line (print's own
    try:                                         # width= is capped at the console's)
        console.print(t)
    finally:
        console.width = width
    return summary
