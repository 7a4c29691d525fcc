"""The one sandboxed Jinja2 environment (`ENV`): the immutable sandbox, strict undefined
variables, and every allocation a template controls routed through the checks of `bounds`:
binary operators, calls of str and int methods, str.format, filters, buffered output, and the
lists, tuples and dicts a template writes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.nodes import Concat
from jinja2.runtime import Context, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter

from sweeper.clock import parse_duration
from sweeper.templating import bounds
from sweeper.templating.bounds import (
    _SCALARS,
    _binop,
    _bound_split,
    _bounded_filter,
    _check_result,
    _check_str_method,
    _format_filter,
    _limit,
    _number,
    _range,
    _sum_sizes,
    _width,
    value_size,
)


class _BoundedFormatter(SandboxedFormatter):
    """str.format / format_map: each field's width and value fit, and so does the sum."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        for digits in re.findall(r"\d+", format_spec):
            _width("a formatting width", _number(digits))
        self.total += value_size(value, bounds.LIMITS.string) + sum(_number(d) for d in re.findall(r"\d+", format_spec))
        _limit("a formatted string", self.total, bounds.LIMITS.string)
        return super().format_field(value, format_spec)


class _OutputBuffer(list[str]):
    """What a `{% set %}` block, a `{% filter %}` block or a macro collects before it is joined:
    it stops at the output limit as it grows."""

    total = 0

    def append(self, chunk: str) -> None:
        self.total += len(chunk)
        _limit("rendered output", self.total, bounds.LIMITS.output)
        super().append(chunk)

    def extend(self, chunks: Iterable[str]) -> None:
        for chunk in chunks:
            self.append(chunk)


class _BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` goes through the environment's bounded join instead of a plain str join, and
    buffered output (set blocks, filter blocks, macros) goes into a bounded list."""

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    # A list, tuple or dict written in a template is measured as it is built: `[a, a]` doubled
    # forty times takes little memory but is 2**40 items to anything that walks it (==, sort,
    # str), which C code does without a pause where the deadline could stop it.
    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.built(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":
            super().visit_Tuple(node, frame)
            return
        self.write("environment.built(")
        super().visit_Tuple(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.built(")
        super().visit_Dict(node, frame)
        self.write(")")

    @optimizeconst
    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every allocation a template controls bounded by LIMITS."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(finalize=self._finalize, **kwargs)
        self.globals["range"] = _range
        self.globals.pop("lipsum", None)  # lorem ipsum of any length: nothing a playbook needs

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        return _binop(operator, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str | bytes) and not isinstance(owner, type):
            if name in ("split", "rsplit"):
                return _bound_split(__obj, args, kwargs)
            args = _check_str_method(name, owner if isinstance(owner, str) else "", args, kwargs)
        elif isinstance(owner, int) and not isinstance(owner, type):
            for a in (*args, *kwargs.values()):
                _width(f"the argument of {name}()", a)
        return _check_result(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        owner: str = value.__self__
        is_map = value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            _limit("a format string", len(owner), bounds.LIMITS.string)
            return _check_result(type(owner)(_BoundedFormatter(self).vformat(owner, args, kwargs)))

        return bounded

    def concat(self, chunks: Iterable[str]) -> str:  # type: ignore[override]
        """Every rendered body (the whole template, a `{% set %}` block, a macro) stops at
        the output limit while it is produced, not after."""
        out: list[str] = []
        total = 0
        limit = bounds.LIMITS.output
        for chunk in chunks:
            total += len(chunk)
            if total > limit:
                _limit("rendered output", total, limit)
            out.append(chunk)
        return "".join(out)

    @staticmethod
    def output_buffer() -> list[str]:
        return _OutputBuffer()

    @staticmethod
    def built(value: Any) -> Any:
        """A list, tuple or dict a template wrote: its whole size, shared parts counted each time."""
        _limit("a built value", value_size(value, bounds.LIMITS.output), bounds.LIMITS.output)
        return value

    def bounded_concat(self, values: tuple[Any, ...]) -> str:
        _limit("a string", _sum_sizes(values), bounds.LIMITS.string)
        return str_join(values)

    @staticmethod
    def _finalize(value: Any) -> Any:
        if not isinstance(value, _SCALARS):
            _limit("an output value", value_size(value, bounds.LIMITS.output), bounds.LIMITS.output)
        return value


def _env() -> BoundedEnvironment:
    env = BoundedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["to_json"] = lambda v, **kw: json.dumps(v, **kw)
    env.filters["from_json"] = json.loads
    env.filters["duration"] = parse_duration
    env.filters["percent"] = lambda v, d=1: f"{float(v) * 100:.{d}f}%"
    env.filters["format"] = _format_filter
    for name, fn in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, fn)
    env.tests["failed"] = lambda r: bool(isinstance(r, dict) and r.get("failed"))
    env.tests["succeeded"] = lambda r: bool(isinstance(r, dict) and not r.get("failed") and not r.get("skipped"))
    env.tests["changed"] = lambda r: bool(isinstance(r, dict) and r.get("changed"))
    env.tests["skipped"] = lambda r: bool(isinstance(r, dict) and r.get("skipped"))
    return env


ENV = _env()
