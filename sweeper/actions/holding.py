"""Taking a node and giving it back: the hold (Sweeper's taint, and a shield from consolidation),
the hand-back (release, or keep held with the verdict's reason), the status marks a finished sweep
leaves, and the conditional node patch they all write with.

Every write to a node is a JSON patch that tests the resourceVersion it was computed
from; on a conflict the node is read again and the change recomputed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeper.clock import iso, read_iso
from sweeper.config import Config
from sweeper.errors import Conflict, NotFound
from sweeper.fleet import gpu_pods_by_node
from sweeper.policy import HOLDING

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def patch_node(kube: Any, name: str, build: Callable[[dict[str, Any]], list[dict[str, Any]] | None],
               tries: int = 5, known: dict[str, Any] | None = None, fresh: bool = False) -> dict[str, Any] | None:
    """Read, compute a JSON patch, apply it conditional on the version read; again on conflict.
    None when the node is gone or nothing needed changing.

    `known`: the node as last read or written, used for the first attempt instead of a read (the
    resourceVersion test still refuses it if the node changed since). Where it says nothing needs
    changing, the node is read to make sure, unless `fresh` says it was read a moment ago."""
    for _ in range(tries):
        if known is not None:
            current, known, confirmed = known, None, fresh
        else:
            try:
                current = kube.get_node(name)
            except NotFound:
                return None
            confirmed = True
        ops = build(current)
        if not ops:
            if confirmed:
                return None
            continue
        try:
            return kube.patch_node(name, [{"op": "test", "path": "/metadata/resourceVersion",
                                           "value": current["metadata"]["resourceVersion"]}] + ops)  # type: ignore[no-any-return]
        except Conflict:
            continue
        except NotFound:
            return None
    raise Conflict(f"node {name}: gave up after {tries} conflicting updates")


def meta_op(node: dict[str, Any], field: str, values: dict[str, str | None]) -> list[dict[str, Any]] | None:
    current = dict(node["metadata"].get(field) or {})
    new = dict(current)
    for k, v in values.items():
        if v is None:
            new.pop(k, None)
        else:
            new[k] = str(v)
    return None if new == current else [{"op": "add", "path": f"/metadata/{field}", "value": new}]


@dataclass(frozen=True)
class Released:
    """What a hand-back did: `changed` when anything was written; `left_to`, the run whose taint
    was found on the node and left in place (never removed by another run)."""

    changed: bool
    left_to: str = ""
    node: dict[str, Any] | None = None  # the node as the write returned it


@dataclass(frozen=True)
class Marks:
    """What a finished sweep leaves on the node for people and tools: the status labels and the
    last result's summary annotation (mark_status)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    key: tuple[str, tuple[str, ...], tuple[str, ...]]  # verdict, reasons, rules: what they say


RELEASED = "released"  # the annotation (under the config's prefix) a release leaves on the node


def release_mark(cfg: Config, at: float, reason: str, by: str, verdict: str = "",
                 false_positive: bool = False) -> Marks:
    """The release's mark: written with the untaint, read (and taken off) by the next run's reconcile.
    A node released after a holding `verdict`, not as a false positive, is also made a suspect, so
    that the next sweep checks it first, whatever its interval says."""
    mark = json.dumps({"at": iso(at), "reason": reason[:200], "by": by[:64], "false_positive": false_positive},
                      separators=(",", ":"))
    p = cfg.prefix
    if false_positive or verdict not in HOLDING:
        return Marks({}, {f"{p}/{RELEASED}": mark}, ("", (), ()))
    why = f"released by hand after verdict {verdict} ({reason[:200]}): checked again first"
    return Marks({f"{p}/suspect": "true"}, {f"{p}/{RELEASED}": mark, f"{p}/suspect-reason": why}, ("", (), ()))


def read_release_mark(annotations: dict[str, str], prefix: str) -> tuple[float, str, bool] | None:
    """(when, why, as a false positive) of a release's mark on a node, or None: none, or one that
    does not read (a node may write its own annotations; a mark only ever spares a node's findings a
    dismissal, or words the reason of one a person made)."""
    raw = annotations.get(f"{prefix}/{RELEASED}")
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        at = read_iso(doc.get("at")) if isinstance(doc, dict) else None
    except (ValueError, RecursionError):
        return None
    if at is None:
        return None
    return at, f"{str(doc.get('reason', ''))[:200]} (by {str(doc.get('by', '?'))[:64]})", doc.get("false_positive") is True


def _foreign(node: dict[str, Any], cfg: Config, owner: str) -> str:
    """The run id of a Sweeper taint on the node that is not `owner`'s, or ""."""
    for t in (node.get("spec") or {}).get("taints") or []:
        if t.get("key") == cfg.taint_key and str(t.get("value", "")) != owner:
            return str(t.get("value", "")) or "?"
    return ""


