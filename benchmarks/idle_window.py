"""The test fits the idle window: a backtest of the depth ladder on a recorded history.

    python -m benchmarks.idle_window [--seed 7] [--days 28] [--interval 24h]

A seeded fleet history is generated and recorded in a History (SQLite, in memory) through the
same `idle_seen` writes a sweep's discoveries make: three pools whose nodes alternate between busy
and idle, with idle spells whose length depends on the pool and the hour (a training pool idle for
minutes by day and hours at night, a batch pool with 40-minute gaps, a spare pool idle for hours),
and faults that arrive on nodes over time. A third of the faults show only under load (NVIDIA/DCGM#313:
ECC errors by the thousand a second under load, none when idle): only DCGM level 3 finds them.
Another third need DCGM level 2 (PCIe, memory); the rest any check finds.

Then each strategy replays the same spells: a node due (no completed test within `--interval`)
starts a test when its idle spell begins; a test that outlasts the spell is aborted when demand
arrives (its GPU-hours are spent for nothing, the node stays due). Strategies: a fixed depth (light,
DCGM 2, DCGM 3 with soak) and the adaptive choice (sweeper.window: the deepest rung that fits the
pool's estimated window, read from the history as it stood at that moment; the light playbook while
the history is thin). It prints, per strategy, the GPU-hours spent (and wasted on aborted tests),
tests completed and aborted, the faults caught (and the load-only ones), and the mean days a fault
waited to be caught.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from sweeper.clock import parse_duration
from sweeper.config import Config
from sweeper.history import History
from sweeper.window import HOUR, Choice, Estimate, Rung, Spell, choose, estimate, ladder

GPUS = 8
START = 1_790_000_000.0 - (1_790_000_000.0 % 86400.0)  # a midnight, UTC
# The ladder of the docs (docs/how-it-works.md): durations include the pod's start and the node checks.
LADDER = ladder([{"name": "light", "playbook": "sweep-light.yaml", "duration": 300.0},
                 {"name": "dcgm-r2", "playbook": "sweep-dcgm.yaml", "duration": 600.0, "dcgm_level": 2},
                 {"name": "dcgm-r3+soak", "playbook": "sweep-dcgm.yaml", "duration": 2700.0, "dcgm_level": 3}])
DEPTH = {r.name: i for i, r in enumerate(LADDER)}  # a fault of depth d is found by a rung of depth >= d
KINDS = (("any check", 0, 0.4), ("DCGM 2", 1, 0.3), ("load-only (DCGM#313)", 2, 0.3))


@dataclass(frozen=True)
class Pool:
    name: str
    nodes: int
    busy_mean: float  # seconds, exponential
    idle_median: tuple[float, float]  # by day (08-20 UTC), by night, seconds, log-normal
    sigma: float = 0.8

    def idle(self, rng: random.Random, t: float) -> float:
        hour = int((t % 86400) // 3600)
        median = self.idle_median[0] if 8 <= hour < 20 else self.idle_median[1]
        return max(60.0, rng.lognormvariate(math.log(median), self.sigma))


POOLS = (Pool("karpenter.sh/nodepool=train", 16, 6 * HOUR, (12 * 60.0, 3 * HOUR)),
         Pool("karpenter.sh/nodepool=batch", 10, 3 * HOUR, (40 * 60.0, 40 * 60.0), sigma=1.0),
         Pool("karpenter.sh/nodepool=spare", 6, 1 * HOUR, (6 * HOUR, 10 * HOUR)))


@dataclass
class Fault:
    node: str
    at: float
    depth: int
    kind: str
    caught: float | None = None


@dataclass
class Fleet:
    spells: list[tuple[float, float, str, str]]  # start, length, node, pool
    faults: list[Fault]
    end: float


def generate(seed: int, days: int) -> Fleet:
    """The seeded history: every node's idle spells and the faults that arrive on it."""
    rng = random.Random(seed)
    end = START + days * 86400.0
    spells, faults = [], []
    for pool in POOLS:
        for i in range(pool.nodes):
            node = f"{pool.name.split('=')[1]}-{i:02d}"
            t = START + rng.uniform(0, pool.busy_mean)
            while t < end:
                length = pool.idle(rng, t)
                spells.append((t, min(length, end - t), node, pool.name))
                t += length + rng.expovariate(1 / pool.busy_mean)
            t = START + rng.expovariate(1 / (15 * 86400.0))  # about one fault a node a fortnight
            while t < end:
                name, depth, _ = rng.choices(KINDS, weights=[k[2] for k in KINDS])[0]
                faults.append(Fault(node, t, depth, name))
                t += rng.expovariate(1 / (15 * 86400.0))
    spells.sort()
    return Fleet(spells, faults, end)


def record(fleet: Fleet) -> History:
    """The spells as a sweep's discoveries would have recorded them, in time order."""
    h = History(":memory:", cluster="bench")
    events = sorted([(s, n, p, True) for s, _, n, p in fleet.spells] +
                    [(s + length, n, p, False) for s, length, n, p in fleet.spells if s + length < fleet.end])
    for ts, node, pool, idle in events:
        h.idle_seen(ts, {node: (pool, idle)})
    return h


