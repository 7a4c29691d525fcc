"""`sweeper run`: one playbook on one node (or none), outside a sweep, recorded in history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sweeper import platforms, profiles
from sweeper.actions import ActionContext, load_all
from sweeper.actions.decide import verdict_of_results
from sweeper.actions.node import patch_node
from sweeper.clock import WallClock
from sweeper.config import Config
from sweeper.errors import ConfigError, NotFound, SweeperError
from sweeper.fleet import NodeView
from sweeper.pairing import pair_status
from sweeper.playbook.executor import Executor, PlayResult, TaskOutcome, load
from sweeper.policy import HOLDING
from sweeper.result import Result
from sweeper.sweep import Sweep, new_run_id


def node_vars(view: NodeView, cfg: Config, uid: str = "") -> dict[str, Any]:
    profile = profiles.match(profiles.load_profiles(cfg.path("profiles")), view.labels)
    return {**Sweep._node_vars(view, profile), "uid": uid}  # the sweep's own builder, plus the uid


@dataclass
class Taken:
    """What a play put on its node itself: the taints it added (exactly, value included) and
    its cordon. Whatever was there before the play is not in here, so it is never removed."""

    taints: list[dict[str, str]] = field(default_factory=list)
    cordoned_by: str = ""

    def note(self, o: TaskOutcome) -> None:
        if o.action == "taint" and isinstance(o.result.get("added"), dict):
            self.taints.append(o.result["added"])
        elif o.action == "cordon" and o.result.get("cordoned_by"):
            self.cordoned_by = str(o.result["cordoned_by"])

    def __bool__(self) -> bool:
        return bool(self.taints or self.cordoned_by)


def give_back(kube: Any, cfg: Config, name: str, taken: Taken) -> list[str]:
    """Take off the node what the play added and is still there (a taint with the same key, value
    and effect; the cordon only while it carries this run's mark); what was removed."""
    mark = f"{cfg.prefix}/cordoned-by"
    removed: list[str] = []

    def build(node: dict[str, Any]) -> list[dict[str, Any]] | None:
        removed.clear()
        spec = node.get("spec") or {}
        taints = spec.get("taints") or []
        keep = [t for t in taints if not any(
            t.get("key") == a["key"] and (t.get("value") or "") == (a["value"] or "") and t.get("effect") == a["effect"]
            for a in taken.taints)]
        removed.extend(f"taint {t['key']}={t.get('value') or ''}:{t['effect']}" for t in taints if t not in keep)
        ops: list[dict[str, Any]] = []
        if len(keep) != len(taints):
            ops.append({"op": "add", "path": "/spec/taints", "value": keep})
        ann = dict(node["metadata"].get("annotations") or {})
        if taken.cordoned_by and ann.get(mark) == taken.cordoned_by:
            ann.pop(mark)
            ops.append({"op": "add", "path": "/metadata/annotations", "value": ann})
            if spec.get("unschedulable"):
                ops.append({"op": "add", "path": "/spec/unschedulable", "value": False})
                removed.append("cordon")
        return ops or None

    if patch_node(kube, name, build) is None:
        return []
    return removed


def run_playbook(path: Path, cfg: Config, *, kube: Any = None, node_name: str | None = None,
                 partner_name: str | None = None, extra_vars: dict[str, Any] | None = None, tags: tuple[str, ...] = (),
                 skip_tags: tuple[str, ...] = (), state: str | None = None,
                 on_task: Callable[[TaskOutcome], None] | None = None, clock: Any = None,
                 cancelled: Callable[[], bool] | None = None,
                 log: Callable[[str], None] | None = None, hand_back: bool = True) -> PlayResult:
    """Run the play. Whatever it tainted or cordoned itself is handed back when it ends without a
    holding verdict (reboot, replace, quarantine), however it ends: failed, cancelled (SIGTERM),
    or stopped by broken input such as an undefined variable, as the sweep controller does.
    A pair playbook runs on `node_name` and `partner_name` together (pair_mode "sweep")."""
    actions = load_all()
    playbook = load(path, actions)  # a broken playbook stops here, before anything is touched
    if playbook.pair and not (node_name and partner_name):
        raise ConfigError(f"{playbook.name!r} is a pair playbook (pair: true): name both nodes, --node A --partner B")
    if partner_name and not playbook.pair:
        raise ConfigError(f"--partner is for a pair playbook (pair: true); {playbook.name!r} runs on one node")
    if partner_name and partner_name == node_name:
        raise ConfigError("a node cannot be its own partner")
    clock = clock or WallClock()
    say = log or (lambda msg: None)
    run_id = new_run_id(clock.now())

    def read(name: str | None) -> dict[str, Any] | None:
        if not name:
            return None
        try:
            return kube.get_node(name)
        except NotFound as exc:
            raise ConfigError(f"no node named {name!r} in the cluster") from exc

    objs = [read(node_name), read(partner_name)]
    # `platform: auto`: settled from the node(s) this play runs on, as a sweep settles it from its fleet.
    seen = [o for o in objs if o is not None]
    found = None
    if seen:
        cfg, found = platforms.resolve(cfg, seen, [p for o in seen for p in kube.active_pods(o["metadata"]["name"])],
                                       kube.runtime_class_names)
    if found is not None:
        say("found " + "; ".join(found.why))

    def target(obj: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if obj is None else \
            node_vars(NodeView.from_obj(obj, cfg.gpu_resources), cfg, obj["metadata"].get("uid", ""))

    node, partner = target(objs[0]), target(objs[1])
    hist = None
    sweep_id = partner_sweep = None
    if state and node:
        from sweeper.history import History

        hist = History(state, cfg.cluster_name or None)
        hist.run_started(run_id, clock.now(), "run")
        kind = "pair" if partner else "sweep"
        sweep_id = hist.sweep_started(run_id, node["name"], clock.now(), playbook.name, node["profile"]["name"],
                                      kind=kind)
        if partner:
            partner_sweep = hist.sweep_started(run_id, partner["name"], clock.now(), playbook.name,
                                               partner["profile"]["name"], kind=kind)
    if hist is not None and node is not None:  # where GFD does not label it, what picks the DCGM build
        node["driver_version"] = hist.driver_version(node["name"])
    ctx = ActionContext(config=cfg, clock=clock, kube=kube, node=node, run_id=run_id, partner=partner)
    if cancelled is not None:
        ctx.cancelled = cancelled
    registered: list[Result] = []  # what the play's checks reported: its verdict when no `decide` ran
    if hist is not None and node is not None:
        def on_result(r: Result) -> None:
            registered.append(r)
            hist.result(sweep_id, r)  # type: ignore[union-attr]
            if partner is not None:
                hist.result(partner_sweep, replace(r, node=partner["name"]))  # type: ignore[union-attr]
        ctx.on_result = on_result
        ctx.intent = lambda op, phase, detail: hist.intent(run_id, node["name"], clock.now(), op, phase, detail)  # type: ignore[union-attr,index]
        ctx.past = hist
    else:
        ctx.on_result = registered.append
    extra = {"run_id": run_id, "taint_key": cfg.taint_key, "default_dcgm_level": cfg.dcgm_level_for(node),
             **({"node": node} if node else {}), **({"partner": partner, "pair_mode": "sweep"} if partner else {}),
             **(extra_vars or {})}
    taken = Taken()
    show = on_task or (lambda o: None)

    def track(o: TaskOutcome) -> None:
        taken.note(o)
        show(o)

    executor = Executor(actions, ctx, track, tags=tags, skip_tags=skip_tags)
    result: PlayResult | None = None
    broken = ""
    try:
        result = executor.run(playbook, extra)
    except Exception as exc:
        broken = str(exc)
        raise
    finally:
        if not executor.vars.get("verdict") and registered and not ctx.cancelled():
            executor.vars.update(verdict_of_results(ctx, registered))  # no `decide`: the findings' verdict
        verdict = str(executor.vars.get("verdict") or "")
        if node is not None and taken and hand_back:
            ctx.intent("untaint", "before", f"run ended: verdict {verdict or 'none'}")
            _hand_back(kube, cfg, node["name"], taken, verdict, executor.vars.get("handed_back"), say,
                       (lambda what: hist.action(run_id, node["name"], clock.now(), "release", what))  # type: ignore[index]
                       if hist is not None else None)
            ctx.intent("untaint", "after", f"run ended: verdict {verdict or 'none'}")
        if hist is not None and sweep_id is not None:
            failed_ = result is None or result.failed
            verdict = verdict or ("error" if failed_ else "pass")
            decision = executor.vars.get("decision")
            reasons = [str(r) for r in executor.vars.get("reasons", [])] or ([broken] if broken else []) or \
                [f"{o.name}: {o.msg}" for o in (result.tasks() if result else []) if o.status == "failed"][:3]
            hist.sweep_finished(sweep_id, clock.now(), verdict, reasons, decision if isinstance(decision, dict) else None)
            if partner is not None and partner_sweep is not None:
                hist.sweep_finished(partner_sweep, clock.now(), verdict, reasons,
                                    decision if isinstance(decision, dict) else None)
                busbw = next((v["busbw"] for v in executor.vars.values()
                              if isinstance(v, dict) and v.get("busbw") is not None), None)
                hist.pair_result(run_id, clock.now(), node["name"], partner["name"], pair_status(verdict), "sweep",  # type: ignore[index]
                                 float(busbw) if busbw is not None else None, "; ".join(reasons)[:1000],
                                 (sweep_id, partner_sweep))
            hist.run_finished(run_id, clock.now(), "failed" if failed_ else "done", 1, {"playbook": playbook.name})
            hist.close()
    return result


def _hand_back(kube: Any, cfg: Config, name: str, taken: Taken, verdict: str, handed_back: Any,
               say: Callable[[str], None], record: Callable[[str], None] | None) -> None:
    if verdict in HOLDING or handed_back == "held":
        say(f"kept on {name} (verdict {verdict or 'held'}): what this play put there holds the node")
        return
    try:
        removed = give_back(kube, cfg, name, taken)
    except SweeperError as exc:  # the play's own error, if any, is the one to report
        say(f"could not hand {name} back: {exc}; the next sweep's reconcile or a person must")
        return
    if removed:
        what = ", ".join(removed)
        say(f"handed back {name}: removed {what} (the play ended without a holding verdict)")
        if record is not None:
            record(f"sweeper run ended without a holding verdict: removed {what}")

def extra_vars(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`-e` values: `key=value` (the value read as YAML) or `@file.yaml` (a mapping), later ones winning."""
    import yaml

    from sweeper.schema import safe_load

    out: dict[str, Any] = {}
    for pair in pairs:
        if pair.startswith("@"):
            try:
                data = safe_load(Path(pair[1:]).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"-e {pair}: {exc}") from exc
            if not isinstance(data, dict):
                raise ConfigError(f"-e {pair}: the file must hold a mapping")
            out.update(data)
            continue
        if "=" not in pair:
            raise ConfigError(f"-e {pair!r}: expected key=value or @file.yaml")
        key, value = pair.split("=", 1)
        if not key.isidentifier():
            raise ConfigError(f"-e {pair!r}: {key!r} is not a variable name")
        try:
            out[key] = safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out
