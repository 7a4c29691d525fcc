"""A held node's evidence, kept before its remedy takes the node away: the evidence Job's bundle
(sweeper.actions.evidence), stored in S3 where `evidence_bucket` names a bucket, else in the
history, keyed by node and run so that a node Karpenter removed still has it. No evidence is ever
a fault of the node: what went wrong is an action row in words, and the verdict stands."""

from __future__ import annotations

import hashlib

from sweeper import profiles
from sweeper.actions.evidence import Evidence, collect_evidence
from sweeper.aws import AwsError, EvidenceBucket
from sweeper.errors import KubeError, PlaybookError
from sweeper.fleet import NodeView
from sweeper.sweep.play import context, node_vars
from sweeper.sweep.state import Run


def keep_evidence(run: Run, node: NodeView, profile: profiles.Profile, sweep_id: int) -> str:
    """Collect and store the held node's bundle; where it went ("" when there is none)."""
    cfg, name, now = run.cfg, node.name, run.clock.now
    if not cfg.evidence or run.dry_run:
        return ""
    ctx = context(run, sweep_id, name, node_vars(node, profile))
    run.rec.intent(run.id, name, now(), "evidence", "before", "")
    try:
        got = collect_evidence(ctx, cfg.evidence_max_bytes, cfg.evidence_timeout)
    except (KubeError, PlaybookError) as exc:
        got = Evidence(why=f"the evidence Job could not run: {exc}")
    run.rec.intent(run.id, name, now(), "evidence", "after", got.why[:500])
    if got.bundle is None:
        run.rec.action(run.id, name, now(), "evidence", f"none kept: {got.why}"[:1000])
        run.log(name, f"no evidence kept: {got.why}")
        return ""
    location = ""
    if cfg.evidence_bucket:
        run.fence()  # a write past the Kubernetes API
        try:
            bucket = EvidenceBucket(cfg.evidence_bucket, cfg.evidence_bucket_prefix, cfg.aws_region or None)
            location = bucket.put(bucket.key(getattr(run.rec, "cluster", "") or "default", name, run.id),
                                  got.bundle, hashlib.sha256(got.bundle).hexdigest())
        except AwsError as exc:  # the history keeps it instead
            run.log(name, f"evidence not stored in S3 ({exc}); kept in the history")
    dropped = run.rec.keep_evidence(run.id, name, now(), got.bundle, got.manifest, location, cfg.evidence_keep_bytes)
    parts = ", ".join(f"{p.get('file')} {p.get('status')}" for p in got.manifest.get("parts") or []
                      if isinstance(p, dict))
    run.rec.action(run.id, name, now(), "evidence", f"{len(got.bundle)} bytes kept in {location or 'the history'}"
                   f" ({parts})"[:1000])
    for n, r in dropped:
        run.log(n, f"evidence of run {r} dropped from the history (evidence_keep_bytes)")
    return location or "history"
