"""A key declared once, on the dataclass the code uses (`setting()` and its `Spec`), and the pydantic
model derived from the declaration (`model_of`) with the way back to the dataclass's values
(`runtime_values`). pydantic is imported when a file is first checked, not before."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

if TYPE_CHECKING:
    from pydantic import BaseModel

from sweeper.clock import parse_duration

DURATION_WORDS = "a duration: 90s, 10m, 6h, 7d, 1w or seconds"


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


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved annotations: the same for the life of the process, and each file read
    asks for them (typing resolves every string annotation again on each call)."""
    return typing.get_type_hints(cls)


def runtime_values(cls: type, model: BaseModel) -> dict[str, Any]:
    """The keys a file set, as the dataclass holds them (lists as tuples, nested models as dicts)."""
    from pydantic import BaseModel

    hints = _hints(cls)
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
