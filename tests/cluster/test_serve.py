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

import pytest

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


@pytest.mark.realtime("`sweeper serve` in a process of its own: its schedules fire on the wall clock, then a SIGTERM")
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


def test_metrics_are_filled_from_the_cluster_and_the_history_before_the_first_run(make_sim, history: History) -> None:
    """Once 0 held and 0 GPU nodes until the first firing, which may be hours away."""
    from dataclasses import replace

    from sweeper.serve import Server
    from tests.conftest import TEST_CONFIG

    sim: Sim = make_sim(nodes=3)
    sim.core.patch_node("gpu-01", {"spec": {"taints": [{"key": "sweeper.dev/sweep", "value": "sw-earlier",
                                                        "effect": "NoSchedule"}]}})
    sid = history.sweep_started("sw-earlier", "gpu-02", 1_790_000_000.0, "sweep-light.yaml", "p5.48xlarge")
    history.sweep_finished(sid, 1_790_000_060.0, "warn", ["nvlink replay rising"])
    cfg = replace(TEST_CONFIG, schedules=({"name": "yearly", "cron": "0 0 1 1 *", "playbook": "sweep-light.yaml"},))
    server = Server(cfg, sim.kube, history, port=0, host="127.0.0.1", log=lambda m: None)
    server.start()
    try:
        text = server.metrics.exposition().decode()
        code, served = get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    assert code == 200 and served == text
    assert "sweeper_gpu_nodes 3.0" in text and "sweeper_nodes_held 1.0" in text and "sweeper_breaker_open 0.0" in text
    assert 'sweeper_node_verdict{node="gpu-02",verdict="warn"} 1.0' in text
    assert 'sweeper_node_last_sweep_timestamp_seconds{node="gpu-02"} 1.79000006e+09' in text
    assert "sweeper_runs_total{" not in text, "no run happened"


@pytest.mark.realtime("`sweeper serve` in a process of its own, stopped by SIGTERM")
def test_serve_without_a_config_takes_the_cronjob_schedule_and_listens_on_loopback(make_sim, tmp_path: Path) -> None:
    """The README shows `sweeper serve` alone; it once failed for want of `schedules` and bound 0.0.0.0."""
    sim: Sim = make_sim(nodes=2)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "serve", "--kubeconfig", str(sim.kubeconfig),
                             "--state", str(tmp_path / "h.db"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        code = 0
        while time.monotonic() < deadline and proc.poll() is None and code != 200:
            time.sleep(0.2)
            try:
                code, _ = get(f"http://127.0.0.1:{port}/healthz")
            except OSError:
                continue
        assert code == 200, proc.stdout.read() if proc.poll() is not None and proc.stdout else "not up"
        code, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200 and "sweeper_gpu_nodes 2.0" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "no `schedules` in the config" in out and "'*/30 * * * *'" in out
    assert f"serving on 127.0.0.1:{port}" in out
