"""One sandboxed Jinja2 environment with strict undefined variables and bounded renders.

Values that come from the cluster (labels, annotations, logs) are data: they are passed in as
variables and never rendered themselves, so `{{ ... }}` inside a label stays literal text.

A render may not build more than `LIMITS` allows (output, string and list sizes, integer
sizes, formatting widths) nor run longer than its deadline: past a bound the playbook is broken
(PlaybookError with the expression and the task's file:line), found before the memory is spent.
Renders run in the render worker (sweeper.render_worker), a child process under RLIMIT_AS that
is killed at the deadline, so what these bounds miss still cannot reach the controller.
The bounds follow Jinja2's own advice for untrusted templates, which points at
`intercepted_binops`, `call` and `MAX_RANGE` as the places to do it:
https://jinja.palletsprojects.com/en/stable/sandbox/
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import inspect
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache, wraps
from pathlib import Path, PurePosixPath
from typing import Any

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, Undefined, UndefinedError, nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.nodes import Concat
from jinja2.runtime import Context, Namespace, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter

from sweeper.clock import parse_duration
from sweeper.errors import PlaybookError

_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*?)\}\}\s*$", re.S)


@dataclass(frozen=True)
class Limits:
    """What one render may build; README's playbook section lists them."""

    output: int = 1 << 20  # characters one render may produce (and one value it may return)
    string: int = 1 << 20  # characters of one string built inside a template (also a formatting width)
    items: int = 100_000  # items of one list, tuple or range built inside a template
    int_bits: int = 4096  # bits of one integer built by * or **
    fact: int = 1 << 20  # JSON size of one value that set_fact stores
    seconds: float = 5.0  # wall-clock time of one render, unless the task's timeout is shorter


LIMITS = Limits()


class LimitExceeded(Exception):
    """A template asked for more than LIMITS allows; render() names the task and expression."""


class RenderTimeout(BaseException):
    """Raised inside the rendering thread at its deadline. A BaseException, so that no
    `except Exception` inside Jinja2 or a filter can swallow it."""


