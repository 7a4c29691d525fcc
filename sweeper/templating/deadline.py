"""A render's deadline, and the one place a render's failure becomes a PlaybookError that
names the task's file:line and the expression (`_guarded`).

Loops inside a template are compiled Python, and nested `range` loops within every size bound
still run for hours. Only an exception raised inside the rendering thread stops them:
`PyThreadState_SetAsyncExc` does that from another thread, on any thread (unlike
`signal.setitimer`, main thread only, which `serve` and the sweep's workers are not). Every
single operation a template can start is bounded in size (`bounds`), so the exception always
arrives within moments. One watchdog thread serves every render (a timer thread per render
would cost a thread start each). An exception delivered while the thread runs a garbage
collector's callback is swallowed there ("Exception ignored in ..."), so the watchdog fires
again every REFIRE seconds until the render is disarmed. Arming and firing share a lock, and
disarming clears an exception that was set but not yet delivered, so a deadline never fires
into later code.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jinja2 import TemplateError

from sweeper.errors import PlaybookError
from sweeper.templating import bounds
from sweeper.templating.bounds import LimitExceeded

# Set in the render worker's process only (sweeper.render_worker sets `templating._IN_WORKER`);
# there a MemoryError is the worker's memory limit, and renders never go to another worker.
_IN_WORKER = False


class RenderTimeout(BaseException):
    """Raised inside the rendering thread at its deadline. A BaseException, so that no
    `except Exception` inside Jinja2 or a filter can swallow it."""


REFIRE = 0.5


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc) if exc is not None else None)


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, int] = {}  # token -> thread id
        self._fired: set[int] = set()  # armed tokens whose exception was set at least once
        self._heap: list[tuple[float, int]] = []  # (deadline, token)
        self._tokens = 0
        self._wake_at = float("inf")
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        with self._cond:
            self._tokens += 1
            token = self._tokens
            at = time.monotonic() + seconds
            self._armed[token] = threading.get_ident()
            heapq.heappush(self._heap, (at, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sweeper-render-deadline", daemon=True)
                self._thread.start()
            if at < self._wake_at:
                self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        """Idempotent: the render's own thread calls it once it is done, however it ended."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:  # it fired: clear what is set but not yet delivered
                self._fired.discard(token)
                _set_async_exc(threading.get_ident(), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    _, token = heapq.heappop(self._heap)
                    _set_async_exc(self._armed[token], RenderTimeout)
                    self._fired.add(token)
                    heapq.heappush(self._heap, (now + REFIRE, token))  # until the render is disarmed
                    continue
                self._wake_at = self._heap[0][0] if self._heap else float("inf")
                self._cond.wait(None if not self._heap else self._wake_at - now)


_WATCHDOG = _Watchdog()
_local = threading.local()


@contextlib.contextmanager
def render_deadline(seconds: float | None) -> Iterator[None]:
    """Renders inside this block stop after `seconds` (a task's `timeout`) when that is shorter
    than LIMITS.seconds."""
    before = getattr(_local, "cap", None)
    if seconds is not None:
        _local.cap = seconds if before is None else min(before, seconds)
    try:
        yield
    finally:
        _local.cap = before


def _deadline() -> tuple[float, str, float | None]:
    """This render's deadline in seconds, how an error names it, and the task's cap (if any)."""
    cap = getattr(_local, "cap", None)
    seconds = bounds.LIMITS.seconds if cap is None else min(cap, bounds.LIMITS.seconds)
    whose = "the task's timeout" if cap is not None and cap < bounds.LIMITS.seconds else "the render deadline"
    return seconds, whose, cap


def _snippet(source: str) -> str:
    return source if len(source) <= 120 else source[:117] + "..."


def _guarded(where: str, source: str, fn: Callable[[], Any]) -> Any:
    """Run one render under its deadline, and turn whatever goes wrong into a PlaybookError
    that names the task's file:line and the expression."""
    snippet = _snippet(source)
    if getattr(_local, "rendering", False):  # a render inside a render: the outer deadline holds
        return fn()
    seconds, whose, _ = _deadline()
    _local.rendering = True
    try:
        token = _WATCHDOG.arm(seconds)
        try:
            return fn()
        finally:
            _WATCHDOG.disarm(token)
    except RenderTimeout:
        _WATCHDOG.disarm(token)  # again: the exception may have arrived inside the first disarm
        raise PlaybookError(f"{where}: rendering {snippet!r} ran past {whose} ({seconds:g}s)") from None
    except (PlaybookError, TemplateError):
        raise  # render() and condition() word these as before
    except LimitExceeded as exc:
        raise PlaybookError(f"{where}: template limit: {exc} in {snippet!r}") from None
    except MemoryError as exc:
        if _IN_WORKER:
            from sweeper.render_worker import MEMORY_LIMIT
            raise PlaybookError(f"{where}: rendering {snippet!r} ran past the render memory limit "
                                f"({MEMORY_LIMIT >> 20} MiB)") from exc
        raise PlaybookError(f"{where}: cannot render {snippet!r}: MemoryError: {str(exc)[:300]}") from None
    except (ArithmeticError, AttributeError, LookupError, RecursionError, TypeError, ValueError) as exc:
        raise PlaybookError(f"{where}: cannot render {snippet!r}: {type(exc).__name__}: {str(exc)[:300]}") from None
    finally:
        _local.rendering = False
