"""What a person waits for at the terminal, each command run as a whole process (interpreter
start, imports, the work, the printing): the start-up of `--help` and of the commands people run
most, `sweeper nodes --offline` of 10,000 nodes into a pipe and onto a terminal, and
`sweeper history NODE` on the benchmark database of benchmarks/history.py (10,000 nodes,
1,000,000 check rows). Targets: start-up under 150 ms, `nodes` under 1 s, `history` under 250 ms.

    python -m benchmarks.cli [--nodes 10000] [--sweeps-per-node 10] [--repeat 5] [--state FILE]

`--state` reuses a database built before (building the full one takes about half a minute).
The median of `--repeat` runs is printed, with the fastest in brackets: on a shared machine the
fastest is the closest to what the code costs. As in an installed package (pip compiles bytecode
when it installs), the commands run from bytecode: a warm-up run writes it, even where
PYTHONDONTWRITEBYTECODE is set for everything else. `python -X importtime -m sweeper.cli --help`
shows where a start-up goes.
"""

from __future__ import annotations

import argparse
import os
import pty
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.history import build


def run(argv: list[str], tty: bool = False) -> float:
    """Seconds for one `sweeper ...` process, its output read to the end (a pipe, or a terminal)."""
    cmd = [sys.executable, "-m", "sweeper.cli", *argv]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"COLUMNS": "120"}
    t0 = time.perf_counter()
    if not tty:
        proc = subprocess.run(cmd, capture_output=True, env=env, check=False)
        took = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.decode()[-500:]}")
        return took
    leader, follower = pty.openpty()
    proc2 = subprocess.Popen(cmd, stdout=follower, stderr=subprocess.DEVNULL, env=env)
    os.close(follower)
    while True:  # drain what the terminal shows, as a terminal would
        try:
            if not os.read(leader, 1 << 16):
                break
        except OSError:
            break
    proc2.wait()
    os.close(leader)
    return time.perf_counter() - t0


def timed(argv: list[str], repeat: int, tty: bool = False) -> str:
    run(argv, tty)  # warm-up: bytecode written, files in the page cache
    times = [run(argv, tty) for _ in range(repeat)]
    return f"{statistics.median(times) * 1000:7.0f} ms  (fastest {min(times) * 1000:.0f} ms)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--sweeps-per-node", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--state", help="a history database built earlier by this benchmark or benchmarks.history")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(args.state) if args.state else Path(tmp) / "history.db"
        if not state.exists():
            built = build(state, args.nodes, args.sweeps_per_node)
            print(f"database: {args.nodes:,} nodes x {args.sweeps_per_node} sweeps, built in {built:.1f} s")
        node = f"node-{args.nodes // 2:05d}"
        floor = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            floor.append(time.perf_counter() - t0)
        print(f"python -c pass (the floor):         {statistics.median(floor) * 1000:7.0f} ms  "
              f"(fastest {min(floor) * 1000:.0f} ms)")
        for argv in (["--help"], ["history", "--help"], ["nodes", "--help"], ["plan", "--help"]):
            print(f"start-up: sweeper {' '.join(argv):<17}{timed(argv, args.repeat)}")
        print(f"sweeper history NODE (1M rows):     {timed(['history', node, '--state', str(state)], args.repeat)}")
        nodes = ["nodes", "--offline", "--state", str(state)]
        print(f"sweeper nodes --offline, a pipe:    {timed(nodes, args.repeat)}")
        print(f"sweeper nodes --offline, a tty:     {timed(nodes, args.repeat, tty=True)}")
        print(f"sweeper nodes --offline -o json:    {timed([*nodes, '-o', 'json'], args.repeat)}")


if __name__ == "__main__":
    main()
