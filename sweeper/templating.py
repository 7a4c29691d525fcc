"""One sandboxed Jinja2 environment with strict undefined variables.

Values that come from the cluster (labels, annotations, logs) are data: they are passed in as
variables and never rendered themselves, so `{{ ... }}` inside a label stays literal text.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, TemplateError, Undefined, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sweeper.clock import parse_duration
from sweeper.errors import PlaybookError

_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.S)


def _env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["to_json"] = lambda v, **kw: json.dumps(v, **kw)
    env.filters["from_json"] = json.loads
    env.filters["duration"] = parse_duration
    env.filters["percent"] = lambda v, d=1: f"{float(v) * 100:.{d}f}%"
    env.tests["failed"] = lambda r: bool(isinstance(r, dict) and r.get("failed"))
    env.tests["succeeded"] = lambda r: bool(isinstance(r, dict) and not r.get("failed") and not r.get("skipped"))
    env.tests["changed"] = lambda r: bool(isinstance(r, dict) and r.get("changed"))
    env.tests["skipped"] = lambda r: bool(isinstance(r, dict) and r.get("skipped"))
    return env


ENV = _env()


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


def render(value: Any, variables: dict[str, Any], where: str = "") -> Any:
    """Render strings in a value recursively. A string that is one `{{ expr }}` keeps the
    expression's native type (a list stays a list), as Ansible does."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        try:
            m = _WHOLE.match(value)
            if m and "{{" not in m.group("expr") and "}}" not in m.group("expr"):
                return _defined(_expression(m.group("expr"))(**variables))
            return _template(value).render(**variables)
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
    try:
        value = _defined(_expression(str(expr))(**variables))
    except UndefinedError as exc:
        raise PlaybookError(f"{where}: undefined variable in condition {expr!r}: {exc.message}") from exc
    except TemplateError as exc:
        raise PlaybookError(f"{where}: cannot evaluate condition {expr!r}: {exc}") from exc
    if not isinstance(value, bool):
        raise PlaybookError(f"{where}: condition {expr!r} gave {value!r} ({type(value).__name__}), not a boolean")
    return value
