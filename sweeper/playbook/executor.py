"""Runs a playbook with the task semantics of Ansible's faithful subset (STYLE.md's table):
when, loop, register, until/retries/delay, changed_when, failed_when, ignore_errors,
block/rescue/always, timeout, tags, include.

Inside the engine a task failure is a value. Exceptions are for broken playbooks (undefined
variables, template errors, a node action with no node): those are never ignored or rescued,
and `always` still runs on the way out, as it does when the run is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.actions import Action, ActionContext, failed
from sweeper.clock import parse_duration
from sweeper.errors import KubeError, PlaybookError
from sweeper.playbook.model import ABSENT, Playbook, Task, load_playbook
from sweeper.templating import check_fact, condition, render, render_deadline

DEFAULT_DELAY = 5.0
DEFAULT_UNTIL_RETRIES = 3


class Cancelled(Exception):
    """The run was asked to stop; raised between tasks, never inside an `always`."""


@dataclass
class TaskOutcome:
    name: str
    action: str
    status: str  # ok, changed, failed, skipped, ignored, rescued
    msg: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    where: str = ""
    item: Any = None
    is_item: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = {"task": self.name, "action": self.action, "status": self.status, "msg": self.msg, "where": self.where}
        if self.is_item:
            d["item"] = self.item
        return d


@dataclass
class PlayResult:
    name: str
    failed: bool
    outcomes: list[TaskOutcome]
    vars: dict[str, Any]
    cancelled: bool = False

    def tasks(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if not o.is_item]


class Executor:
    def __init__(self, actions: dict[str, Action], ctx: ActionContext,
                 on_task: Callable[[TaskOutcome], None] | None = None,
                 tags: tuple[str, ...] = (), skip_tags: tuple[str, ...] = ()) -> None:
        self.actions = actions
        self.ctx = ctx
        self.on_task = on_task or (lambda o: None)
        self.tags = set(tags)
        self.skip_tags = set(skip_tags)
        self.vars: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.outcomes: list[TaskOutcome] = []
        self._last_failure: tuple[Task, dict[str, Any]] | None = None

    # -- the play ---------------------------------------------------------------------
    def run(self, playbook: Playbook, extra_vars: dict[str, Any] | None = None) -> PlayResult:
        self.extra = dict(extra_vars or {})
        self._preflight(playbook)
        self.vars = {}
        for key, value in playbook.vars.items():  # in order, so a var may use the ones before it
            self.vars[key] = render(value, {**self.vars, **self.extra}, f"{playbook.source}: vars.{key}")
        self.vars.update(self.extra)
        self.outcomes = []
        try:
            failed_ = self._run_list(playbook.tasks, {}, (), (), in_always=False)
        except Cancelled:
            return PlayResult(playbook.name, True, self.outcomes, self.vars, cancelled=True)
        return PlayResult(playbook.name, failed_, self.outcomes, self.vars)

    def _preflight(self, playbook: Playbook) -> None:
        for t in playbook.all_tasks():
            act = self.actions.get(t.action)
            if act and act.needs_node and self.ctx.node is None:
                raise PlaybookError(f"{t.where}: {t.action} needs a target node; run with --node NODE")
            if act and act.needs_cluster and self.ctx.kube is None:
                raise PlaybookError(f"{t.where}: {t.action} needs a cluster (kubeconfig or in-cluster config)")

    def _scope(self, local: dict[str, Any]) -> dict[str, Any]:
        return {**self.vars, **local, **self.extra}

    def _selected(self, tags: tuple[str, ...]) -> bool:
        ts = set(tags)
        if ts & self.skip_tags:
            return False
        if "never" in ts and not ts & self.tags:
            return False
        if not self.tags or "all" in self.tags:
            return True
        return bool(ts & self.tags) or "always" in ts

    # -- lists, blocks, tasks ----------------------------------------------------------------
    def _run_list(self, tasks: tuple[Task, ...], local: dict[str, Any], when: tuple[Any, ...],
                  tags: tuple[str, ...], in_always: bool) -> bool:
        for task in tasks:
            if self._run_task(task, local, when, tags, in_always):
                return True
        return False

    def _run_task(self, task: Task, local: dict[str, Any], when: tuple[Any, ...], tags: tuple[str, ...],
                  in_always: bool) -> bool:
        """Run a task or block; True when it failed and was neither ignored nor rescued."""
        if not in_always and self.ctx.cancelled():
            raise Cancelled()
        tags = tags + task.tags
        if task.vars:
            local = {**local, **render(task.vars, self._scope(local), f"{task.where}: vars")}
        if task.is_block:
            return self._block(task, local, when + task.when, tags, in_always)
        if not self._selected(tags):
            return False
        conditions = when + task.when
        with render_deadline(self._render_cap(task, local)):
            if task.loop is ABSENT:
                scope = self._scope(local)
                false = self._false_condition(conditions, scope, task)
                result = self._skipped(false) if false is not None else self._attempts(task, scope)
            else:
                result = self._loop(task, local, conditions)
        return self._finish(task, result)

    def _render_cap(self, task: Task, local: dict[str, Any]) -> float | None:
        """A task's `timeout` also bounds each render of that task (its when, loop, arguments,
        until and the action's own templates). One that names the loop item is known only per
        item; the default render deadline still holds for the renders before it."""
        if task.timeout is None:
            return None
        try:
            return _duration(task.timeout, self._scope(local), task, "timeout")
        except PlaybookError:
            return None

    def _block(self, task: Task, local: dict[str, Any], when: tuple[Any, ...], tags: tuple[str, ...],
               in_always: bool) -> bool:
        failed_ = False
        try:
            failed_ = self._run_list(task.block, local, when, tags, in_always)
            if failed_ and task.rescue:
                ftask, fresult = self._last_failure or (task, {})
                failed_task = {"name": ftask.name, "action": ftask.action, "where": ftask.where}
                self.vars.update({"failed_task": failed_task, "failed_result": fresult,
                                  "ansible_failed_task": failed_task, "ansible_failed_result": fresult})
                failing = [o for o in self.outcomes if o.status == "failed" and not o.is_item]
                failed_ = self._run_list(task.rescue, local, when, tags, in_always)
                if not failed_ and failing:
                    failing[-1].status = "rescued"
        finally:
            if task.always:
                failed_ = self._run_list(task.always, local, when, tags, in_always=True) or failed_
        return failed_

    def _false_condition(self, conditions: tuple[Any, ...], scope: dict[str, Any], task: Task) -> Any:
        for cond in conditions:
            if not condition(cond, scope, f"{task.where}: when"):
                return cond
        return None

    @staticmethod
    def _skipped(false_condition: Any) -> dict[str, Any]:
        return {"changed": False, "failed": False, "skipped": True, "false_condition": false_condition,
                "skip_reason": f"Conditional result was False: {false_condition}", "msg": ""}

    def _loop(self, task: Task, local: dict[str, Any], conditions: tuple[Any, ...]) -> dict[str, Any]:
        items = render(task.loop, self._scope(local), f"{task.where}: loop")
        if not isinstance(items, list):
            raise PlaybookError(f"{task.where}: loop must template to a list, got {type(items).__name__}")
        if not items:
            return {"changed": False, "failed": False, "skipped": True, "results": [],
                    "skip_reason": "No items in the list", "msg": ""}
        results = []
        for i, item in enumerate(items):
            meta = {"index": i + 1, "index0": i, "first": i == 0, "last": i == len(items) - 1,
                    "length": len(items), "revindex": len(items) - i, "revindex0": len(items) - i - 1}
            ilocal = {**local, task.loop_var: item, "ansible_loop": meta}
            if task.index_var:
                ilocal[task.index_var] = i
            scope = self._scope(ilocal)
            false = self._false_condition(conditions, scope, task)
            r = self._skipped(false) if false is not None else self._attempts(task, scope)
            r = {**r, task.loop_var: item, "ansible_loop_var": task.loop_var}
            if task.loop_var != "item":
                r["item"] = item
            results.append(r)
            label = render(task.label, scope, task.where) if task.label else item
            self._emit(task, r, is_item=True, item=label)
        any_failed = any(r.get("failed") for r in results)
        return {"results": results, "changed": any(r.get("changed") for r in results), "failed": any_failed,
                "skipped": all(r.get("skipped") for r in results),
                "msg": "One or more items failed" if any_failed else "All items completed"}

    # -- one task, with retries ------------------------------------------------------------------
    def _attempts(self, task: Task, scope: dict[str, Any]) -> dict[str, Any]:
        act = self.actions[task.action]
        if task.until is not None and task.retries != 0:
            retries = task.retries if task.retries is not None else DEFAULT_UNTIL_RETRIES
        elif task.until is None and task.retries:
            retries = task.retries
        else:
            retries = 0
        delay = DEFAULT_DELAY if task.delay is None else _duration(task.delay, scope, task, "delay")
        attempt = 0
        while True:
            attempt += 1
            result = self._once(task, act, scope)
            if retries:
                # Ansible sets `attempts` before judging changed_when, failed_when and until
                # (TaskExecutor._execute, lib/ansible/executor/task_executor.py: "Make attempts
                # and retries available early to allow their use in changed/failed_when").
                result["attempts"] = attempt
            self._apply_when_flags(task, scope, result)
            if retries == 0 or result.get("timed_out"):
                break
            view = {**scope, **({task.register: result} if task.register else {})}
            if task.until is not None:
                done = condition(task.until, view, f"{task.where}: until")
            else:
                done = not result.get("failed")
            if done:
                break
            if attempt >= 1 + retries:
                result["failed"] = True
                result["msg"] = f"Retried {retries} times and the condition was never met: {result.get('msg', '')}"
                break
            self.ctx.clock.sleep(delay)
        if retries:
            result["attempts"] = attempt
        else:
            result.pop("attempts", None)
        return result

    def _once(self, task: Task, act: Action, scope: dict[str, Any]) -> dict[str, Any]:
        timeout = None if task.timeout is None else _duration(task.timeout, scope, task, "timeout")
        with render_deadline(timeout):
            return self._run_action(task, act, scope, timeout)

    def _run_action(self, task: Task, act: Action, scope: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        rendered: dict[str, Any] = {}
        raw_names = {a.name for a in act.args if a.raw}
        for k, v in task.args.items():
            rendered[k] = v if k in raw_names else render(v, scope, f"{task.where}: {task.action}.{k}")
        if timeout is not None and "timeout" in {a.name for a in act.args} and "timeout" not in rendered:
            rendered["timeout"] = timeout
        args = act.validate(rendered, task.where)
        ctx = self.ctx
        ctx.vars = scope
        ctx.facts = {}
        start = ctx.clock.now()
        ctx.deadline = None if timeout is None else start + timeout
        ctx.timed_out = False
        try:
            result = dict(act.fn(ctx, args))
        except KubeError as exc:
            result = failed(f"cluster error: {exc}")
        except PlaybookError as exc:
            if str(exc).startswith(task.where):
                raise
            what = "" if str(exc).startswith(task.action) else f"{task.action}: "
            raise PlaybookError(f"{task.where}: {what}{exc}") from exc
        finally:
            ctx.deadline = None
        if timeout is not None and (ctx.timed_out or ctx.clock.now() - start > timeout):
            result = {**result, "failed": True, "timed_out": True,
                      "msg": f"the task timed out after {timeout:g}s: {result.get('msg', '')}".rstrip(": ")}
        for key, value in ctx.facts.items():
            check_fact(key, value, f"{task.where}: {task.action}")
        self.vars.update(ctx.facts)
        result.setdefault("changed", False)
        result.setdefault("failed", False)
        result.setdefault("msg", "")
        return result

    def _apply_when_flags(self, task: Task, scope: dict[str, Any], result: dict[str, Any]) -> None:
        for key, expr in (("changed", task.changed_when), ("failed", task.failed_when)):
            if expr is None:
                continue
            view = {**scope, **({task.register: result} if task.register else {}), "result": result}
            exprs = expr if isinstance(expr, list) else [expr]
            try:
                if key == "failed":
                    result[key] = any(condition(e, view, f"{task.where}: {key}_when") for e in exprs)
                else:
                    result[key] = all(condition(e, view, f"{task.where}: {key}_when") for e in exprs)
            except PlaybookError as exc:
                result["failed"] = True
                result["msg"] = f"error while evaluating {key}_when: {exc}"

    # -- bookkeeping ------------------------------------------------------------------------------
    def _finish(self, task: Task, result: dict[str, Any]) -> bool:
        if task.register:
            self.vars[task.register] = result
        outcome = self._emit(task, result)
        if outcome.status == "failed":
            self._last_failure = (task, result)
        return outcome.status == "failed"

    def _emit(self, task: Task, result: dict[str, Any], is_item: bool = False, item: Any = None) -> TaskOutcome:
        if result.get("skipped"):
            status = "skipped"
        elif result.get("failed"):
            status = "ignored" if task.ignore_errors else "failed"
        else:
            status = "changed" if result.get("changed") else "ok"
        msg = str(result.get("msg") or result.get("skip_reason") or "")
        outcome = TaskOutcome(task.name, task.action, status, msg, result, task.where, item, is_item)
        self.outcomes.append(outcome)
        self.on_task(outcome)
        return outcome


def _duration(value: Any, scope: dict[str, Any], task: Task, what: str) -> float:
    try:
        return parse_duration(render(value, scope, task.where))
    except ValueError as exc:
        raise PlaybookError(f"{task.where}: {what} is not a duration: {value!r}") from exc


def load(path: str | Path, actions: dict[str, Action]) -> Playbook:
    return load_playbook(Path(path), actions)
