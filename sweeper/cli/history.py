"""Commands that read or keep the history: nodes, history, report, backtest, state prune."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from sweeper.cli import printer
from sweeper.cli.app import main
from sweeper.cli.options import (
    cluster_choice,
    cluster_options,
    config_for,
    examples,
    history_at,
    kube_for,
    need_state,
    no_local_history,
    output_options,
    reads_the_cluster,
    run_cli,
    scoped,
    shown,
    since_cutoff,
    since_window,
    state_options,
    stderr_out,
)
from sweeper.clock import iso
from sweeper.errors import ConfigError, KubeError, SweeperError
from sweeper.files import write_atomic
from sweeper.output import Out, iso_times


@main.command("nodes", epilog=examples("sweeper nodes", "sweeper nodes --offline -o wide",
                                       "sweeper nodes --no-headers | grep held",
                                       "sweeper nodes --state postgresql://sweeper@db/sweeper --cluster all"))
@cluster_options
@cluster_choice
@click.option("--offline", is_flag=True, help="From the history alone, without asking the cluster.")
@output_options
@run_cli
@reads_the_cluster
def nodes_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str,
              cluster: str | None, offline: bool, out: Out) -> None:
    """The fleet as a table: each GPU node's last sweep and verdict, when it is due, whether it is a
    suspect and whether Sweeper holds it.

    With no local history for the kubeconfig context (no --state, no SWEEPER_STATE), the history
    the cluster's `sweeper serve` keeps, read through the API server; when that cannot be read,
    what the nodes' labels and annotations say of their last sweep. It says which, in its title
    (and `source` in -o json). A --state (or SWEEPER_STATE, or the config's `state`) that names no
    history is exit 2, as for `history` and `report`; so is --offline with none. With every
    cluster of a shared history (`--cluster all`), each row names its cluster; only the cluster
    this kubeconfig reaches is asked for its nodes.
    """
    from sweeper.views import cluster_fleet_rows, fleet_node_rows, fleet_rows

    cfg = config_for(config_path)
    now = time.time()
    source = ""  # where the rows came from, when not from this history and the cluster
    if not offline and no_local_history(state):
        read = cluster_fleet_rows(kube_for(kubeconfig, context, cfg, once=True), cfg, now)
        rows, source = read.value, read.source
        _said(read, state)
    else:
        need_state(state)  # a --state, SWEEPER_STATE or config `state` that names no history is a typo, not a fleet never swept
        hist, every = scoped(history_at(state, create=False, cluster=cfg.cluster_name), cluster, cfg)
        kube = None if offline else kube_for(kubeconfig, context, cfg)
        try:
            if every and (cluster is not None or len(hist.clusters()) > 1):
                rows = fleet_node_rows(hist, cfg, kube, now)
            else:
                rows = fleet_rows(hist, cfg, kube, now)
        except KubeError as exc:  # the history is here: it can be read without the cluster
            raise KubeError(f"{exc}; `sweeper nodes --offline` shows the history at {shown(state)} alone",
                            exc.status, exc.reason) from exc
        source = f"the history at {shown(state)}" + (" alone" if offline else " and the cluster")
    if out.structured:
        out.document(iso_times({"nodes": rows, "source": source}))
    else:
        printer.nodes(out, rows, now, source, in_cluster=not offline)


def _said(read: Any, state: str) -> None:
    """Where a reading command read from, on stderr; and why not the cluster's history, when not."""
    if read.why:
        stderr_out().write(f"no history at {shown(state)}, and the cluster's Sweeper could not be read ({read.why}); "
                           f"showing {read.source}", "warn")
    else:
        stderr_out().write(f"no history at {shown(state)}: read from {read.source}")


@main.command(epilog=examples("sweeper history gpu-p5-04", "sweeper history gpu-p5-04 --since 7d --check ecc -o wide",
                              "sweeper history gpu-p5-04 -o json | jq '.sweeps[0]'",
                              "sweeper history gpu-p5-04 --evidence 20260301-0200-ab12 --to gpu-p5-04.tar.gz",
                              "sweeper history gpu-p5-04 --evidence 20260301-0200-ab12 --to - | tar tzf -"))
@click.argument("node")
@cluster_options
@cluster_choice
@click.option("--since", help="Only what happened within this long (e.g. 7d, 12h, 30m; a number alone is seconds).")
@click.option("--check", "check", default="", help="Only findings and metrics whose name starts with this "
              "(e.g. ecc, nvlink, xid, nccl).")
@click.option("--evidence", "evidence_run", metavar="RUN",
              help="Write the node's evidence bundle of run RUN (a tar.gz, written whole, never extracted).")
@click.option("--to", "to", type=click.Path(dir_okay=False, allow_dash=True),
              help="Where --evidence writes ('-' for stdout; default evidence-NODE-RUN.tar.gz).")
@click.option("--force", is_flag=True, help="Let --evidence overwrite an existing file.")
@output_options
@run_cli
@reads_the_cluster
def history(node: str, config_path: str | None, kubeconfig: str | None, context: str | None, state: str,
            cluster: str | None, since: str | None, check: str, evidence_run: str | None, to: str | None,
            force: bool, out: Out) -> None:
    """A node's sweeps, verdicts and the rules behind them, pair runs (partner, mode, bus
    bandwidth), failed checks, actions and metric trends (sparklines). A node the history has
    never seen is exit 2.

    With no local history for the kubeconfig context (no --state, no SWEEPER_STATE), the history
    the cluster's `sweeper serve` keeps, read through the API server; when that cannot be read,
    what the node's labels and annotations say of its last sweep. It says which. In a history several
    clusters share, a node is its cluster's: a name recorded in more than one cluster read needs
    --cluster.

    The runs that kept the node's evidence (held for reboot, replacement or a person) are listed;
    --evidence RUN writes that bundle out, from the local history (or S3 where it went there),
    even after the node itself is gone.
    """
    if evidence_run is not None:
        return _write_evidence(node, evidence_run, to, force, config_path, state)
    if to is not None or force:
        raise ConfigError("--to and --force go with --evidence RUN")
    if no_local_history(state):
        from sweeper.views import cluster_node_history

        cfg = config_for(config_path)
        cutoff = since_cutoff(since)
        read = cluster_node_history(kube_for(kubeconfig, context, cfg, once=True), cfg, node,
                                    None if cutoff is None else time.time() - cutoff, check)
        _said(read, state)
        h, known, where = read.value, read.value.pop("known", True), read.source
    else:
        need_state(state)
        hist = _one_node_cluster(scoped(history_at(state), cluster, config_for(config_path))[0], node, "")
        h = hist.node_history(node, since_cutoff(since), check=check)
        known, where = hist.knows(node), f"the history at {shown(state)}"
        if hist.scope is not None and cluster is not None:
            h["cluster"] = hist.scope
        h.pop("known", None)
        h["evidence"] = hist.evidence_runs(node)
    if not (h["sweeps"] or h["actions"] or h["pruned_days"]) and not known:
        raise ConfigError(f"no node {node!r} in {where} (`sweeper nodes` lists the nodes it knows)")
    h.pop("generated", None)
    if out.structured:
        out.document(iso_times(h))
    else:
        printer.print_history(out, h, since_window(since))


def _write_evidence(node: str, run_id: str, to: str | None, force: bool, config_path: str | None, state: str) -> None:
    """The bundle as one file (never over an existing one unless --force; never through a symlink),
    or on stdout."""
    import re

    from sweeper.views import evidence_bundle

    need_state(state)
    data = evidence_bundle(history_at(state, create=False), config_for(config_path), node, run_id)
    if to == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    path = to or re.sub(r"[^A-Za-z0-9._-]", "_", f"evidence-{node}-{run_id}.tar.gz")
    try:
        write_atomic(path, data, overwrite=force, mode=0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists: --force to overwrite it") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    stderr_out().write(f"{len(data)} bytes of evidence of {node} (run {run_id}) written to {path}")


@main.command("report", epilog=examples("sweeper report", "sweeper report --since 7d -o /tmp/fleet.html",
                                        "sweeper report --node gpu-p5-06 -o gpu-p5-06.html --offline",
                                        "sweeper report --state postgresql://sweeper@db/sweeper --cluster all -o fleet.html"))
@cluster_options
@cluster_choice
@click.option("--since", default="30d", show_default=True, help="How far back the report looks.")
@click.option("--policy", "policy_name", help="Policy whose trend rules the report charts (default: the config's).")
@click.option("-o", "--output", default="sweeper-report.html", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the HTML file ('-' for stdout). Here -o names a file, not a format: an output "
              "format's name (json, yaml, table, wide) is refused; ./json writes a file of that name.")
@click.option("--node", "node", help="Write this node's page alone: its sweeps, findings, actions and metrics "
              "per GPU.")
@click.option("--offline", is_flag=True, help="Do not ask the cluster for its GPU nodes: use the last run's plan.")
@run_cli
@reads_the_cluster
def report_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str,
               cluster: str | None, since: str, policy_name: str | None, output: str, node: str | None,
               offline: bool) -> None:
    """The fleet at a glance as one self-contained HTML file (opens with no network): coverage of
    every GPU node per profile, every sweep on a time axis, the nodes held and why, nodes replaced,
    trends behind decisions, per-profile NCCL bandwidth, and a page per node.

    GPU nodes come from the cluster when it answers, else from the last run's recorded plan. With
    no local history for the kubeconfig context (no --state, no SWEEPER_STATE), the report the
    cluster's `sweeper serve` draws from its history, read through the API server.

    `--cluster all`: the fleet page over every cluster of a shared history (nodes, held, failures
    per node-day, last run, trend) at -o, and each cluster's report beside it (`<name>-<cluster>.html`).
    """
    from sweeper.output import FORMATS
    from sweeper.report import cluster_gpu_nodes
    from sweeper.views import policy_for, report_page

    if output in FORMATS:  # every other command's -o is a format: `report -o json` would write HTML to ./json
        raise ConfigError(f"-o {output}: the report's -o names the HTML file it writes, and the report has no "
                          f"{output} form (`sweeper nodes --json` and `sweeper history NODE --json` print the "
                          f"history as JSON); for a file named {output}, give -o ./{output}")

    if no_local_history(state) and not offline:
        from sweeper.remote import RemoteHistory

        cfg = config_for(config_path)
        reader = RemoteHistory(kube_for(kubeconfig, context, cfg, once=True), cfg.namespace)
        cutoff = since_cutoff(since) or 0.0
        stderr_out().write(f"no history at {shown(state)}: the report of {reader.where}")
        _write_page(reader.report(time.time() - cutoff, node), output, None)
        return
    need_state(state)
    cfg = config_for(config_path)
    gpu, source = None, ""
    if not offline and node is None:
        try:
            kube = kube_for(kubeconfig, context, cfg, once=True)  # no waiting on a cluster that is not there
            gpu, source = cluster_gpu_nodes(kube, cfg), "the cluster"
        except SweeperError as exc:
            stderr_out().write(f"GPU nodes from the last run's plan: the cluster did not answer ({exc})")
    hist, every = scoped(history_at(state, cluster=cfg.cluster_name), cluster, cfg)
    if every and (cluster is not None or len(hist.clusters()) > 1) and node is None:
        _write_fleet(hist, cfg, policy_for(cfg, policy_name), since_cutoff(since) or 0.0, output,
                     None if gpu is None else (hist.cluster, gpu, source))
        return
    if node is not None:
        hist = _one_node_cluster(hist, node, "--node: ")
        if not hist.node_history(node)["sweeps"]:
            raise ConfigError(f"--node: no sweep of {node!r} in {shown(state)}")
    page, pages = report_page(hist, cfg, policy_for(cfg, policy_name), since_cutoff(since) or 0.0, gpu=gpu,
                              source=source, node=node)
    _write_page(page, output, pages)


def _one_node_cluster(hist: Any, node: str, what: str) -> Any:
    """The history read as the node's one cluster, where every cluster is read: a name recorded in
    several clusters is several nodes, and the reader must say which."""
    if hist.scope is not None:
        return hist
    clusters = hist.node_clusters(node)
    if len(clusters) > 1:
        raise ConfigError(f"{what}{node!r} is recorded in clusters {', '.join(clusters)}: name one with --cluster")
    return hist.for_cluster(clusters[0]) if clusters else hist


def _write_fleet(hist: Any, cfg: Any, policy: Any, since: float, output: str, gpu: Any) -> None:
    """The fleet page at `output`, each cluster's report beside it."""
    from sweeper.views import fleet_report

    if output == "-":
        raise ConfigError("--cluster all writes a page per cluster beside the fleet page: name a file with -o")
    path = Path(output)
    fleet, pages = fleet_report(hist, cfg, policy, since, path.stem, gpu)
    for name, page in pages.items():
        _write_page(page, str(path.with_name(name)), None)
    _write_page(fleet, output, None)


def _write_page(page: str, output: str, pages: int | None) -> None:
    if output == "-":
        click.echo(page, nl=False)
        return
    try:
        write_atomic(output, page)  # a symlink planted at `output` is replaced, never written through
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc}") from exc
    stderr_out().write(f"wrote {output} ({len(page) / 1024:.0f} KiB"
                       + (f", {pages} node page(s))" if pages is not None else ")"))


