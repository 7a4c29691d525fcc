"""`sweeper run`: one playbook on one node (or none), outside a sweep, recorded in history."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeper import profiles
from sweeper.actions import ActionContext, load_all
from sweeper.clock import WallClock
from sweeper.config import Config
from sweeper.errors import ConfigError, NotFound
from sweeper.fleet import NodeView
from sweeper.playbook.executor import Executor, PlayResult, TaskOutcome, load
from sweeper.sweep import new_run_id


def node_vars(view: NodeView, cfg: Config, uid: str = "") -> dict[str, Any]:
    profile = profiles.match(profiles.load_profiles(cfg.path("profiles")), view.labels)
    return {"name": view.name, "labels": view.labels, "annotations": view.annotations, "gpus": view.gpus,
            "uid": uid, "profile": profile.as_vars()}


def run_playbook(path: Path, cfg: Config, *, kube: Any = None, node_name: str | None = None,
                 extra_vars: dict[str, Any] | None = None, tags: tuple[str, ...] = (),
                 skip_tags: tuple[str, ...] = (), state: str | None = None,
                 on_task: Callable[[TaskOutcome], None] | None = None, clock: Any = None) -> PlayResult:
    actions = load_all()
    playbook = load(path, actions)  # a broken playbook stops here, before anything is touched
    clock = clock or WallClock()
    run_id = new_run_id(clock.now())
    node = None
    if node_name:
        try:
            obj = kube.get_node(node_name)
        except NotFound as exc:
            raise ConfigError(f"no node named {node_name!r} in the cluster") from exc
        node = node_vars(NodeView.from_obj(obj, cfg.gpu_resources), cfg, obj["metadata"].get("uid", ""))
    hist = None
    sweep_id = None
    if state and node:
        from sweeper.history import History

        hist = History(state)
        hist.run_started(run_id, clock.now(), "run")
        sweep_id = hist.sweep_started(run_id, node["name"], clock.now(), playbook.name, node["profile"]["name"])
    ctx = ActionContext(config=cfg, clock=clock, kube=kube, node=node, run_id=run_id)
    if hist is not None and node is not None:
        ctx.on_result = lambda r: hist.result(sweep_id, r)  # type: ignore[union-attr]
        ctx.intent = lambda op, phase, detail: hist.intent(run_id, node["name"], clock.now(), op, phase, detail)  # type: ignore[union-attr,index]
        ctx.past = hist
    extra = {"run_id": run_id, "taint_key": cfg.taint_key, **({"node": node} if node else {}), **(extra_vars or {})}
    result = Executor(actions, ctx, on_task, tags=tags, skip_tags=skip_tags).run(playbook, extra)
    if hist is not None and sweep_id is not None:
        verdict = str(result.vars.get("verdict") or ("error" if result.failed else "pass"))
        decision = result.vars.get("decision")
        hist.sweep_finished(sweep_id, clock.now(), verdict, [str(r) for r in result.vars.get("reasons", [])],
                            decision if isinstance(decision, dict) else None)
        hist.run_finished(run_id, clock.now(), "failed" if result.failed else "done", 1, {"playbook": playbook.name})
        hist.close()
    return result
