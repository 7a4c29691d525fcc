"""Commands that sweep or steer sweeping: sweep, plan, serve, release, pause, resume, breaker."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import click

from sweeper.cli import printer
from sweeper.cli.app import main
from sweeper.cli.options import (
    cluster_options,
    config_for,
    examples,
    history_at,
    history_exists,
    kube_for,
    output_options,
    run_cli,
    stderr_out,
)
from sweeper.clock import iso
from sweeper.output import Out, iso_times


@main.command(epilog=examples("sweeper sweep --config config.yaml", "sweeper sweep --dry-run",
                              "sweeper sweep --max-nodes 1 -o json"))
@cluster_options
@click.option("--dry-run", is_flag=True, help="Decide everything, write nothing to the cluster (nor create a "
              "history file).")
@click.option("--max-nodes", type=int, help="Override max_nodes for this run.")
@output_options
@run_cli
def sweep(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, dry_run: bool,
          max_nodes: int | None, out: Out) -> None:
    """One rolling pass over the cluster's GPU nodes (the CronJob's command)."""
    from sweeper.errors import Interrupted, ToolErrors
    from sweeper.sweep import Sweep

    cfg = config_for(config_path, max_nodes=max_nodes)
    sw = Sweep(kube_for(kubeconfig, context, cfg), cfg, history_at(state, create=not dry_run, cluster=cfg.cluster_name),
               emit=None if out.structured else printer.progress(stderr_out()), dry_run=dry_run)
    interrupted = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: sw.stop.set())
    # Ctrl-C stops the run as SIGTERM does (every node handed back, the run recorded and reported),
    # then the exit code says so
    def on_interrupt(*_: Any) -> None:
        interrupted.set()
        sw.stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C does not wait for the hand-back

    signal.signal(signal.SIGINT, on_interrupt)
    report = sw.run()
    if cfg.pushgateway_url and not dry_run:
        try:
            _push(sw, report, cfg.pushgateway_url)
        except OSError as exc:  # the sweep happened; a lost push is reported, not fatal
            stderr_out().write(f"could not push metrics to {cfg.pushgateway_url}: {exc}", "warn")
    if out.fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    elif out.structured:
        out.document(report.to_dict())
    else:
        printer.outcomes(out, report)
    if interrupted.is_set():  # before the tool stop: what ended the run was Ctrl-C
        raise Interrupted("interrupted (Ctrl-C): the run stopped and handed back every node it held"
                          + (f"; before that: {report.tool_stop}" if report.tool_stop else ""))
    if report.tool_stop:
        raise ToolErrors(report.tool_stop)  # exit 5: the check is broken, not the nodes


def _push(sw: Any, report: Any, url: str) -> None:
    """The run's figures to a Prometheus Pushgateway (a CronJob is gone before a scrape)."""
    from sweeper.metrics import Metrics

    metrics = Metrics()
    sw.observe(metrics, report)
    metrics.push(url)


@main.command("plan", epilog=examples("sweeper plan", "sweeper plan --config config.yaml -o wide",
                                      "sweeper plan -o json | jq '.nodes[] | select(.take)'"))
@cluster_options
@output_options
@run_cli
def plan_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, out: Out) -> None:
    """Which nodes a sweep would take now, and why every other GPU node is skipped; and the gate's
    queue: the nodes carrying gate_taint, each taken, waiting or held with its reason. Changes
    nothing (not even the history file: a missing one is not created)."""
    from sweeper.views import plan_view

    cfg = config_for(config_path)
    view = plan_view(kube_for(kubeconfig, context, cfg), cfg, history_at(state, create=False, cluster=cfg.cluster_name))
    if out.fmt == "json":
        click.echo(json.dumps(view.doc, indent=2))
    elif out.structured:
        out.document(view.doc)
    else:
        printer.plan(out, view)


@main.command("serve", epilog=examples(
    "sweeper serve                      # the config's playbook every 30 minutes, on 127.0.0.1:8080",
    "sweeper serve --config config.yaml --address 0.0.0.0 --port 8080   # in a pod"))
@cluster_options
@click.option("--port", default=8080, show_default=True, type=int,
              help="HTTP port for /metrics, /healthz, / and the read-only /api/v1/.")
