"""Opt-in: where the suite's CPU goes, test by test (docs/testing.md, "Measured").

    .venv/bin/python -m pytest -n 4 --dist loadgroup -p tests.cpu_times

Each test's setup, call and teardown are timed in CPU seconds of the process that ran it (its threads
included) and of the child processes it waited for (a sweep in a process of its own, pip, the
wheel's demo). A `sweeper` process forked by `tests.procs` is reaped by the zygote, not by the
test's process: the zygote's CPU seconds, its reaped children's included, are read from /proc and
counted as a child's. Wall time on a shared machine is whatever share of the CPU the run got; CPU seconds
are what the run costs, and on a quiet machine with N cores its wall time is at least the total over
N. At the end it prints the costliest tests and files, each worker's total (import and collection
included) and the sum. A server the tests talk to without starting it (PostgreSQL) is not counted.
"""

from __future__ import annotations

import resource
import sys
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, cast

import pytest

KEY = "cpu_seconds"
TOP = 40


def _now() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    zygote = sys.modules.get("tests.procs")  # until it is reaped at the end (tests/conftest.py)
    forked = zygote.cpu_seconds() if zygote is not None else 0.0
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime + forked


def _timed(item: pytest.Item) -> Iterator[None]:
    own, kids = _now()
    yield
    own2, kids2 = _now()
    item.user_properties.append((KEY, (own2 - own, kids2 - kids)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _timed(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _timed(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _timed(item)


class _Tally:
    def __init__(self) -> None:
        self.tests: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.workers: dict[str, tuple[float, float]] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":  # each phase's report carries the phases so far: count the last
            return
        for name, value in report.user_properties:
            if name == KEY:
                own, kids = cast(tuple[float, float], value)
                self.tests[report.nodeid][0] += own
                self.tests[report.nodeid][1] += kids

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        out = getattr(node, "workeroutput", {}) or {}
        if KEY in out:
            self.workers[f"worker {out.get('workerid', '?')}"] = tuple(out[KEY])  # type: ignore[assignment]

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if self.workers:  # pytest-xdist's controller: collection, scheduling, reporting
            self.workers["controller"] = _now()  # its children: the workers, once they exit
        else:  # no workers: this process ran everything
            self.workers["main"] = _now()
        tr = terminalreporter
        tr.write_sep("=", "CPU seconds (own process + waited-for children)")
        rows = sorted(self.tests.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
        for nodeid, (own, kids) in rows[:TOP]:
            tr.write_line(f"{own + kids:8.1f} {own:8.1f} {kids:8.1f}  {nodeid}")
        files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for nodeid, (own, kids) in self.tests.items():
            f = files[nodeid.split("::", 1)[0]]
            f[0] += own
            f[1] += kids
        tr.write_sep("-", "by file")
        for path, (own, kids) in sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:TOP]:
            tr.write_line(f"{own + kids:8.1f} {own:8.1f} {kids:8.1f}  {path}")
        in_tests = sum(a + b for a, b in self.tests.values())
        tr.write_sep("-", "totals")
        for wid, (own, kids) in sorted(self.workers.items()):
            tr.write_line(f"{own + kids:8.1f} {own:8.1f} {kids:8.1f}  {wid} (all of it)")
        # the controller's children are the workers: its total is the whole run's
        total = sum(self.workers["controller" if "controller" in self.workers else "main"])
        tr.write_line(f"{in_tests:8.1f} in tests, {total:.1f} in the whole run, {len(self.tests)} tests")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Tally(), "cpu_times_tally")


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out[KEY] = list(_now())
        out["workerid"] = session.config.workerinput["workerid"]  # type: ignore[attr-defined]
