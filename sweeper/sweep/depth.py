"""How deep a node's sweep goes: each discovery records which GPU nodes are idle and which busy (the
idle spells the estimate reads), and each node taken gets the deepest rung of `depth_ladder` that
fits its pool's idle window at this hour (sweeper.window), or the configured playbook when there is
no ladder or too little history. The choice and its reasons are logged, evented and, once the
sweep is conclusive, recorded as a `depth` action (what `depth_deep_after` reads back)."""

from __future__ import annotations

from typing import Any

from sweeper import window
from sweeper.fleet import NodeView, Plan
from sweeper.playbook.model import Playbook

IDLE_REASONS = ("idle", "not-due", "over-budget", "too-young")  # nothing runs on it (held ones aside)


def observe(rec: Any, cfg: Any, p: Plan, now: float) -> None:
    """Record what plan `p` saw: each GPU node idle or busy, with its pool. Held, cordoned or not
    Ready nodes say nothing of the workload's demand and are left out."""
    seen = {d.node.name: (window.pool_of(d.node.labels, cfg.pool_labels), d.take or d.reason in IDLE_REASONS)
            for d in (*p.take, *p.skip) if d.take or d.reason in (*IDLE_REASONS, "busy")}
    if seen:
        rec.idle_seen(now, seen)


def estimate(rec: Any, cfg: Any, pool: str, now: float, cache: dict[str, window.Estimate] | None = None
             ) -> window.Estimate:
    """The pool's idle window now, read once per pool and run when `cache` is given."""
    if cache is not None and pool in cache:
        return cache[pool]
    spells = [window.Spell(s, n, o) for s, n, o in rec.idle_spells(pool, now - cfg.depth_lookback, now)]
    est = window.estimate(spells, pool, now, cfg.depth_quantile, cfg.depth_min_samples, cfg.depth_by_week)
    if cache is not None:
        cache[pool] = est
    return est


def choose(rec: Any, cfg: Any, rungs: tuple[window.Rung, ...], view: NodeView, now: float,
           cache: dict[str, window.Estimate] | None = None) -> window.Choice:
    """The rung node `view` gets now, and why."""
    if not rungs:
        return window.choose(rungs, None, cfg.depth_margin, None, now, cfg.depth_deep_after)
    est = estimate(rec, cfg, window.pool_of(view.labels, cfg.pool_labels), now, cache)
    last = rec.last_depth(rungs[-1].name).get(view.name) if cfg.depth_deep_after > 0 else None
    return window.choose(rungs, est, cfg.depth_margin, last, now, cfg.depth_deep_after)


def playbook_of(sweep: Any, choice: window.Choice) -> Playbook:
    """The playbook a choice runs: its rung's, or the sweep's own."""
    return sweep.rung_books[choice.rung.name] if choice.rung is not None else sweep.playbook  # type: ignore[no-any-return]


def recorded(run: Any, node: str, choice: window.Choice, verdict: str) -> None:
    """After a sweep at a rung: a `depth` action when it said something about the node."""
    if choice.rung is not None and verdict not in ("inconclusive", "error") and not run.dry_run:
        run.rec.action(run.id, node, run.clock.now(), "depth", f"{choice.rung.name}: {choice.why}"[:1000])
