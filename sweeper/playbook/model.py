"""Playbooks as typed, immutable objects, loaded strictly: unknown keys are errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import PlaybookError

TASK_KEYS = {"name", "register", "when", "ignore_errors", "block", "rescue", "always", "tags", "timeout", "vars"}


@dataclass(frozen=True)
class Task:
    name: str
    action: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    register: str = ""
    when: tuple[Any, ...] = ()
    ignore_errors: bool = False
    timeout: Any = None
    tags: tuple[str, ...] = ()
    block: tuple[Task, ...] = ()
    rescue: tuple[Task, ...] = ()
    always: tuple[Task, ...] = ()
    where: str = ""

    @property
    def is_block(self) -> bool:
        return bool(self.block or self.rescue or self.always)


@dataclass(frozen=True)
class Playbook:
    name: str
    tasks: tuple[Task, ...]
    vars: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def load_playbook(path: Path, actions: set[str]) -> Playbook:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise PlaybookError(f"{path}: cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise PlaybookError(f"{loc}: YAML syntax error: {getattr(exc, 'problem', exc)}") from exc
    return parse_playbook(raw, actions, str(path))


def parse_playbook(raw: Any, actions: set[str], origin: str = "<playbook>") -> Playbook:
    if not isinstance(raw, dict):
        raise PlaybookError(f"{origin}: a playbook is a mapping with name, vars and tasks")
    unknown = set(raw) - {"name", "vars", "tasks"}
    if unknown:
        raise PlaybookError(f"{origin}: unknown key(s) {sorted(unknown)}; expected name, vars, tasks")
    tasks = raw.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise PlaybookError(f"{origin}: tasks must be a non-empty list")
    pvars = raw.get("vars") or {}
    if not isinstance(pvars, dict):
        raise PlaybookError(f"{origin}: vars must be a mapping")
    return Playbook(name=str(raw.get("name", Path(origin).stem)), vars=pvars, source=origin,
                    tasks=tuple(_task(t, actions, f"{origin}: tasks[{i}]") for i, t in enumerate(tasks)))


def _task(raw: Any, actions: set[str], where: str) -> Task:
    if not isinstance(raw, dict):
        raise PlaybookError(f"{where}: a task is a mapping")
    action_keys = [k for k in raw if k not in TASK_KEYS]
    unknown = [k for k in action_keys if k not in actions]
    if unknown:
        raise PlaybookError(f"{where}: unknown key or action {unknown[0]!r}; actions: {', '.join(sorted(actions))}")
    is_block = any(k in raw for k in ("block", "rescue", "always"))
    if is_block and action_keys:
        raise PlaybookError(f"{where}: a block cannot also run the action {action_keys[0]!r}")
    if not is_block and len(action_keys) != 1:
        raise PlaybookError(f"{where}: a task runs exactly one action, found {action_keys or 'none'}")
    when = raw.get("when", ())
    when = tuple(when) if isinstance(when, list) else (when,) if when not in ((), None) else ()
    name = str(raw.get("name") or (action_keys[0] if action_keys else "block"))
    sub = where + f" ({name})"
    args = raw.get(action_keys[0]) if action_keys else {}
    if args is None:
        args = {}
    if action_keys and not isinstance(args, dict):
        raise PlaybookError(f"{sub}: the arguments of {action_keys[0]!r} must be a mapping")
    tags = raw.get("tags", ())
    return Task(name=name, action=action_keys[0] if action_keys else "", args=args,
                register=str(raw.get("register", "")), when=when, ignore_errors=bool(raw.get("ignore_errors", False)),
                timeout=raw.get("timeout"), tags=tuple([tags] if isinstance(tags, str) else tags), where=sub,
                block=tuple(_task(t, actions, f"{sub}.block[{i}]") for i, t in enumerate(raw.get("block") or [])),
                rescue=tuple(_task(t, actions, f"{sub}.rescue[{i}]") for i, t in enumerate(raw.get("rescue") or [])),
                always=tuple(_task(t, actions, f"{sub}.always[{i}]") for i, t in enumerate(raw.get("always") or [])))
