"""What a command imports before it runs: a command loads only what it uses (sweeper.cli.app imports a
command's module when that command is asked for). Each process's start-up is what a person waits for at
the terminal (benchmarks/cli.py times it): the Kubernetes client alone is about 1 s of CPU, SQLAlchemy
about 0.3 s, the parsers and the XID catalogue about 0.2 s. Read from `python -X importtime`, which
names every module a process imports (https://docs.python.org/3/using/cmdline.html#cmdoption-X)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from sweeper.cli import main
from sweeper.cli.app import _Main

# Never at start-up of a command that does not use them: the Kubernetes client (and what only it
# pulls in), the config's checking, the report's templates and terminal tables, the parsers.
HEAVY = ("kubernetes", "pydantic", "jinja2", "rich", "sweeper.formats", "sweeper.parsers", "sweeper.xid",
         "sweeper.sweep", "sweeper.sim")


def imported(*argv: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules `python -m sweeper ARGV` imported, and the finished process."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "SWEEPER_CONFIG", "SWEEPER_STATE")}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sweeper", *argv], capture_output=True,
                          text=True, env=env | {"COLUMNS": "120"}, timeout=120)
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "sweeper.cli.app" in names, proc.stderr[-2000:]
    return names, proc


def heavy_in(names: set[str], *allowed: str) -> list[str]:
    return sorted(n for n in names for h in HEAVY if h not in allowed and (n == h or n.startswith(h + ".")))


def a_history(tmp_path: Path) -> Path:
    from sweeper.history import History

    state = tmp_path / "h.db"
    h = History(state)
    t0 = time.time() - 3600
    h.run_started("sw-1", t0, "sweep")
    sid = h.sweep_started("sw-1", "gpu-01", t0, "sweep-light.yaml", "p5.48xlarge")
    h.sweep_finished(sid, t0 + 60, "fail", ["xid 79"])
    h.run_finished("sw-1", t0 + 90, "done", 1, {})
    h.close()
    return state


def test_help_imports_no_command() -> None:
    names, proc = imported("--help")
    assert proc.returncode == 0 and "history" in proc.stdout, proc.stderr[-2000:]
    assert heavy_in(names) == [], heavy_in(names)
    assert "sqlalchemy" not in names
    assert not {n for n in names if n.startswith("sweeper.cli.")} - {"sweeper.cli.app", "sweeper.cli.options",
                                                                   "sweeper.cli.printer"}, sorted(names)


def test_history_of_a_node_on_sqlite_needs_no_kubernetes_client(tmp_path: Path) -> None:
    """`sweeper history NODE` and `sweeper nodes --offline` read a local SQLite history: SQLAlchemy
    Core and its SQLite dialect, not the Kubernetes client, the parsers or the other commands."""
    state = a_history(tmp_path)
    names, proc = imported("history", "gpu-01", "--state", str(state))
    assert proc.returncode == 0 and "xid 79" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert heavy_in(names) == [], heavy_in(names)
    assert "sqlalchemy.dialects.sqlite" in names and "sqlalchemy.dialects.postgresql" not in names
    assert "sweeper.cli.sweeping" not in names and "sweeper.cli.ingest" not in names
    names, proc = imported("nodes", "--offline", "--state", str(state))
    assert proc.returncode == 0 and "gpu-01" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert heavy_in(names) == [], heavy_in(names)


def test_every_command_is_in_the_map_of_its_module() -> None:
    """A command is imported through `_Main.MODULES`: one missing there would not be found."""
    for module in sorted({*_Main.MODULES.values()}):
        importlib.import_module(f"sweeper.cli.{module}")
    ctx = click.Context(main)
    assert set(main.commands) - set(_Main.LAZY) == set(_Main.MODULES)
    for name, module in _Main.MODULES.items():
        cmd = main.get_command(ctx, name)
        assert cmd is not None and cmd.callback is not None, name
        assert cmd.callback.__module__ == f"sweeper.cli.{module}", (name, cmd.callback.__module__)
    assert set(main.list_commands(ctx)) == {*_Main.MODULES, *_Main.LAZY} == set(_Main.SHORT)


def test_a_sweep_imports_no_reader_it_does_not_use(make_sim: Any, tmp_path: Path) -> None:
    """A sweep's checks report in Sweeper's own format: the readers of other tools' output, the node
    side's checks and NVML (an evidence Job's bundle is read with them, when a node is held), and
    kubernetes-validate (which the Kubernetes client's dynamic client imports when it is installed;
    `sweeper lint` uses it) stay out of a sweep that holds no node."""
    sim = make_sim(nodes=2)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("max_nodes: 2\nmax_percent: 100\npoll_interval: 0.05\ncheck_timeout: 1800\n")
    names, proc = imported("sweep", "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"),
                           "--config", str(cfg), "--json")
    assert proc.returncode == 0 and '"gpu-01"' in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert {"kubernetes", "sqlalchemy", "sweeper.sweep", "sweeper.parsers.sweeper_result"} <= names
    assert not {"jsonschema", "pynvml", "sweeper.checks", "rich"} & names  # jsonschema: kubernetes-validate's
    # the readers a sweep needs: its own format, the XID catalogue's kernel-log lines (the policy's
    # findings), the pair runs' (NCCL, ping); not those of a node's tools, which `sweeper ingest` reads
    readers = {n for n in names if n.startswith("sweeper.parsers.")}
    assert not readers & {f"sweeper.parsers.{m}" for m in ("dcgm", "nvidia_smi", "ibv_devinfo", "fi_info", "topo")}, \
        readers
