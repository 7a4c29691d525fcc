"""Renders of untrusted playbooks in a child process under memory and CPU bounds (issue 22:
"Renders are bounded for real"). The attacks: a template that allocates past what the size
limits catch, a C-level operation that holds the GIL past the in-process deadline, and a
controller that dies while its render worker is busy.

RLIMIT_AS makes an allocation past it fail with ENOMEM, which CPython raises as MemoryError
(setrlimit(2): https://man7.org/linux/man-pages/man2/setrlimit.2.html, RLIMIT_AS and RLIMIT_CPU);
an asynchronous exception is only checked between bytecodes, so a single C call (`sum` over a
range) runs on until it returns (PyThreadState_SetAsyncExc:
https://docs.python.org/3/c-api/init.html#c.PyThreadState_SetAsyncExc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sweeper import render_worker, templating
from sweeper.errors import PlaybookError
from sweeper.history import History
from sweeper.render_worker import MEMORY_LIMIT, WORKER
from sweeper.templating import LIMITS, condition, render, render_deadline
from tests.conftest import TEST_CONFIG, Sim, run_sweep

# What the size limits would let through if they had a gap: every test below widens LIMITS
# (which travel with each request) so that only the worker's own bounds stand.
OPEN = replace(LIMITS, output=1 << 40, string=1 << 40, items=1 << 60, int_bits=1 << 40)


@pytest.fixture(autouse=True)
def _process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(render_worker.ENV_SWITCH, raising=False)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_render_past_the_memory_limit_is_a_playbook_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 GB asked for in the worker: a MemoryError there, a PlaybookError here, this process unmoved."""
    render("{{ 1 }}", {}, "warm")
    monkeypatch.setattr(templating, "LIMITS", OPEN)
    before, started, at = _rss(), WORKER.started, time.monotonic()
    with pytest.raises(PlaybookError, match=rf"^pb\.yaml:4: msg: rendering .* ran past the render memory limit "
                                            rf"\({MEMORY_LIMIT >> 20} MiB\)$"):
        render("{{ ('x' * 3000000000) | length }}", {}, "pb.yaml:4: msg")
    assert time.monotonic() - at < 5
    assert _rss() - before < 16 << 20
    assert render("{{ x * 2 }}", {"x": 21}, "pb.yaml:5") == 42
    assert WORKER.started == started + 1, "the worker left after its MemoryError and a fresh one answered"