@main.command("backtest", epilog=examples("sweeper backtest --policy default",
                                          "sweeper backtest --policy ./my-policy.yaml --since 30d -o json"))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
              help="Sweeper config YAML (default: $SWEEPER_CONFIG).")
@state_options
@cluster_choice
@click.option("--policy", "policy_name", required=True, help="The policy to try: a file, or a name in policies/ (`default` or `default.yaml`).")
@click.option("--since", default="90d", show_default=True, help="How much history to replay.")
@output_options
@run_cli
def backtest_cmd(config_path: str | None, state: str, cluster: str | None, policy_name: str, since: str,
                 out: Out) -> None:
    """Replay the recorded history under another policy: which nodes it would have held, rebooted
    or replaced, and when, next to what actually happened. Changes nothing. `--cluster all`
    replays each cluster of a shared history on its own rows, naming each node `cluster/node`."""
    from sweeper.backtest import backtest, backtest_fleet
    from sweeper.views import policy_for

    need_state(state)
    cfg = config_for(config_path)
    hist, every = scoped(history_at(state, cluster=cfg.cluster_name), cluster, cfg)
    replay = backtest_fleet if every and (cluster is not None or len(hist.clusters()) > 1) else backtest
    bt = replay(hist, policy_for(cfg, policy_name), since_cutoff(since) or 0.0)
    if out.structured:
        out.document(iso_times(bt.to_dict()))
    else:
        printer.backtest(out, bt)


@main.group("state")
def state_group() -> None:
    """The history database: retention."""


@state_group.command("prune", epilog=examples("sweeper state prune --older-than 180d --dry-run",
                                              "sweeper state prune --older-than 180d"))
@state_options
@click.option("--older-than", required=True, help="Delete sweeps older than this (e.g. 180d); a daily summary "
              "per node is kept.")
@click.option("--dry-run", is_flag=True, help="Count what would go, delete nothing.")
@output_options
@run_cli
def state_prune(state: str, older_than: str, dry_run: bool, out: Out) -> None:
    """Delete old sweeps, checks, metrics, actions and intents, keeping one summary row per node
    per day (sweeps, verdict counts, min/max/last of each metric)."""
    need_state(state)
    before = since_cutoff(older_than)
    assert before is not None
    counts = history_at(state).prune(before, dry_run=dry_run)
    if out.structured:
        out.document(iso_times({"dry_run": dry_run, "before": before, **counts}))
        return
    verb = "would delete" if dry_run else "deleted"
    out.write(f"{verb} {counts['node_sweeps']} sweeps, {counts['checks']} checks, {counts['metrics']} metrics "
              f"older than {iso(before)}; {counts['summaries']} daily summaries kept")
