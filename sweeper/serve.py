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
exposes /metrics (Prometheus), /healthz, / (the fleet report, refreshed), and the history
read-only as JSON under /api/v1/ (sweeper.remote reads it through the API server's service proxy,
so `sweeper nodes`, `history` and `report` on a laptop show the cluster's history). SIGTERM stops
the running sweep (its nodes are handed back), waits for it, and exits 0.

Bad data and load end no more than they must: any exception ends only the run it happened in;
/healthz answers 503 when the queue thread is dead or no run has finished for longer than the
schedules allow; the page on / is rendered by one request at a time and kept PAGE_TTL seconds;
at most MAX_CONNECTIONS requests are served at once (more are answered 503 at once), each
socket read or write times out after SOCKET_TIMEOUT seconds; it listens on 127.0.0.1 unless told
otherwise."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

from apscheduler.events import EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from sweeper.clock import parse_duration
from sweeper.config import Config
from sweeper.errors import ConfigError, LockHeld, SweeperError
from sweeper.metrics import Metrics
from sweeper.policy import load_policy
from sweeper.remedy import preflight
from sweeper.report import gather, render
from sweeper.schedules import DEFAULT_SCHEDULE, longest_gap, trigger, with_default_schedule

__all__ = ["DEFAULT_SCHEDULE", "Server", "longest_gap", "serve", "trigger", "with_default_schedule"]
from sweeper.sweep import Sweep
from sweeper.views import fleet_rows, report_page

PAGE_TTL = 30.0  # seconds a rendered / is served again (the page itself refreshes every 60)
MAX_CONNECTIONS = 32  # requests served at once; more are answered 503 without a thread
SOCKET_TIMEOUT = 10.0  # seconds one read or write of a request's socket may take
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")  # the report has no script: none may run, whatever the data holds
API = "/api/v1/"  # the read-only history (Server.read)
JSON = "application/json"
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nbusy\n")


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per request up to MAX_CONNECTIONS; past that, 503 from the accepting thread."""

    daemon_threads = True
    request_queue_size = 128  # connections the kernel holds for accept(): a burst is answered, not dropped

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 limit: int = MAX_CONNECTIONS) -> None:
        self.slots = threading.BoundedSemaphore(limit)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class Server:
    def __init__(self, cfg: Config, kube: Any, history: Any, *, port: int = 8080, host: str = "127.0.0.1",
                 log: Callable[[str], None] = print, misfire_grace: float = 300.0,
                 max_connections: int = MAX_CONNECTIONS, socket_timeout: float = SOCKET_TIMEOUT) -> None:
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
            # A schedule that names a playbook (other than the config's) or a DCGM level runs that, not the ladder.
            own = sch.get("playbook") not in (None, cfg.playbook) or sch.get("dcgm_level") is not None
            run_cfg = cfg.with_overrides(playbook=sch.get("playbook"), max_nodes=sch.get("max_nodes"),
                                         dcgm_level=sch.get("dcgm_level"), depth_ladder=() if own else None,
                                         interval=parse_duration(sch["interval"]) if sch.get("interval") else None)
            self.scheduler.add_job(self.fire, trigger(str(sch["cron"])), args=[str(sch["name"]), run_cfg],
                                   id=str(sch["name"]), name=str(sch["name"]))
        self.scheduler.add_listener(self._missed, EVENT_JOB_MISSED)
        now = time.time()
        # /healthz fails when no run has finished for this long: the longest wait between two firings
        # of a schedule, a whole run (run_deadline, and as long again for the nodes under test to
        # finish), and the grace time of a missed firing.
        gaps = [longest_gap(trigger(str(sch["cron"])), now) for sch in cfg.schedules]
        run = 2 * cfg.run_deadline if cfg.run_deadline > 0 else 86400.0
        self.stale_after = max(gaps, default=0.0) + run + misfire_grace + 60.0
        self.last_done = now  # when the latest run ended (or the server started)
        self._page: tuple[float, bytes] | None = None
        self._page_lock = threading.Lock()  # one render at a time; the others wait for its page
        self._read_lock = threading.Lock()  # one read of the API at a time (the history is one connection)
        self.socket_timeout = socket_timeout
        self.httpd = BoundedHTTPServer((host, port), self._handler(), max_connections)
        self._http: threading.Thread | None = None

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
            try:
                self.run_schedule(name, cfg)
            except Exception as exc:  # noqa: BLE001 - a bug or bad data ends this run, never the queue
                self.log(f"schedule {name}: run failed on an unexpected {type(exc).__name__}: {exc}")
                self.metrics.runs.labels(f"schedule:{name}", "failed").inc()
            finally:
                self.last_done = time.time()

    def healthy(self) -> tuple[bool, str]:
        """Whether sweeps still happen: the scheduler and the queue thread alive, a recent run."""
        if self.stopping.is_set():
            return False, "stopping"
        if not self.scheduler.running:
            return False, "the scheduler is not running"
        if not self._queue.is_alive():
            return False, "the queue thread is dead: no sweep can run"
        idle = time.time() - self.last_done
        if idle > self.stale_after and not self.running:
            return False, f"no run has ended for {idle:.0f}s (the schedules allow {self.stale_after:.0f}s)"
        if idle > self.stale_after + self.cfg.run_deadline + 600:
            return False, f"the running sweep has gone {idle:.0f}s without ending"
        return True, "ok"

    def page(self) -> bytes:
        """The live report, rendered by one request at a time and kept PAGE_TTL seconds."""
        with self._page_lock:
            if self._page is not None and time.monotonic() - self._page[0] < PAGE_TTL:
                return self._page[1]
            now = time.time()
            data = gather(self.history, self.policy, now - 30 * 86400, now, self.cfg.interval)
            body = render(data, "Sweeper fleet report (live)", refresh=60).encode()
            self._page = (time.monotonic(), body)
            return body

    def read(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes, str]:
        """The read-only API, under /api/v1/: `nodes` (the fleet's rows, as `sweeper nodes` shows them),
        `nodes/NAME/history` (`since`: seconds back; `check`: a name prefix), and `report` (the HTML
        page; `since`, `node`). Times are epoch seconds; nothing here writes."""
        def arg(name: str) -> str:
            return (query.get(name) or [""])[-1]

        parts = [unquote(p) for p in path.strip("/").split("/")]
        since = float(arg("since")) if arg("since") else None
        with self._read_lock:
            now = time.time()
            cutoff = now - since if since is not None else None
            if parts == ["nodes"]:
                return 200, _json({"nodes": fleet_rows(self.history, self.cfg, self.kube, now), "generated": now}), JSON
            if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "history":
                h = self.history.node_history(parts[1], cutoff, check=arg("check"))
                return 200, _json({**h, "known": bool(h["sweeps"] or h["actions"] or h["pruned_days"])
                                   or self.history.knows(parts[1]), "generated": now}), JSON
            if parts == ["report"]:
                node = arg("node") or None
                if node is not None and not self.history.node_history(node)["sweeps"]:
                    return 404, _json({"error": f"no sweep of {node!r} in the history"}), JSON
                page, _ = report_page(self.history, self.cfg, self.policy, cutoff or now - 30 * 86400,
                                      gpu=None, node=node)
                return 200, page.encode(), "text/html; charset=utf-8"
        return 404, _json({"error": f"no {API}{path}"}), JSON

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
            timeout = server.socket_timeout  # each read and write of the socket; a silent client is dropped
            disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK wait between them

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                return

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Security-Policy", CSP)
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # a timed-out or closed client
                    self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802
                path, _, query = self.path.partition("?")
                if path.startswith(API):
                    try:
                        code, body, ctype = server.read(path[len(API):], parse_qs(query))
                    except Exception as exc:  # noqa: BLE001 - a history that cannot be read: say so
                        server.log(f"{path}: could not be read: {type(exc).__name__}: {exc}")
                        code, body, ctype = 500, _json({"error": "the history could not be read; see the log"}), JSON
                    self._send(code, body, ctype)
                elif path == "/metrics":
                    self._send(200, server.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/healthz":
                    ok, why = server.healthy()
                    self._send(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
                elif path in ("/", "/index.html"):
                    try:
                        body = server.page()
                    except Exception as exc:  # noqa: BLE001 - a history the report cannot draw: say so
                        server.log(f"the report could not be drawn: {type(exc).__name__}: {exc}")
                        self._send(500, b"the report could not be drawn; see the log\n", "text/plain")
                        return
                    self._send(200, body, "text/html; charset=utf-8")
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
        except Exception as exc:  # noqa: BLE001 - bad data in the cluster: the runs will say more
            self.log(f"could not read the cluster at start ({type(exc).__name__}: {exc}); /metrics fills with "
                     "the first run")
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
        self.start_http()
        jobs = ", ".join(f"{j.id} ({j.trigger})" for j in self.scheduler.get_jobs())
        self.log(f"serving on {self.httpd.server_address[0]!s}:{self.port}; schedules: {jobs}")

    def start_http(self) -> None:
        """Answer /metrics, /healthz and / (on a thread of its own)."""
        self._http = threading.Thread(target=self.httpd.serve_forever, name="serve-http", daemon=True)
        self._http.start()

    def stop(self) -> None:
        """Stop taking runs, stop the running sweeps (they hand their nodes back), wait for them."""
        self.stopping.set()
        if self.scheduler.running:
            self.scheduler.pause()
        with self._lock:
            for sweep in self.running.values():
                sweep.stop.set()
            self._wake.set()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        if self._queue.is_alive():
            self._queue.join()
        if self._http is not None:
            self.httpd.shutdown()
        self.httpd.server_close()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, default=str).encode()


def serve(cfg: Config, kube: Any, history: Any, port: int, host: str, log: Callable[[str], None],
          stop: threading.Event) -> None:
    server = Server(cfg, kube, history, port=port, host=host, log=log)
    server.start()
    stop.wait()
    log("stopping: handing back the nodes of the running sweep")
    server.stop()
    log("stopped")



