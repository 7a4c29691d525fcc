"""Playbooks as typed, immutable objects, loaded strictly: unknown keys, wrong types, bad
action arguments and duplicate keys are errors that name file:line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.actions import Action
from sweeper.errors import PlaybookError
from sweeper.playbook.source import Located, load_yaml, parse_yaml, where
from sweeper.templating import check_syntax

TASK_KEYS = {"name", "register", "when", "ignore_errors", "block", "rescue", "always", "tags", "timeout", "vars",
             "loop", "loop_control", "until", "retries", "delay", "changed_when", "failed_when", "include"}
LOOP_CONTROL = {"loop_var", "index_var", "label"}
ABSENT = object()


@dataclass(frozen=True)
class Task:
    name: str
    where: str
    action: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    register: str = ""
    when: tuple[Any, ...] = ()
    loop: Any = ABSENT
    loop_var: str = "item"
    index_var: str = ""
    label: str = ""
    until: Any = None
    retries: int | None = None
    delay: Any = None
    changed_when: Any = None
    failed_when: Any = None
    ignore_errors: bool = False
    timeout: Any = None
    tags: tuple[str, ...] = ()
    vars: dict[str, Any] = field(default_factory=dict)
    block: tuple[Task, ...] = ()
    rescue: tuple[Task, ...] = ()
    always: tuple[Task, ...] = ()
    is_block: bool = False

    def walk(self) -> list[Task]:
        out = [self]
        for t in self.block + self.rescue + self.always:
            out += t.walk()
        return out


@dataclass(frozen=True)
class Playbook:
    name: str
    tasks: tuple[Task, ...]
    vars: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    pair: bool = False  # run by the engine on two nodes at once (template variables `node` and `partner`)

    def all_tasks(self) -> list[Task]:
        return [t for top in self.tasks for t in top.walk()]


def load_playbook(path: Path, actions: dict[str, Action], problems: list[str] | None = None) -> Playbook:
    """Load strictly. With `problems`, keep going past a broken top-level task and collect every
    message (for `sweeper lint`); without, raise on the first."""
    return _playbook(load_yaml(path), actions, str(path), (path.resolve(),), problems)


def parse_playbook(text: str, actions: dict[str, Action], origin: str = "<playbook>") -> Playbook:
    return _playbook(parse_yaml(text, origin), actions, origin, ())


def _playbook(raw: Any, actions: dict[str, Action], origin: str, stack: tuple[Path, ...],
              problems: list[str] | None = None) -> Playbook:
    if not isinstance(raw, dict):
        raise PlaybookError(f"{origin}:1: a playbook is a mapping with name, vars and tasks")
    unknown = sorted(set(raw) - {"name", "vars", "tasks", "pair"})
    if unknown:
        raise PlaybookError(f"{where(raw, unknown[0], origin)}: unknown key {unknown[0]!r}; "
                            "a playbook has name, pair, vars and tasks")
    if not isinstance(raw.get("pair", False), bool):
        raise PlaybookError(f"{where(raw, 'pair', origin)}: pair must be true or false")
    tasks = raw.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise PlaybookError(f"{where(raw, 'tasks', origin + ':1')}: tasks must be a non-empty list")
    pvars = raw.get("vars") or {}
    if not isinstance(pvars, dict):
        raise PlaybookError(f"{where(raw, 'vars', origin)}: vars must be a mapping")
    ctx = _Ctx(actions, origin, stack)
    parsed = []
    for t in tasks:
        try:
            parsed.append(ctx.task(t))
        except PlaybookError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
    return Playbook(name=str(raw.get("name") or Path(origin).stem), vars=dict(pvars), source=origin,
                    tasks=tuple(parsed), pair=bool(raw.get("pair", False)))


class _Ctx:
    def __init__(self, actions: dict[str, Action], origin: str, stack: tuple[Path, ...]) -> None:
        self.actions = actions
        self.origin = origin
        self.stack = stack

    def err(self, raw: Any, key: str | None, message: str) -> PlaybookError:
        return PlaybookError(f"{where(raw, key, self.origin)}: {message}")

    def task(self, raw: Any) -> Task:
        if not isinstance(raw, Located):  # every mapping the loader builds is Located
            return self._fail_shape(raw)
        name = raw.get("name")
        action_keys = [k for k in raw if k not in TASK_KEYS]
        for k in action_keys:
            if k not in self.actions:
                raise self.err(raw, k, f"unknown key or action {k!r}; actions are: {', '.join(sorted(self.actions))}")
        is_block = "block" in raw
        for k in ("rescue", "always"):
            if k in raw and not is_block:
                raise self.err(raw, k, f"{k!r} belongs to a block; add a 'block' list")
        if "include" in raw:
            if action_keys or is_block:
                raise self.err(raw, "include", "an include cannot also run an action or a block")
            return self._include(raw)
        if is_block and action_keys:
            raise self.err(raw, action_keys[0], f"a block cannot also run the action {action_keys[0]!r}")
        if not is_block and len(action_keys) != 1:
            found = ", ".join(action_keys) or "none"
            raise self.err(raw, None, f"a task runs exactly one action (found {found})")
        common = self._common(raw, str(name) if name else (action_keys[0] if action_keys else "block"))
        if is_block:
            for k in ("loop", "until", "retries", "register", "changed_when", "failed_when"):
                if k in raw:
                    raise self.err(raw, k, f"{k!r} is not allowed on a block")
            lists = {}
            for k in ("block", "rescue", "always"):
                value = raw.get(k) or []
                if not isinstance(value, list):
                    raise self.err(raw, k, f"{k!r} must be a list of tasks")
                lists[k] = tuple(self.task(t) for t in value)
            return Task(**common, block=lists["block"], rescue=lists["rescue"], always=lists["always"], is_block=True)
        action = self.actions[action_keys[0]]
        args = raw[action_keys[0]]
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise self.err(raw, action_keys[0], f"the arguments of {action.name!r} must be a mapping, "
                                                f"got {type(args).__name__}")
        self._check_args(raw, action, args)
        return Task(**common, action=action.name, args=dict(args))

    def _fail_shape(self, raw: Any) -> Task:
        raise PlaybookError(f"{self.origin}: a task must be a mapping, got {type(raw).__name__}: {str(raw)[:60]!r}")

    def _common(self, raw: Located, name: str) -> dict[str, Any]:
        when = raw.get("when", ())
        if isinstance(when, list):
            when = tuple(when)
        elif when in ((), None):
            when = ()
        else:
            when = (when,)
        for w in when:
            if not isinstance(w, (str, bool)):
                raise self.err(raw, "when", f"a condition is an expression string, got {type(w).__name__}")
            if isinstance(w, str):
                if "{{" in w:
                    raise self.err(raw, "when", f"conditions are bare expressions; drop the braces in {w!r}")
                self._syntax(raw, "when", w, expression=True)
        tags = raw.get("tags", ())
        tags = (tags,) if isinstance(tags, str) else tuple(tags or ())
        lc = raw.get("loop_control") or {}
        if not isinstance(lc, dict) or set(lc) - LOOP_CONTROL:
            raise self.err(raw, "loop_control", f"loop_control takes {sorted(LOOP_CONTROL)}")
        retries = raw.get("retries")
        if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool) or retries < 0):
            raise self.err(raw, "retries", "retries must be a non-negative integer")
        for k in ("until", "changed_when", "failed_when"):
            v = raw.get(k)
            if isinstance(v, str):
                self._syntax(raw, k, v, expression=True)
        tvars = raw.get("vars") or {}
        if not isinstance(tvars, dict):
            raise self.err(raw, "vars", "vars must be a mapping")
        register = raw.get("register", "")
        if register and not str(register).isidentifier():
            raise self.err(raw, "register", f"register needs a variable name, got {register!r}")
        for key in ("ignore_errors",):
            if key in raw and not isinstance(raw[key], bool):
                raise self.err(raw, key, f"{key} must be true or false")
        return {"name": name, "where": raw.where(), "register": str(register), "when": when,
                "loop": raw.get("loop", ABSENT), "loop_var": str(lc.get("loop_var", "item")),
                "index_var": str(lc.get("index_var", "")), "label": str(lc.get("label", "")),
                "until": raw.get("until"), "retries": retries, "delay": raw.get("delay"),
                "changed_when": raw.get("changed_when"), "failed_when": raw.get("failed_when"),
                "ignore_errors": bool(raw.get("ignore_errors", False)), "timeout": raw.get("timeout"),
                "tags": tags, "vars": dict(tvars)}

    def _syntax(self, raw: Located, key: str, text: str, expression: bool = False) -> None:
        problem = check_syntax(text, expression=expression)
        if problem:
            raise self.err(raw, key, problem)

    def _check_args(self, raw: Located, action: Action, args: dict[str, Any]) -> None:
        raw_args = {a.name for a in action.args if a.raw}
        for k, v in args.items():
            where_ = args if isinstance(args, Located) else raw
            if k in raw_args:
                for expr in (v if isinstance(v, list) else [v]):
                    if isinstance(expr, str):
                        self._syntax(where_, k, expr, expression=True)
            elif isinstance(v, str) and ("{{" in v or "{%" in v):
                self._syntax(where_, k, v)
        if action.free_form:
            return
        known = {a.name: a for a in action.args}
        for k in args:
            if k not in known:
                raise self.err(args if isinstance(args, Located) else raw, k,
                               f"{action.name}: unknown argument {k!r}; expected one of {sorted(known) or 'none'}")
        for a in action.args:
            if a.required and a.name not in args:
                raise self.err(raw, action.name, f"{action.name}: missing required argument {a.name!r}")
            if a.name in args and not a.raw:
                v = args[a.name]
                templated = isinstance(v, str) and "{{" in v
                if v is not None and not templated and not isinstance(v, a.type):
                    raise self.err(args if isinstance(args, Located) else raw, a.name,
                                   f"{action.name}: argument {a.name!r} must be {a.type_name}, got {type(v).__name__}")
                if a.choices and not templated and v not in a.choices:
                    raise self.err(args if isinstance(args, Located) else raw, a.name,
                                   f"{action.name}: argument {a.name!r} must be one of {list(a.choices)}, got {v!r}")

    def _include(self, raw: Located) -> Task:
        target = raw["include"]
        if not isinstance(target, str):
            raise self.err(raw, "include", "include takes a playbook file name")
        base = Path(self.origin).parent
        path = (base / target).resolve()
        if path in self.stack:
            raise self.err(raw, "include", f"include cycle: {' -> '.join(p.name for p in self.stack + (path,))}")
        if not path.exists():
            raise self.err(raw, "include", f"included playbook {target!r} not found (looked in {base})")
        sub = _playbook(load_yaml(path), self.actions, str(path), self.stack + (path,))
        common = self._common(raw, str(raw.get("name") or f"include {target}"))
        common["vars"] = {**sub.vars, **common["vars"]}
        return Task(**common, block=sub.tasks, is_block=True)
