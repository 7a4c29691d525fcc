"""Actions that touch nothing outside the play."""

from __future__ import annotations

from typing import Any

from sweeper.actions import ActionContext, Arg, action, failed, ok
from sweeper.clock import parse_duration


@action("debug", Arg("msg", (str, int, float, bool, list, dict), default=""), help="Print a message.")
def debug(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    ctx.log(str(args["msg"]))
    return ok(str(args["msg"]))


@action("set_fact", Arg("facts", dict, required=True), help="Set variables for the tasks that follow.")
def set_fact(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    ctx.facts.update(args["facts"])
    return ok(f"set {', '.join(sorted(args['facts']))}", ansible_facts=args["facts"])


@action("assert", Arg("that", (list, str, bool), required=True), Arg("fail_msg", str, default="assertion failed"),
        Arg("success_msg", str, default="all assertions passed"),
        help="Fail unless every condition is true (conditions are rendered before the call).")
def assert_(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    conds = args["that"] if isinstance(args["that"], list) else [args["that"]]
    for i, c in enumerate(conds):
        if not isinstance(c, bool):
            return failed(f"condition {i} gave {c!r}, not a boolean")
        if not c:
            return failed(args["fail_msg"], assertion=i)
    return ok(args["success_msg"])


@action("fail", Arg("msg", str, default="failed as requested"), help="Fail the task with a message.")
def fail(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    return failed(args["msg"])


@action("wait", Arg("seconds", (int, float, str), required=True), help="Sleep on the injected clock.")
def wait(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    secs = parse_duration(args["seconds"])
    ctx.clock.sleep(secs)
    return ok(f"waited {secs:g}s")
