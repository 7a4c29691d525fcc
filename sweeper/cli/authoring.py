"""Commands for the people who write checks and playbooks: run, lint, check, profiles."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sweeper.cli import printer
from sweeper.cli.app import main
from sweeper.cli.options import (
    cluster_options,
    config_for,
    examples,
    kube_for,
    output_options,
    run_cli,
    stderr_out,
    stopped_by_sigterm,
)
from sweeper.errors import ConfigError
from sweeper.output import Out, clean, clean_lines


@main.command("run", epilog=examples(
    "sweeper run sweep-dcgm.yaml --node gpu-p5-04",
    "sweeper run quarantine-deep.yaml --node gpu-p5-04 -e dcgm_level=4",
    "sweeper run sweep-light.yaml --node gpu-p5-04 --json",
    "sweeper run pair-fabric.yaml --node gpu-p5-04 --partner gpu-p5-05"))
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--node", help="Target node (node actions need one).")
@click.option("--partner", help="The second node of a pair playbook (`pair: true`); --node is the first.")
@click.option("-e", "--extra-vars", "extra", multiple=True, metavar="KEY=VALUE|@FILE",
              help="Variables that override the playbook's (repeatable; values are YAML).")
@click.option("--tags", help="Run only tasks with these tags (comma-separated).")
@click.option("--skip-tags", help="Skip tasks with these tags (comma-separated).")
@cluster_options
@click.option("--no-hand-back", "keep", is_flag=True,
              help="Leave what the play tainted or cordoned on the node even without a holding verdict "
                   "(a maintenance playbook that means to keep the node out).")
@click.option("--json", "as_json", is_flag=True, help="Print the per-task outcomes as JSON on stdout.")
@click.option("--playbook-dir", type=click.Path(file_okay=False),
              help="The author's playbooks, looked up before the shipped ones (overrides the config's playbook_dir).")
@run_cli
def run_cmd(playbook: str, node: str | None, partner: str | None, extra: tuple[str, ...], tags: str | None,
            skip_tags: str | None, keep: bool, config_path: str | None, kubeconfig: str | None, context: str | None, state: str,
            as_json: bool, playbook_dir: str | None) -> None:
    """Run one playbook, on one node (--node) or with no target (pure actions only).

    What the play tainted or cordoned itself is handed back when it ends without a holding
    verdict (reboot, replace, quarantine): on failure, on SIGTERM, on an undefined variable.
    A pair playbook (`pair: true`) runs on --node and --partner together; it neither holds nor
    hands back either node (run it on nodes that are idle, or that Sweeper holds).
    Exit 0 when the play succeeds (a rescued failure counts as success), 1 when it fails,
    2 when the playbook or its variables are invalid.
    """
    from sweeper.runner import extra_vars, run_playbook

    cfg = config_for(config_path).with_overrides(playbook_dir=playbook_dir)
    path = Path(playbook)
    if not path.exists() and cfg.playbook_file(playbook).exists():
        path = cfg.playbook_file(playbook)
    kube = kube_for(kubeconfig, context, cfg) if node else None

    err = stderr_out()
    with stopped_by_sigterm() as stop:  # stop between tasks, run `always`, hand the node back
        result = run_playbook(path, cfg, kube=kube, node_name=node, partner_name=partner,
                              extra_vars=extra_vars(extra),
                              tags=tuple(t for t in (tags or "").split(",") if t),
                              skip_tags=tuple(t for t in (skip_tags or "").split(",") if t),
                              state=state if node else None,
                              on_task=(lambda o: None) if as_json else lambda o: printer.task(err, o),
                              cancelled=stop.is_set, log=lambda msg: click.echo(clean_lines(msg), err=True),
                              hand_back=not keep)
    if as_json:
        click.echo(json.dumps({"playbook": result.name, "failed": result.failed, "cancelled": result.cancelled,
                               "tasks": [o.to_dict() for o in result.outcomes]}, indent=2, default=str))
    else:
        printer.play(err, result)
    sys.exit(1 if result.failed else 0)


@main.command("lint", epilog=examples("sweeper lint", "sweeper lint my-playbooks/ --config config.yaml --strict",
                                      "sweeper lint --config config.yaml -o json"))
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Also check this config file, and "
              "that every playbook, job template, policy and folder it names is there.")
@click.option("--strict", is_flag=True, help="Warnings count as problems (exit 1).")
@output_options
@run_cli
def lint_cmd(paths: tuple[str, ...], config_path: str | None, strict: bool, out: Out) -> None:
    """Check playbooks, job templates (rendered and validated as Kubernetes objects),
    profiles and config. Every problem is printed as file:line: message; exit 1 if any.
    Warnings (file:line: warning: ...), such as a task that takes the node with no `always`
    that hands it back, are printed too but exit 0 unless --strict.

    With --config, every playbook, light_playbook, job template, policy and folder the config
    names must be where a sweep looks for it (file:line: error: ...). A PATH or --config file
    that does not exist is bad input (exit 2).

    Without PATHs: the shipped playbooks/, job-templates/, profiles/ and policies/ (or the
    config's folders).
    """
    from sweeper.config import Config, load_config
    from sweeper.lint import lint_paths

    missing = [p for p in (*paths, *([config_path] if config_path else [])) if not Path(p).exists()]
    if missing:
        raise ConfigError(f"no such file or directory: {', '.join(missing)}")
    try:
        cfg = load_config(config_path) if config_path else Config()
    except ConfigError:
        cfg = Config()  # lint_paths reports each of the config's problems
    targets = [Path(p) for p in paths] or [cfg.path(k) for k in ("playbooks", "job-templates", "profiles", "policies")
                                           if cfg.path(k).exists()]  # a folder the config names wrongly: its line
    report = lint_paths(targets, cfg, Path(config_path) if config_path else None)
    if out.structured:
        out.document({"checked": report.checked, "problems": report.problems, "warnings": report.warnings})
    else:
        for p in report.problems + report.warnings:
            click.echo(clean(p))
        stderr_out().write(f"{len(report.checked)} file(s) checked, {len(report.problems)} problem(s)"
                           + (f", {len(report.warnings)} warning(s)" if report.warnings else ""))
    sys.exit(1 if report.problems or (strict and report.warnings) else 0)


@main.command("profiles", epilog=examples("sweeper profiles", "sweeper profiles --nodes -o wide"))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
              help="Sweeper config YAML (default: $SWEEPER_CONFIG).")
@click.option("--nodes", "with_nodes", is_flag=True, help="Also show which profile each GPU node gets.")
@click.option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig file (with --nodes).")
@click.option("--context", help="kubeconfig context (with --nodes).")
@output_options
@run_cli
def profiles_cmd(config_path: str | None, with_nodes: bool, kubeconfig: str | None, context: str | None,
                 out: Out) -> None:
    """The hardware profiles, and with --nodes which one each GPU node of the cluster gets
    (by instance type, then GPU product label, then the conservative default)."""
    from sweeper.views import profile_rows

    cfg = config_for(config_path)
    rows, nodes = profile_rows(cfg, kube_for(kubeconfig, context, cfg) if with_nodes else None)
    if out.fmt == "json":
        click.echo(json.dumps({"profiles": rows, "nodes": nodes}, indent=2))
    elif out.structured:
        out.document({"profiles": rows, "nodes": nodes})
    else:
        printer.profiles(out, rows, nodes)


def check_command() -> click.Command:
    """`sweeper check`, its flags made from the checks' option table (imported only now)."""
    from sweeper.checks.options import OPTIONS

    fn: Callable[..., Any] = check
    for name, typ, default, help_text in reversed(OPTIONS):
        fn = click.option("--" + name.replace("_", "-"), name, type=typ, default=default, show_default=True,
                          help=help_text)(fn)
    fn = click.option("--termination-log", default="/dev/termination-log", show_default=True,
                      help="Where to write the short summary Kubernetes reads back.")(fn)
    fn = output_options(fn)
    return click.command("check", epilog=examples(
        "sweeper check --expect-gpus 8 --gpu-model H100 --nic efa --expect-nics 32",
        "sweeper check --skip-kernel-log 'unprivileged' -o json"))(fn)


def check(out: Out, termination_log: str, **kw: Any) -> None:
    """Run the node-local checks (inside a Job on the node) and print one result document.

    Exit 0 when everything passed or warned, 1 when a check failed or could not run.
    """
    import pynvml

    from sweeper.checks import read_kernel_log, run_node_checks, system_uptime
    from sweeper.checks.host import RealHost
    from sweeper.checks.options import CheckOptions

    opts = CheckOptions(**{**kw, "node": kw.get("node") or os.environ.get("NODE_NAME", "")})
    klog, why = read_kernel_log(opts)
    result = run_node_checks(opts, pynvml, klog, now=time.time(), uptime=system_uptime(), kernel_log_error=why,
                             host=RealHost(opts.host_root))
    printer.result_document(out, f"checks on {opts.node or 'this node'}: {result.status}", result)
    try:
        if Path(termination_log).exists():  # Kubernetes creates it in the container; elsewhere, leave /dev alone
            Path(termination_log).write_text(result.summary())
    except OSError:
        pass
    sys.exit(0 if result.status in ("pass", "warn", "skip") else 1)


@main.command("evidence", epilog=examples("sweeper evidence --host-root /host --max-bytes 2097152"))
@click.option("--node", default="", help="Name of the node (default: $NODE_NAME).")
@click.option("--host-root", default="/", show_default=True,
              help="Where the host's journal directories and /var/log are mounted in the container.")
@click.option("--max-bytes", type=click.IntRange(64 * 1024, 8 * 1024 * 1024), default=2 * 1024 * 1024,
              show_default=True, help="Cap of the compressed bundle (parts are cut, then dropped, to fit).")
@click.option("--bug-report-timeout", type=click.FloatRange(1, 1800), default=240.0, show_default=True,
              help="Seconds nvidia-bug-report.sh may take, where the image has it.")
@run_cli
def evidence_cmd(node: str, host_root: str, max_bytes: int, bug_report_timeout: float) -> None:
    """Collect a held node's evidence (inside a Job on the node) and print it: base64 of a tar.gz
    between two marker lines, its manifest first (what was collected, missing, cut). A missing
    tool or file is noted in the manifest, never an error. Exit 0 when the bundle was printed.
    """
    from sweeper.checks.evidence import collect, emit
    from sweeper.checks.host import RealHost

    got = collect(RealHost(host_root), node or os.environ.get("NODE_NAME", ""), max_bytes,
                  bug_report_timeout=bug_report_timeout)
    stderr_out().write(f"evidence: {len(got.bundle)} bytes; " + ", ".join(
        f"{p['file']} {p['status']}" for p in got.manifest["parts"]))
    click.echo(emit(got.bundle), nl=False)
