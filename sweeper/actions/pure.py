"""Actions that touch nothing outside the play."""

from __future__ import annotations

from typing import Any

from sweeper.actions import ActionContext, Arg, action, failed, ok
from sweeper.clock import parse_duration
from sweeper.errors import PlaybookError
from sweeper.templating import condition, render


@action("debug", Arg("msg", (str, int, float, bool, list, dict), help="what to print"),
        Arg("var", str, raw=True, help="name of a variable (or an expression) to print instead"),
        help="Print a message, or a variable's value.")
def debug(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    if args["var"]:
        value = render("{{ " + args["var"] + " }}", ctx.vars, "debug.var")
        ctx.log(f"{args['var']} = {value!r}")
        return ok(f"{args['var']} = {value!r}", value=value)
    msg = "Hello world!" if args["msg"] is None else args["msg"]
    ctx.log(str(msg))
    return ok(str(msg))


@action("set_fact", help="Set variables (the arguments, any names) for the rest of the play.", free_form=True)
def set_fact(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    for key in args:
        if not str(key).isidentifier():
            raise PlaybookError(f"set_fact: {key!r} is not a valid variable name")
    ctx.facts.update(args)
    return ok(f"set {', '.join(sorted(args))}", ansible_facts=dict(args))


@action("assert", Arg("that", (list, str, bool), required=True, raw=True,
                      help="bare expressions (no braces), all of which must be true"),
        Arg("fail_msg", str, default="Assertion failed", help="message when one is false"),
        Arg("success_msg", str, default="All assertions passed", help="message when all are true"),
        help="Fail unless every condition is true; the result names the first false one.")
def assert_(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    conds = args["that"] if isinstance(args["that"], list) else [args["that"]]
    for c in conds:
        if not condition(c, ctx.vars, "assert.that"):
            return failed(render(args["fail_msg"], ctx.vars, "assert.fail_msg"), assertion=c, evaluated_to=False)
    return ok(render(args["success_msg"], ctx.vars, "assert.success_msg"))


@action("fail", Arg("msg", str, default="Failed as requested from task", help="why"),
        help="Fail the task with a message.")
def fail(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    return failed(args["msg"])


@action("wait", Arg("seconds", (int, float, str), required=True, help="a number of seconds or a duration like 2m"),
        help="Sleep on the injected clock (the simulated clock in tests); a task timeout cuts it short.")
def wait(ctx: ActionContext, args: dict[str, Any]) -> dict[str, Any]:
    try:
        secs = parse_duration(args["seconds"])
    except ValueError as exc:
        raise PlaybookError(f"wait: {args['seconds']!r} is not a duration") from exc
    ctx.sleep(secs)
    return ok(f"waited {secs:g}s")
