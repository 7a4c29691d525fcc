"""Prometheus metrics with prometheus-client: per node the last sweep time and verdict, failed
checks, nodes held, replacements, the breaker, run duration and API errors. A CronJob cannot
be scraped, so `sweeper sweep` pushes them to a Pushgateway when one is configured;
`sweeper serve` exposes them on /metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, push_to_gateway

from sweeper.policy import VERDICTS


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.last_sweep = Gauge("sweeper_node_last_sweep_timestamp_seconds", "When the node was last swept",
                                ["node"], registry=r)
        self.verdict = Gauge("sweeper_node_verdict", "1 for the verdict of the node's last sweep", ["node", "verdict"],
                             registry=r)
        self.checks_failed = Gauge("sweeper_node_checks_failed", "Checks that failed in the node's last sweep",
                                   ["node"], registry=r)
        self.held = Gauge("sweeper_nodes_held", "GPU nodes Sweeper holds (tainted)", registry=r)
        self.gpu_nodes = Gauge("sweeper_gpu_nodes", "GPU nodes seen in the last run", registry=r)
        self.replacements = Counter("sweeper_replacements", "Replacements requested", ["provider"], registry=r)
        self.remediations = Counter("sweeper_remediations", "Remediations started", ["kind"], registry=r)
        self.breaker = Gauge("sweeper_breaker_open", "1 while the circuit breaker is open", registry=r)
        self.paused = Gauge("sweeper_paused", "1 while sweeping is paused", registry=r)
        self.run_seconds = Gauge("sweeper_run_duration_seconds", "Duration of the last run", ["mode"], registry=r)
        self.runs = Counter("sweeper_runs", "Runs finished", ["mode", "status"], registry=r)
        self.api_requests = Counter("sweeper_api_requests", "Kubernetes API requests made", registry=r)
        self.tool_errors = Counter("sweeper_tool_errors", "Sweeps that ended error because the check could not run "
                                   "(its image, its spec, admission): faults of the tool, not of nodes", ["reason"],
                                   registry=r)
        self.tool_stop = Gauge("sweeper_tool_error_stop", "1 when the last run stopped on a repeated fault of the check",
                               registry=r)
        self.api_errors = Counter("sweeper_api_errors", "Kubernetes API requests that failed (after retries too)",
                                  registry=r)

    def observe_run(self, report: Any, mode: str, api_errors: int = 0, breaker_open: bool = False,
                    paused: bool = False, failed_checks: dict[str, int] | None = None,
                    remedies: list[Any] | None = None, tool_errors: dict[str, str] | None = None,
                    tool_stop: bool = False) -> None:
        for o in report.outcomes:
            if not o.verdict or o.action in ("raced", "skipped", "would-take"):
                continue
            self.last_sweep.labels(o.node).set(report.finished)
            for v in VERDICTS:
                self.verdict.labels(o.node, v).set(1 if v == o.verdict else 0)
            self.checks_failed.labels(o.node).set((failed_checks or {}).get(o.node, 0))
        held_after = report.plan.held + sum(1 for o in report.outcomes if o.action == "held") \
            - sum(1 for d in report.plan.take if d.reason == "recheck")
        self.held.set(max(0, held_after))
        self.gpu_nodes.set(report.plan.gpu_nodes)
        for rem in remedies or []:
            if rem.dry_run or not rem.ok:
                continue
            if rem.provider in ("karpenter", "asg"):
                self.replacements.labels(rem.provider).inc()
            elif rem.provider in ("reboot", "gpu-reset"):
                self.remediations.labels(rem.provider).inc()
        for cause in (tool_errors or {}).values():
            self.tool_errors.labels(cause.split(":", 1)[0]).inc()  # the reason only: a bounded label
        self.tool_stop.set(1 if tool_stop else 0)
        self.breaker.set(1 if breaker_open else 0)
        self.paused.set(1 if paused else 0)
        self.run_seconds.labels(mode).set(max(0.0, report.finished - report.started))
        self.runs.labels(mode, "dry-run" if report.dry_run else "done").inc()
        self.api_requests.inc(report.api_requests)
        self.api_errors.inc(api_errors)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def push(self, gateway: str, job: str = "sweeper") -> None:
        push_to_gateway(gateway, job=job, registry=self.registry, timeout=10)
