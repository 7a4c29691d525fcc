"""How long a node of a pool stays idle at this hour, and the deepest check that fits it.

The estimator: the idle spells of the pool (one row a spell, from the history) that began within
the same hour of the day (or of the week, with `by_week`) over the look-back, and of those the
`quantile` of their lengths: a conservative window, most spells that begin now last at least that
long. A spell still open has lasted at least so long: it joins only when it already outlasts the
estimate of the closed ones (so it can only raise it; one that began a minute ago says nothing).
Fewer than `min_samples` closed spells: no estimate, and the sweep runs its configured fixed
playbook, saying so.

The ladder: rungs from light to deep, each a playbook (and optionally a DCGM level) with the
duration it holds a node, soak included. The choice is the deepest rung whose duration times
(1 + margin) fits the window. A node whose last deep test is older than `deep_after` (or that never
had one) gets the deepest rung when its duration fits the pool's median window, margin aside: the
window allows it more often than not.

DCGM levels and what each costs on an 8-GPU node: -r 1 about 30 s, -r 2 about 2 min, -r 3 about
15 min, -r 4 one to two hours (docs/playbooks.md; NVIDIA's `dcgmi diag` reference). Faults that
show only under load (NVIDIA/DCGM#313: ECC errors that only a stress run raises) are found by the
levels that stress the GPU (3 and up), never by a light check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sweeper.errors import ConfigError

HOUR, DAY = 3600.0, 86400.0


@dataclass(frozen=True)
class Spell:
    """One idle spell of a node: when it began and how long it lasted (`open`: it still lasts)."""

    start: float
    length: float
    open: bool = False


@dataclass(frozen=True)
class Estimate:
    """The window a node of `pool` may expect from `at`: `seconds` (None: history too thin),
    `median`, the spells it stood on (`samples`) and the sentence that says so."""

    pool: str
    slot: int  # the hour of the day (0-23) or of the week (0-167)
    seconds: float | None
    median: float | None
    samples: int
    why: str


@dataclass(frozen=True)
class Rung:
    """One step of the depth ladder."""

    name: str
    playbook: str
    seconds: float  # how long it holds a node, soak included
    dcgm_level: int | None = None


@dataclass(frozen=True)
class Choice:
    """The rung a node gets (None: the configured fixed playbook) and why."""

    rung: Rung | None
    why: str
    estimate: Estimate | None = None
    rule: str = "fixed"  # fixed | fits | deep-overdue | nothing-fits

    def as_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {"depth": self.rung.name if self.rung else None, "rule": self.rule, "why": self.why,
                "window_s": e.seconds if e else None, "samples": e.samples if e else 0}


def slot_of(ts: float, by_week: bool = False) -> int:
    """The hour of the day (UTC), or of the week (Monday 00h = 0), that `ts` falls in."""
    t = datetime.fromtimestamp(ts, UTC)
    return t.weekday() * 24 + t.hour if by_week else t.hour


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` (the lower of the two neighbours: never optimistic)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.floor(q * (len(ordered) - 1))))]


def estimate(spells: Iterable[Spell], pool: str, at: float, q: float, min_samples: int,
             by_week: bool = False) -> Estimate:
    """The idle window of `pool` at time `at`, from the spells that began in the same slot."""
    slot = slot_of(at, by_week)
    here = [s for s in spells if slot_of(s.start, by_week) == slot and s.length > 0]
    lengths = [s.length for s in here if not s.open]
    where = f"pool {pool or '(none)'} at {'hour-of-week' if by_week else 'hour'} {slot}"
    if len(lengths) < max(1, min_samples):
        return Estimate(pool, slot, None, None, len(lengths),
                        f"{where}: {len(lengths)} idle spell(s) in the history, fewer than {min_samples}")
    closed = quantile(lengths, q)
    lengths += [s.length for s in here if s.open and s.length >= closed]
    window, median = quantile(lengths, q), quantile(lengths, 0.5)
    return Estimate(pool, slot, window, median, len(lengths),
                    f"{where}: {q:.0%} of {len(lengths)} idle spells lasted under {window / 60:.0f} min "
                    f"(median {median / 60:.0f} min)")


def ladder(rows: Sequence[Mapping[str, Any]]) -> tuple[Rung, ...]:
    """The configured ladder (light first); rungs must get longer as they get deeper."""
    rungs = tuple(Rung(str(r["name"]), str(r["playbook"]), float(r["duration"]),
                       int(r["dcgm_level"]) if r.get("dcgm_level") is not None else None) for r in rows)
    for a, b in zip(rungs, rungs[1:], strict=False):
        if b.seconds <= a.seconds:
            raise ConfigError(f"depth_ladder: {b.name!r} ({b.seconds:g}s) is after {a.name!r} ({a.seconds:g}s) "
                              "but not longer: list the rungs light first")
    if len({r.name for r in rungs}) != len(rungs):
        raise ConfigError("depth_ladder: two rungs share a name")
    return rungs


def choose(rungs: Sequence[Rung], est: Estimate | None, margin: float, last_deep: float | None, now: float,
           deep_after: float) -> Choice:
    """The deepest rung that fits the window with its margin; the deepest of all for a node whose
    deep test is overdue, when it fits the median window. No estimate: the fixed playbook."""
    if not rungs:
        return Choice(None, "no depth ladder configured: the configured playbook")
    if est is None or est.seconds is None:
        why = est.why if est else "no idle history"
        return Choice(None, f"{why}: the configured playbook", est)
    deep = rungs[-1]
    overdue = deep_after > 0 and (last_deep is None or now - last_deep > deep_after)
    if overdue and est.median is not None and deep.seconds <= est.median:
        age = "never had one" if last_deep is None else f"last one {(now - last_deep) / DAY:.1f} days ago"
        return Choice(deep, f"{deep.name}: deep test overdue ({age}; every {deep_after / DAY:g} days) and "
                            f"{deep.seconds / 60:g} min fits the median window; {est.why}", est, "deep-overdue")
    fits = [r for r in rungs if r.seconds * (1 + margin) <= est.seconds]
    if not fits:
        return Choice(rungs[0], f"{rungs[0].name}: nothing fits the window, the lightest rung; {est.why}", est,
                      "nothing-fits")
    best = fits[-1]
    return Choice(best, f"{best.name}: {best.seconds / 60:g} min (+{margin:.0%}) fits; {est.why}", est, "fits")


def pool_of(labels: Mapping[str, str], keys: Sequence[str]) -> str:
    """A node's pool: the value of the first of `keys` it carries ("" when none)."""
    return next((f"{k}={labels[k]}" for k in keys if labels.get(k)), "")
