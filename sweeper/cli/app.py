"""The `sweeper` command group: what `sweeper --help` lists, `--debug`, and `check` built only
when asked for. The commands themselves live beside it, by what they serve."""

from __future__ import annotations

import importlib

import click

from sweeper import __version__
from sweeper.cli.options import DEBUG


class _Main(click.Group):
    """The command group. Each command's module is imported only when that command runs or its help
    is asked for (`MODULES`), so a command loads what it uses and nothing another needs: `history`
    on a local history imports no Kubernetes client, `sweeper --help` no command at all (it lists
    `SHORT`). `check` takes its options from the node checks' own table, so it is built (and the
    checks imported) only when it runs or its help is asked for."""

    LAZY = {"check": "Run the node-local checks (inside a Job on the node) and print one result document."}
    # command -> the module of sweeper.cli that registers it on import
    MODULES = {
        "backtest": "history", "breaker": "sweeping", "cohorts": "cohorts", "demo": "simulator",
        "evidence": "authoring", "history": "history", "ingest": "ingest", "lint": "authoring",
        "nodes": "history", "pause": "sweeping", "plan": "sweeping", "profiles": "authoring",
        "release": "sweeping", "report": "history", "resume": "sweeping", "run": "authoring",
        "serve": "sweeping", "sim": "simulator", "state": "history", "sweep": "sweeping",
    }
    # What `sweeper --help` lists: whole on 80 columns, where click would cut each first sentence with "...".
    SHORT = {
        "backtest": "Replay the history under another policy.",
        "breaker": "The circuit breaker: status, reset.",
        "check": "The node-local checks, run inside a check Job.",
        "cohorts": "Failure rate by a shared fact (driver, rack): who stands apart.",
        "demo": "The whole product on the embedded simulated cluster.",
        "evidence": "Collect a held node's evidence bundle (inside a Job on the node).",
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
        return sorted({*self.commands, *self.LAZY, *self.MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.MODULES and cmd_name not in self.commands:
            importlib.import_module(f"sweeper.cli.{self.MODULES[cmd_name]}")
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            from sweeper.cli.authoring import check_command

            self.add_command(check_command(), cmd_name)
        return self.commands.get(cmd_name)

    def all_commands(self) -> dict[str, click.Command]:
        """Every command, each module imported (the docs' and the README's tests walk them all)."""
        ctx = click.Context(self)
        return {name: cmd for name in self.list_commands(ctx) if (cmd := self.get_command(ctx, name)) is not None}

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self.SHORT.get(n) or (self.commands.get(n) or self.get_command(ctx, n)
                                          or click.Command(n, help=self.LAZY[n])).get_short_help_str(limit))
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
    DEBUG["on"] = debug