@dataclass
class Tally:
    name: str
    gpu_hours: float = 0.0
    wasted: float = 0.0
    done: int = 0
    aborted: int = 0
    by_depth: dict[str, int] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)

    def row(self) -> list[str]:
        caught = [f for f in self.faults if f.caught is not None]
        load = [f for f in self.faults if f.depth == 2]
        waits = [(f.caught - f.at) / 86400.0 for f in caught if f.caught is not None]
        return [self.name, f"{self.gpu_hours:,.0f}", f"{self.wasted:,.0f}", str(self.done), str(self.aborted),
                f"{len(caught)}/{len(self.faults)}", f"{sum(1 for f in load if f.caught)}/{len(load)}",
                f"{statistics.mean(waits):.1f}" if waits else "-",
                " ".join(f"{k}:{v}" for k, v in sorted(self.by_depth.items(), key=lambda kv: DEPTH[kv[0]]))]


Pick = Callable[[str, str, float, "float | None"], Rung]  # (node, pool, when, its last deep test) -> the rung


def replay(fleet: Fleet, name: str, pick: Pick, interval: float) -> Tally:
    """One strategy over the recorded spells."""
    tally = Tally(name, faults=[Fault(f.node, f.at, f.depth, f.kind) for f in fleet.faults])
    pending: dict[str, list[Fault]] = {}
    for f in tally.faults:
        pending.setdefault(f.node, []).append(f)
    last: dict[str, float] = {}  # node -> its last completed test
    deep: dict[str, float] = {}  # node -> its last completed deepest test
    for start, length, node, pool in fleet.spells:
        if start - last.get(node, -math.inf) < interval:
            continue
        rung = pick(node, pool, start, deep.get(node))
        if rung.seconds > length:  # demand came first: aborted, nothing learnt
            tally.aborted += 1
            tally.wasted += length / 3600 * GPUS
            tally.gpu_hours += length / 3600 * GPUS
            continue
        tally.done += 1
        tally.by_depth[rung.name] = tally.by_depth.get(rung.name, 0) + 1
        tally.gpu_hours += rung.seconds / 3600 * GPUS
        finished = start + rung.seconds
        last[node] = finished
        for f in pending.get(node, []):
            if f.caught is None and f.at <= start and f.depth <= DEPTH[rung.name]:
                f.caught = finished
        if rung == LADDER[-1]:
            deep[node] = finished
    return tally


def fixed(rung: Rung) -> Pick:
    """A fixed-depth sweep: `rung` every time."""
    def pick(node: str, pool: str, t: float, last_deep: float | None) -> Rung:
        return rung
    return pick


def adaptive(history: History, cfg: Config) -> tuple[Pick, list[Choice]]:
    """The depth ladder as a sweep would choose, from the history as it stood at each moment."""
    made: list[Choice] = []
    cache: dict[tuple[str, int], Estimate] = {}

    def pick(node: str, pool: str, t: float, last_deep: float | None) -> Rung:
        key = (pool, int(t // 3600))
        if key not in cache:
            rows = history.idle_spells(pool, t - cfg.depth_lookback, t)
            cache[key] = estimate([Spell(s, n, o) for s, n, o in rows], pool, t, cfg.depth_quantile,
                                  cfg.depth_min_samples, cfg.depth_by_week)
        choice = choose(LADDER, cache[key], cfg.depth_margin, last_deep, t, cfg.depth_deep_after)
        made.append(choice)
        return choice.rung or LADDER[0]  # thin history: the configured playbook, the light one
    return pick, made


def table(rows: list[list[str]]) -> str:
    head = ["strategy", "GPU-h spent", "GPU-h wasted", "tests done", "aborted", "faults caught",
            "load-only caught", "days to catch", "depths run"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--days", type=int, default=28)
    ap.add_argument("--interval", default="24h", help="a node is due again this long after its last test")
    args = ap.parse_args(argv)
    interval = parse_duration(args.interval)
    fleet = generate(args.seed, args.days)
    history = record(fleet)
    cfg = Config()
    tallies = []
    for rung in LADDER:
        tallies.append(replay(fleet, f"fixed {rung.name}", fixed(rung), interval))
    pick, made = adaptive(history, cfg)
    tallies.append(replay(fleet, "adaptive (window)", pick, interval))
    rows = [t.row() for t in tallies]
    print(f"idle-window backtest: seed {args.seed}, {args.days} days, {sum(p.nodes for p in POOLS)} nodes of "
          f"{GPUS} GPUs in {len(POOLS)} pools, {len(fleet.spells)} idle spells, {len(fleet.faults)} faults "
          f"({sum(1 for f in fleet.faults if f.depth == 2)} load-only), due every {interval / 3600:g} h")
    print(f"adaptive: quantile {cfg.depth_quantile}, margin {cfg.depth_margin:.0%}, min samples "
          f"{cfg.depth_min_samples}, deep test every {cfg.depth_deep_after / 86400:g} days when the median window "
          "allows")
    print(table(rows))
    rules: dict[str, int] = {}
    for c in made:
        rules[c.rule] = rules.get(c.rule, 0) + 1
    print("adaptive choices by rule: " + ", ".join(f"{k} {v}" for k, v in sorted(rules.items())))
    history.close()


if __name__ == "__main__":
    main()