# -- sizes -------------------------------------------------------------------------------------
def value_size(value: Any, limit: int) -> int:
    """About how many characters `value` takes as text (JSON or str()), counted without building
    it; the walk stops as soon as it passes `limit`, so a value that shares one list many times
    over (`[a, a]` nested thirty deep) costs no more than `limit` steps."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, float):
            total += 24
        elif isinstance(v, bytes | bytearray):
            total += 4 * len(v) + 3
        elif isinstance(v, Mapping):
            total += 2 + 4 * len(v)
            if total <= limit:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, list | tuple | set | frozenset):
            total += 2 + 2 * len(v)
            if total <= limit:
                stack.extend(v)
        elif isinstance(v, Namespace):
            total += 16
            stack.append(object.__getattribute__(v, "_Namespace__attrs"))
        else:
            total += 16
        if total > limit:
            return total
    return total


def _limit(what: str, size: int, limit: int) -> None:
    if size > limit:
        raise LimitExceeded(f"{what} of {size:,} (the limit is {limit:,})")


def _check_result(value: Any) -> Any:
    """After an operation: the string or sequence it built is within bounds."""
    if isinstance(value, str | bytes):
        _limit("a string", len(value), LIMITS.string)
    elif isinstance(value, list | tuple | dict | set | frozenset | range):
        _limit("a sequence", len(value), LIMITS.items)
        if not isinstance(value, range):  # its parts too: `a + a` of a shared list, a filter's result
            _limit("a built value", value_size(value, LIMITS.output), LIMITS.output)
    return value


def _width(what: str, value: Any) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        _limit(what, abs(value), LIMITS.string)


# -- operators ---------------------------------------------------------------------------------
_PRINTF = re.compile(r"%(?:\((?P<key>[^)]*)\))?[-#0 +]*(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d*))?[hlL]?(?P<conv>.)",
                     re.S)


def _number(text: str) -> int:
    return int(text) if len(text) <= 9 else LIMITS.string + 1


def _printf(fmt: str, args: Any) -> str:
    """`fmt % args` once its widths, precisions and substituted values are known to fit."""
    total = len(fmt)
    items = args if isinstance(args, tuple) else (args,)
    pos = 0
    for m in _PRINTF.finditer(fmt):
        if m.group("conv") == "%":
            continue
        for part in (m.group("width"), m.group("prec")):
            if part == "*":
                n = items[pos] if pos < len(items) else 0
                pos += 1
            else:
                n = _number(part) if part else 0
            _width("a formatting width", n)
            total += abs(n) if isinstance(n, int) else 0
        if m.group("key") is not None:
            arg = args.get(m.group("key")) if isinstance(args, Mapping) else None
        else:
            arg = items[pos] if pos < len(items) else None
            pos += 1
        total += value_size(arg, LIMITS.string)
        _limit("a formatted string", total, LIMITS.string)
    return _check_result(fmt % args)


def _binop(op: str, left: Any, right: Any) -> Any:
    seqs = str | bytes | list | tuple
    if op == "*":
        if isinstance(left, int) and isinstance(right, seqs):
            left, right = right, left
        if isinstance(left, seqs) and isinstance(right, int):
            what, limit = ("a string", LIMITS.string) if isinstance(left, str | bytes) else ("a sequence", LIMITS.items)
            _limit(what, len(left) * max(right, 0), limit)
        elif isinstance(left, int) and isinstance(right, int):
            _limit("an integer of bits", left.bit_length() + right.bit_length(), LIMITS.int_bits)
        return _check_result(left * right)
    if op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _limit("an integer of bits", (abs(left).bit_length() - 1) * right, LIMITS.int_bits)
        return left**right
    if op == "%":
        if isinstance(left, str):
            return _printf(left, right)
        return left % right
    if isinstance(left, str | bytes) and isinstance(right, str | bytes):
        _limit("a string", len(left) + len(right), LIMITS.string)
    elif isinstance(left, list | tuple) and isinstance(right, list | tuple):
        _limit("a sequence", len(left) + len(right), LIMITS.items)
    return left + right


def _range(*args: int) -> range:
    rng = range(*args)
    _limit("a range", len(rng), LIMITS.items)
    return rng


# -- str methods and filters -------------------------------------------------------------------
def _replace_size(s: str, old: str, new: str, count: int | None) -> int:
    hits = s.count(old) if old else len(s) + 1
    if count is not None and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


_SCALARS = (str, int, float, type(None))  # as text, each is as long as the value itself, or short


def _sum_sizes(values: Iterable[Any], start: int = 0) -> int:
    """The text size of several values together, stopping once past the string limit."""
    total = start
    for v in values:
        total += len(v) if isinstance(v, str) else 24 if isinstance(v, _SCALARS) else value_size(v, LIMITS.string)
        if total > LIMITS.string:
            break
    return total


def _join_size(sep: str, items: list[Any]) -> int:
    return _sum_sizes(items, len(sep) * max(len(items) - 1, 0))


def _check_str_method(name: str, s: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Before a str method runs: the size it would build. Returns the (maybe materialised) args."""
    for a in (*args, *kwargs.values()):
        _width(f"the argument of {name}()", a)
    if name == "join" and args:
        items = list(args[0])
        _limit("the items to join", len(items), LIMITS.items)
        _limit("a joined string", _join_size(s, items), LIMITS.string)
        return (items, *args[1:])
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = args[2] if len(args) > 2 else kwargs.get("count")
        _limit("a string", _replace_size(s, args[0], args[1], count), LIMITS.string)
    if name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        _limit("a string", len(s) + s.count("\t") * max(int(tab), 0), LIMITS.string)
    return args


