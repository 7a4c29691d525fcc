"""The verbs of a playbook, each a small function with declared, validated arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.clock import Clock, WallClock
from sweeper.config import Config
from sweeper.errors import PlaybookError
from sweeper.result import Result


@dataclass(frozen=True)
class Arg:
    name: str
    type: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    help: str = ""


@dataclass(frozen=True)
class Action:
    name: str
    fn: Callable[[ActionContext, dict[str, Any]], dict[str, Any]]
    args: tuple[Arg, ...]
    help: str
    needs_node: bool = False

    def validate(self, args: dict[str, Any], where: str) -> dict[str, Any]:
        known = {a.name for a in self.args}
        extra = set(args) - known
        if extra:
            raise PlaybookError(f"{where}: {self.name}: unknown argument(s) {sorted(extra)}; "
                                f"expected {sorted(known) or 'none'}")
        out: dict[str, Any] = {}
        for a in self.args:
            if a.name not in args:
                if a.required:
                    raise PlaybookError(f"{where}: {self.name}: missing required argument {a.name!r}")
                out[a.name] = a.default
                continue
            value = args[a.name]
            if value is not None and not isinstance(value, a.type):
                want = a.type.__name__ if isinstance(a.type, type) else "/".join(t.__name__ for t in a.type)
                raise PlaybookError(f"{where}: {self.name}: argument {a.name!r} must be {want}, "
                                    f"got {type(value).__name__}")
            out[a.name] = value
        return out


@dataclass
class ActionContext:
    """What actions may touch: the cluster, the clock, the node under test, and observers."""

    config: Config = field(default_factory=Config)
    clock: Clock = field(default_factory=WallClock)
    kube: Any = None
    node: dict[str, Any] | None = None
    run_id: str = "adhoc"
    on_result: Callable[[Result], None] = lambda r: None
    intent: Callable[[str, str, str], None] = lambda op, phase, detail: None
    log: Callable[[str], None] = lambda msg: None
    facts: dict[str, Any] = field(default_factory=dict)
    cancelled: Callable[[], bool] = lambda: False


REGISTRY: dict[str, Action] = {}


def action(name: str, *args: Arg, help: str, needs_node: bool = False) -> Callable[..., Any]:
    def register(fn: Callable[[ActionContext, dict[str, Any]], dict[str, Any]]) -> Any:
        REGISTRY[name] = Action(name, fn, args, help, needs_node)
        return fn
    return register


def ok(msg: str = "", changed: bool = False, **data: Any) -> dict[str, Any]:
    return {"changed": changed, "failed": False, "msg": msg, **data}


def failed(msg: str, **data: Any) -> dict[str, Any]:
    return {"changed": False, "failed": True, "msg": msg, **data}


def load_all() -> dict[str, Action]:
    from sweeper.actions import decide, jobs, pure  # noqa: F401  (registration by import)

    return REGISTRY
