"""Rendering a playbook's text: `render` (values, recursively), `condition` (a bare `when`
expression), `check_fact` and `check_syntax`, and the hand-off of each render to the render
worker."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, Undefined, UndefinedError, nodes

from sweeper.errors import PlaybookError
from sweeper.templating import bounds, deadline
from sweeper.templating.bounds import _limit, value_size
from sweeper.templating.deadline import _deadline, _guarded, _local, _snippet
from sweeper.templating.environment import ENV

_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.S)


# -- the render worker ---------------------------------------------------------------------------
# Every render of a playbook's text (render, condition, render_template) runs in the render
# worker (sweeper.render_worker: a child process under RLIMIT_AS, killed at the deadline)
# unless SWEEPER_RENDER_ISOLATION=thread. Inside the worker, _IN_WORKER is set and the same
# functions render in-process. A request whose variables hold a value pickle cannot carry (a
# callable, an open client) renders in-process as before; the executor's variables are plain
# data (results, facts, node dicts), so that path is not taken by playbooks.


def _to_worker() -> bool:
    if deadline._IN_WORKER or getattr(_local, "rendering", False):
        return False
    from sweeper.render_worker import isolated
    return isolated()


@lru_cache(maxsize=4096)
def _names(source: str) -> frozenset[str] | None:
    """The variables a template reads; None when it does not parse (the worker says why)."""
    try:
        # every name read anywhere: a superset of what the context supplies (meta's
        # find_undeclared_variables leaves out names that are also globals, such as `namespace`)
        return frozenset(n.name for n in ENV.parse(source).find_all(nodes.Name) if n.ctx == "load")
    except Exception:  # noqa: BLE001 - a syntax error, or nesting too deep for the parser
        return None


def _needed(source: str, variables: dict[str, Any]) -> dict[str, Any]:
    """Only the variables the template reads cross to the worker: the scope can hold large
    results that this render never looks at."""
    names = _names(source)
    return {} if names is None else {k: variables[k] for k in names if k in variables}


def _in_worker(op: str, args: tuple[Any, ...], where: str, source: str) -> tuple[bool, Any]:
    """(True, value) from the worker, or (False, None) when the request cannot cross."""
    from sweeper import render_worker
    seconds, whose, cap = _deadline()
    try:
        return True, render_worker.run(op, args, where, _snippet(source), seconds, whose, cap, bounds.LIMITS)
    except render_worker.Unpicklable:
        return False, None


@lru_cache(maxsize=4096)
def _expression(source: str) -> Any:
    """Compiled once per distinct source: compiling dominates rendering."""
    return ENV.compile_expression(source, undefined_to_none=False)


@lru_cache(maxsize=4096)
def _template(source: str) -> Any:
    return ENV.from_string(source)


def _defined(value: Any) -> Any:
    """A bare expression yields an Undefined instead of raising; make it raise."""
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    return value


def _native(source: str, variables: dict[str, Any]) -> Any:
    value = _defined(_expression(source)(**variables))
    _limit("a rendered value", value_size(value, bounds.LIMITS.output), bounds.LIMITS.output)
    return value


def _text(source: str, variables: dict[str, Any]) -> str:
    template = _template(source)
    return ENV.concat(template.root_render_func(template.new_context(variables)))


def render(value: Any, variables: dict[str, Any], where: str = "") -> Any:
    """Render strings in a value recursively. A string that is one `{{ expr }}` keeps the
    expression's native type (a list stays a list), as Ansible does."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        if _to_worker():
            done, out = _in_worker("render", (value, _needed(value, variables), where), where, value)
            if done:
                return out
        try:
            m = _WHOLE.match(value)
            if m and "{{" not in m.group("expr") and "}}" not in m.group("expr"):
                expr = m.group("expr")
                return _guarded(where, value, lambda: _native(expr, variables))
            return _guarded(where, value, lambda: _text(value, variables))
        except UndefinedError as exc:
            raise PlaybookError(f"{where}: undefined variable: {exc.message}") from exc
        except TemplateError as exc:
            raise PlaybookError(f"{where}: template error in {value!r}: {exc}") from exc
    if isinstance(value, list):
        return [render(v, variables, where) for v in value]
    if isinstance(value, dict):
        return {(render(k, variables, where) if isinstance(k, str) else k): render(v, variables, where)
                for k, v in value.items()}
    return value


def check_fact(name: str, value: Any, where: str = "") -> None:
    """A fact that set_fact stores stays within LIMITS.fact (its JSON size), so facts that
    double themselves stop at the bound instead of at the memory limit."""
    size = value_size(value, bounds.LIMITS.fact)
    if size > bounds.LIMITS.fact:
        raise PlaybookError(f"{where}: template limit: the fact {name!r} is over {bounds.LIMITS.fact:,} characters as JSON")


def check_syntax(text: str, expression: bool = False) -> str:
    """'' if the template (or bare expression) parses, else what is wrong."""
    try:
        if expression:
            ENV.compile_expression(text)
        else:
            ENV.parse(text)
    except TemplateError as exc:
        kind = "expression" if expression else "template"
        return f"{kind} syntax error in {text!r}: {exc}"
    return ""


def condition(expr: str | bool, variables: dict[str, Any], where: str = "") -> bool:
    """A bare `when` expression (no braces); it must yield a real boolean."""
    if isinstance(expr, bool):
        return expr
    if _to_worker():
        source = "{{ " + str(expr) + " }}"
        done, out = _in_worker("condition", (expr, _needed(source, variables), where), where, str(expr))
        if done:
            return bool(out)
    try:
        value = _guarded(where, str(expr), lambda: _defined(_expression(str(expr))(**variables)))
    except UndefinedError as exc:
        raise PlaybookError(f"{where}: undefined variable in condition {expr!r}: {exc.message}") from exc
    except TemplateError as exc:
        raise PlaybookError(f"{where}: cannot evaluate condition {expr!r}: {exc}") from exc
    if not isinstance(value, bool):
        raise PlaybookError(f"{where}: condition {expr!r} gave {value!r} ({type(value).__name__}), not a boolean")
    return value
