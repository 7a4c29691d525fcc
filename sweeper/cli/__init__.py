"""The `sweeper` command. Each command parses, calls the library, and prints through the one
printer (sweeper.cli.printer); the commands are grouped by what they serve: sweeping, reading the
history, authoring checks and playbooks, and the simulated cluster."""

from __future__ import annotations

from sweeper.cli import authoring, cohorts, history, simulator, sweeping  # noqa: F401 - each registers its commands
from sweeper.cli.app import main
from sweeper.cli.printer import print_history
from sweeper.cli.printer import progress as _printer
from sweeper.output import sparkline

__all__ = ["_printer", "main", "print_history", "sparkline"]
