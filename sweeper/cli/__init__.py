"""The `sweeper` command. Each command parses, calls the library, and prints through the one
printer (sweeper.cli.printer); the commands are grouped by what they serve: sweeping, reading the
history, authoring checks and playbooks, and the simulated cluster. A command's module is imported
only when that command runs (sweeper.cli.app), so a command loads only what it uses."""

from __future__ import annotations

from sweeper.cli.app import main  # each command's module is imported when the command is asked for
from sweeper.cli.printer import print_history
from sweeper.cli.printer import progress as _printer
from sweeper.output import sparkline

__all__ = ["_printer", "main", "print_history", "sparkline"]
