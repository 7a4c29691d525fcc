"""`sweeper serve`: sweeping on schedules, as a long-running Deployment instead of a CronJob.

One rolling queue: a single thread runs one sweep at a time, each a rolling run (nodes taken
as slots free up, until none is due or run_deadline). APScheduler 3 fires each schedule of
the config on its cron trigger (seconds allowed, for tests and tight loops), and a firing
gives that schedule the next turn: a firing of the schedule whose run is going is part of
that run, one of a schedule already waiting is coalesced, and one of another schedule asks
the running sweep to take no new node (those under test finish), so the schedules take
turns. A missed firing within the grace time fires once, later ones are skipped. Every run
takes the same Lease as the CronJob, so a serve and a CronJob never sweep at once: a run
that finds the lock held records it and waits for its schedule's next firing. An HTTP server
exposes /metrics (Prometheus), /healthz, and / (the fleet report, refreshed). SIGTERM stops
the running sweep (its nodes are handed back), waits for it, and exits 0."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from apscheduler.events import EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from sweeper.clock import parse_duration
from sweeper.config import Config
from sweeper.errors import ConfigError, LockHeld, SweeperError
from sweeper.metrics import Metrics
from sweeper.policy import load_policy
from sweeper.remedy import preflight
from sweeper.report import gather, render
from sweeper.sweep import Sweep


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


class Server:
    def __init__(self, cfg: Config, kube: Any, history: Any, *, port: int = 8080, host: str = "0.0.0.0",
                 log: Callable[[str], None] = print, misfire_grace: float = 300.0) -> None:
        if not cfg.schedules:
            raise ConfigError("no schedules in the config: add `schedules: [{name, cron, playbook}]`")
        preflight(cfg)  # at start-up: a provider that cannot act (asg without AWS credentials) exits 3
        self.cfg, self.kube, self.history, self.log = cfg, kube, history, log
        self.metrics = Metrics()
        self.scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": int(misfire_grace)})
        self.running: dict[str, Sweep] = {}  # the schedule whose sweep is running (one at most)
        self.waiting: dict[str, Config] = {}  # schedules that fired and wait their turn, in firing order
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queue = threading.Thread(target=self._turns, name="serve-queue", daemon=True)
        self.policy = load_policy(cfg.path("policies") / cfg.policy)
        for sch in cfg.schedules:
            run_cfg = cfg.with_overrides(playbook=sch.get("playbook"), max_nodes=sch.get("max_nodes"),
                                         dcgm_level=sch.get("dcgm_level"),
                                         interval=parse_duration(sch["interval"]) if sch.get("interval") else None)
            self.scheduler.add_job(self.fire, trigger(str(sch["cron"])), args=[str(sch["name"]), run_cfg],
                                   id=str(sch["name"]), name=str(sch["name"]))
        self.scheduler.add_listener(self._missed, EVENT_JOB_MISSED)
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def _missed(self, event: JobExecutionEvent) -> None:
        self.log(f"schedule {event.job_id}: a firing was missed (beyond the grace time); skipped")

    def fire(self, name: str, cfg: Config) -> None:
        """A schedule's cron firing: its turn in the queue (see the module's docstring)."""
        with self._lock:
            if self.stopping.is_set() or name in self.running:
                return
            self.waiting.setdefault(name, cfg)
            for sweep in self.running.values():
                sweep.drain.set()
            self._wake.set()

    def _turns(self) -> None:
        """The rolling queue: the waiting schedules' sweeps, one after another, in firing order."""
        while not self.stopping.is_set():
            self._wake.wait()
            with self._lock:
                if not self.waiting or self.stopping.is_set():
                    self._wake.clear()
                    continue
                name = next(iter(self.waiting))
                cfg = self.waiting.pop(name)
            self.run_schedule(name, cfg)

    def run_schedule(self, name: str, cfg: Config) -> None:
        if self.stopping.is_set():
            return
        t0 = time.monotonic()
        sweep = Sweep(self.kube, cfg, self.history, mode=f"schedule:{name}")
        with self._lock:
            if self.stopping.is_set():
                return
            self.running[name] = sweep
            if self.waiting:
                sweep.drain.set()  # another schedule fired meanwhile: this one takes its first plan, then yields
        try:
            report = sweep.run()
        except LockHeld as exc:
            self.log(f"schedule {name}: another sweep holds the lock ({exc}); waiting for the next firing")
            self.metrics.runs.labels(f"schedule:{name}", "lock-held").inc()
            return
        except SweeperError as exc:
            self.log(f"schedule {name}: run failed: {exc}")
            self.metrics.runs.labels(f"schedule:{name}", "failed").inc()
            return
        finally:
            with self._lock:
                self.running.pop(name, None)
        sweep.observe(self.metrics, report, f"schedule:{name}")
        self.log(f"schedule {name}: {len(report.outcomes)} node(s) in {time.monotonic() - t0:.1f}s")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                return

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                if path == "/metrics":
                    self._send(200, server.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/healthz":
                    ok = server.scheduler.running and not server.stopping.is_set()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"stopping\n", "text/plain")
                elif path in ("/", "/index.html"):
                    now = time.time()
                    data = gather(server.history, server.policy, now - 30 * 86400, now, server.cfg.interval)
                    self._send(200, render(data, "Sweeper fleet report (live)", refresh=60).encode(),
                               "text/html; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain")

        return Handler

    def prime(self) -> None:
        """Fill /metrics before the first run: the GPU nodes and those held, from the cluster; the
        breaker and pause switches; each node's last sweep and verdict, from the history. A cluster
        that cannot be read is logged; the gauges then fill with the first run."""
        from sweeper.fleet import plan
        from sweeper.policy import VERDICTS

        try:
            sweep = Sweep(self.kube, self.cfg, self.history)
            gates = sweep.gates()
            p = plan(self.kube.list_nodes(self.cfg.gpu_node_selector, page_size=self.cfg.page_size),
                     self.kube.active_pods(page_size=self.cfg.page_size), self.cfg, self.history.last_swept(),
                     time.time(), gates)
        except SweeperError as exc:
            self.log(f"could not read the cluster at start ({exc}); /metrics fills with the first run")
            return
        m = self.metrics
        m.gpu_nodes.set(p.gpu_nodes)
        m.held.set(p.held)
        m.breaker.set(1 if gates.breaker else 0)
        m.paused.set(1 if gates.paused else 0)
        for row in self.history.fleet():
            m.last_sweep.labels(row["node"]).set(row["finished"] or row["started"])
            for v in VERDICTS:
                m.verdict.labels(row["node"], v).set(1 if v == row["verdict"] else 0)

    def start(self) -> None:
        self.prime()
        self.scheduler.start()
        self._queue.start()
        threading.Thread(target=self.httpd.serve_forever, name="serve-http", daemon=True).start()
        jobs = ", ".join(f"{j.id} ({j.trigger})" for j in self.scheduler.get_jobs())
        self.log(f"serving on {self.httpd.server_address[0]!s}:{self.port}; schedules: {jobs}")

    def stop(self) -> None:
        """Stop taking runs, stop the running sweeps (they hand their nodes back), wait for them."""
        self.stopping.set()
        self.scheduler.pause()
        with self._lock:
            for sweep in self.running.values():
                sweep.stop.set()
            self._wake.set()
        self.scheduler.shutdown(wait=True)
        if self._queue.is_alive():
            self._queue.join()
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(cfg: Config, kube: Any, history: Any, port: int, host: str, log: Callable[[str], None],
          stop: threading.Event) -> None:
    server = Server(cfg, kube, history, port=port, host=host, log=log)
    server.start()
    stop.wait()
    log("stopping: handing back the nodes of the running sweep")
    server.stop()
    log("stopped")



