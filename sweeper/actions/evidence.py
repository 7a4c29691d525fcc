"""The evidence Job: run `sweeper evidence` on a held node (sweeper-evidence.yaml.j2, through the
scheduler as the check ran), follow it with the one Job-following loop, and read the bundle out
of its pod's log. What goes wrong is said in words and never touches the node's verdict: evidence
is kept for people, not judged."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweeper.actions import ActionContext
from sweeper.actions.follow import Shape, follow, job_created, watched
from sweeper.actions.jobs import EVIDENCE_TEMPLATE, render_job
from sweeper.actions.podstate import finished
from sweeper.errors import KubeError
from sweeper.result import Result, error_result

# What the pod's log may hold besides the bundle (the command's own lines) on top of its base64.
LOG_SLACK = 64 * 1024


@dataclass
class Evidence:
    """A held node's bundle (None when there is none) and its manifest, or why there is none."""

    bundle: bytes | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    why: str = ""


def collect_evidence(ctx: ActionContext, cap: int, timeout: float) -> Evidence:
    """Run the evidence Job on the held node `ctx.node` and read its bundle (at most `cap` bytes)."""
    # Here, not above: the node-side checks it sits beside (NVML among them) are no part of a sweep's start.
    from sweeper.checks.evidence import BundleError, extract, read_manifest

    node = str((ctx.node or {}).get("name", ""))
    job = render_job(ctx, EVIDENCE_TEMPLATE, timeout, {"evidence_max_bytes": cap})
    namespace, name = ctx.config.check_namespace, job["metadata"]["name"]
    got = Evidence()

    def read(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        now = ctx.clock.now()
        done = [p for p in pods if finished(p)]
        if not done:
            got.why = "the evidence Job finished but none of its pods is left to read"
            return error_result(node, "evidence", got.why, now)
        pod = max(done, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        try:
            log = ctx.kube.pod_log(namespace, pod["metadata"]["name"], limit_bytes=cap * 4 // 3 + cap // 38 + LOG_SLACK)
        except KubeError as exc:
            got.why = f"cannot read the evidence pod's log: {exc}"
            return error_result(node, "evidence", got.why, now)
        try:
            bundle = extract(log, cap)
            got.manifest = read_manifest(bundle)
        except BundleError as exc:
            got.why = str(exc)
            return error_result(node, "evidence", got.why, now)
        got.bundle = bundle
        return Result(node=node, source="evidence", started=now, finished=now, checks=(), status="pass")

    with watched(ctx, namespace, name) as source, job_created(ctx, namespace, job):
        outcome = follow(ctx, source, Shape(node), timeout, False, read)
    if got.bundle is None and not got.why:
        result = outcome.result
        hung = result is not None and any(c.code == "DeadlineExceeded" for c in result.checks)
        got.why = (f"the evidence Job did not finish within {int(timeout)}s (evidence_timeout)" if hung else
                   outcome.inconclusive or ("; ".join(c.message for c in result.checks)[:500] if result else "")
                   or "the evidence Job gave no bundle")
    return got
