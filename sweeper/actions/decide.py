"""`decide`: turn this sweep's registered results, and the node's history, into its verdict."""

from __future__ import annotations

from typing import Any

from sweeper.actions import ActionContext, Arg, action, device_plugin, ok
from sweeper.errors import ConfigError
from sweeper.policy import HOLDING, Policy, load_policy, policy_path
from sweeper.policy import decide as policy_decide
from sweeper.result import Result

_CACHE: dict[tuple[str, float], Policy] = {}


def policy_for(ctx: ActionContext, name: str = "") -> Policy:
    """The policy file (by name in policies/, or a path), cached until it changes."""
    name = name or ctx.config.policy
    path = policy_path(ctx.config.path("policies"), name)
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError as exc:
        raise ConfigError(f"policy {path}: {exc}") from exc
    if key not in _CACHE:
        _CACHE[key] = load_policy(path)
    return _CACHE[key]


@action("decide", Arg("results", list, required=True, help="registered run_job results"),
        Arg("policy", str, help="policy file in policies/ (default: the config's `policy`)"),
        help="Turn results and the node's history into a verdict (pass, warn, reboot, replace, quarantine, "
             "error, inconclusive) by the policy; sets the facts `verdict`, `reasons` and `decision` "
             "(causes, rules that fired). GPUs the device plugin holds back are a symptom: named beside "
             "Sweeper's own findings, or, with those clean and only application or informational XIDs, "
             "the plugin's pod is deleted on a node Sweeper holds and allocatable awaited (`device_plugin_pods`).")
def decide(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    docs = []
    for r in args["results"]:
        if not isinstance(r, dict):
            continue
        if r.get("status") == "inconclusive":
            docs.append({"status": "inconclusive", "msg": r.get("msg", "")})
        else:
            docs.append(r.get("result") or {"checks": []})
    node = ctx.node or {}
    dismissed = set(node.get("dismissed") or [])
    policy = policy_for(ctx, args.get("policy") or "")
    now = ctx.clock.now()
    unhealthy = [u for u in (node.get("gpu_resources") or {}).get("unhealthy") or []
                 if int(u["allocatable"]) < int(u["capacity"])]
    if unhealthy:  # GPUs the device plugin marked unhealthy: a symptom; its cause is what Sweeper reads
        own = policy_decide(docs, dismissed, policy).verdict
        held_back = _held_back(ctx, str(node.get("name", "")), unhealthy, docs, own, dismissed, now)
        ctx.on_result(held_back)
        docs.append(held_back.to_dict())
    v = policy_decide(docs, dismissed, policy, node=str(node.get("name", "")),
                      profile=str((node.get("profile") or {}).get("name", "")), now=now, past=ctx.past)
    decision = {"verdict": v.verdict, "causes": list(v.causes), "rules": list(v.rules), "decided": now,
                "policy": policy.name, "gpus": list(v.gpus)}
    facts = {"verdict": v.verdict, "reasons": list(v.reasons), "decision": decision}
    ctx.facts.update(facts)
    rules = f" (rules: {', '.join(v.rules)})" if v.rules else ""
    return ok(f"verdict {v.verdict}{rules}: {'; '.join(v.reasons)[:300]}", verdict=v.verdict,
              reasons=list(v.reasons), decision=decision, ansible_facts=facts)


def verdict_of_results(ctx: ActionContext, results: list[Result]) -> dict[str, Any]:
    """The facts `decide` would set from these registered results (the policy's verdict, its
    reasons and decision), for a play that ended without a `decide`; it acts on nothing."""
    node = ctx.node or {}
    docs = [r.to_dict() for r in results]
    now = ctx.clock.now()
    v = policy_decide(docs, set(node.get("dismissed") or []), policy_for(ctx), node=str(node.get("name", "")),
                      profile=str((node.get("profile") or {}).get("name", "")), now=now, past=ctx.past)
    decision = {"verdict": v.verdict, "causes": list(v.causes), "rules": list(v.rules), "decided": now,
                "policy": policy_for(ctx).name, "gpus": list(v.gpus)}
    return {"verdict": v.verdict, "reasons": [f"no decide task: the verdict of the {len(results)} "
                                              "registered result(s)", *v.reasons], "decision": decision}


def _held_back(ctx: ActionContext, node: str, unhealthy: list[dict[str, Any]], docs: list[dict[str, Any]],
               own: str, dismissed: set[str], now: float) -> Result:
    """The device plugin's shortfall beside Sweeper's own findings: a symptom of a holding finding,
    or of one a person dismissed (`warn`, naming it); with clean readings and only application or
    informational XIDs, a restart of the plugin (`warn` when allocatable comes back, else `fail`:
    the node is held with why); else `fail`. Never a cause of a ladder or a relapse (policy.SYMPTOMS)."""
    what = device_plugin.shortfall(unhealthy)
    xids = device_plugin.xids_seen(docs)
    seen = device_plugin.in_words(xids)
    if own in HOLDING:
        return device_plugin.finding(node, now, "warn", f"{what}: a symptom of Sweeper's own findings "
                                     f"({device_plugin.failing(docs) or seen})")
    live = [(code, gpu) for code, gpu in xids if f"xid|{code}|{'' if gpu is None else gpu}" not in dismissed]
    if xids and not device_plugin.benign(xids) and device_plugin.benign(live):
        return device_plugin.finding(node, now, "warn", f"{what}: a symptom of findings a person dismissed "
                                     f"as false positives ({seen})")
    earlier = sorted(k for k in dismissed if k.startswith("xid|"))
    if not xids and earlier:  # the XID a person dismissed is older than the node's last pass: no longer read
        return device_plugin.finding(node, now, "warn", f"{what}: a symptom of findings a person dismissed "
                                     f"as false positives ({', '.join(earlier)})")
    if own in ("error", "inconclusive"):
        return device_plugin.finding(node, now, "fail", f"{what}; Sweeper's own check did not run to say why")
    if not device_plugin.benign(xids):
        return device_plugin.finding(node, now, "fail", f"{what}; Sweeper's own readings: {seen}")
    done = device_plugin.restart(ctx, node)
    status = "warn" if done.ok else "fail"
    return device_plugin.finding(node, now, status, f"{what}; Sweeper's own readings are clean ({seen}): "
                                 f"{done.detail}")