def test_a_c_level_loop_is_killed_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sum` over a range of 10**15 is one C call: no exception reaches it, the kill does."""
    render("{{ 1 }}", {}, "warm")
    monkeypatch.setattr(templating, "LIMITS", replace(OPEN, seconds=1.0))
    started, at = WORKER.started, time.monotonic()
    with pytest.raises(PlaybookError, match=r"^pb\.yaml:7: x: rendering .* ran past the render deadline \(1s\)$"):
        render("{{ range(10**15) | sum }}", {}, "pb.yaml:7: x")
    assert time.monotonic() - at < 1.0 + render_worker.GRACE + 1.0
    with render_deadline(0.5), pytest.raises(PlaybookError, match=r"ran past the task's timeout \(0\.5s\)"):
        condition("(range(10**15) | sum) > 0", {}, "pb.yaml:8: when")
    assert render("{{ 'ok' }}", {}, "pb.yaml:9") == "ok"
    assert WORKER.started == started + 2


def test_a_worker_that_dies_mid_render_names_its_limits() -> None:
    render("{{ 1 }}", {}, "warm")
    pid = WORKER.pid
    assert pid is not None
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(PlaybookError, match=r"^pb\.yaml:2: x: rendering .* ended the render worker \(killed by "
                                            r"SIGKILL\): past its memory limit"):
        render(spin, {}, "pb.yaml:2: x")
    assert render("{{ 2 + 2 }}", {}, "pb.yaml:3") == 4


def test_renders_from_many_threads_each_get_their_own_answer() -> None:
    got: dict[int, object] = {}

    def one(i: int) -> None:
        got[i] = render("{{ [n, n * n] }}", {"n": i, "other": "x" * 1000}, f"t{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {i: [i, i * i] for i in range(16)}


def test_the_thread_switch_renders_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(render_worker.ENV_SWITCH, "thread")
    sent = WORKER.requests
    assert render("{{ x | select('odd') | list }}", {"x": [1, 2, 3]}, "pb") == [1, 3]
    assert WORKER.requests == sent


def test_a_sweep_renders_through_the_worker(make_sim, history: History) -> None:
    """The shipped DCGM sweep on the simulated cluster, every render in the worker, none in-process."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"pcie_replay": [1]}})
    sent, fallbacks = WORKER.requests, WORKER.fallbacks
    report = run_sweep(sim, history, replace(TEST_CONFIG, playbook="sweep-dcgm.yaml"))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "quarantine"}
    assert WORKER.requests - sent > 20
    assert WORKER.fallbacks == fallbacks


PARENT = """
import sys, time
from dataclasses import replace
from sweeper import templating
from sweeper.render_worker import WORKER
templating.render("{{ 1 }}", {}, "x")
print(WORKER.pid, flush=True)
if sys.argv[1] == "busy":
    templating.LIMITS = replace(templating.LIMITS, items=1 << 60, seconds=2.0)
    templating.render("{{ range(10**15) | sum }}", {}, "x")
time.sleep(60)
"""


def _gone(pid: int, within: float) -> bool:
    """The process ended (or is a zombie its new parent has yet to reap) within `within` seconds."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a live process, from /proc (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gone_by_cpu(pid: int, cpu_bound: float, wall_cap: float = 300.0) -> bool:
    """The process ended before it had used `cpu_bound` CPU seconds. RLIMIT_CPU counts CPU time,
    not wall time, so on a loaded machine the worker meets it later by the clock but at the same
    CPU; `wall_cap` only keeps a broken bound from hanging the suite."""
    until = time.monotonic() + wall_cap
    while time.monotonic() < until:
        used = _cpu_seconds(pid)
        if used is None:
            return True
        if used > cpu_bound:
            return False
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("while_", ["idle", "busy"])
def test_sigterm_of_the_parent_leaves_no_worker(while_: str) -> None:
    """Idle, the worker leaves on end-of-file of its pipe; busy in C, RLIMIT_CPU ends it."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PARENT), while_], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        time.sleep(0.5)
        assert not _gone(pid, 0.1), "the worker runs while its parent does"
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        if while_ == "idle":
            assert _gone(pid, 2.0)
        else:  # the parent set a 2 s deadline: RLIMIT_CPU ends the worker at about 2 + GRACE + CPU_MARGIN
            assert _gone_by_cpu(pid, 2.0 + render_worker.GRACE + render_worker.CPU_MARGIN + 1.5)
    finally:
        proc.kill()
        proc.wait()


def test_an_answer_that_is_not_plain_data_is_refused() -> None:
    """The parent reads answers with an unpickler that looks up no class outside a short list:
    a worker taken over by a sandbox escape cannot have the parent call os.system."""
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("true",))

    import io
    import pickle
    raw = pickle.dumps(("ok", Evil()))
    with pytest.raises(pickle.UnpicklingError, match="posix.system"):
        render_worker._PlainUnpickler(io.BytesIO(raw)).load()
    plain = ("ok", [1, "a", {"b": (2.5, None)}, {3}, frozenset({4}), range(3)])
    assert render_worker._PlainUnpickler(io.BytesIO(pickle.dumps(plain, protocol=5))).load() == plain
    assert render("{{ range(3) }}", {}, "pb") == range(3)
    assert render("{{ 'a' | safe }}", {}, "pb") == "a"  # a markupsafe.Markup
    with pytest.raises(PlaybookError, match=r"^pb: cannot render .*: TypeError: a rendered Namespace cannot be returned"):
        render("{{ namespace(a=1) }}", {}, "pb")


def test_variables_that_cannot_cross_render_in_process() -> None:
    """The documented exception: a callable in the variables stays in this process."""
    fallbacks = WORKER.fallbacks
    assert render("{{ n + 1 }}", {"n": 1, "f": lambda: 0}, "pb") == 2  # `f` is not read: only `n` crosses
    assert WORKER.fallbacks == fallbacks
    assert render("{{ f is defined and n }}", {"n": 1, "f": lambda: 0}, "pb") == 1
    assert WORKER.fallbacks == fallbacks + 1


def test_the_deadline_counts_the_render_not_the_workers_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded controller a fresh interpreter can take longer to start than a render's whole
    deadline; the start is waited for on its own (the worker says it is ready), and a worker
    that ends at its start is named as such."""
    slow = render_worker.Worker()
    slow.command = [sys.executable, "-c", "import runpy, time; time.sleep(2.5); "
                    "runpy.run_module('sweeper.render_worker', run_name='__main__')"]
    monkeypatch.setattr(render_worker, "WORKER", slow)
    try:
        at = time.monotonic()
        answer = slow.call(("render", ("{{ 6 * 7 }}", {}), replace(OPEN, seconds=1.0), None), 1.0)
        assert answer == ("ok", 42) and time.monotonic() - at >= 2.5
    finally:
        slow.stop()
    broken = render_worker.Worker()
    broken.command = [sys.executable, "-c", "raise SystemExit(3)"]
    monkeypatch.setattr(render_worker, "WORKER", broken)
    with pytest.raises(PlaybookError, match=r"^pb\.yaml:3: cannot render .*the render worker ended at its start "
                                            r"\(exit status 3\)"):
        render("{{ 1 }}", {}, "pb.yaml:3")
