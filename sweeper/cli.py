"""The `sweeper` command. It parses, calls the library, and prints; nothing else."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sweeper import __version__
from sweeper.clock import iso, parse_duration
from sweeper.errors import ConfigError, SweeperError
from sweeper.formats import FORMATS as READ_FORMATS
from sweeper.output import FORMATS, Col, Out, clean, clean_lines

if TYPE_CHECKING:
    from sweeper.config import Config

# The CLI imports what a command needs when the command runs (the config's pydantic, the
# Kubernetes client, the history's sqlite-utils, the checks): `--help` and the reading
# commands start in well under 150 ms. benchmarks/cli.py measures it.
HOLDING = ("reboot", "replace", "quarantine")  # sweeper.policy.HOLDING, without importing the policy


def _err() -> Out:
    return Out.to(stream=sys.stderr)


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`-o table|wide|json|yaml`, `--no-headers`, and `--json` (kept for scripts: `-o json`); the
    command receives them as one `out`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, output_format: str, as_json: bool, no_headers: bool, **kwargs: Any) -> Any:
        return fn(*args, out=Out.to("json" if as_json else output_format, not no_headers), **kwargs)

    for opt in reversed([
            click.option("-o", "--output", "output_format", type=click.Choice(FORMATS), default="table",
                         show_default=True, help="table; wide (more columns, ISO times); json or yaml (the document)."),
            click.option("--json", "as_json", is_flag=True, help="Same as -o json."),
            click.option("--no-headers", is_flag=True, help="Tables without their header and title lines.")]):
        wrapper = opt(wrapper)
    return wrapper


def _examples(*lines: str) -> str:
    """A command's epilog: copy-paste examples, kept as written (click's \\b)."""
    return "Examples:\n\n\b\n" + "\n".join("  " + line for line in lines)


STATE_HELP = ("SQLite history file (default: $SWEEPER_STATE, else state/<kubeconfig context>.db, "
              "in a pod without a kubeconfig state/sweeper.db).")


def state_option() -> Callable[..., Any]:
    return click.option("--state", default=None, help=STATE_HELP)


def with_state(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Fill in `state` when --state is not given: named for the kubeconfig context (sweeper.kubeconfig),
    so two clusters never share a history; say so on stderr. Drops --kubeconfig and --context for a
    command that only reads the history."""
    import inspect

    takes = set(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("state") is None:
            from sweeper.kubeconfig import default_state

            kwargs["state"], context = default_state(kwargs.get("kubeconfig"), kwargs.get("context"))
            ctx = click.get_current_context(silent=True)
            if ctx is not None:
                ctx.params["state"] = kwargs["state"]
            if context:
                click.echo(clean_lines(f"history {kwargs['state']}: named for the kubeconfig context {context} "
                                       "(--state or SWEEPER_STATE to choose another)"), err=True)
        for name in ("kubeconfig", "context"):
            if name not in takes:
                kwargs.pop(name, None)
        return fn(*args, **kwargs)
    return wrapper


def state_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--state, and the --kubeconfig and --context that name it, for a command that reads the history
    without asking the cluster."""
    fn = with_state(fn)
    for opt in reversed([
            click.option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig whose current context names the "
                         "history file (default: ~/.kube/config)."),
            click.option("--context", help="kubeconfig context whose history to read (state/<context>.db)."),
            state_option()]):
        fn = opt(fn)
    return fn


EXIT_BUG = 70  # EX_SOFTWARE of BSD's sysexits.h: an internal error, never confused with 1 (findings)
_debug = {"on": False}


def run_cli(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map the error tree to exit codes with one clear line on stderr (`--debug`: the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
            sys.stdout.flush()  # a reader that closed the pipe is found here, not at the interpreter's exit
            return out
        except BrokenPipeError:  # `sweeper history NODE | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's "Note on SIGPIPE"
            sys.exit(0)
        except SweeperError as exc:
            _fail(exc, exc.exit_code, str(exc))  # one unwrapped line, so file:line stays greppable
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except (RecursionError, MemoryError, OverflowError) as exc:
            _fail(exc, 2, f"{_inputs()}: too large or too deeply nested to handle ({_what(exc)})")
        except ValueError as exc:  # a value a file or an argument carried (a template's format, a number)
            _fail(exc, 2, f"{_inputs()}: {_what(exc)}")
        except Exception as exc:
            if type(exc).__module__ == "sqlite3":  # the CLI never imports sqlite3; the history should have mapped it
                _fail(exc, 3, f"history {_param('state') or ''}: {_what(exc)}")
            if type(exc).__name__ == "MarkupError":  # text from a file or a node taken for rich markup
                _fail(exc, 2, f"{_inputs()}: could not print: {_what(exc)}")
            _fail(exc, EXIT_BUG, f"internal error, a bug in Sweeper (please report it): {_what(exc)}")
    return wrapper


def _fail(exc: BaseException, code: int, line: str) -> None:
    if _debug["on"]:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    else:
        line += "" if code in (1, 3, 4) or isinstance(exc, SweeperError) else "; --debug shows the traceback"
    click.echo(f"error: {clean_lines(line)}", err=True)  # a message may quote a file or a node: shown, never obeyed
    sys.exit(code)


def _what(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200] + '...' if len(text) > 200 else text}"


def _param(name: str) -> Any:
    ctx = click.get_current_context(silent=True)
    return ctx.params.get(name) if ctx else None


def _inputs() -> str:
    """The files the failing command was given, to name in its one line."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return "sweeper"
    files = [str(v) for v in ctx.params.values() if isinstance(v, str) and v and Path(v).is_file()]
    return f"sweeper {ctx.info_name}" + (f" ({', '.join(files)})" if files else "")


class _Main(click.Group):
    """The command group. `check` takes its options from the node checks' own table, so it is built
    (and the checks imported) only when it runs or its help is asked for: other commands start fast."""

    LAZY = {"check": "Run the node-local checks (inside a Job on the node) and print one result document."}
    # What `sweeper --help` lists: whole on 80 columns, where click would cut each first sentence with "...".
    SHORT = {
        "backtest": "Replay the history under another policy.",
        "breaker": "The circuit breaker: status, reset.",
        "check": "The node-local checks, run inside a check Job.",
        "demo": "The whole product on the embedded simulated cluster.",
        "history": "A node's sweeps, verdicts, pairs, findings, actions and trends.",
        "ingest": "Parse a tool's output and record it in a node's history.",
        "lint": "Check playbooks, job templates, profiles and config.",
        "nodes": "The fleet: each GPU node's last sweep, verdict, when due.",
        "pause": "Stop sweeps from taking nodes (held nodes stay held).",
        "plan": "Which nodes a sweep would take now, and why not the others.",
        "profiles": "The hardware profiles, and which one each node gets.",
        "release": "The panic button: hand back the nodes Sweeper holds.",
        "report": "The fleet report: one self-contained HTML file.",
        "resume": "Undo `sweeper pause`.",
        "run": "Run one playbook, on one node or with no target.",
        "serve": "Sweep on cron schedules; serve /metrics and the report.",
        "sim": "The simulated cluster as an HTTP API server (sim serve).",
        "state": "The history database: retention (state prune).",
        "sweep": "One rolling pass over the GPU nodes (the CronJob's command).",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            self.add_command(_check_command(), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self.SHORT.get(n) or (self.commands.get(n) or click.Command(n, help=self.LAZY[n]))
                 .get_short_help_str(limit))
                for n in names if n not in self.commands or not self.commands[n].hidden]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Examples:\n\n\b\n  sweeper demo\n  sweeper plan\n  sweeper nodes -o wide\n"
                    "  sweeper history gpu-p5-04 --since 7d")
