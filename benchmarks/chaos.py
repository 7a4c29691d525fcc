"""Chaos: `sweeper sweep` killed with SIGKILL at random points, under API faults, run after run.

    python -m benchmarks.chaos [--kills 40] [--nodes 8] [--seed 7] [--json]

Each round starts `sweeper sweep` as its own process against the simulated cluster over HTTP
(5xx and 429 answers, replies lost after the write, dropped connections) and kills it after a
random number of API requests; the next round's run reconciles what the dead one left. After
the last kill, runs go on until one finishes cleanly. Then it reads the cluster and the history
and prints: kills, open sweep rows left, lost verdicts (a verdict the intent log proves that the
history does not hold), stray taints (Sweeper's taint on a node no recorded verdict holds), stray
Jobs, and dismissals (no person released anything, so any is a false one). Exit 1 if any of
those is not zero.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from sweeper.clock import iso_micro
from sweeper.config import Config
from sweeper.history import History
from sweeper.policy import HOLDING
from sweeper.sim.cluster import SimCluster
from sweeper.sim.errors import ApiError
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer

FAULTS = {"rate": 0.03, "lost_reply_rate": 0.03, "drop_rate": 0.01}


def fleet(nodes: int, seed: int) -> dict[str, Any]:
    """Two failing nodes (XID 79: reboot; a row-remap failure: replace) and two busy ones (light checks)."""
    return {"name": "chaos", "seed": seed, "speed": 600,
            "node_groups": [{"name_prefix": "gpu-", "count": nodes, "instance_type": "p5.48xlarge", "age": "2d"}],
            "faults": {"gpu-01": {"xids": [{"code": 79, "gpu": 2}]}, "gpu-04": {"remap_failure": [3]}},
            "workloads": [{"node": f"gpu-{nodes - 1:02d}", "gpus": 8, "duration": None},
                          {"node": f"gpu-{nodes - 2:02d}", "gpus": 8, "duration": None}],
            "api_faults": FAULTS}


def measure(cluster: SimCluster, state: Path, cfg: Config) -> dict[str, Any]:
    store = cluster.store
    with store.lock:
        taints = {n["metadata"]["name"]: (t.get("value", ""), (n["metadata"].get("annotations") or {}))
                  for n in store.iter("nodes") for t in n["spec"].get("taints") or [] if t.get("key") == cfg.taint_key}
        jobs = [j["metadata"]["name"] for j in store.iter("jobs")]
    h = History(state)
    try:
        open_rows = h.db.execute("select count(*) from node_sweeps where finished is null").fetchone()[0]
        lost = []  # a row left open counts too when its verdict was reached
        for row in h.db.query("select run_id, node, verdict from node_sweeps"):
            proven = h.proven_verdict(row["run_id"], row["node"])
            if proven and proven["verdict"] != row["verdict"] and \
                    (proven["verdict"], row["verdict"]) != ("replace", "quarantine"):  # the run's own cap
                lost.append(f"{row['node']} (run {row['run_id']}): {proven['verdict']} recorded as "
                            f"{row['verdict'] or 'nothing (left open)'}")
        held, stray = {}, []
        for node, (run, ann) in sorted(taints.items()):
            last = list(h.db.query("select verdict from node_sweeps where node = ? and finished is not null and "
                                   "kind = 'sweep' order by finished desc limit 1", [node]))
            verdict = last[0]["verdict"] if last else ""
            if verdict in HOLDING and ann.get(f"{cfg.prefix}/verdict") == verdict:
                held[node] = verdict
            else:
                stray.append(f"{node} (run {run}, last verdict {verdict or 'none'})")
        runs: dict[str, int] = {}
        for r in h.db.query("select status, count(*) as n from runs group by status"):
            runs[r["status"]] = r["n"]
        dismissals = h.db.execute("select count(*) from actions where action = 'false-positive'").fetchone()[0]
        sweeps = h.db.execute("select count(*) from node_sweeps").fetchone()[0]
    finally:
        h.close()
    return {"open_sweep_rows": open_rows, "lost_verdicts": lost, "stray_taints": stray, "stray_jobs": jobs,
            "dismissals": dismissals, "held": held, "runs_by_status": runs, "sweep_rows": sweeps}


def chaos(kills: int, nodes: int, seed: int, max_requests: int) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster = SimCluster(parse_fleet(fleet(nodes, seed)))
    cfg = Config(lock_ttl=3)
    with ApiServer(cluster).start() as server, tempfile.TemporaryDirectory() as tmp:
        # A client killed mid-request breaks its connection: expected here, not worth a traceback.
        server.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        kc = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        config, state = Path(tmp) / "config.yaml", Path(tmp) / "history.db"
        config.write_text(yaml.safe_dump({"max_nodes": 4, "max_percent": 100, "poll_interval": 0.05,
                                          "check_timeout": 300, "lock_ttl": cfg.lock_ttl, "api_attempts": 6,
                                          "interval": 1, "light_interval": 1}))  # every node due again at the next run
        cmd = [sys.executable, "-m", "sweeper.cli", "sweep", "--kubeconfig", str(kc), "--state", str(state),
               "--config", str(config), "--json"]
        exits: dict[str, int] = {}
        killed = rounds = 0
        guard = threading.Lock()
        while killed < kills and rounds < kills * 3:
            rounds += 1
            at = rng.randint(1, max_requests)
            seen = {"n": 0, "killed": False}
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            def hook(stage: str, method: str, path: str, proc: subprocess.Popen[bytes] = proc,
                     seen: dict[str, Any] = seen, at: int = at) -> None:
                with guard:
                    seen["n"] += 1
                    if seen["n"] == at and not seen["killed"]:
                        seen["killed"] = True
                        os.kill(proc.pid, signal.SIGKILL)
                        proc.wait()

            server.hooks.append(hook)
            rc = proc.wait(timeout=600)
            server.hooks.clear()
            if seen["killed"]:
                killed += 1
                expire_lease(cluster, cfg)  # the dead run's Lease runs out (its TTL, in simulated time)
            else:
                exits[str(rc)] = exits.get(str(rc), 0) + 1
        final = []
        for _ in range(5):  # runs until one finishes cleanly (a 5xx may still end one early)
            rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600).returncode
            final.append(rc)
            if rc == 0:
                break
        figures = measure(cluster, state, cfg)
    return {"kills": killed, "runs": rounds + len(final), "exits_unkilled": exits, "final_runs": final,
            "nodes": nodes, "api_faults": FAULTS, **figures}


def expire_lease(cluster: SimCluster, cfg: Config) -> None:
    """Age the Lease past its duration. The sweeper processes read the wall clock (the simulated
    one runs 600 times faster), so its renewTime goes an hour back in wall-clock time."""
    def stale(lease: dict[str, Any]) -> None:
        lease["spec"]["renewTime"] = iso_micro(time.time() - 3600)

    try:
        cluster.store.mutate("leases", cfg.namespace, cfg.lock_name, stale)
    except ApiError:  # no Lease yet: the run died before taking it
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=40)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-requests", type=int, default=300, help="kill after 1..N API requests of a run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = chaos(args.kills, args.nodes, args.seed, args.max_requests)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        f = r["api_faults"]
        print(f"chaos: {r['kills']} SIGKILLs in {r['runs']} runs of `sweeper sweep` on {r['nodes']} nodes, API faults "
              f"{f['rate']:.0%} 5xx/429, {f['lost_reply_rate']:.0%} lost replies, {f['drop_rate']:.0%} dropped")
        print(f"runs not killed, by exit code: {r['exits_unkilled']}; final runs: {r['final_runs']}")
        print(f"runs by status in the history: {r['runs_by_status']}; sweep rows: {r['sweep_rows']}")
        print(f"open sweep rows left: {r['open_sweep_rows']}")
        print(f"lost verdicts: {len(r['lost_verdicts'])}" + "".join(f"\n  {x}" for x in r["lost_verdicts"]))
        print(f"stray taints: {len(r['stray_taints'])}" + "".join(f"\n  {x}" for x in r["stray_taints"]))
        print(f"stray Jobs: {len(r['stray_jobs'])}" + "".join(f"\n  {x}" for x in r["stray_jobs"]))
        print(f"dismissals recorded: {r['dismissals']}")
        print("held at the end: " + (", ".join(f"{n} ({v})" for n, v in r["held"].items()) or "none"))
    bad = r["open_sweep_rows"] or r["lost_verdicts"] or r["stray_taints"] or r["stray_jobs"] or r["dismissals"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