@click.option("--address", "--host", "address", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 in a pod, so Prometheus and the kubelet's probes reach it).")
@run_cli
def serve_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, port: int,
              address: str) -> None:
    """Sweep on the config's schedules (APScheduler cron triggers; the same Lease as the CronJob, so
    runs never overlap) and serve /metrics, /healthz, the live fleet report on /, and the history
    read-only as JSON under /api/v1/ (what `nodes`, `history` and `report` read through the API
    server from a laptop). Without `schedules` in the config (or without a config), the config's
    playbook runs every 30 minutes, as the CronJob does. SIGTERM stops the running sweep, which
    hands its nodes back, and exits 0."""
    from sweeper.schedules import with_default_schedule
    from sweeper.serve import serve

    err = stderr_out()
    cfg, note = with_default_schedule(config_for(config_path))
    if note:
        err.write(note)
    kube = kube_for(kubeconfig, context, cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serve(cfg, kube, history_at(state, cluster=cfg.cluster_name), port, address, lambda m: err.write(f"{iso(time.time())} {m}"), stop)


@main.command("release", epilog=examples(
    "sweeper release --all --reason 'stopping the rollout' --dry-run",
    "sweeper release gpu-p5-04 --reason 'the job owner needs it back today'",
    "sweeper release gpu-p5-04 --false-positive --reason 'XID 79 was a driver bug, fixed in 570.133'"))
@click.argument("nodes", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every node Sweeper holds.")
@click.option("--reason", required=True, help="Why (recorded in the history when there is one, and on the node).")
@click.option("--false-positive", is_flag=True,
              help="Say the verdicts were wrong: the next run dismisses the findings that held each node (they "
                   "warn, and never hold it again; kept as dismissed.NODE in the control ConfigMap, whose key a "
                   "person deletes to undo it). Without it a node released after a failing verdict is a suspect: "
                   "the next sweep checks it first, and the same findings hold it again.")
@click.option("--dry-run", is_flag=True, help="Say what would be released; change nothing.")
@cluster_options
@output_options
@run_cli
def release_cmd(nodes: tuple[str, ...], everything: bool, reason: str, false_positive: bool, dry_run: bool,
                config_path: str | None, kubeconfig: str | None, context: str | None, state: str, out: Out) -> None:
    """The panic button: hand back every node Sweeper holds (or those named): untaint, undo
    its cordons, delete its Jobs. Works from the cluster alone when the history is lost (each
    node carries the release on it, so no sweeper takes it for a dismissal). A release is no
    judgement: the next sweep checks the node again, unless --false-positive says otherwise."""
    from sweeper.clock import WallClock
    from sweeper.errors import StateError
    from sweeper.release import release

    cfg = config_for(config_path)
    kube = kube_for(kubeconfig, context, cfg)
    recorder = None
    if history_exists(state):
        try:
            recorder = history_at(state, cluster=cfg.cluster_name)
        except StateError as exc:
            stderr_out().write(f"history unavailable ({exc}); releasing from the cluster alone", "warn")
    rows = release(kube, cfg, list(nodes), everything, reason, WallClock(), recorder, dry_run, false_positive,
                   by=_who())
    if out.fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    elif out.structured:
        out.document(rows)
    else:
        printer.released(out, rows, dry_run)


# -- the switches: breaker and pause -------------------------------------------------------
def _who() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _controls(config_path: str | None, kubeconfig: str | None, context: str | None) -> Any:
    """The control ConfigMap of the cluster the kubeconfig names."""
    from sweeper.control import Controls

    cfg = config_for(config_path)
    return Controls(kube_for(kubeconfig, context, cfg), cfg.namespace, cfg.control_name)


def _note(state: str, action: str, detail: str, now: float) -> None:
    """Record a person's switch in the local history, where there is one (a run records what it
    sees in its own history)."""
    if history_exists(state):
        history_at(state).action("manual", "*", now, action, detail)


@main.group()
def breaker() -> None:
    """The circuit breaker: it opens when too many nodes fail within a window (a systemic fault
    is not a node fault), stops all sweeping, and stays open until a person resets it."""


@breaker.command("status", epilog=examples("sweeper breaker status", "sweeper breaker status -o json"))
@cluster_options
@output_options
@run_cli
def breaker_status(config_path: str | None, kubeconfig: str | None, context: str | None, state: str,
                   out: Out) -> None:
    """Whether the breaker is open, since when and why; and whether sweeping is paused."""
    switches = _controls(config_path, kubeconfig, context).all()
    b = switches.get("breaker") or {"state": "closed"}
    if out.structured:
        out.document(iso_times({**b, "paused": switches.get("pause")}))
    else:
        printer.controls(out, b, switches.get("pause"))


@breaker.command("reset", epilog=examples("sweeper breaker reset --reason 'bad driver rolled back'"))
@click.option("--reason", required=True, help="Why it is safe to sweep again (recorded).")
@cluster_options
@run_cli
def breaker_reset(reason: str, config_path: str | None, kubeconfig: str | None, context: str | None,
                  state: str) -> None:
    """Close the breaker; sweeps take one node at a time for the cooldown that follows."""
    controls = _controls(config_path, kubeconfig, context)
    now = time.time()
    b = {k: v for k, v in (controls.get("breaker") or {}).items() if k != "ts"}
    controls.set("breaker", {**b, "state": "closed", "closed_at": now, "closed_by": _who(), "close_reason": reason},
                 now)
    _note(state, "breaker-reset", f"{_who()}: {reason}", now)
    click.echo("breaker closed")


@main.command(epilog=examples("sweeper pause --reason 'driver rollout'",
                              "sweeper pause --reason 'maintenance window' --context prod"))
@click.option("--reason", required=True, help="Why (recorded and shown by plan).")
@cluster_options
@run_cli
def pause(reason: str, config_path: str | None, kubeconfig: str | None, context: str | None, state: str) -> None:
    """Stop sweeps from taking nodes until `sweeper resume` (held nodes stay held). The switch
    lives in the cluster: it stops every sweeper that uses the same cluster."""
    now = time.time()
    _controls(config_path, kubeconfig, context).set("pause", {"by": _who(), "reason": reason}, now)
    _note(state, "pause", f"{_who()}: {reason}", now)
    click.echo("sweeping paused")


@main.command(epilog=examples("sweeper resume"))
@cluster_options
@run_cli
def resume(config_path: str | None, kubeconfig: str | None, context: str | None, state: str) -> None:
    """Undo `sweeper pause`."""
    now = time.time()
    _controls(config_path, kubeconfig, context).set("pause", None, now)
    _note(state, "resume", _who(), now)
    click.echo("sweeping resumed")
