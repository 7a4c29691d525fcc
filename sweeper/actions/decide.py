"""`decide`: turn this sweep's registered results into the node's verdict."""

from __future__ import annotations

from typing import Any

from sweeper.actions import ActionContext, Arg, action, ok
from sweeper.policy import decide as policy_decide


@action("decide", Arg("results", list, required=True, help="registered run_job results"),
        help="Turn results into a verdict (pass, warn, reboot, replace, quarantine, error, inconclusive); "
             "sets the facts `verdict` and `reasons`.")
def decide(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    docs = []
    for r in args["results"]:
        if not isinstance(r, dict):
            continue
        if r.get("status") == "inconclusive":
            docs.append({"status": "inconclusive", "msg": r.get("msg", "")})
        else:
            docs.append(r.get("result") or {"checks": []})
    dismissed = set(((ctx.node or {}).get("dismissed")) or [])
    v = policy_decide(docs, dismissed)
    ctx.facts.update({"verdict": v.verdict, "reasons": list(v.reasons)})
    return ok(f"verdict {v.verdict}: {'; '.join(v.reasons)[:300]}", verdict=v.verdict, reasons=list(v.reasons),
              ansible_facts={"verdict": v.verdict, "reasons": list(v.reasons)})
