"""`sweeper` commands in processes of their own, forked from a pre-imported zygote.

The crash tests (`tests/cluster/test_safety.py`, `test_pair_sweep.py`, `test_gate.py`) start about
90 `sweeper sweep` processes a run, SIGKILL most of them at a chosen API request and run the sweep
again. A fresh interpreter spends 1.3 to 1.5 of the 2 CPU seconds such a process costs on imports
(the Kubernetes client, SQLAlchemy, pydantic, Sweeper itself: `python -X importtime -m sweeper.cli
sweep ...`). Here each one is forked instead from a server process that imported all of that once:
multiprocessing's forkserver, itself a fresh interpreter started (lazily, once per pytest worker)
by fork and exec, so a worker's threads (the simulated API server's) are never forked. Measured
(a 2-core machine at a load average of about 25): one sweep of a served simulator cost 3.3 to 3.5 s
of CPU as `python -m sweeper.cli sweep`, 1.0 to 1.2 s forked from the zygote; the three files'
figures are in docs/testing.md ("Sweeps forked from a zygote").

The children are real processes, each with its own pid, and the tests rely on that: SIGKILL,
SIGTERM (the sweep's own handler, installed in the child's main thread), SIGSTOP/SIGCONT, their
own Lease and history writes, their exit code (`sys.exit` from click, negative for a signal, as
`subprocess.Popen.returncode`), their stdout and stderr on file descriptors 1 and 2 (inherited by
what they start). The child does what the interpreter does around `python -m sweeper.cli ARGS`:
the environment is a full copy of the caller's `os.environ` at `start` (the zygote's own was frozen
when it started), the working directory the caller's, `sys.argv` and `sys.stdout`/`sys.stderr`
made afresh for fds 1 and 2 (stderr line-buffered, stdout line-buffered only on a terminal), and
at the end non-daemon threads are joined, `atexit` handlers run (multiprocessing's children
otherwise skip them: the render worker is stopped by one), the streams flushed. What it does not
do is tear the interpreter down (`os._exit` after a garbage collection): an object only a module
global still holds is not finalized, which no test observes. Nothing the sweep reads at import
time depends on the environment (checked: configuration, colour and width are read when used).

Tests about start-up itself (`tests/test_cli_startup.py`, `tests/test_wheel.py`), the served
simulator (`sweeper sim serve`) and the deployed CronJob's command (`tests/cluster/test_rbac.py`)
keep `subprocess`.

`_Popen._launch` is multiprocessing's own (CPython 3.11) less the parent's `__main__`; a Python whose
forkserver start differs fails `tests/test_procs.py` first.

CPU seconds: a child's time is counted by the zygote, which reaps it, not by the pytest worker;
`cpu_seconds()` gives the zygote's own and its children's, and `tests/cpu_times.py` adds it.
"""

from __future__ import annotations

import atexit
import gc
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing import context, forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.connection import wait as _wait_ready
from pathlib import Path
from typing import IO, Any

DEVNULL = subprocess.DEVNULL
PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT

# What `sweeper sweep` imports (a sweep's sys.modules, by package): imported once, in the zygote.
PRELOAD = [
    "tests.procs",
    "sweeper.cli", "sweeper.cli.sweeping", "sweeper.sweep", "sweeper.history", "sweeper.kube",
    "sweeper.kube.adapter", "sweeper.templating", "sweeper.render_worker", "sweeper.playbook",
    "sweeper.policy", "sweeper.checks", "sweeper.parsers", "sweeper.parsers.nccl", "sweeper.parsers.pair",
    "sweeper.parsers.ping", "sweeper.actions", "sweeper.actions.pair", "sweeper.actions.mpijob", "sweeper.lock",
    "sweeper.kubeconfig", "sweeper.platforms", "sweeper.profiles", "sweeper.notify",
    "kubernetes", "kubernetes.client", "kubernetes.config", "kubernetes.watch", "sqlalchemy",
    "sqlalchemy.dialects.sqlite", "sqlite3", "pydantic", "jinja2", "yaml", "click", "requests", "urllib3",
]

_lock = threading.Lock()
_ctx: Any = None


def _context() -> Any:
    global _ctx
    with _lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _ctx = ctx
    return _ctx


class _Popen(popen_forkserver.Popen):
    """multiprocessing's forkserver start, less the parent's `__main__`: a spawned child re-runs
    the parent's main script (a test runner's, here), which a `sweeper` process never would."""

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child's sentinel of this process, as multiprocessing keeps it
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(context.ForkServerProcess):  # type: ignore[name-defined,misc]
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:
        return _Popen(process_obj)


def _server_pid() -> int | None:
    return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


def cpu_seconds() -> float:
    """The zygote's CPU seconds: its own (the imports) and those of the children it reaped."""
    pid = _server_pid() if _ctx is not None else None
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def stop() -> None:
    """End the zygote and reap it, so that its CPU time, its children's included, counts to this
    process as a subprocess's would. SIGKILL: a graceful exit tears down an interpreter holding
    every module of a sweep, seconds on a loaded machine, and pytest-xdist may kill a worker first
    (the zygote would then go unreaped, and its CPU seconds uncounted)."""
    if _ctx is None:
        return
    for server in (forkserver._forkserver, resource_tracker._resource_tracker):  # type: ignore[attr-defined]
        pid = getattr(server, "_forkserver_pid", None) or getattr(server, "_pid", None)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server._stop()  # closes its pipe, reaps it