@click.version_option(__version__, prog_name="sweeper")
@click.option("--debug", is_flag=True, help="On an error, print the traceback instead of one line.")
def main(debug: bool) -> None:
    """Sweeper keeps the GPU nodes of a Kubernetes cluster healthy: it takes idle GPU nodes
    out of scheduling a few at a time, runs active health checks on them as Jobs, and hands
    each node back or holds it with a reason. Every result goes into a SQLite history.

    Exit codes: 0 done, 1 findings (check, lint, ingest) or a failed play (run), 2 bad input,
    3 cluster or state unreachable,
    4 another sweep holds the lock, 5 the sweep stopped on a repeated fault of the check itself,
    70 an internal error (a bug; --debug shows the traceback).
    """
    _debug["on"] = debug


def _config(path: str | None, **overrides: Any) -> Config:
    from sweeper.config import load_config

    return load_config(path).with_overrides(**overrides)


def _kubeconfig_missing(kubeconfig: str | None) -> str | None:
    """Why no kubeconfig can be read, naming the path, or None. Like kubectl, KUBECONFIG may list
    several files (':'-separated, missing ones skipped); with none given, ~/.kube/config is read
    outside a pod (https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/)."""
    if kubeconfig:
        paths = [p for p in kubeconfig.split(os.pathsep) if p]
        if paths and not any(Path(p).expanduser().is_file() for p in paths):
            return f"no kubeconfig at {', '.join(paths)} (from --kubeconfig or KUBECONFIG)"
        return None
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None  # in a pod: the service account
    default = Path("~/.kube/config").expanduser()
    if not default.is_file():
        return (f"no kubeconfig: {default} does not exist and this is not a pod; "
                "pass --kubeconfig or set KUBECONFIG")
    return None


def _kube(kubeconfig: str | None, context: str | None, cfg: Config) -> Any:
    missing = _kubeconfig_missing(kubeconfig)
    if missing:
        raise ConfigError(missing)
    from sweeper.kube import Kube, RetryPolicy

    kube = Kube.from_config(kubeconfig, context)
    kube.retry = RetryPolicy(attempts=max(1, cfg.api_attempts))
    return kube


def _history(state: str, create: bool = True) -> Any:
    """The history at `state`. create=False (plan, --dry-run): a missing file is not created; an
    empty history in memory stands in for it, so a command that changes nothing leaves no file."""
    from sweeper.history import History

    if not create and not Path(state).exists():
        return History(":memory:")
    return History(state)


common_cluster = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
                 help="Sweeper config YAML (default: $SWEEPER_CONFIG)."),
    click.option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig file (default: in-cluster or ~/.kube/config)."),
    click.option("--context", help="kubeconfig context."),
    state_option(),
]


def cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = with_state(fn)
    for opt in reversed(common_cluster):
        fn = opt(fn)
    return fn


