"""Runs a playbook: when, register, ignore_errors, block/rescue/always, per-task timeout.

Inside the engine a task failure is a value; exceptions are for broken playbooks
(undefined variables, template errors), which are never ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.actions import Action, ActionContext
from sweeper.errors import PlaybookError
from sweeper.playbook.model import Playbook, Task
from sweeper.templating import condition, render


@dataclass
class TaskOutcome:
    name: str
    action: str
    status: str  # ok, changed, failed, skipped, ignored, rescued
    msg: str = ""
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlayResult:
    name: str
    failed: bool
    outcomes: list[TaskOutcome]
    vars: dict[str, Any]

    @property
    def facts(self) -> dict[str, Any]:
        return self.vars


class Executor:
    def __init__(self, actions: dict[str, Action], ctx: ActionContext,
                 on_task: Callable[[TaskOutcome], None] | None = None) -> None:
        self.actions = actions
        self.ctx = ctx
        self.on_task = on_task or (lambda o: None)

    def run(self, playbook: Playbook, extra_vars: dict[str, Any] | None = None) -> PlayResult:
        variables: dict[str, Any] = {}
        variables.update(render(playbook.vars, {**(extra_vars or {})}, f"{playbook.source}: vars"))
        variables.update(extra_vars or {})
        outcomes: list[TaskOutcome] = []
        failed = self._tasks(playbook.tasks, variables, outcomes)
        return PlayResult(playbook.name, failed, outcomes, variables)

    def _tasks(self, tasks: tuple[Task, ...], variables: dict[str, Any], outcomes: list[TaskOutcome]) -> bool:
        for task in tasks:
            if self._task(task, variables, outcomes):
                return True
        return False

    def _task(self, task: Task, variables: dict[str, Any], outcomes: list[TaskOutcome]) -> bool:
        """Run one task or block; True if it failed (and was not ignored or rescued)."""
        for cond in task.when:
            if not condition(cond, variables, task.where):
                res = {"changed": False, "failed": False, "skipped": True,
                       "skip_reason": f"Conditional result was False: {cond}"}
                self._finish(task, "skipped", res, variables, outcomes)
                return False
        if task.is_block:
            return self._block(task, variables, outcomes)
        act = self.actions[task.action]
        args = act.validate(render(task.args, variables, task.where), task.where)
        if task.timeout is not None and "timeout" in args and args["timeout"] is None:
            args["timeout"] = task.timeout
        self.ctx.facts = {}
        result = act.fn(self.ctx, args)
        variables.update(self.ctx.facts)
        if result.get("failed"):
            status = "ignored" if task.ignore_errors else "failed"
        else:
            status = "changed" if result.get("changed") else "ok"
        self._finish(task, status, result, variables, outcomes)
        return status == "failed"

    def _block(self, task: Task, variables: dict[str, Any], outcomes: list[TaskOutcome]) -> bool:
        failed = False
        try:
            failed = self._tasks(task.block, variables, outcomes)
            if failed and task.rescue:
                last = outcomes[-1] if outcomes else None
                variables["failed_task"] = {"name": last.name, "action": last.action} if last else {}
                variables["failed_result"] = last.result if last else {}
                failed = self._tasks(task.rescue, variables, outcomes)
                if not failed and last is not None:
                    last.status = "rescued"
        finally:
            if task.always:
                always_failed = self._tasks(task.always, variables, outcomes)
                failed = failed or always_failed
        return failed

    def _finish(self, task: Task, status: str, result: dict[str, Any], variables: dict[str, Any],
                outcomes: list[TaskOutcome]) -> None:
        if task.register:
            variables[task.register] = result
        outcome = TaskOutcome(task.name, task.action or "block", status, str(result.get("msg", "")), result)
        outcomes.append(outcome)
        self.on_task(outcome)


def load(path: str, actions: dict[str, Action]) -> Playbook:
    from pathlib import Path

    from sweeper.playbook.model import load_playbook

    pb = load_playbook(Path(path), set(actions))
    _validate(pb.tasks, actions)
    return pb


def _validate(tasks: tuple[Task, ...], actions: dict[str, Action]) -> None:
    """Static argument checks where arguments are not templated."""
    for t in tasks:
        if t.action:
            literal = {k: v for k, v in t.args.items() if not (isinstance(v, str) and "{{" in v)}
            known = {a.name for a in actions[t.action].args}
            extra = set(t.args) - known
            if extra:
                raise PlaybookError(f"{t.where}: {t.action}: unknown argument(s) {sorted(extra)}; "
                                    f"expected {sorted(known) or 'none'}")
            for a in actions[t.action].args:
                if a.required and a.name not in t.args:
                    raise PlaybookError(f"{t.where}: {t.action}: missing required argument {a.name!r}")
            del literal
        _validate(t.block + t.rescue + t.always, actions)
