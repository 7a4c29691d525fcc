"""`sweeper serve` as a process: two schedules on second-level cron triggers against the
simulated cluster, never overlapping (the sweep Lease), /metrics, /healthz and the live
report, and a clean stop on SIGTERM with every node handed back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from sweeper.history import History
from tests.conftest import Sim


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_serve_runs_two_schedules_without_overlap_and_stops_cleanly(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=3)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("""
max_percent: 100
interval: 1s
poll_interval: 0.05
light_playbook: ""
schedules:
  - {name: light, cron: "*/2 * * * * *", playbook: sweep-light.yaml}
  - {name: deep, cron: "*/3 * * * * *", playbook: sweep-dcgm.yaml, max_nodes: 1}
""")
    state = tmp_path / "h.db"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "serve", "--config", str(cfg), "--kubeconfig",
                             str(sim.kubeconfig), "--state", str(state), "--port", str(port), "--host", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 60
        modes: set[str] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if state.exists():
                h = History(state)
                modes = {r["mode"] for r in h.db.query("select mode from runs where finished is not null")}
                runs = h.db.execute("select count(*) from runs where finished is not null").fetchone()[0]
                h.close()
                if {"schedule:light", "schedule:deep"} <= modes and runs >= 5:
                    break
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert {"schedule:light", "schedule:deep"} <= modes
        assert get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
        code, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200 and 'sweeper_runs_total{mode="schedule:light",status="done"}' in metrics
        assert "sweeper_node_last_sweep_timestamp_seconds" in metrics
        code, page = get(f"http://127.0.0.1:{port}/")
        assert code == 200 and "Sweeper fleet report (live)" in page and 'http-equiv="refresh"' in page
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped" in out
    h = History(state)
    runs = list(h.db.query("select id, mode, started, finished, status from runs order by started"))
    assert all(r["finished"] is not None for r in runs), "every run finished, the one SIGTERM cut short included"
    for a, b in zip(runs, runs[1:], strict=False):
        assert a["finished"] <= b["started"], f"runs overlap: {a} and {b}"
    h.close()
    for n in sim.core.list_node().items:
        assert not [t for t in n.spec.taints or [] if t.key == "sweeper.dev/sweep"], "every node handed back"
