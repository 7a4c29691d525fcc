"""The cron triggers of the config's `schedules`, as `sweeper serve` runs them: five fields (or six,
seconds first), the CronJob's schedule for a config without any, and the longest wait between
two firings (what /healthz allows before it calls the queue stale)."""

from __future__ import annotations

import datetime as dt

from apscheduler.triggers.cron import CronTrigger

from sweeper.config import Config
from sweeper.errors import ConfigError


def trigger(cron: str) -> CronTrigger:
    """Five fields (minute hour day month weekday), or six with seconds first."""
    fields = cron.split()
    try:
        if len(fields) == 5:
            return CronTrigger.from_crontab(cron, timezone="UTC")
        if len(fields) == 6:
            sec, minute, hour, day, month, dow = fields
            return CronTrigger(second=sec, minute=minute, hour=hour, day=day, month=month, day_of_week=dow,
                               timezone="UTC")
    except ValueError as exc:
        raise ConfigError(f"schedule cron {cron!r}: {exc}") from exc
    raise ConfigError(f"schedule cron {cron!r}: five fields, or six with seconds first")


DEFAULT_SCHEDULE = "*/30 * * * *"  # the CronJob's (sweeper.manifests), for a config without `schedules`


def with_default_schedule(cfg: Config) -> tuple[Config, str]:
    """The config, given the CronJob's schedule for its playbook when it has no `schedules`, and a
    line saying so ("" when it has its own)."""
    if cfg.schedules:
        return cfg, ""
    cfg = cfg.with_overrides(schedules=({"name": "sweep", "cron": DEFAULT_SCHEDULE, "playbook": cfg.playbook},))
    return cfg, (f"no `schedules` in the config: sweeping with {cfg.playbook} on {DEFAULT_SCHEDULE!r}, as the "
                 "CronJob does; add `schedules: [{name, cron, playbook}]` to the config to change it")


def longest_gap(trig: CronTrigger, now: float, firings: int = 16) -> float:
    """The longest wait between two of a trigger's next firings (a weekday cron waits over a weekend)."""
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    prev = trig.get_next_fire_time(None, t)
    gap = 0.0
    for _ in range(firings):
        if prev is None:
            break
        nxt = trig.get_next_fire_time(prev, prev + dt.timedelta(microseconds=1))
        if nxt is None or nxt <= prev:
            break
        gap, prev = max(gap, (nxt - prev).total_seconds()), nxt
    return gap