def release(kube: Any, cfg: Config, name: str, owner: str, clear_suspect: bool = False,
            marks: Marks | None = None, known: dict[str, Any] | None = None) -> Released:
    """Take run `owner`'s taint and Sweeper's annotations off and leave everything else as found;
    after a conclusive good verdict, also the suspect label. A taint of any other run is left
    alone, node and all: the JSON patch tests the taint it removes, value included. `marks`: the
    status labels and last-result annotation, written in the same patch. `known`: the node as
    this run last saw it (see patch_node)."""
    prefix = cfg.prefix

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        taints = (node.get("spec") or {}).get("taints") or []
        keep = [t for t in taints if t.get("key") != cfg.taint_key]
        ops: list[dict[str, Any]] = [{"op": "test", "path": f"/spec/taints/{i}", "value": t}
                                     for i, t in enumerate(taints) if t.get("key") == cfg.taint_key]
        ann = _unshielded(node, prefix)
        for k in ("held-by", "held-since", "verdict", "reason", "remediation", "remediated-at", "boot-id", "recheck",
                  RELEASED):  # an older release's mark goes; a release writes its own below (`marks`)
            ann.pop(f"{prefix}/{k}", None)
        if ann.pop(f"{prefix}/cordoned-by", None) and (node.get("spec") or {}).get("unschedulable"):
            ops.append({"op": "add", "path": "/spec/unschedulable", "value": False})
        if len(keep) != len(taints):
            ops.append({"op": "add", "path": "/spec/taints", "value": keep})
        labels = dict(node["metadata"].get("labels") or {})
        if clear_suspect:
            ann.pop(f"{prefix}/suspect-reason", None)
            labels.pop(f"{prefix}/suspect", None)  # checked and handed back
        if marks is not None:
            labels.update(marks.labels)
            ann.update(marks.annotations)
        if labels != (node["metadata"].get("labels") or {}):
            ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
        if ann != (node["metadata"].get("annotations") or {}):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": ann})
        return ops if any(op["op"] != "test" for op in ops) else None

    return _patch_owned(kube, cfg, name, owner, build, known)


def keep_held(kube: Any, cfg: Config, name: str, verdict: str, reason: str, owner: str,
              known: dict[str, Any] | None = None) -> bool:
    """Keep run `owner`'s taint, say why on the node, and stop shielding it from Karpenter.
    False, and nothing written, when the node carries another run's taint."""
    return not hold_with_reason(kube, cfg, name, verdict, reason, owner, known=known).left_to


def hold_with_reason(kube: Any, cfg: Config, name: str, verdict: str, reason: str, owner: str,
                     marks: Marks | None = None, known: dict[str, Any] | None = None) -> Released:
    """keep_held, saying what it did: `left_to` names the other run whose taint is on the node
    (nothing written). `marks` and `known` as for release."""
    prefix = cfg.prefix

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        ann = _unshielded(node, prefix)
        ann[f"{prefix}/verdict"] = verdict
        ann[f"{prefix}/reason"] = reason[:1000]
        ops = []
        if marks is not None:
            ann.update(marks.annotations)
            labels = {**(node["metadata"].get("labels") or {}), **marks.labels}
            if labels != (node["metadata"].get("labels") or {}):
                ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
        return ops + [{"op": "add", "path": "/metadata/annotations", "value": ann}]

    return _patch_owned(kube, cfg, name, owner, build, known)


def _patch_owned(kube: Any, cfg: Config, name: str, owner: str,
                 build: Callable[[dict[str, Any]], list[dict[str, Any]] | None],
                 known: dict[str, Any] | None) -> Released:
    """patch_node for a node run `owner` holds; nothing is written where another run's taint is on it."""
    other = [""]

    def guarded(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        other[0] = _foreign(node, cfg, owner)
        return None if other[0] else build(node)

    done = patch_node(kube, name, guarded, known=known)
    return Released(done is not None, other[0], done)


def _unshielded(node: dict[str, Any], prefix: str) -> dict[str, str]:
    """The node's annotations without the consolidation shield, where Sweeper put it there."""
    ann = dict(node["metadata"].get("annotations") or {})
    if ann.pop(f"{prefix}/added-do-not-disrupt", None):
        ann.pop(DO_NOT_DISRUPT, None)
    return ann


def hold(kube: Any, cfg: Config, node: dict[str, Any], run_id: str, now: float) -> dict[str, Any]:
    """Taint the node as read (a resourceVersion test, no retry: a conflict means the node changed
    under us and must be looked at again) and shield it from consolidation while held."""
    meta = node["metadata"]
    # A node held already (back from a reboot for its re-check) carries our taint: replace it.
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != cfg.taint_key]
    ann = dict(meta.get("annotations") or {})
    # A release's mark is of the hold before this one: it must not spare what this hold finds.
    for key in ("recheck", "verdict", "reason", RELEASED):
        ann.pop(f"{cfg.prefix}/{key}", None)
    ann.update({f"{cfg.prefix}/held-by": run_id, f"{cfg.prefix}/held-since": iso(now)})
    if DO_NOT_DISRUPT not in (meta.get("annotations") or {}):
        ann[DO_NOT_DISRUPT] = "true"
        ann[f"{cfg.prefix}/added-do-not-disrupt"] = "true"
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
           {"op": "add", "path": "/spec/taints", "value": taints + [
               {"key": cfg.taint_key, "value": run_id, "effect": "NoSchedule"}]},
           {"op": "add", "path": "/metadata/annotations", "value": ann}]
    return kube.patch_node(meta["name"], ops)  # type: ignore[no-any-return]


