"""Injectable time: production uses the wall clock, the simulation a faster one."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Sleep until the event is set or the time is up; True if it was set."""


class WallClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


class ScaledClock:
    """A clock that runs `speed` times faster than real time from a chosen start.

    Shared by the simulated scheduler, kubelet and workload generator, and by a
    sweeper running in the same process, so that a 10-minute check takes a
    second of real time and every deadline still holds in simulated seconds.
    """

    def __init__(self, speed: float = 1.0, start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._start_sim = time.time() if start is None else start
        self._start_real = time.monotonic()
        self._offset = 0.0
        self._frozen: float | None = None
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now()

    def _now(self) -> float:
        if self._frozen is not None:
            return self._frozen
        return self._start_sim + self._offset + (time.monotonic() - self._start_real) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds) / self.speed)

    def advance(self, seconds: float) -> None:
        """Jump forward (days between sweep cycles in the demo)."""
        with self._lock:
            if self._frozen is not None:
                self._frozen += seconds
            else:
                self._offset += seconds

    def freeze(self) -> None:
        """Stop simulated time where it is: it then moves only by `advance`, so a test can hold a
        state of the simulated cluster (a node mid-reboot) however slow the machine running it is."""
        with self._lock:
            if self._frozen is None:
                self._frozen = self._now()

    def thaw(self) -> None:
        """Let simulated time run on from where it was frozen."""
        with self._lock:
            if self._frozen is not None:
                self._start_sim, self._offset, self._start_real = self._frozen, 0.0, time.monotonic()
                self._frozen = None


def iso(ts: float) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes timestamps."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_iso(text: object) -> float | None:
    """A timestamp from data someone else may have written (an annotation): None when unreadable."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        return parse_iso(text)
    except (ValueError, OverflowError, OSError):
        return None


def parse_duration(text: str | int | float) -> float:
    """'90s', '10m', '6h', '7d', or a number of seconds."""
    if isinstance(text, int | float):
        return float(text)
    s = str(text).strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if s and s[-1] in units:
        return float(s[:-1]) * units[s[-1]]
    return float(s)
