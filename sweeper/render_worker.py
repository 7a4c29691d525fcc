"""Renders of playbook templates in a child process with its own memory and CPU bounds.

One long-lived worker per Sweeper process, started on the first render with fork+exec of a
fresh interpreter (`python -m sweeper.render_worker`, never a bare fork of a threaded process).
The worker caps its address space (RLIMIT_AS, MEMORY_LIMIT) and renders requests sent over
its stdin/stdout as pickles: (what, arguments, LIMITS, the deadline cap) -> a value, a
PlaybookError's words, or an error's type name and message (never a traceback). The parent
waits at most the render deadline plus GRACE, then SIGKILLs the worker and starts a fresh one
on the next render: the kill is what bounds a C-level operation that holds the GIL, which
the in-process deadline (an exception delivered between bytecodes) cannot stop.

Why not `multiprocessing`'s spawn: it re-runs the parent's main module in the child (for the
`sweeper` console script that imports the whole CLI and the Kubernetes client); a plain
interpreter that imports only `sweeper.templating` starts faster and smaller. Framing is
`multiprocessing.connection.Connection` over the two pipes.

Why no PR_SET_PDEATHSIG: Linux sends it when the *thread* that started the child exits, and
the first render of a sweep happens in a worker thread that ends with its pool. The worker
leaves instead on end-of-file of its stdin (the kernel closes the parent's end when the parent
dies, SIGKILL or SIGTERM alike), and a render stuck in C when its parent dies meets RLIMIT_CPU,
which the worker sets before each request to the CPU it has used plus the deadline and a
margin (the soft limit counts the process's whole CPU time, so it moves with every request).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from sweeper.errors import PlaybookError

MEMORY_LIMIT = 1 << 30  # bytes of address space; a worker maps ~100 MiB (23 MiB resident) once it has rendered
GRACE = 0.25  # seconds past the deadline before the kill, so the worker's own deadline answers first
CPU_MARGIN = 2  # CPU seconds past a request's deadline before RLIMIT_CPU ends an orphaned worker
STARTUP = 60.0  # seconds a fresh worker may take to start and import, outside any render's deadline
READY = b"ready"  # the worker's first message: it has imported the templating module
ANSWER_LIMIT = 64 << 20  # bytes of one pickled answer (a render's value is at most LIMITS.output characters)
ENV_SWITCH = "SWEEPER_RENDER_ISOLATION"  # "thread": render in-process (the simulator and tests may)


def isolated() -> bool:
    """Whether renders go to the worker: the default, unless the switch says `thread`."""
    return os.environ.get(ENV_SWITCH, "process").strip().lower() != "thread"


class WorkerStartError(Exception):
    """A fresh worker did not say it was ready within STARTUP seconds, or ended first."""


class Unpicklable(Exception):
    """The request holds a value that cannot cross to the worker."""


class Worker:
    """The parent's handle on one worker process; one render at a time, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._owner = 0  # the pid that started the worker: a forked copy of this process starts its own
        self.started = 0  # workers started so far (tests and the benchmark read it)
        self.requests = 0  # renders sent to a worker
        self.fallbacks = 0  # requests that held a value that cannot cross, rendered in-process
        self.command = [sys.executable, "-m", "sweeper.render_worker"]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _start(self) -> None:
        self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, close_fds=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._send = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._recv = Connection(os.dup(self._proc.stdout.fileno()), writable=False)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._owner = os.getpid()
        self.started += 1
        # A render's deadline counts the render, not the interpreter's start: on a loaded machine
        # the start alone can take longer than a deadline of seconds.
        try:
            ready = self._recv.poll(STARTUP) and self._recv.recv_bytes(len(READY)) == READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            try:  # its pipe closed: the exit status follows at once
                code: int | None = self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            self.stop()
            raise WorkerStartError(f"the render worker did not start within {STARTUP:g}s" if code is None
                                   else f"the render worker ended at its start ({_how(code)})")

    def stop(self) -> None:
        """SIGKILL the worker (if any) and forget it; the next request starts a fresh one."""
        proc, self._proc = self._proc, None
        for conn in (self._send, self._recv):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._send = self._recv = None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
            proc.wait()

    def call(self, request: tuple[Any, ...], seconds: float) -> tuple[Any, ...]:
        """Send one request and wait at most `seconds` + GRACE for its answer. Returns the
        worker's answer, ("timeout",) after a kill, or ("died", how) when the worker ended."""
        try:
            data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
            raise Unpicklable(str(exc)) from None
        with self._lock:
            self.requests += 1
            if self._owner != os.getpid():
                self._proc = self._send = self._recv = None  # the worker and its pipes are the parent's
            if self._proc is None or self._proc.poll() is not None:
                self.stop()
                try:
                    self._start()
                except WorkerStartError as exc:
                    return ("start", str(exc))
            assert self._send is not None and self._recv is not None and self._proc is not None
            try:
                self._send.send_bytes(data)
                if not self._recv.poll(seconds + GRACE):
                    self.stop()
                    return ("timeout",)
                raw = self._recv.recv_bytes(ANSWER_LIMIT)  # OSError past it
            except (EOFError, OSError):
                proc = self._proc
                self.stop()
                return ("died", _how(proc.returncode))
            try:
                answer: tuple[Any, ...] = _PlainUnpickler(io.BytesIO(raw)).load()
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
                self.stop()  # it sent something no render makes: not trusted again
                return ("error", "TypeError", f"the render worker's answer cannot be read: {str(exc)[:200]}")
            if answer[0] == "memory":  # the worker leaves after a MemoryError: start afresh
                self.stop()
            return answer


