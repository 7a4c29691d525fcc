"""The one printer of the CLI: how each command's result shows as a table on a terminal (the
JSON and YAML forms are the documents themselves, printed by sweeper.output's Out). Every
function takes an Out and the data; none reads the cluster or the history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sweeper.clock import iso
from sweeper.output import Col, Out, clean, sparkline

HOLDING = ("reboot", "replace", "quarantine")  # sweeper.policy.HOLDING, without importing the policy


def progress(console: Any) -> Callable[[str, dict[str, Any]], None]:
    """Progress lines of a sweep. `console`: an Out, or anything with a `file` (a rich Console)."""
    o = console if isinstance(console, Out) else Out(stream=getattr(console, "file", None))

    def say(*parts: tuple[str, str | None] | str) -> None:
        o.file.write("".join(o.paint(clean(p)) if isinstance(p, str) else o.paint(clean(p[0]), p[1])
                             for p in parts) + "\n")

    def emit(event: str, d: dict[str, Any]) -> None:
        if event == "plan":
            say(f"run {d['run_id']}: {d['gpu_nodes']} GPU nodes, {d['held']} already held, "
                f"budget {d['budget']}; taking {taking(d['take'], d.get('recheck', ()))}")
            if d.get("gate"):
                say(f"  gate: taking {', '.join(d['gate'])} (new or rebooted nodes, within the gate's own budget)")
        elif event == "ungate":
            say(f"  {d['node']}: passed its gate ({d['verdict']}); its startup taint is off, handed to work")
        elif event == "hold":
            say(f"  {d['node']}: held (tainted), running checks")
        elif event == "pair":
            a, b = d["nodes"]
            say(f"  {a} + {b}: " + ("re-pair of suspect " + a + " with known-good " + b if d["mode"] == "repair"
                                   else "pair") + " held, running the two-node all-reduce")
        elif event == "raced":
            say(f"  {d['node']}: ", ("a GPU pod landed first", "warn"), f" ({', '.join(d['pods'])}); released untouched")
        elif event == "done":
            action = "held for a re-pair with a known-good partner" if d["action"] == "suspect" else d["action"]
            say(f"  {d['node']}: ", (d["verdict"] or "-", d["verdict"]), f" -> {action}"
                + (f"  ({'; '.join(d['reasons'])})" if d["verdict"] != "pass" else ""))
        elif event == "breaker":
            say(("circuit breaker open", "replace"), f": {d['reason']}; no more nodes are taken until "
                "`sweeper breaker reset`")
        elif event == "light":
            say(f"  {d['node']} (busy): light check ", (d["verdict"] or "-", d["verdict"]),
                f", now a suspect ({'; '.join(d['reasons'])})" if d["verdict"] in HOLDING else "")
        elif event == "reconcile":
            say(f"  {d['node']}: reconciled, {d['action']} ({d['why']})")
        elif event == "skip":
            say(f"  {d['node']}: skipped ({d['why']})")
        elif event == "remedy":
            say(f"  {d['node']}: {d['provider']}: {d['action']} ({d['detail']})")
    return emit


def taking(take: list[str], recheck: Any) -> str:
    """The nodes a run takes, its re-checks of nodes it holds (back from a reboot or GPU reset, taken
    within the budget of held nodes) said as such."""
    again = [n for n in take if n in set(recheck)]
    fresh = [n for n in take if n not in again]
    parts = [", ".join(fresh)] if fresh else []
    if again:
        parts.append(", ".join(again) + (" (re-checks of nodes it holds)" if len(again) > 1
                                         else " (a re-check of a node it holds)"))
    return "; ".join(parts) or "none"


_OUTCOME_COLS = (Col("node"), Col("verdict"), Col("action"), Col("seconds", wide=True), Col("reasons", cut=True))


def task(out: Out, o: Any) -> None:
    """One task's outcome of `sweeper run`, as it ends; the message whole: a `debug` of a registered
    value is read for its end as much as its start."""
    label = f" ({o.item})" if o.is_item else ""
    out.file.write(out.paint(f"{o.status:>8}", o.status) + "  " + clean(f"{o.name}{label}")
                   + (": " + clean(o.msg) if o.msg else "") + "\n")


def play(out: Out, result: Any) -> None:
    """The play's end: failed or ok, and an ok that rescued a failure says which (a check stopped
    by a GPU pod, say), so that it does not read as a check that ran and passed."""
    rescued = [o for o in result.tasks() if o.status == "rescued"]
    said = ""
    if rescued and not result.failed:
        first = rescued[0]
        said = f" ({len(rescued)} failure(s) rescued; the first: {first.name}" + (f": {first.msg}" if first.msg else "")
        said = (said[:300] + "...)") if len(said) > 300 else said + ")"
    out.file.write(clean(f"play {result.name!r}: ") + out.paint("failed" if result.failed else "ok") + clean(said)
                   + "\n")


def outcomes(out: Out, report: Any) -> None:
    """A sweep's outcome per node, and why the nodes it did not take were skipped."""
    out.title(f"run {report.run_id}" + (" (dry run)" if report.dry_run else ""))
    out.table(_OUTCOME_COLS, ([o.node, o.verdict, o.action, f"{o.seconds:.0f}", "; ".join(o.reasons)]
                              for o in report.outcomes), colour=[1])
    reasons: dict[str, int] = {}
    # the rolling queue takes nodes its first plan skipped (over the budget then): those were swept
    swept = {o.node for o in report.outcomes if o.action != "light"}
    for d in report.plan.skip:
        if d.node.name not in swept:
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
    if reasons:
        out.title("skipped: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))


_SWEEP_COLS = (Col("started"), Col("run"), Col("verdict"), Col("rule"), Col("playbook", wide=True),
               Col("profile", wide=True), Col("why", cut=True))
_FINDING_COLS = (Col("when"), Col("check"), Col("gpu"), Col("status"), Col("code"), Col("message", cut=True))
_ACTION_COLS = (Col("when"), Col("run", wide=True), Col("action"), Col("detail", cut=True))
_CLAIM_COLS = (Col("when"), Col("run", wide=True), Col("source"), Col("claim"), Col("test", wide=True),
               Col("outcome"), Col("evidence", cut=True))
_EVIDENCE_COLS = (Col("when"), Col("run"), Col("bytes"), Col("where"), Col("parts", cut=True))
_PAIR_COLS = (Col("when"), Col("run", wide=True), Col("partner"), Col("mode"), Col("busbw GB/s"), Col("status"),
              Col("detail", cut=True))


def pair_mode(p: dict[str, Any]) -> str:
    """sweep, or a re-pair with this node as the suspect or as the known-good partner."""
    if p["mode"] != "repair":
        return str(p["mode"])
    return "re-pair (suspect)" if p["role"] == "node" else "re-pair (known-good)"


def print_history(console: Any, h: dict[str, Any], window: str = "") -> None:
    """The history of one node as tables. `console`: an Out, or anything with a `file` (the demo's
    rich Console), which gets ISO times and whole cells. `window`: the --since read, as it was read
    (`7s`, `2d`), said when nothing falls in it."""
    o = console if isinstance(console, Out) else Out(fmt="wide", stream=getattr(console, "file", None))
    if not h["sweeps"] and not h["actions"]:
        o.write(f"no history for node {h['node']}" + (f" in the last {window}" if window else
                                                      " in this window" if h.get("pruned_days") else ""))
        return
    o.title(f"history of {h['node']}")
    o.table(_SWEEP_COLS, ([o.when(s["started"]), s["run_id"], s["verdict"] or "unfinished",
                           _rule(s.get("rules"), s["verdict"]),
                           s.get("playbook") or "", s.get("profile") or "",
                           "; ".join(s["reasons"]) if s["verdict"] != "pass" else ""] for s in h["sweeps"]),
            colour=[2])
    if h.get("pairs"):
        o.title("")
        o.title("pairs" + (f" (the latest 20 of {len(h['pairs'])})" if len(h["pairs"]) > 20 else ""))
        o.table(_PAIR_COLS, ([o.when(p["ts"]), p["run_id"], p["partner"], pair_mode(p),
                              "" if p["busbw"] is None else f"{p['busbw']:.1f}", p["status"], p["detail"]]
                             for p in h["pairs"][:20]), colour=[5])
    if h.get("claims"):  # other tools' conditions and taints, as Sweeper's checks found them
        o.title("")
        o.title("other tools' claims, tested" + (f" (the latest 20 of {len(h['claims'])})"
                                                 if len(h["claims"]) > 20 else ""))
        o.table(_CLAIM_COLS, ([o.when(c["ts"]), c["run_id"], c["source"], c["code"], c["test"], c["outcome"],
                               c["evidence"]] for c in h["claims"][:20]), colour=[5])
    if h.get("pruned_days"):
        days = h["pruned_days"]
        o.title(f"{sum(d['sweeps'] for d in days)} older sweeps over {len(days)} days were pruned "
                f"({days[0]['day']} to {days[-1]['day']}); their daily summaries are kept.")
    problems = [(s, p) for s in h["sweeps"] for p in s["problems"]]
    if problems:
        o.title("")
        o.title("findings" + (f" (the latest 30 of {len(problems)}; -o json has all)" if len(problems) > 30 else ""))
        o.table(_FINDING_COLS, ([o.when(s["started"]), p["name"], p["gpu"], p["status"], p["code"], p["message"]]
                                for s, p in problems[:30]), colour=[3])
    if h["actions"]:
        o.title("")
        o.title("actions" + (f" (the latest 20 of {len(h['actions'])})" if len(h["actions"]) > 20 else ""))
        o.table(_ACTION_COLS, ([o.when(a["ts"]), a["run_id"], a["action"] + (" (dry run)" if a["dry_run"] else ""),
                                a["detail"]] for a in h["actions"][:20]))
    if h.get("evidence"):
        o.title("")
        o.title("evidence kept (sweeper history NODE --evidence RUN writes one out)")
        o.table(_EVIDENCE_COLS, ([o.when(e["ts"]), e["run_id"], e["bytes"], e["where"],
                                  ", ".join(f"{f} {st}" for f, st in e["parts"].items())] for e in h["evidence"][:10]))
    if h["metrics"]:
        o.title("")
        o.title("metric trends (counts summed over GPUs, temperatures the hottest GPU's, thermal margins the "
                "nearest its limit; settings such as the PCIe link and the power limit have none)")
        rows = []
        for name, series in sorted(h["metrics"].items()):
            vals = [v for _, v in series][-30:]
            rows.append([name, sparkline(vals), f"{vals[-1]:g}"])
        o.table((Col("metric"), Col("trend"), Col("last")), rows)


_CHECK_COLS = (Col("check"), Col("gpu"), Col("status"), Col("severity", wide=True), Col("code"),
               Col("message", cut=True))


def result_document(out: Out, title: str, result: Any) -> None:
    """A result document as `check` and `ingest` print it: the document itself for `-o json`
    (result.to_json(), the contract's bytes), its dict for yaml, else its checks as a table."""
    if out.fmt == "json":
        click.echo(result.to_json())
    elif out.structured:
        out.document(result.to_dict())
    else:
        checks(out, title, result)


def checks(out: Out, title: str, result: Any) -> None:
    """A result document's checks (`check`, `ingest`)."""
    out.title(title)
    out.table(_CHECK_COLS, ([c.name, c.gpu, c.status, c.severity, c.code, c.message] for c in result.checks),
              colour=[2])


def breaker_line(b: dict[str, Any]) -> tuple[str, str]:
    """The breaker's state in a word, and the rest of its line."""
    if b.get("state") == "open":
        return "open", f" since {iso(b['opened_at'])}: {b.get('reason', '')}"
    return "closed", (f" (reset by {b.get('closed_by')} at {iso(b['closed_at'])})" if b.get("closed_at") else "")



def controls(out: Out, b: dict[str, Any], pause: dict[str, Any] | None) -> None:
    """The breaker and the pause switch (a person's words: text, never markup)."""
    word, rest = breaker_line(b)
    out.file.write(out.paint(word) + clean(rest) + "\n")
    if pause:
        out.file.write(out.paint("paused") + clean(f" by {pause.get('by', '?')} at {iso(pause['ts'])}: "
                                                   f"{pause.get('reason', '')}") + "\n")


def plan(out: Out, view: Any) -> None:
    """Which nodes a sweep would take now (sweeper.views.PlanView), and why not the others."""
    doc = view.doc
    for line in (doc["paused"], doc["breaker"]):
        if line:
            out.write(line, "warn")  # a person's words: text, never markup
    out.title(f"{doc['gpu_nodes']} GPU nodes found ({doc['found_by']})")
    if not doc["gpu_nodes"]:
        out.write(f"No node of the {view.listed} listed has one of these resources in status.capacity. Is the GPU "
                  "device plugin running on the GPU nodes? Set gpu_resources / gpu_resource_prefixes for "
                  "another resource name" + (", or check gpu_node_selector." if view.selector else "."))
        return
    for note in doc["notes"]:
        out.write(note)
    out.title(f"{doc['gpu_nodes']} GPU nodes, {doc['held']} held, budget {doc['budget']}")
    paired = view.paired
    deep = any(r.get("depth") for r in doc["nodes"])  # a depth ladder: each node's depth and why
    cols = (Col("node"), Col("take"), *((Col("partner"),) if paired else ()), Col("reason"),
            *((Col("depth"),) if deep else ()), Col("detail", cut=True))
    out.table(cols, ([r["node"], "yes" if r["take"] else "no", *((r["partner"] or "-",) if paired else ()),
                      r["reason"], *((r.get("depth") or "-",) if deep else ()),
                      r["detail"] + (f"; depth {r['why']}" if deep and r.get("why") else "")]
                     for r in sorted(doc["nodes"], key=lambda r: (not r["take"], r["node"]))), colour=[1])
    gate = doc.get("gate") or {}
    if gate.get("nodes"):  # the gate's queue: new nodes (and nodes back from a reboot) not yet handed to work
        out.title(f"{len(gate['nodes'])} gated node(s) ({gate['taint']}), gate budget {gate['budget']}")
        out.table((Col("node"), Col("take"), Col("reason"), Col("detail", cut=True)),
                  ([r["node"], "yes" if r["take"] else "no", r["reason"], r["detail"]] for r in gate["nodes"]),
                  colour=[1])


def _rule(rules: list[str] | None, verdict: str | None) -> str:
    """The rule behind a verdict as every table names it: the policy's named rules, or `findings`
    when the check's own findings decided (the report's node page says the same)."""
    return ", ".join(rules or []) or ("findings" if verdict not in ("pass", None, "") else "")


def nodes(out: Out, rows: list[dict[str, Any]], now: float, source: str = "", in_cluster: bool = True) -> None:
    """The fleet (sweeper.views.fleet_rows): one row per GPU node, led by its cluster where the rows
    carry one (`--cluster all`). `source`: where the rows came from, when not from this history and
    the cluster."""
    every = any("cluster" in r for r in rows)
    out.title(f"{len(rows)} GPU nodes" + (f" in {len({r['cluster'] for r in rows})} clusters" if every else "")
              + (f" (from {source})" if source else ""))
    out.table(((Col("cluster"),) if every else ()) + (Col("node"), Col("profile"), Col("last sweep"), Col("verdict"), Col("rule"), Col("due"),
               Col("overdue", wide=True), Col("in cluster", wide=True), Col("suspect", cut=True), Col("held")),
              ([*([r["cluster"]] if every else []), r["node"], r["profile"] or "-", out.when(r["last_sweep"], "never"), r["verdict"] or "-",
                _rule(r["rules"], r["verdict"]) if r["verdict"] else "-", "now" if r["due"] is not None and r["due"] <= now else out.when(r["due"]),
                "yes" if r["overdue"] else "no", ("yes" if r["in_cluster"] else "no") if in_cluster else "-",
                r["suspect"], "held" if r["held"] else ""] for r in rows),
              colour=[4, 10] if every else [3, 9])


def profiles(out: Out, rows: list[dict[str, Any]], nodes: list[dict[str, str]]) -> None:
    """The hardware profiles, and which one each GPU node gets."""

    def opt(value: Any, fmt: str = "{}") -> str:
        return "-" if value is None else fmt.format(value)

    out.title("profiles")
    out.table((Col("profile"), Col("GPUs"), Col("NVLinks"), Col("PCIe"), Col("fabric"), Col("MTU"),
               Col("NCCL floor GB/s"), Col("instance types", cut=True)),
              ([r["profile"], f"{r['gpus']} x {r['gpu_model'] or 'any'}", opt(r["nvlinks"]),
                " ".join(x for x in (opt(r["pcie_gen"], "gen{}"), opt(r["pcie_width"], "x{}")) if x != "-") or "-",
                "-" if r["nic"] == "none" else f"{opt(r['nics'])} x {r['nic']}"
                + ("" if r["nic_rate_gbps"] is None else f" {r['nic_rate_gbps']:g} Gb/s"),
                opt(r["mtu"]), opt(r["nccl_busbw_min"], "{:g}"), ", ".join(r["instance_types"]) or "-"]
               for r in rows))
    if nodes:
        out.title("")
        out.title("nodes")
        out.table((Col("node"), Col("instance type"), Col("profile")),
                  ([n["node"], n["instance_type"], n["profile"]] for n in nodes))


def backtest(out: Out, bt: Any) -> None:
    """A replay under another policy next to what happened: first holds per node, pairs, counts."""
    rec, rep = bt.first_holds("recorded"), bt.first_holds("replayed")
    out.title(f"policy {bt.policy} on {len(bt.decisions)} recorded sweeps: "
              f"{sum(d.differs for d in bt.decisions)} decisions differ")
    rows = []
    every = any(d.cluster is not None for d in bt.decisions)
    for node in sorted(set(rec) | set(rep)):
        a, b = rep.get(node), rec.get(node)
        rows.append([node, a.replayed if a else "never held", out.when(a.at if a else None, ""),
                     ", ".join(a.rules) if a else "", b.recorded if b else "never held",
                     out.when(b.at if b else None, "")])
    out.table((Col("cluster/node" if every else "node"), Col("would have"), Col("when"), Col("rule"), Col("actually"),
               Col("when")), rows, colour=[1, 4])
    pairs = bt.pair_changes()
    if pairs:
        out.title(f"{len(pairs)} decisions on pairs differ")
        out.table((Col("node"), Col("when"), Col("partner"), Col("mode"), Col("would have"), Col("rule"),
                   Col("actually")),
                  [[d.key, out.when(d.at, ""), d.partner or "", d.mode or "", d.replayed, ", ".join(d.rules),
                    d.recorded] for d in pairs], colour=[4, 6])
    for which in ("recorded", "replayed"):
        c = bt.counts(which)
        out.title(f"{which}: " + ", ".join(f"{n} {v}" for v, n in sorted(c.items())))


def released(out: Out, rows: list[dict[str, Any]], dry_run: bool) -> None:
    out.title("released" if not dry_run else "would release")
    out.table((Col("node"), Col("action"), Col("detail", cut=True)), ([r["node"], r["action"], r["detail"]]
                                                                        for r in rows))