# -- sweep -----------------------------------------------------------------------------
@main.command(epilog=_examples("sweeper sweep --config config.yaml", "sweeper sweep --dry-run",
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
    from sweeper.sweep import Sweep

    cfg = _config(config_path, max_nodes=max_nodes)
    kube = _kube(kubeconfig, context, cfg)
    hist = _history(state, create=not dry_run)
    sw = Sweep(kube, cfg, hist, emit=None if out.structured else _printer(_err()), dry_run=dry_run)
    signal.signal(signal.SIGTERM, lambda *_: sw.stop.set())
    report = sw.run()
    if cfg.pushgateway_url and not dry_run:
        from sweeper.metrics import Metrics

        metrics = Metrics()
        sw.observe(metrics, report)
        try:
            metrics.push(cfg.pushgateway_url)
        except OSError as exc:  # the sweep happened; a lost push is reported, not fatal
            _err().write(f"could not push metrics to {cfg.pushgateway_url}: {exc}", "warn")
    if out.fmt == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    elif out.structured:
        out.document(report.to_dict())
    else:
        _print_outcomes(out, report)
    if report.tool_stop:
        from sweeper.errors import ToolErrors

        raise ToolErrors(report.tool_stop)  # exit 5: the check is broken, not the nodes


def _printer(console: Any) -> Callable[[str, dict[str, Any]], None]:
    """Progress lines of a sweep. `console`: an Out, or anything with a `file` (a rich Console)."""
    o = console if isinstance(console, Out) else Out(stream=getattr(console, "file", None))

    def say(*parts: tuple[str, str | None] | str) -> None:
        o.file.write("".join(o.paint(clean(p)) if isinstance(p, str) else o.paint(clean(p[0]), p[1])
                             for p in parts) + "\n")

    def emit(event: str, d: dict[str, Any]) -> None:
        if event == "plan":
            say(f"run {d['run_id']}: {d['gpu_nodes']} GPU nodes, {d['held']} already held, "
                f"budget {d['budget']}; taking {_taking(d['take'], d.get('recheck', ()))}")
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


def _taking(take: list[str], recheck: Any) -> str:
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


def _print_outcomes(out: Out, report: Any) -> None:
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


# -- run -------------------------------------------------------------------------------
def _extra_vars(pairs: tuple[str, ...]) -> dict[str, Any]:
    import yaml

    from sweeper.schema import safe_load

    out: dict[str, Any] = {}
    for pair in pairs:
        if pair.startswith("@"):
            try:
                data = safe_load(Path(pair[1:]).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"-e {pair}: {exc}") from exc
            if not isinstance(data, dict):
                raise ConfigError(f"-e {pair}: the file must hold a mapping")
            out.update(data)
            continue
        if "=" not in pair:
            raise ConfigError(f"-e {pair!r}: expected key=value or @file.yaml")
        key, value = pair.split("=", 1)
        if not key.isidentifier():
            raise ConfigError(f"-e {pair!r}: {key!r} is not a variable name")
        try:
            out[key] = safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


@main.command("run", epilog=_examples(
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
    from sweeper.runner import run_playbook

    cfg = _config(config_path).with_overrides(playbook_dir=playbook_dir)
    path = Path(playbook)
    if not path.exists() and cfg.playbook_file(playbook).exists():
        path = cfg.playbook_file(playbook)
    kube = _kube(kubeconfig, context, cfg) if node else None

    err = _err()

    def progress(o: Any) -> None:
        if as_json:
            return
        label = f" ({o.item})" if o.is_item else ""
        # the message whole: a `debug` of a registered value is read for its end as much as its start
        err.file.write(err.paint(f"{o.status:>8}", o.status) + "  " + clean(f"{o.name}{label}")
                       + (": " + clean(o.msg) if o.msg else "") + "\n")

    import threading

    stop = threading.Event()  # SIGTERM: stop between tasks, run `always`, hand the node back
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        result = run_playbook(path, cfg, kube=kube, node_name=node, partner_name=partner,
                              extra_vars=_extra_vars(extra),
                              tags=tuple(t for t in (tags or "").split(",") if t),
                              skip_tags=tuple(t for t in (skip_tags or "").split(",") if t),
                              state=state if node else None, on_task=progress, cancelled=stop.is_set,
                              log=lambda msg: click.echo(clean_lines(msg), err=True), hand_back=not keep)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps({"playbook": result.name, "failed": result.failed, "cancelled": result.cancelled,
                               "tasks": [o.to_dict() for o in result.outcomes]}, indent=2, default=str))
    else:
        err.file.write(clean(f"play {result.name!r}: ") + err.paint("failed" if result.failed else "ok") + "\n")
    sys.exit(1 if result.failed else 0)


# -- lint ------------------------------------------------------------------------------
@main.command("lint", epilog=_examples("sweeper lint", "sweeper lint my-playbooks/ --config config.yaml --strict"))
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Also check this config file.")
@click.option("--strict", is_flag=True, help="Warnings count as problems (exit 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the problems as JSON.")
@run_cli
def lint_cmd(paths: tuple[str, ...], config_path: str | None, strict: bool, as_json: bool) -> None:
    """Check playbooks, job templates (rendered and validated as Kubernetes objects),
    profiles and config. Every problem is printed as file:line: message; exit 1 if any.
    Warnings (file:line: warning: ...), such as a task that takes the node with no `always`
    that hands it back, are printed too but exit 0 unless --strict.

    Without PATHs: the shipped playbooks/, job-templates/, profiles/ and policies/.
    """
    from sweeper.config import Config, load_config
    from sweeper.lint import lint_paths

    try:
        cfg = load_config(config_path) if config_path else Config()
    except ConfigError:
        cfg = Config()  # lint_paths reports each of the config's problems
    targets = [Path(p) for p in paths] or [cfg.path("playbooks"), cfg.path("job-templates"), cfg.path("profiles"),
                                           cfg.path("policies")]
    report = lint_paths(targets, cfg, Path(config_path) if config_path else None)
    if as_json:
        click.echo(json.dumps({"checked": report.checked, "problems": report.problems, "warnings": report.warnings},
                              indent=2))
    else:
        for p in report.problems + report.warnings:
            click.echo(clean(p))
        _err().write(f"{len(report.checked)} file(s) checked, {len(report.problems)} problem(s)"
                  + (f", {len(report.warnings)} warning(s)" if report.warnings else ""))
    sys.exit(1 if report.problems or (strict and report.warnings) else 0)


# -- ingest and profiles ---------------------------------------------------------------
@main.command("ingest", epilog=_examples(
    "dcgmi diag -r 3 -j > diag.json; sweeper ingest gpu-p5-04 diag.json --exit-code $?",
    "dmesg | sweeper ingest gpu-p5-04 - --format kernel-log",
    "sweeper ingest gpu-p5-04 all_reduce.txt --format nccl --profile p5.48xlarge --no-record"))
@click.argument("node")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(READ_FORMATS),
              help="What the file holds; auto detects it. nvidia-smi takes both -q and --query-gpu CSV.")
@click.option("--profile", "profile_name", help="Judge against this hardware profile (GPU count and model, "
              "NVLinks, NICs, NCCL floor); the flags below override it.")
@click.option("--exit-code", type=int, help="The tool's exit code, as a cross-check (dcgm, nccl, fi-info).")
@click.option("--expect-gpus", type=int, help="GPU count the node should have (dcgm, nvidia-smi).")
@click.option("--expect-nics", type=int, help="EFA or InfiniBand device count (ibv-devinfo, fi-info).")
@click.option("--min-busbw", type=float, help="Bus bandwidth floor in GB/s at the largest size (nccl).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
              help="Config file (for --profile; default: $SWEEPER_CONFIG).")
@state_options
@click.option("--no-record", is_flag=True, help="Parse and print only.")
@output_options
@run_cli
def ingest_cmd(node: str, file: str, fmt: str, profile_name: str | None, exit_code: int | None,
               expect_gpus: int | None, expect_nics: int | None, min_busbw: float | None, config_path: str | None,
               state: str, no_record: bool, out: Out) -> None:
    """Parse a tool's output produced outside Sweeper (a Slurm prolog, a manual DCGM run) into the
    common result, print it, and record it in the node's history. Exit 1 when it holds a failure."""
    from contextlib import nullcontext

    from sweeper.ingest import ingest_stream
    from sweeper.sweep import new_run_id

    expect: dict[str, Any] = {}
    if profile_name:
        from sweeper import profiles as prof

        catalogue = prof.load_profiles(_config(config_path).path("profiles"))
        if profile_name not in catalogue:
            raise ConfigError(f"no profile {profile_name!r}; known: {', '.join(sorted(catalogue))}")
        p = catalogue[profile_name]
        expect = {"expect_gpus": p.gpus, "gpu_model": p.gpu_model, "nvlinks": p.nvlinks, "nic": p.nic,
                  "expect_nics": p.nics if p.nic in ("efa", "ib") else None, "nic_affinity": p.nic_affinity,
                  "min_busbw": p.nccl_busbw_min}
    for key, value in (("expect_gpus", expect_gpus), ("expect_nics", expect_nics), ("min_busbw", min_busbw)):
        if value is not None:
            expect[key] = value
    try:
        with (nullcontext(sys.stdin.buffer) if file == "-" else Path(file).open("rb")) as stream:
            found, result = ingest_stream(stream, node, fmt, exit_code=exit_code, **expect)
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    except RecursionError as exc:  # json.loads on a document nested thousands deep
        raise ConfigError(f"{file}: nested too deeply to read (deeper than Python's recursion limit)") from exc
    if not no_record:
        h = _history(state)
        run_id = new_run_id(time.time())
        h.run_started(run_id, time.time(), "ingest")
        sid = h.sweep_started(run_id, node, result.started, f"ingest:{found}", "", kind="ingest")
        h.result(sid, result)
        h.sweep_finished(sid, time.time(), result.status, [f"{c.name}: {c.message}" for c in result.failed_checks])
        h.run_finished(run_id, time.time(), "done", 0, {"ingested": file, "format": found})
    if out.fmt == "json":
        click.echo(result.to_json())
    elif out.structured:
        out.document(result.to_dict())
    else:
        out.title(f"{node}: {found} -> {result.status}")
        out.table(_CHECK_COLS, ([c.name, c.gpu, c.status, c.severity, c.code, c.message] for c in result.checks),
                  colour=[2])
    sys.exit(0 if result.status in ("pass", "warn", "skip") else 1)


@main.command("profiles", epilog=_examples("sweeper profiles", "sweeper profiles --nodes -o wide"))
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
    from sweeper import profiles as prof

    cfg = _config(config_path)
    catalogue = prof.load_profiles(cfg.path("profiles"))
    rows: list[dict[str, Any]] = [{"profile": p.name, **p.as_vars()} for p in catalogue.values()]
    nodes: list[dict[str, str]] = []
    if with_nodes:
        kube = _kube(kubeconfig, context, cfg)
        from sweeper.fleet import gpu_nodes

        for obj in gpu_nodes(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size), cfg):
            labels = obj["metadata"].get("labels") or {}
            nodes.append({"node": obj["metadata"]["name"], "profile": prof.match(catalogue, labels).name,
                          "instance_type": labels.get("node.kubernetes.io/instance-type", "")})
    if out.fmt == "json":
        click.echo(json.dumps({"profiles": rows, "nodes": nodes}, indent=2))
        return
    if out.structured:
        out.document({"profiles": rows, "nodes": nodes})
        return

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


# -- release -----------------------------------------------------------------------------
@main.command("release", epilog=_examples(
    "sweeper release gpu-p5-04 --reason 'checked by hand, fine'",
    "sweeper release --all --reason 'stopping the rollout' --dry-run"))
@click.argument("nodes", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every node Sweeper holds.")
@click.option("--reason", required=True, help="Why (recorded in the history when there is one).")
@click.option("--dry-run", is_flag=True, help="Say what would be released; change nothing.")
@cluster_options
@output_options
@run_cli
def release_cmd(nodes: tuple[str, ...], everything: bool, reason: str, dry_run: bool, config_path: str | None,
                kubeconfig: str | None, context: str | None, state: str, out: Out) -> None:
    """The panic button: hand back every node Sweeper holds (or those named): untaint, undo
    its cordons, delete its Jobs. Works from the cluster alone when the history is lost."""
    from sweeper.clock import WallClock
    from sweeper.errors import StateError
    from sweeper.release import release

    cfg = _config(config_path)
    kube = _kube(kubeconfig, context, cfg)
    recorder = None
    if Path(state).exists():
        try:
            recorder = _history(state)
        except StateError as exc:
            _err().write(f"history unavailable ({exc}); releasing from the cluster alone", "warn")
    rows = release(kube, cfg, list(nodes), everything, reason, WallClock(), recorder, dry_run)
    if out.fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if out.structured:
        out.document(rows)
        return
    out.title("released" if not dry_run else "would release")
    out.table((Col("node"), Col("action"), Col("detail", cut=True)), ([r["node"], r["action"], r["detail"]] for r in rows))


# -- controls ----------------------------------------------------------------------------
def _who() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@main.group()
def breaker() -> None:
    """The circuit breaker: it opens when too many nodes fail within a window (a systemic fault
    is not a node fault), stops all sweeping, and stays open until a person resets it."""


def _controls(config_path: str | None, kubeconfig: str | None, context: str | None) -> Any:
    """The control ConfigMap of the cluster the kubeconfig names."""
    from sweeper.control import Controls

    cfg = _config(config_path)
    return Controls(_kube(kubeconfig, context, cfg), cfg.namespace, cfg.control_name)


def _note(state: str, action: str, detail: str, now: float) -> None:
    """Record a person's switch in the local history, where there is one (a run records what it
    sees in its own history)."""
    if Path(state).exists():
        _history(state).action("manual", "*", now, action, detail)


def _breaker_line(b: dict[str, Any]) -> tuple[str, str]:
    if b.get("state") == "open":
        return "open", f" since {iso(b['opened_at'])}: {b.get('reason', '')}"
    return "closed", (f" (reset by {b.get('closed_by')} at {iso(b['closed_at'])})" if b.get("closed_at") else "")


@breaker.command("status", epilog=_examples("sweeper breaker status", "sweeper breaker status -o json"))
@cluster_options
@output_options
@run_cli
def breaker_status(config_path: str | None, kubeconfig: str | None, context: str | None, state: str,
                   out: Out) -> None:
    """Whether the breaker is open, since when and why; and whether sweeping is paused."""
    switches = _controls(config_path, kubeconfig, context).all()
    b = switches.get("breaker") or {"state": "closed"}
    pause = switches.get("pause")
    if out.structured:
        out.document(_iso_times({**b, "paused": pause}))
        return
    word, rest = _breaker_line(b)
    out.file.write(out.paint(word) + clean(rest) + "\n")  # a person's words: text, never markup
    if pause:
        out.file.write(out.paint("paused") + clean(f" by {pause.get('by', '?')} at {iso(pause['ts'])}: "
                                                   f"{pause.get('reason', '')}") + "\n")


@breaker.command("reset", epilog=_examples("sweeper breaker reset --reason 'bad driver rolled back'"))
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


@main.command(epilog=_examples("sweeper pause --reason 'driver rollout'",
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


@main.command(epilog=_examples("sweeper resume"))
@cluster_options
@run_cli
def resume(config_path: str | None, kubeconfig: str | None, context: str | None, state: str) -> None:
    """Undo `sweeper pause`."""
    now = time.time()
    _controls(config_path, kubeconfig, context).set("pause", None, now)
    _note(state, "resume", _who(), now)
    click.echo("sweeping resumed")


# -- plan ------------------------------------------------------------------------------
@main.command("plan", epilog=_examples("sweeper plan", "sweeper plan --config config.yaml -o wide",
                                       "sweeper plan -o json | jq '.nodes[] | select(.take)'"))
@cluster_options
@output_options
@run_cli
def plan_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, out: Out) -> None:
    """Which nodes a sweep would take now, and why every other GPU node is skipped. Changes nothing
    (not even the history file: a missing one is not created)."""
    from sweeper.fleet import gpu_nodes, looked_for
    from sweeper.fleet import plan as make_plan

    cfg = _config(config_path)
    kube = _kube(kubeconfig, context, cfg)
    hist = _history(state, create=False)
    nodes = kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size)
    pods = kube.active_pods(page_size=cfg.page_size)
    from sweeper.sweep import Sweep

    sweep = Sweep(kube, cfg, hist)
    found = sweep.resolve_platform(gpu_nodes(nodes, cfg), pods)
    cfg = sweep.cfg
    gates = sweep.gates()
    p = make_plan(nodes, pods, cfg, hist.last_swept(sweep.kind), time.time(), gates)
    p.notes = [*(found.why if found else ()), *p.notes]
    rows: list[dict[str, Any]] = [{"node": d.node.name, "take": d.take, "reason": d.reason, "detail": d.detail}
                                  for d in p.take + p.skip]
    partners = sweep.partners(p) if sweep.playbook.pair else None
    for r in rows if partners is not None else []:  # a pair playbook takes nodes two at a time
        r["partner"] = partners.get(r["node"], "")  # type: ignore[union-attr]
        if r["partner"] and not r["take"]:  # an odd node of another group left it room
            r.update(take=True, reason="idle", detail=f"paired with {r['partner']}")
        elif r["take"] and not r["partner"]:
            r.update(take=False, reason="no-partner", detail="no other due node of its profile and placement "
                     "(pair_labels) to pair with within the budget; it waits")
    doc = {"gpu_nodes": p.gpu_nodes, "found_by": looked_for(cfg), "held": p.held, "budget": p.budget, "nodes": rows,
           "paused": gates.paused, "breaker": gates.breaker, "notes": p.notes,
           "platform": {"platform": cfg.platform, "runtime_class": cfg.runtime_class_name,
                        "dcgm_hostengine": cfg.hostengine}}
    if out.fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    if out.structured:
        out.document(doc)
        return
    for line in (gates.paused, gates.breaker):
        if line:
            out.write(line, "warn")  # a person's words: text, never markup
    out.title(f"{p.gpu_nodes} GPU nodes found ({looked_for(cfg)})")
    if not p.gpu_nodes:
        out.write(f"No node of the {len(nodes)} listed has one of these resources in status.capacity. Is the GPU "
                  "device plugin running on the GPU nodes? Set gpu_resources / gpu_resource_prefixes for "
                  "another resource name" + (", or check gpu_node_selector." if cfg.gpu_node_selector else "."))
        return
    for note in p.notes:
        out.write(note)
    out.title(f"{p.gpu_nodes} GPU nodes, {p.held} held, budget {p.budget}")
    cols = (Col("node"), Col("take"), *((Col("partner"),) if partners is not None else ()), Col("reason"),
            Col("detail", cut=True))
    out.table(cols, ([r["node"], "yes" if r["take"] else "no", *((r["partner"] or "-",) if partners is not None
                                                                  else ()), r["reason"], r["detail"]]
                     for r in sorted(rows, key=lambda r: (not r["take"], r["node"]))), colour=[1])


# -- history ---------------------------------------------------------------------------
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return SPARK[0] * len(values)
    return "".join(SPARK[int((v - lo) / (hi - lo) * (len(SPARK) - 1))] for v in values)


@main.command(epilog=_examples("sweeper history gpu-p5-04", "sweeper history gpu-p5-04 --since 7d --check ecc -o wide",
                               "sweeper history gpu-p5-04 -o json | jq '.sweeps[0]'"))
@click.argument("node")
@state_options
@click.option("--since", help="Only what happened within this long (e.g. 7d, 12h).")
@click.option("--check", "check", default="", help="Only findings and metrics whose name starts with this "
              "(e.g. ecc, nvlink, xid, nccl).")
@output_options
@run_cli
def history(node: str, state: str, since: str | None, check: str, out: Out) -> None:
    """A node's sweeps, verdicts and the rules behind them, pair runs (partner, mode, bus
    bandwidth), failed checks, actions and metric trends (sparklines). A node the history has
    never seen is exit 2."""
    _need_state(state)
    cutoff = _since(since)
    hist = _history(state)
    h = hist.node_history(node, cutoff, check=check)
    if not (h["sweeps"] or h["actions"] or h["pruned_days"]) and not hist.knows(node):
        raise ConfigError(f"no node {node!r} in the history at {state} (`sweeper nodes --offline` lists the "
                          "nodes it knows)")
    if out.structured:
        out.document(_iso_times(h))
        return
    print_history(out, h)


_TIME_KEYS = frozenset({"started", "finished", "decided", "ts", "last_sweep", "due", "opened_at", "closed_at", "at",
                        "since", "before"})


def _iso_times(value: Any, key: str = "") -> Any:
    """A document with its times (epoch seconds under the keys above, and the first item of a metric
    series) as ISO 8601 UTC, as the JSON and YAML forms show them."""
    from sweeper.output import iso as iso_z

    if isinstance(value, dict):
        if key == "metrics":  # name to its series of (time, value)
            return {k: [[iso_z(p[0]), *p[1:]] for p in v] for k, v in value.items()}
        return {k: _iso_times(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_iso_times(v, key) for v in value]
    if key in _TIME_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return iso_z(value)
    return value


def _need_state(state: str) -> None:
    if not Path(state).exists():
        raise ConfigError(f"no history at {state} (set --state or SWEEPER_STATE)")


def _since(since: str | None, default: float | None = None) -> float | None:
    try:
        if since:
            return time.time() - parse_duration(since)
    except ValueError as exc:
        raise ConfigError(f"--since: not a duration: {since!r}") from exc
    return None if default is None else time.time() - default


def _policy(cfg: Config, name: str | None) -> Any:
    from sweeper.policy import load_policy

    name = name or cfg.policy
    path = Path(name) if ("/" in name or Path(name).exists()) else cfg.path("policies") / name
    return load_policy(path)


DEFAULT_SCHEDULE = "*/30 * * * *"  # the CronJob's (sweeper.manifests), for a config without `schedules`


@main.command("serve", epilog=_examples(
    "sweeper serve                      # the config's playbook every 30 minutes, on 127.0.0.1:8080",
    "sweeper serve --config config.yaml --address 0.0.0.0 --port 8080   # in a pod"))
@cluster_options
@click.option("--port", default=8080, show_default=True, type=int, help="HTTP port for /metrics, /healthz and /.")
@click.option("--address", "--host", "address", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 in a pod, so Prometheus and the kubelet's probes reach it).")
@run_cli
def serve_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, port: int,
              address: str) -> None:
    """Sweep on the config's schedules (APScheduler cron triggers; the same Lease as the CronJob, so
    runs never overlap) and serve /metrics, /healthz and the live fleet report on /. Without
    `schedules` in the config (or without a config), the config's playbook runs every 30 minutes,
    as the CronJob does. SIGTERM stops the running sweep, which hands its nodes back, and exits 0."""
    import threading

    from sweeper.serve import serve

    cfg = _config(config_path)
    err = _err()
    if not cfg.schedules:
        cfg = cfg.with_overrides(schedules=({"name": "sweep", "cron": DEFAULT_SCHEDULE, "playbook": cfg.playbook},))
        err.write(f"no `schedules` in the config: sweeping with {cfg.playbook} on {DEFAULT_SCHEDULE!r}, as the "
                  "CronJob does; add `schedules: [{name, cron, playbook}]` to the config to change it")
    kube = _kube(kubeconfig, context, cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serve(cfg, kube, _history(state), port, address, lambda m: err.write(f"{iso(time.time())} {m}"), stop)


@main.command("nodes", epilog=_examples("sweeper nodes", "sweeper nodes --offline -o wide",
                                        "sweeper nodes --no-headers | grep held"))
@cluster_options
@click.option("--offline", is_flag=True, help="From the history alone, without asking the cluster.")
@output_options
@run_cli
def nodes_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, offline: bool,
              out: Out) -> None:
    """The fleet as a table: each GPU node's last sweep and verdict, when it is due, whether it is a
    suspect and whether Sweeper holds it."""
    cfg = _config(config_path)
    hist = _history(state, create=False)
    latest = {r["node"]: r for r in hist.fleet()}
    # a light check of a busy node shows, but only a full sweep makes a node not due (the planner's rule);
    # the history is asked again only where a latest row is not one
    full = hist.last_swept() if any(r.get("kind") != "sweep" or r.get("verdict") == "inconclusive"
                                    for r in latest.values()) else {n: r["started"] for n, r in latest.items()}
    now = time.time()
    rows: list[dict[str, Any]] = []
    views: list[Any] = []
    profile_of: dict[str, str] = {}
    if not offline:
        from sweeper import profiles as prof
        from sweeper.fleet import NodeView, gpu_nodes, suspect_signals

        kube = _kube(kubeconfig, context, cfg)
        views = [NodeView.from_obj(o, cfg.gpu_resources)
                 for o in gpu_nodes(kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size), cfg)]
        catalogue = prof.load_profiles(cfg.path("profiles"))  # a node never swept gets the profile it would
        profile_of = {v.name: prof.match(catalogue, v.labels).name for v in views}
    names = [v.name for v in views] if views else sorted(latest)
    by_name = {v.name: v for v in views}
    for name in names:
        last = latest.get(name)
        v = by_name.get(name)
        swept = full.get(name)
        due = (swept + cfg.interval) if swept is not None else now
        taint = v.sweep_taint(cfg.taint_key) if v else None
        rows.append({
            "node": name, "profile": (last["profile"] if last else "") or profile_of.get(name, ""),
            "last_sweep": last["started"] if last else None, "verdict": last["verdict"] if last else "",
            "rules": last.get("rules", []) if last else [], "due": max(due, now) if v or last else None,
            "overdue": swept is not None and now - swept > cfg.interval,
            "suspect": "; ".join(suspect_signals(v, cfg)) if v else "",
            "held": bool(taint) or (v is not None and f"{cfg.prefix}/cordoned-by" in v.annotations),
            "in_cluster": v is not None})
    if out.structured:
        out.document(_iso_times({"nodes": rows}))
        return
    out.title(f"{len(rows)} GPU nodes" + (" (from the history alone)" if offline else ""))
    out.table((Col("node"), Col("profile"), Col("last sweep"), Col("verdict"), Col("rule"), Col("due"),
               Col("overdue", wide=True), Col("in cluster", wide=True), Col("suspect", cut=True), Col("held")),
              ([r["node"], r["profile"] or "-", out.when(r["last_sweep"], "never"), r["verdict"] or "-",
                ", ".join(r["rules"]), "now" if r["due"] is not None and r["due"] <= now else out.when(r["due"]),
                "yes" if r["overdue"] else "no", "-" if offline else ("yes" if r["in_cluster"] else "no"),
                r["suspect"], "held" if r["held"] else ""] for r in rows), colour=[3, 9])


@main.command("report", epilog=_examples("sweeper report", "sweeper report --since 7d -o /tmp/fleet.html",
                                         "sweeper report --node gpu-p5-06 -o gpu-p5-06.html --offline"))
@cluster_options
@click.option("--since", default="30d", show_default=True, help="How far back the report looks.")
@click.option("--policy", "policy_name", help="Policy whose trend rules the report charts (default: the config's).")
@click.option("-o", "--output", default="sweeper-report.html", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the HTML file ('-' for stdout).")
@click.option("--node", "node", help="Write this node's page alone: its sweeps, findings, actions and metrics "
              "per GPU.")
@click.option("--offline", is_flag=True, help="Do not ask the cluster for its GPU nodes: use the last run's plan.")
@run_cli
def report_cmd(config_path: str | None, kubeconfig: str | None, context: str | None, state: str, since: str,
               policy_name: str | None, output: str, node: str | None, offline: bool) -> None:
    """The fleet at a glance as one self-contained HTML file (opens with no network): coverage of
    every GPU node per profile, every sweep on a time axis, the nodes held and why, nodes replaced,
    trends behind decisions, per-profile NCCL bandwidth, and a page per node.

    GPU nodes come from the cluster when it answers, else from the last run's recorded plan.
    """
    from sweeper import profiles as prof
    from sweeper.report import cluster_gpu_nodes, gather, render, render_node

    _need_state(state)
    cfg = _config(config_path)
    cutoff = _since(since) or 0.0
    floors = {p.name: p.nccl_busbw_min for p in prof.load_profiles(cfg.path("profiles")).values()
              if p.nccl_busbw_min}
    gpu_nodes, source = None, ""
    if not offline and node is None:
        try:
            kube = _kube(kubeconfig, context, cfg)
            kube.retry = dataclasses.replace(kube.retry, attempts=1)  # no waiting on a cluster that is not there
            gpu_nodes, source = cluster_gpu_nodes(kube, cfg), "the cluster"
        except SweeperError as exc:
            _err().write(f"GPU nodes from the last run's plan: the cluster did not answer ({exc})")
    hist = _history(state)
    if node is not None and not hist.node_history(node)["sweeps"]:
        raise ConfigError(f"--node: no sweep of {node!r} in {state}")
    data = gather(hist, _policy(cfg, policy_name), cutoff, time.time(), cfg.interval, floors,
                  gpu_nodes=gpu_nodes, node_source=source, node=node)
    page = render_node(data) if node is not None else render(data)
    if output == "-":
        click.echo(page, nl=False)
        return
    try:
        Path(output).write_text(page)
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc}") from exc
    _err().write(f"wrote {output} ({len(page) / 1024:.0f} KiB, {len(data.pages)} node page(s))")


@main.command("backtest", epilog=_examples("sweeper backtest --policy strict.yaml",
                                           "sweeper backtest --policy ./my-policy.yaml --since 30d -o json"))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
              help="Sweeper config YAML (default: $SWEEPER_CONFIG).")
@state_options
@click.option("--policy", "policy_name", required=True, help="The policy to try: a file, or a name in policies/.")
@click.option("--since", default="90d", show_default=True, help="How much history to replay.")
@output_options
@run_cli
def backtest_cmd(config_path: str | None, state: str, policy_name: str, since: str, out: Out) -> None:
    """Replay the recorded history under another policy: which nodes it would have held, rebooted
    or replaced, and when, next to what actually happened. Changes nothing."""
    from sweeper.backtest import backtest

    _need_state(state)
    cfg = _config(config_path)
    cutoff = _since(since) or 0.0
    bt = backtest(_history(state), _policy(cfg, policy_name), cutoff)
    if out.structured:
        out.document(_iso_times(bt.to_dict()))
        return
    rec, rep = bt.first_holds("recorded"), bt.first_holds("replayed")
    out.title(f"policy {bt.policy} on {len(bt.decisions)} recorded sweeps: "
              f"{sum(d.differs for d in bt.decisions)} decisions differ")
    rows = []
    for node in sorted(set(rec) | set(rep)):
        a, b = rep.get(node), rec.get(node)
        rows.append([node, a.replayed if a else "never held", out.when(a.at if a else None, ""),
                     ", ".join(a.rules) if a else "", b.recorded if b else "never held",
                     out.when(b.at if b else None, "")])
    out.table((Col("node"), Col("would have"), Col("when"), Col("rule"), Col("actually"), Col("when")), rows,
              colour=[1, 4])
    pairs = bt.pair_changes()
    if pairs:
        out.title(f"{len(pairs)} decisions on pairs differ")
        out.table((Col("node"), Col("when"), Col("partner"), Col("mode"), Col("would have"), Col("rule"),
                   Col("actually")),
                  [[d.node, out.when(d.at, ""), d.partner or "", d.mode or "", d.replayed, ", ".join(d.rules),
                    d.recorded] for d in pairs], colour=[4, 6])
    for which in ("recorded", "replayed"):
        c = bt.counts(which)
        out.title(f"{which}: " + ", ".join(f"{n} {v}" for v, n in sorted(c.items())))


@main.group("state")
def state_group() -> None:
    """The history database: retention."""


@state_group.command("prune", epilog=_examples("sweeper state prune --older-than 180d --dry-run",
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
    _need_state(state)
    before = _since(older_than)
    assert before is not None
    counts = _history(state).prune(before, dry_run=dry_run)
    if out.structured:
        out.document(_iso_times({"dry_run": dry_run, "before": before, **counts}))
        return
    verb = "would delete" if dry_run else "deleted"
    out.write(f"{verb} {counts['node_sweeps']} sweeps, {counts['checks']} checks, {counts['metrics']} metrics "
              f"older than {iso(before)}; {counts['summaries']} daily summaries kept")


_SWEEP_COLS = (Col("started"), Col("run"), Col("verdict"), Col("rule"), Col("playbook", wide=True),
               Col("profile", wide=True), Col("why", cut=True))
_FINDING_COLS = (Col("when"), Col("check"), Col("gpu"), Col("status"), Col("code"), Col("message", cut=True))
_ACTION_COLS = (Col("when"), Col("run", wide=True), Col("action"), Col("detail", cut=True))
_PAIR_COLS = (Col("when"), Col("run", wide=True), Col("partner"), Col("mode"), Col("busbw GB/s"), Col("status"),
              Col("detail", cut=True))


def _pair_mode(p: dict[str, Any]) -> str:
    """sweep, or a re-pair with this node as the suspect or as the known-good partner."""
    if p["mode"] != "repair":
        return str(p["mode"])
    return "re-pair (suspect)" if p["role"] == "node" else "re-pair (known-good)"


def print_history(console: Any, h: dict[str, Any]) -> None:
    """The history of one node as tables. `console`: an Out, or anything with a `file` (the demo's
    rich Console), which gets ISO times and whole cells."""
    o = console if isinstance(console, Out) else Out(fmt="wide", stream=getattr(console, "file", None))
    if not h["sweeps"] and not h["actions"]:
        o.write(f"no history for node {h['node']}" + (" in this window" if h.get("pruned_days") else ""))
        return
    o.title(f"history of {h['node']}")
    o.table(_SWEEP_COLS, ([o.when(s["started"]), s["run_id"], s["verdict"] or "unfinished",
                           ", ".join(s.get("rules") or []) or ("findings" if s["verdict"] not in ("pass", None) else ""),
                           s.get("playbook") or "", s.get("profile") or "",
                           "; ".join(s["reasons"]) if s["verdict"] != "pass" else ""] for s in h["sweeps"]),
            colour=[2])
    if h.get("pairs"):
        o.title("")
        o.title("pairs" + (f" (the latest 20 of {len(h['pairs'])})" if len(h["pairs"]) > 20 else ""))
        o.table(_PAIR_COLS, ([o.when(p["ts"]), p["run_id"], p["partner"], _pair_mode(p),
                              "" if p["busbw"] is None else f"{p['busbw']:.1f}", p["status"], p["detail"]]
                             for p in h["pairs"][:20]), colour=[5])
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
    if h["metrics"]:
        o.title("")
        o.title("metric trends (counts summed over GPUs, temperatures the hottest GPU's, thermal margins the "
                "nearest its limit; settings such as the PCIe link and the power limit have none)")
        rows = []
        for name, series in sorted(h["metrics"].items()):
            vals = [v for _, v in series][-30:]
            rows.append([name, sparkline(vals), f"{vals[-1]:g}"])
        o.table((Col("metric"), Col("trend"), Col("last")), rows)


# -- check -----------------------------------------------------------------------------
def _check_command() -> click.Command:
    """`sweeper check`, its flags made from the checks' option table (imported only now)."""
    from sweeper.checks.options import OPTIONS

    fn: Callable[..., Any] = check
    for name, typ, default, help_text in reversed(OPTIONS):
        fn = click.option("--" + name.replace("_", "-"), name, type=typ, default=default, show_default=True,
                          help=help_text)(fn)
    fn = click.option("--termination-log", default="/dev/termination-log", show_default=True,
                      help="Where to write the short summary Kubernetes reads back.")(fn)
    fn = output_options(fn)
    return click.command("check", epilog=_examples(
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
    if out.fmt == "json":
        click.echo(result.to_json())
    elif out.structured:
        out.document(result.to_dict())
    else:
        out.title(f"checks on {opts.node or 'this node'}: {result.status}")
        out.table(_CHECK_COLS, ([c.name, c.gpu, c.status, c.severity, c.code, c.message] for c in result.checks),
                  colour=[2])
    try:
        if Path(termination_log).exists():  # Kubernetes creates it in the container; elsewhere, leave /dev alone
            Path(termination_log).write_text(result.summary())
    except OSError:
        pass
    sys.exit(0 if result.status in ("pass", "warn", "skip") else 1)


_CHECK_COLS = (Col("check"), Col("gpu"), Col("status"), Col("severity", wide=True), Col("code"),
               Col("message", cut=True))


# -- sim -------------------------------------------------------------------------------
@main.group()
def sim() -> None:
    """The simulated GPU cluster (an HTTP Kubernetes API with a fault model)."""


@sim.command("serve", epilog=_examples(
    "sweeper sim serve --port 8443 --kubeconfig-out state/sim.kubeconfig",
    "sweeper sim serve --fleet my-fleet.yaml --speed 60"))
@click.option("--fleet", "fleet_path", type=click.Path(exists=True, dir_okay=False),
              help="Fleet YAML (default: the demo's fleet).")
@click.option("--port", type=int, default=8443, show_default=True, help="Port on 127.0.0.1.")
@click.option("--kubeconfig-out", type=click.Path(dir_okay=False), default="state/sim.kubeconfig",
              show_default=True, help="Where to write a kubeconfig that points at the server.")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Simulated seconds per real second (default: the fleet file's `speed` where it sets one, "
                   "else 1). At 1 the simulated clock is the wall clock, the only one kubectl and a Sweeper "
                   "in another process read; faster, their timestamps fall behind.")
@run_cli
def sim_serve(fleet_path: str | None, port: int, kubeconfig_out: str, speed: float | None) -> None:
    """Serve the simulated cluster until interrupted; point kubectl or Sweeper at it."""
    from sweeper.clock import ScaledClock
    from sweeper.sim.cluster import SimCluster
    from sweeper.sim.fleet import DEMO_FLEET, load_fleet, parse_fleet
    from sweeper.sim.server import ApiServer

    fleet = load_fleet(Path(fleet_path)) if fleet_path else parse_fleet(DEMO_FLEET, "demo fleet")
    if speed is None:  # the file's own speed, as the embedded simulator uses it; the demo's fleet at 1x
        speed = fleet.speed if fleet_path and fleet.speed_given else 1.0
    cluster = SimCluster(fleet, ScaledClock(speed))
    try:
        server = ApiServer(cluster, port=port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on 127.0.0.1:{port}: {exc}") from exc
    server.start()
    kc = server.write_kubeconfig(Path(kubeconfig_out), namespace=fleet.namespace)
    err = _err()
    err.write(f"simulated cluster {fleet.name!r}: {len(fleet.nodes)} nodes at {server.url}, "
              f"{cluster.clock.speed:g}x real time")
    err.write(f"kubeconfig: {kc}   (export KUBECONFIG={kc})")
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__("now", True))
    try:
        while not stopping["now"]:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


# -- demo ------------------------------------------------------------------------------
@main.command(epilog=_examples("sweeper demo", "sweeper demo --cycles 8 --hours-between 12 --state demo.db"))
@click.option("--cycles", type=int, default=5, show_default=True, help="Sweep cycles to run.")
@click.option("--hours-between", type=float, default=6.0, show_default=True,
              help="Simulated hours between cycles.")
@click.option("--state", help="History file (default: a fresh temporary one).")
@run_cli
def demo(cycles: int, hours_between: float, state: str | None) -> None:
    """The whole product on the embedded simulated cluster: a 16-node p5 fleet in a Karpenter pool
    with injected faults, several sweep cycles in simulated time (checks, verdicts, reboots and
    re-checks, a GPU reset, a replacement), then the fleet, a held node's history and the fleet
    report (an HTML file)."""
    import tempfile

    from rich.console import Console

    from sweeper.demo import run_demo

    state_path = Path(state) if state else Path(tempfile.mkdtemp(prefix="sweeper-demo-")) / "history.db"
    console = Console(highlight=False)
    run_demo(console, state_path, cycles=cycles, hours_between=hours_between, printer=_printer(console),
             print_history=print_history)


if __name__ == "__main__":
    main()
