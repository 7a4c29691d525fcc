"""One description of a YAML file's keys (type, range, unit, help) that drives its loader, its
`file:line: key: what is wrong; allowed: ...` messages, `sweeper lint` and docs/configuration.md.

The keys are declared once, on the frozen dataclass the rest of the code uses, with `setting()`.
A pydantic v2 model is derived from that declaration to check a file. pydantic rather than
msgspec: pydantic reports every problem of a file in one pass (msgspec stops at the first), each
with a structured location (`loc`) that maps onto the YAML line of the key; it has per-field
range constraints, strict scalars (so `"4"` is not an integer) and `extra="forbid"` for unknown
keys. The runtime objects stay plain dataclasses, so `dataclasses.replace` and attribute access
are unchanged and cost nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import yaml

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

from sweeper.clock import parse_duration
from sweeper.errors import ConfigError


# -- YAML without aliases ------------------------------------------------------------------
class NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases (`*name`): a few hundred bytes of nested aliases
    ("billion laughs") expand to gigabytes once anything walks the data, and no file Sweeper
    reads needs them."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)  # type: ignore[no-any-return]


def safe_load(text: str) -> Any:
    """One YAML document, as `yaml.safe_load` reads it, but refusing aliases."""
    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def safe_load_all(text: str) -> list[Any]:
    """Every YAML document of `text`, refusing aliases."""
    return list(yaml.load_all(text, Loader=NoAliasLoader))  # noqa: S506 - a SafeLoader subclass

DURATION_WORDS = "a duration: 90s, 10m, 6h, 7d, 1w or seconds"


class ConfigProblems(ConfigError):
    """A file with one or more problems; `problems` holds each as `file:line: key: ...`."""

    def __init__(self, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more problem(s); `sweeper lint` lists each)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)
        self.problems = problems


@dataclass(frozen=True)
class Spec:
    """What a key may hold: its help line, whether it is a duration, its range and its choices."""

    help: str = ""
    duration: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] = ()
    min_length: int | None = None
    pattern: str | None = None
    annotation: Any = None  # an explicit pydantic type for a nested shape
    allowed: str = ""  # words for what `annotation` allows
    convert: Callable[[Any], Any] | None = None  # from the checked value to the runtime one
    shown_default: str = ""  # the docs' words for a default the loader fills in

    def constraints(self) -> dict[str, Any]:
        kw = {k: getattr(self, k) for k in ("ge", "gt", "le", "lt", "min_length", "pattern")
              if getattr(self, k) is not None}
        return kw


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            **spec: Any) -> Any:
    """A dataclass field with its file description (see Spec)."""
    meta = {"spec": Spec(help=help, **spec)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spec_of(f: dataclasses.Field[Any]) -> Spec | None:
    s = f.metadata.get("spec")
    return s if isinstance(s, Spec) else None


def to_seconds(value: Any) -> Any:
    """A human duration to seconds; what is not one is left for the float check to refuse."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError:
            raise ValueError("not a duration") from None
    if isinstance(value, int | float):
        return float(value)
    return value


def duration_type(**constraints: Any) -> Any:
    from pydantic import BeforeValidator, Field, Strict

    return Annotated[float, BeforeValidator(to_seconds), Strict(), Field(allow_inf_nan=False, **constraints)]


def _scalar(tp: Any, spec: Spec) -> Any:
    from pydantic import Field, Strict

    if spec.choices:
        return Literal[spec.choices]  # type: ignore[valid-type]
    extra: dict[str, Any] = {"allow_inf_nan": False} if tp is float else {}
    return Annotated[tp, Strict(), Field(**spec.constraints(), **extra)]


class Deferred:
    """An annotation built when a file is first checked (so pydantic is imported only then)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build


def _annotation(tp: Any, spec: Spec) -> Any:
    if spec.annotation is not None:
        return spec.annotation.build() if isinstance(spec.annotation, Deferred) else spec.annotation
    if spec.duration:
        inner = duration_type(**spec.constraints())
        return Optional[inner] if _optional(tp) else inner  # noqa: UP045 - built at run time
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _optional(tp):
        return Optional[_annotation(next(a for a in args if a is not type(None)), spec)]  # noqa: UP045
    if tp in (int, float, bool, str):
        return _scalar(tp, spec)
    item_spec = dataclasses.replace(spec, min_length=None)
    if (origin is tuple and args[1:] == (Ellipsis,) or origin is list) and args[0] in (int, float, str):
        return list[_scalar(args[0], item_spec)]  # type: ignore[misc]
    if origin is dict and args[1] in (int, float, str, bool):
        return dict[args[0], _scalar(args[1], item_spec)]  # type: ignore[misc,valid-type]
    raise TypeError(f"no file type for {tp!r}: give the setting an annotation")


def _optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp) and typing.get_origin(tp) in (typing.Union, types.UnionType)


def model_of(cls: type, name: str | None = None) -> type[BaseModel]:
    """The pydantic model of the keys of a dataclass declared with `setting()`."""
    from pydantic import ConfigDict, create_model

    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        if spec is None:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields[f.name] = (_annotation(hints[f.name], spec), ... if required else None)
    return create_model(name or f"{cls.__name__}File", __config__=ConfigDict(extra="forbid"), **fields)


def runtime_values(cls: type, model: BaseModel) -> dict[str, Any]:
    """The keys a file set, as the dataclass holds them (lists as tuples, nested models as dicts)."""
    from pydantic import BaseModel

    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for key in model.model_fields_set:
        value = getattr(model, key)
        spec = spec_of(by_name[key])
        if spec and spec.convert:
            value = spec.convert(value)
        elif isinstance(value, BaseModel):
            value = value.model_dump(exclude_none=True)
        elif isinstance(value, list):
            value = [v.model_dump(exclude_none=True) if isinstance(v, BaseModel) else v for v in value]
            if typing.get_origin(hints[key]) is tuple:
                value = tuple(value)
        out[key] = value
    return out


# -- reading a file with line marks -----------------------------------------------------
def read_yaml(path: Path, what: str) -> tuple[Any, yaml.Node | None]:
    """The file's data and its composed node tree (for line numbers)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    try:
        node = yaml.compose(text, Loader=NoAliasLoader)
        data = safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigProblems([f"{path}:{mark.line + 1 if mark else 1}: YAML syntax error: {exc.problem}"]) from exc
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigProblems([f"{path}:1: not readable as YAML: {type(exc).__name__}"]) from exc
    return data, node


def locate(node: yaml.Node | None, loc: tuple[Any, ...]) -> tuple[int, yaml.Node | None]:
    """The 1-based line of the deepest key of `loc` present in the YAML, and the node there."""
    if node is None:
        return 1, None
    line = node.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            # the last of repeated keys, as PyYAML keeps the last value
            hit = next(((k, v) for k, v in reversed(node.value) if str(getattr(k, "value", "")) == str(part)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return line + 1, node


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


def problems_of(exc: ValidationError, origin: str, node: yaml.Node | None, model: type[BaseModel],
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


def check(model: type[BaseModel], data: Any, origin: str, node: yaml.Node | None, cls: type | None = None,
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