def _bound_split(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """split/rsplit stop at the item limit instead of building a million small strings."""
    sep = args[0] if args else kwargs.pop("sep", None)
    maxsplit = args[1] if len(args) > 1 else kwargs.pop("maxsplit", -1)
    cap = LIMITS.items if maxsplit is None or maxsplit < 0 else min(maxsplit, LIMITS.items)
    return _check_result(method(sep, cap))


# Filters that turn their input into text, and which argument of a filter is a width or count.
_TEXT_FILTERS = {"string", "tojson", "to_json", "pprint", "safe", "escape", "e", "forceescape",
                 "urlencode", "xmlattr", "join", "format"}
_WIDTH_ARGS = {"center": "width", "indent": "width", "wordwrap": "width", "truncate": "length", "batch": "linecount",
               "slice": "slices", "tojson": "indent", "to_json": "indent"}


def _check_filter(name: str, value: Any, arguments: dict[str, Any]) -> None:
    """Before a filter runs: what it would build from its value and arguments."""
    if name in _TEXT_FILTERS:
        _limit("a value to turn into text", value_size(value, LIMITS.string), LIMITS.string)
    width_arg = _WIDTH_ARGS.get(name)
    if width_arg and width_arg in arguments:
        w = arguments[width_arg]
        _width(f"the {width_arg} of {name}", w)
        if name in ("batch", "slice") and isinstance(w, int):
            _limit(f"the {width_arg} of {name}", w, LIMITS.items)
        if name in ("tojson", "to_json") and isinstance(w, int):
            _limit("an indented JSON text", value_size(value, LIMITS.string) * (1 + max(w, 0)), LIMITS.output)
    s = value if isinstance(value, str) else ""
    if name == "replace":
        old, new = str(arguments.get("old", "")), str(arguments.get("new", ""))
        _limit("a string", _replace_size(s, old, new, arguments.get("count")), LIMITS.string)
    elif name == "indent":
        w = arguments.get("width", 4)
        per_line = len(w) if isinstance(w, str) else max(int(w), 0)
        _limit("an indented string", len(s) + (s.count("\n") + 1) * per_line, LIMITS.string)
    elif name == "wordwrap":
        width = max(int(arguments.get("width", 79)), 1)
        wrap = arguments.get("wrapstring") or "\n"
        _limit("a wrapped string", len(s) + (len(s) // width + s.count("\n") + 1) * len(str(wrap)), LIMITS.string)
    elif name == "center":
        _limit("a string", max(len(s), int(arguments.get("width", 80))), LIMITS.string)
    elif name == "sum" and isinstance(value, list | tuple) and isinstance(arguments.get("start"), list | tuple):
        _limit("a sequence", sum(len(v) for v in value if isinstance(v, list | tuple)), LIMITS.items)


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    # Jinja2 passes a context or environment first to some filters; an async-capable filter's
    # wrapper takes one even where the function it wraps (whose signature we see) does not.
    first = 0 if getattr(fn, "jinja_pass_arg", None) is None else 1
    lead = 0 if getattr(inspect.unwrap(fn), "jinja_pass_arg", None) is None else 1
    var_kw = [p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD] if sig else []

    @wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if sig is not None:
            try:
                bound = sig.bind(*args[first - lead:], **kwargs)
            except TypeError:
                pass  # the filter itself says what is wrong with its arguments
            else:
                arguments = dict(bound.arguments)
                for name_ in var_kw:
                    arguments.update(arguments.pop(name_, {}))
                values = list(bound.arguments.values())
                value: Any = values[lead] if len(values) > lead else None
                if name == "join" and len(args) > first:
                    items = list(value)
                    _limit("the items to join", len(items), LIMITS.items)
                    _limit("a joined string", _join_size(str(bound.arguments.get("d", "")), items), LIMITS.string)
                    args = (*args[:first], items, *args[first + 1:])
                else:
                    _check_filter(name, value, arguments)
        return _check_result(fn(*args, **kwargs))

    return bounded


def _format_filter(value: Any, *args: Any, **kwargs: Any) -> str:
    """Jinja2's `format` filter (`value % args`), through the bounded `%`."""
    if args and kwargs:
        raise TypeError("can't handle positional and keyword arguments at the same time")
    return _printf(str(value), kwargs or args)


class _BoundedFormatter(SandboxedFormatter):
    """str.format / format_map: each field's width and value fit, and so does the sum."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        for digits in re.findall(r"\d+", format_spec):
            _width("a formatting width", _number(digits))
        self.total += value_size(value, LIMITS.string) + sum(_number(d) for d in re.findall(r"\d+", format_spec))
        _limit("a formatted string", self.total, LIMITS.string)
        return super().format_field(value, format_spec)


class _OutputBuffer(list[str]):
    """What a `{% set %}` block, a `{% filter %}` block or a macro collects before it is joined:
    it stops at the output limit as it grows."""

    total = 0

    def append(self, chunk: str) -> None:
        self.total += len(chunk)
        _limit("rendered output", self.total, LIMITS.output)
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
            _limit("a format string", len(owner), LIMITS.string)
            return _check_result(type(owner)(_BoundedFormatter(self).vformat(owner, args, kwargs)))

        return bounded

    def concat(self, chunks: Iterable[str]) -> str:  # type: ignore[override]
        """Every rendered body (the whole template, a `{% set %}` block, a macro) stops at
        the output limit while it is produced, not after."""
        out: list[str] = []
        total = 0
        limit = LIMITS.output
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
        _limit("a built value", value_size(value, LIMITS.output), LIMITS.output)
        return value

    def bounded_concat(self, values: tuple[Any, ...]) -> str:
        _limit("a string", _sum_sizes(values), LIMITS.string)
        return str_join(values)

    @staticmethod
    def _finalize(value: Any) -> Any:
        if not isinstance(value, _SCALARS):
            _limit("an output value", value_size(value, LIMITS.output), LIMITS.output)
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


# -- the deadline ------------------------------------------------------------------------------
# Loops inside a template are compiled Python, and nested `range` loops within every size bound
# still run for hours. Only an exception raised inside the rendering thread stops them:
# `PyThreadState_SetAsyncExc` does that from another thread, on any thread (unlike
# `signal.setitimer`, main thread only, which `serve` and the sweep's workers are not). Every
# single operation a template can start is bounded in size above, so the exception always
# arrives within moments. One watchdog thread serves every render (a timer thread per render
# would cost a thread start each). An exception delivered while the thread runs a garbage
# collector's callback is swallowed there ("Exception ignored in ..."), so the watchdog fires
# again every REFIRE seconds until the render is disarmed. Arming and firing share a lock, and
# disarming clears an exception that was set but not yet delivered, so a deadline never fires
# into later code.
REFIRE = 0.5
def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc) if exc is not None else None)


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, int] = {}  # token -> thread id
        self._fired: set[int] = set()  # armed tokens whose exception was set at least once
        self._heap: list[tuple[float, int]] = []  # (deadline, token)
        self._tokens = 0
        self._wake_at = float("inf")
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        with self._cond:
            self._tokens += 1
            token = self._tokens
            at = time.monotonic() + seconds
            self._armed[token] = threading.get_ident()
            heapq.heappush(self._heap, (at, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sweeper-render-deadline", daemon=True)
                self._thread.start()
            if at < self._wake_at:
                self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        """Idempotent: the render's own thread calls it once it is done, however it ended."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:  # it fired: clear what is set but not yet delivered
                self._fired.discard(token)
                _set_async_exc(threading.get_ident(), None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    _, token = heapq.heappop(self._heap)
                    _set_async_exc(self._armed[token], RenderTimeout)
                    self._fired.add(token)
                    heapq.heappush(self._heap, (now + REFIRE, token))  # until the render is disarmed
                    continue
                self._wake_at = self._heap[0][0] if self._heap else float("inf")
                self._cond.wait(None if not self._heap else self._wake_at - now)


_WATCHDOG = _Watchdog()
_local = threading.local()


@contextlib.contextmanager
def render_deadline(seconds: float | None) -> Iterator[None]:
    """Renders inside this block stop after `seconds` (a task's `timeout`) when that is shorter
    than LIMITS.seconds."""
    before = getattr(_local, "cap", None)
    if seconds is not None:
        _local.cap = seconds if before is None else min(before, seconds)
    try:
        yield
    finally:
        _local.cap = before


def _deadline() -> tuple[float, str, float | None]:
    """This render's deadline in seconds, how an error names it, and the task's cap (if any)."""
    cap = getattr(_local, "cap", None)
    seconds = LIMITS.seconds if cap is None else min(cap, LIMITS.seconds)
    whose = "the task's timeout" if cap is not None and cap < LIMITS.seconds else "the render deadline"
    return seconds, whose, cap


def _snippet(source: str) -> str:
    return source if len(source) <= 120 else source[:117] + "..."


def _guarded(where: str, source: str, fn: Callable[[], Any]) -> Any:
    """Run one render under its deadline, and turn whatever goes wrong into a PlaybookError
    that names the task's file:line and the expression."""
    snippet = _snippet(source)
    if getattr(_local, "rendering", False):  # a render inside a render: the outer deadline holds
        return fn()
    seconds, whose, _ = _deadline()
    _local.rendering = True
    try:
        token = _WATCHDOG.arm(seconds)
        try:
            return fn()
        finally:
            _WATCHDOG.disarm(token)
    except RenderTimeout:
        _WATCHDOG.disarm(token)  # again: the exception may have arrived inside the first disarm
        raise PlaybookError(f"{where}: rendering {snippet!r} ran past {whose} ({seconds:g}s)") from None
    except (PlaybookError, TemplateError):
        raise  # render() and condition() word these as before
    except LimitExceeded as exc:
        raise PlaybookError(f"{where}: template limit: {exc} in {snippet!r}") from None
    except MemoryError as exc:
        if _IN_WORKER:
            from sweeper.render_worker import MEMORY_LIMIT
            raise PlaybookError(f"{where}: rendering {snippet!r} ran past the render memory limit "
                                f"({MEMORY_LIMIT >> 20} MiB)") from exc
        raise PlaybookError(f"{where}: cannot render {snippet!r}: MemoryError: {str(exc)[:300]}") from None
    except (ArithmeticError, AttributeError, LookupError, RecursionError, TypeError, ValueError) as exc:
        raise PlaybookError(f"{where}: cannot render {snippet!r}: {type(exc).__name__}: {str(exc)[:300]}") from None
    finally:
        _local.rendering = False


# -- the render worker ---------------------------------------------------------------------------
# Every render of a playbook's text (render, condition, render_template) runs in the render
# worker (sweeper.render_worker: a child process under RLIMIT_AS, killed at the deadline)
# unless SWEEPER_RENDER_ISOLATION=thread. Inside the worker, _IN_WORKER is set and the same
# functions render in-process. A request whose variables hold a value pickle cannot carry (a
# callable, an open client) renders in-process as before; the executor's variables are plain
# data (results, facts, node dicts), so that path is not taken by playbooks.
_IN_WORKER = False


def _to_worker() -> bool:
    if _IN_WORKER or getattr(_local, "rendering", False):
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
        return True, render_worker.run(op, args, where, _snippet(source), seconds, whose, cap, LIMITS)
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
    _limit("a rendered value", value_size(value, LIMITS.output), LIMITS.output)
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
    size = value_size(value, LIMITS.fact)
    if size > LIMITS.fact:
        raise PlaybookError(f"{where}: template limit: the fact {name!r} is over {LIMITS.fact:,} characters as JSON")


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



# -- job templates by name ---------------------------------------------------------------------
@dataclass(frozen=True)
class JobTemplate:
    """A job template found by name: its file, its text, and whether it is one Sweeper ships
    (only a shipped template may be a privileged remediation Job)."""

    name: str
    path: Path
    text: str
    shipped: bool


def resolve_template(name: str, shipped: Path, author: Path | None = None) -> JobTemplate:
    """The template `name` (a `.j2` file name, or a relative path inside a folder), found in the
    author's folder (config `template_dir`) first, then in the shipped job-templates/. An absolute
    path, a `..`, or a file whose real path (symlinks followed) leaves its folder is refused, and
    the refusal never shows what the file holds."""
    why = _bad_name(name)
    if why:
        raise PlaybookError(f"job template {name!r}: {why}")
    folders = [(author, False)] if author is not None and author.resolve() != shipped.resolve() else []
    for folder, is_shipped in [*folders, (shipped, True)]:
        assert folder is not None
        candidate = folder / name
        if not candidate.exists() and not candidate.is_symlink():
            continue
        root, real = folder.resolve(), candidate.resolve()
        if not real.is_relative_to(root):
            raise PlaybookError(f"job template {name!r}: {candidate} leaves its folder {folder} (it points at another "
                                "place); a template must be a file inside the folder")
        if not real.is_file():
            raise PlaybookError(f"job template {name!r}: {candidate} is not a file")
        try:
            text = real.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PlaybookError(f"job template {name!r}: cannot read {candidate}: {type(exc).__name__}") from None
        return JobTemplate(name, candidate, text, is_shipped and folder.resolve() == shipped.resolve())
    where = " or ".join(str(f) for f, _ in [*folders, (shipped, True)] if f is not None)
    raise PlaybookError(f"job template {name!r}: not found in {where}")


def _bad_name(name: str) -> str:
    if not name or "\x00" in name or "\\" in name:
        return "not a template name"
    parts = PurePosixPath(name)
    if parts.is_absolute() or name.startswith("~"):
        return "an absolute path; name a template of job-templates/ or of the config's template_dir"
    if ".." in parts.parts:
        return "'..' leaves the template folder; name a template inside it"
    if not name.endswith(".j2"):
        return "a job template's name ends in .j2"
    return ""


def render_template(template: JobTemplate, variables: dict[str, Any]) -> str:
    """A job template rendered whole. Errors name the file and line, never its text: a file that is
    not a template (or holds a secret) is not echoed back."""
    where = str(template.path)
    if _to_worker():
        done, out = _in_worker("template", (template, _needed(template.text, variables)), where,
                               f"<the template {template.name}>")
        if done:
            return str(out)
    try:
        compiled = _template(template.text)  # compiled once per text: the worker lives long
    except TemplateSyntaxError as exc:
        raise PlaybookError(f"{where}:{exc.lineno}: template syntax error: {exc.message}") from None
    try:
        return str(_guarded(where, f"<the template {template.name}>",
                            lambda: ENV.concat(compiled.root_render_func(compiled.new_context(variables)))))
    except UndefinedError as exc:
        raise PlaybookError(f"{where}: undefined variable: {exc.message}") from None
    except TemplateError as exc:
        raise PlaybookError(f"{where}: template error: {type(exc).__name__}") from None