def gpu_pods_on(kube: Any, cfg: Config, name: str) -> list[str]:
    return gpu_pods_by_node(kube.active_pods(node=name), cfg).get(name, [])


CONDITION = "GpuSweepHealthy"
LAST_RESULT_LIMIT = 4096


def status_marks(cfg: Config, verdict: str, reasons: list[str], rules: list[str], now: float) -> Marks:
    """The status labels, the last sweep time, and the last result's summary (at most 4 KiB)."""
    p = cfg.prefix
    summary: dict[str, Any] = {"verdict": verdict, "at": iso(now), "rules": rules, "reasons": []}
    for r in reasons[:5]:
        candidate = {**summary, "reasons": summary["reasons"] + [r[:600]]}
        if len(json.dumps(candidate)) > LAST_RESULT_LIMIT:
            break
        summary = candidate
    return Marks({f"{p}/status": verdict, f"{p}/last-sweep": str(int(now))},
                 {f"{p}/last-result": json.dumps(summary, separators=(",", ":"))},
                 (verdict, tuple(reasons), tuple(rules)))


def mark_status(kube: Any, cfg: Config, name: str, verdict: str, reasons: list[str], rules: list[str],
                now: float, condition: bool = False, marked: dict[str, Any] | None = None) -> None:
    """What people and other tools see on the node after a sweep: labels for the status and the
    last sweep time, an annotation with the last result's summary (at most 4 KiB), and, when
    asked, the GpuSweepHealthy condition, whose lastTransitionTime moves only when its status
    does (so that a repairer counting time in a state can act). `marked`: the node as the
    hand-back wrote it with this verdict's labels and annotation, which are then not written again."""
    if marked is None:
        marks = status_marks(cfg, verdict, reasons, rules, now)
        # One merge patch of Sweeper's own keys: nothing else on the node is read or rewritten.
        node = kube.patch_node(name, {"metadata": {"labels": marks.labels, "annotations": marks.annotations}},
                               content_type="application/merge-patch+json")
    else:
        node = marked
    if not condition or node is None or verdict in ("error", "inconclusive"):
        return
    healthy = "False" if verdict in HOLDING else "True"
    current = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == CONDITION), None)
    since = current["lastTransitionTime"] if current and current.get("status") == healthy else iso(now)
    cond = {"type": CONDITION, "status": healthy, "reason": f"Sweep{verdict.capitalize()}",
            "message": ("; ".join(reasons) if verdict != "pass" else "all checks passed")[:1000],
            "lastHeartbeatTime": iso(now), "lastTransitionTime": since}
    kube.patch_node_status(name, {"status": {"conditions": [cond]}})


def ungate(kube: Any, cfg: Config, name: str) -> bool:
    """Take the gate's taint (`gate_taint`) off the node, and no other taint: the JSON patch tests
    each taint it removes. False when the node is gone or does not carry it."""
    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        taints = (node.get("spec") or {}).get("taints") or []
        ours = [(i, t) for i, t in enumerate(taints) if cfg.gate_taint and t.get("key") == cfg.gate_taint]
        if not ours:
            return None
        return [{"op": "test", "path": f"/spec/taints/{i}", "value": t} for i, t in ours] + \
            [{"op": "add", "path": "/spec/taints", "value": [t for t in taints if t.get("key") != cfg.gate_taint]}]

    return patch_node(kube, name, build) is not None


def gate(kube: Any, cfg: Config, name: str, why: str) -> bool:
    """Put the gate's taint on the node (before Sweeper's reboot or GPU reset), so it is validated
    again before any work lands on it. False when it was there already or the node is gone."""
    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        taints = (node.get("spec") or {}).get("taints") or []
        if not cfg.gate_taint or any(t.get("key") == cfg.gate_taint for t in taints):
            return None
        return [{"op": "add", "path": "/spec/taints",
                 "value": taints + [{"key": cfg.gate_taint, "value": why, "effect": "NoSchedule"}]}]

    return patch_node(kube, name, build) is not None