class _PlainUnpickler(pickle.Unpickler):
    """An answer holds plain data only: no class outside this list is looked up, so a worker
    that a sandbox escape took over cannot run code in the parent through its answer."""

    ALLOWED = frozenset({("builtins", "range"), ("builtins", "complex"), ("builtins", "set"),
                         ("builtins", "frozenset"), ("markupsafe", "Markup")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"a value of type {module}.{name}")
        return super().find_class(module, name)


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


WORKER = Worker()
atexit.register(WORKER.stop)


def run(op: str, args: tuple[Any, ...], where: str, snippet: str, seconds: float, whose: str,
        cap: float | None, limits: Any) -> Any:
    """One render in the worker: its value, or the PlaybookError the in-process render would
    raise (the same words for a deadline; a worker that dies names the memory limit)."""
    try:
        answer = WORKER.call((op, args, limits, cap), seconds)
    except Unpicklable:
        WORKER.fallbacks += 1
        raise
    kind = answer[0]
    if kind == "ok":
        return answer[1]
    if kind in ("playbook", "memory"):
        raise PlaybookError(answer[1] or f"{where}: rendering {snippet!r} ran past the render memory limit "
                                         f"({MEMORY_LIMIT >> 20} MiB)")
    if kind == "timeout":
        raise PlaybookError(f"{where}: rendering {snippet!r} ran past {whose} ({seconds:g}s)")
    if kind == "start":
        raise PlaybookError(f"{where}: cannot render {snippet!r}: {answer[1]}")
    if kind == "died":
        raise PlaybookError(f"{where}: rendering {snippet!r} ended the render worker ({answer[1]}): past its "
                            f"memory limit ({MEMORY_LIMIT >> 20} MiB) or its CPU bound")
    raise PlaybookError(f"{where}: cannot render {snippet!r}: {answer[1]}: {answer[2]}")


# -- the worker's side --------------------------------------------------------------------------
def _cpu_backstop(seconds: float) -> None:
    """RLIMIT_CPU a little past this request's deadline, counted from the CPU used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime + seconds + GRACE) + CPU_MARGIN
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard == resource.RLIM_INFINITY or soft <= hard:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _handle(request: tuple[Any, ...]) -> tuple[Any, ...]:
    from sweeper import templating

    op, args, limits, cap = request
    templating.LIMITS = limits
    seconds = limits.seconds if cap is None else min(cap, limits.seconds)
    _cpu_backstop(seconds)
    ops: dict[str, Callable[..., Any]] = {"render": templating.render, "condition": templating.condition,
                                          "template": templating.render_template}
    fn = ops[op]
    try:
        with templating.render_deadline(cap):
            value = fn(*args)
        return ("ok", _plain(value, limits.items))
    except PlaybookError as exc:
        return ("memory" if isinstance(exc.__context__, MemoryError) else "playbook", str(exc))
    except MemoryError:  # outside a guarded render (compiling, turning the value into a list)
        return ("memory", None)
    except Exception as exc:  # noqa: BLE001 - the parent words it; no traceback crosses
        return ("error", type(exc).__name__, str(exc)[:300])


def _plain(value: Any, items: int) -> Any:
    """A generator a filter returned (`select`, `map`) crosses as the list it yields."""
    if isinstance(value, Iterator):
        out = []
        for v in value:
            out.append(v)
            if len(out) > items:
                raise PlaybookError(f"a rendered sequence of more than {items:,} items")
        return out
    return value


def _serve(inbox: Connection, outbox: Connection) -> None:
    while True:
        try:
            data = inbox.recv_bytes()
        except (EOFError, OSError):
            return  # the parent is gone
        answer = _handle(pickle.loads(data))
        try:
            payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - a value that cannot cross back
            payload = pickle.dumps(("error", "TypeError", f"a rendered {type(answer[1]).__name__} cannot be "
                                    f"returned: {str(exc)[:200]}"))
        try:
            outbox.send_bytes(payload)
        except OSError:
            return
        if answer[0] == "memory":
            return  # what a MemoryError left half-built is not trusted: the parent starts afresh


def main() -> None:
    """The worker: bound its memory, then answer requests until its stdin ends."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    out_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print goes to stderr, never into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from sweeper import templating  # before the first request, not during its deadline

    templating._IN_WORKER = True
    outbox = Connection(out_fd, readable=False)
    try:
        outbox.send_bytes(READY)
    except OSError:
        return
    _serve(Connection(os.dup(0), writable=False), outbox)


if __name__ == "__main__":
    main()