class _Fd:
    """A file descriptor handed to the child (sent to the zygote with the start request)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return int(dup.detach())


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(argv: list[str], env: dict[str, str], cwd: str, out: int, err: int) -> None:
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err} - {1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()  # what the interpreter read from the environment at its start: the time zone,
    tempfile.tempdir = None  # and the temporary directory once asked for
    os.chdir(cwd)
    enc = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    errors = getattr(sys.__stdout__, "errors", None) or "strict"
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(open(1, "wb", closefd=False), encoding=enc, errors=errors,
                                                   line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", closefd=False), encoding=enc,
                                                   errors="backslashreplace", line_buffering=True)
    import sweeper.cli
    from sweeper.cli import main

    sys.argv = [str(Path(sweeper.cli.__file__).with_name("__main__.py")), *argv]  # as `python -m sweeper.cli`
    code = 0
    try:
        main(args=argv, prog_name="sweeper")
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    # what the interpreter does after its main module: join threads, atexit, flush; then exit
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)



def _fd_of(spec: Any, default: int, opened: list[IO[bytes]]) -> tuple[int, IO[bytes] | None]:
    """The descriptor the child gets for one stream, and the file to read back for PIPE."""
    if spec is None:
        return default, None
    if spec == DEVNULL:
        f = open(os.devnull, "wb")
        opened.append(f)
        return f.fileno(), None
    if spec == PIPE:
        f = tempfile.TemporaryFile()
        opened.append(f)
        return f.fileno(), f
    if isinstance(spec, int):
        return spec, None
    return spec.fileno(), None


class Proc:
    """`subprocess.Popen`'s face on a zygote child: pid, poll, wait, signals, communicate."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 stdout: Any = None, stderr: Any = None, text: bool = False) -> None:
        self.args = list(argv)
        self.text = text
        opened: list[IO[bytes]] = []
        try:
            out, self._out = _fd_of(stdout, 1, opened)
            if stderr == STDOUT:
                err, self._err = out, None
            else:
                err, self._err = _fd_of(stderr, 2, opened)
            env = dict(os.environ if env is None else env)
            cwd = str(cwd) if cwd is not None else os.getcwd()
            _context()
            self._p = _Process(target=_child, args=(self.args, env, cwd, _Fd(out), _Fd(err)),
                                         name="sweeper " + " ".join(self.args[:1]))
            self._p.start()
        finally:
            for f in opened:
                if f is not self._out and f is not self._err:
                    f.close()
        # Only this object reads the child's exit status (multiprocessing would also poll it from
        # another start and join it at exit, which a Popen does not).
        multiprocessing.process._children.discard(self._p)  # type: ignore[attr-defined]
        self.pid: int = self._p.pid
        self._wait_lock = threading.Lock()
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and _wait_ready([self._p.sentinel], 0):
            self._reap()
        return self.returncode

    def _reap(self) -> None:
        with self._wait_lock:
            if self.returncode is None:
                self._p.join()
                self.returncode = self._p.exitcode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not _wait_ready([self._p.sentinel], timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, f: IO[bytes] | None) -> Any:
        if f is None:
            return None
        f.seek(0)
        data = f.read()
        f.close()
        return data.decode(errors="replace") if self.text else data

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Wait for the end, then the captured output (PIPE streams are files here, read at the end)."""
        self.wait(timeout)
        out, err = self._read(self._out), self._read(self._err)
        self._out = self._err = None
        return out, err

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.poll() is None:
            self.kill()
            self.wait()
        self.communicate()


# The zygote leans on CPython 3.11's forkserver internals (`_Popen._launch`); on another Python, or
# with SWEEPER_TEST_ZYGOTE=0, each command is a fresh interpreter again (slower, the same tests).
ZYGOTE = sys.version_info[:2] == (3, 11) and os.environ.get("SWEEPER_TEST_ZYGOTE", "1") != "0"


def start(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
          stdout: Any = None, stderr: Any = None, text: bool = False) -> Proc | subprocess.Popen[Any]:
    """`sweeper ARGV` in a process of its own (see the module's docstring): stdout and stderr each
    None (this process's), DEVNULL, PIPE (read back by `communicate`), STDOUT (stderr only), a
    file object or a descriptor."""
    if not ZYGOTE:
        return subprocess.Popen([sys.executable, "-m", "sweeper.cli", *argv], env=env, cwd=cwd, stdout=stdout,
                                stderr=stderr, text=text)
    return Proc(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=text)


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """As `subprocess.run([... "sweeper", *argv], capture_output=True, text=True, timeout=...)`:
    on the timeout the child is killed and TimeoutExpired raised."""
    proc = start(argv, env=env, cwd=cwd, stdout=PIPE, stderr=PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.wait(), out, err)
