"""A file checked against its model: each problem as `file:line: key: what is wrong; allowed: ...`
(in words for the type, range and choices, with a near key suggested for an unknown one), and the
docs' table of keys from the same declaration."""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

from sweeper.schema.declaration import Spec, _optional, spec_of
from sweeper.schema.yamlfile import ConfigProblems, NodeRef, locate

_TYPE_WORDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
               dict: "a mapping", type(None): "empty"}


def _shown(value: Any, node: yaml.Node | None) -> str:
    if isinstance(node, yaml.ScalarNode):
        text = node.value if node.style is None else repr(node.value)
        return text if len(text) <= 40 else text[:37] + "..."
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def allowed_words(tp: Any, spec: Spec) -> str:
    """`integer >= 0`, `duration > 0s`, `one of a, b`: what a key allows, in a few words."""
    if spec.allowed:
        return spec.allowed
    if spec.choices:
        return "one of " + ", ".join(repr(c) if c == "" else str(c) for c in spec.choices)
    base = typing.get_args(tp)[0] if _optional(tp) else tp
    if spec.duration:
        words = "duration"
    elif typing.get_origin(base) is tuple:
        words = "list of " + {str: "strings", int: "integers", float: "numbers"}.get(typing.get_args(base)[0], "items")
    else:
        words = {int: "integer", float: "number", bool: "true or false", str: "string"}.get(base, str(base))
    bounds = []
    for op, key in ((">=", "ge"), (">", "gt"), ("<=", "le"), ("<", "lt")):
        v = getattr(spec, key)
        if v is not None:
            bounds.append(f"{op} {human_seconds(v) if spec.duration else _num(v)}")
    if spec.min_length and base is str:
        words = "non-empty string"
    if spec.pattern:
        words += " (" + spec.pattern + ")"
    words = " ".join([words, " and ".join(bounds)]).strip()
    return words + " or empty" if _optional(tp) else words


def _num(v: float) -> str:
    return f"{v:g}"


def human_seconds(seconds: float) -> str:
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g}s"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def problems_of(exc: ValidationError, origin: str, node: NodeRef, model: type[BaseModel],
                cls: type | None = None) -> list[str]:
    """Each pydantic error as `file:line: key: what is wrong; allowed: what is allowed`."""
    hints = typing.get_type_hints(cls) if cls else {}
    specs = {f.name: spec_of(f) for f in dataclasses.fields(cls)} if cls else {}
    out: list[tuple[int, str]] = []
    for e in exc.errors(include_url=False):
        # pydantic adds steps such as `function-before[...]` or `[key]`; the file has only keys and indexes
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p))
        line, at = locate(node, loc)
        key = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))
        kind = e["type"]
        spec = specs.get(str(loc[0])) if len(loc) == 1 else None
        allowed = allowed_words(hints[str(loc[0])], spec) if spec else e["msg"].replace("Input should be ", "")
        if kind == "extra_forbidden":
            parent = _keys_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), parent, n=1)
            wrong = "unknown key" + (f" (did you mean {close[0]}?)" if close else "")
            allowed = ("keys " + ", ".join(sorted(parent))) if 0 < len(parent) <= 16 else \
                "the keys in docs/configuration.md" if parent else "no other keys"
        elif kind == "missing":
            wrong, allowed = "missing", (allowed if spec else "a value (the key is required)")
        else:
            shown = _shown(e.get("input"), at)
            if isinstance(e.get("input"), float) and not math.isfinite(e["input"]):
                wrong = f"{shown} is not a finite number"
            elif kind in ("greater_than", "greater_than_equal"):
                wrong = f"{shown} is too small"
            elif kind in ("less_than", "less_than_equal"):
                wrong = f"{shown} is too large"
            elif kind == "value_error":
                wrong = f"{shown} is {e['msg'].replace('Value error, ', '')}"
            elif kind == "string_pattern_mismatch":
                wrong = f"{shown} does not match"
            elif kind in ("literal_error", "enum"):
                wrong = f"{shown} is not one of the choices"
            elif kind.endswith("_type") or kind.endswith("_parsing"):
                wrong = f"{shown} is {_TYPE_WORDS.get(type(e.get('input')), type(e.get('input')).__name__)}"
            else:
                wrong = f"{shown}: {e['msg'][0].lower()}{e['msg'][1:]}"
        out.append((line, f"{origin}:{line}: {key or '(top)'}: {wrong}; allowed: {allowed}"))
    return [text for _, text in sorted(out, key=lambda pair: pair[0])]


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the model allows at `loc` (a mapping inside the file)."""
    from pydantic import BaseModel

    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and isinstance(part, str) \
                and part in current.model_fields:
            current = current.model_fields[part].annotation
        current = _model_inside(current)
        if current is None:
            return []
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _model_inside(tp: Any) -> Any:
    """The model a type holds: itself, or inside a list, dict value or Optional."""
    from pydantic import BaseModel

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in reversed(typing.get_args(tp)):
        found = _model_inside(arg)
        if found is not None:
            return found
    return None


def check(model: type[BaseModel], data: Any, origin: str, node: NodeRef, cls: type | None = None,
          what: str = "file") -> BaseModel:
    """Validate `data` against `model`; every problem raised at once as ConfigProblems."""
    from pydantic import ValidationError

    if data is None:
        data = {}
    if not isinstance(data, dict):
        line, _ = locate(node, ())
        raise ConfigProblems([f"{origin}:{line}: (top): {_TYPE_WORDS.get(type(data), 'not a mapping')}; "
                              f"allowed: a mapping of keys ({what})"])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigProblems(problems_of(exc, origin, node, model, cls)) from None
    except RecursionError as exc:
        raise ConfigProblems([f"{origin}:1: (top): nested too deeply; allowed: a {what}"]) from exc


def reference_table(cls: type) -> str:
    """The docs' table of keys, generated from the declaration."""
    hints = typing.get_type_hints(cls)
    rows = ["| key | default | allowed | what it does |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        if spec is None:
            continue
        if spec.shown_default:
            d: Any = spec.shown_default
        elif f.default is not dataclasses.MISSING:
            d = f.default
        elif f.default_factory is not dataclasses.MISSING:
            d = f.default_factory()
        else:
            d = "(required)"
        if spec.duration and isinstance(d, int | float):
            shown = human_seconds(float(d))
        elif isinstance(d, tuple):
            shown = "[" + ", ".join(map(str, d)) + "]" if d else "[]"
        elif isinstance(d, bool):
            shown = str(d).lower()
        elif d is None:
            shown = "-"
        elif d == "":
            shown = '""'
        else:
            shown = str(d) if not isinstance(d, dict) else yaml.safe_dump(d, default_flow_style=True).strip()
        cell, what = (text.replace("|", "\\|") for text in (allowed_words(hints[f.name], spec), spec.help))
        rows.append(f"| `{f.name}` | `{shown}` | {cell} | {what} |")
    return "\n".join(rows) + "\n"
