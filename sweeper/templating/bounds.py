"""What one render may build (`LIMITS`), and the checks that hold a template to it before it
builds more: operators, str methods, filters and sizes counted without building the value.

`LIMITS` lives here alone: every module of the package reads `bounds.LIMITS` when it runs, so
setting `sweeper.templating.LIMITS` (the render worker does, with the controller's) takes
effect everywhere."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

from jinja2.runtime import Namespace


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
