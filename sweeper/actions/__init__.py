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
    """One argument of an action, declared once: validation, `sweeper lint` and docs/actions.md."""

    name: str
    type: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] = ()
    raw: bool = False  # passed to the action unrendered (conditions the action evaluates itself)

    @property
    def type_name(self) -> str:
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}
        return " or ".join(names.get(t, t.__name__) for t in types)


@dataclass(frozen=True)
class Action:
    name: str
    fn: Callable[[ActionContext, dict[str, Any]], dict[str, Any]]
    args: tuple[Arg, ...]
    help: str
    needs_node: bool = False
    needs_cluster: bool = False
    free_form: bool = False  # any keys (set_fact)

    def validate(self, args: dict[str, Any], where: str) -> dict[str, Any]:
        if self.free_form:
            return dict(args)
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
            if value is not None and not a.raw and not isinstance(value, a.type):
                raise PlaybookError(f"{where}: {self.name}: argument {a.name!r} must be {a.type_name}, "
                                    f"got {type(value).__name__}")
            if a.choices and value not in a.choices:
                raise PlaybookError(f"{where}: {self.name}: argument {a.name!r} must be one of {list(a.choices)}, "
                                    f"got {value!r}")
            out[a.name] = value
        return out


@dataclass
class ActionContext:
    """What actions may touch: the cluster, the clock, the node under test, and observers."""

    config: Config = field(default_factory=Config)
    clock: Clock = field(default_factory=WallClock)
    kube: Any = None
    node: dict[str, Any] | None = None
    partner: dict[str, Any] | None = None  # a pair playbook's node B (the same shape as `node`); None: no pair
    run_id: str = "adhoc"
    on_result: Callable[[Result], None] = lambda r: None
    intent: Callable[[str, str, str], None] = lambda op, phase, detail: None
    log: Callable[[str], None] = lambda msg: None
    facts: dict[str, Any] = field(default_factory=dict)
    cancelled: Callable[[], bool] = lambda: False
    vars: dict[str, Any] = field(default_factory=dict)  # the variables the current task sees
    deadline: float | None = None  # the task's timeout, on the injected clock
    timed_out: bool = False  # set when a wait was cut short by the deadline
    on_record: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    past: Any = None  # the node's history, for the policy's history rules (policy.Past); None: findings only
    jobwatch: Any = None  # the run's shared watch of its check Jobs (actions.jobwatch.RunWatch); None: run_job's own
    # What the sweep already read of the node: `node` (as its hold's patch returned it), `at` (then),
    # `idle_at` (when its pods were listed after the taint and held no GPU). Actions reuse it
    # within node.SEEN_FRESH instead of reading again.
    seen: dict[str, Any] = field(default_factory=dict)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock.now()

    def sleep(self, seconds: float) -> bool:
        """Sleep within the task's deadline; False when the deadline cut it short."""
        left = self.remaining()
        if left is not None and left <= seconds:
            self.clock.sleep(max(0.0, left))
            self.timed_out = True
            return False
        self.clock.sleep(seconds)
        return True

    @property
    def node_name(self) -> str:
        if not self.node:
            raise PlaybookError("this action needs a target node (sweeper run --node NODE)")
        return str(self.node["name"])

    def cluster(self) -> Any:
        if self.kube is None:
            raise PlaybookError("this action needs a cluster (a kubeconfig or in-cluster config)")
        return self.kube


REGISTRY: dict[str, Action] = {}


def action(name: str, *args: Arg, help: str, needs_node: bool = False, needs_cluster: bool = False,
           free_form: bool = False) -> Callable[..., Any]:
    def register(fn: Callable[[ActionContext, dict[str, Any]], dict[str, Any]]) -> Any:
        REGISTRY[name] = Action(name, fn, args, help, needs_node, needs_cluster or needs_node, free_form)
        return fn
    return register


def ok(msg: str = "", changed: bool = False, **data: Any) -> dict[str, Any]:
    return {"changed": changed, "failed": False, "msg": msg, **data}


def failed(msg: str, **data: Any) -> dict[str, Any]:
    return {"changed": False, "failed": True, "msg": msg, **data}


def load_all() -> dict[str, Action]:
    from sweeper.actions import decide, jobs, node, pair, pure  # noqa: F401  (registration by import)

    return REGISTRY
