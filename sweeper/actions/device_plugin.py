"""The device plugin's word on a node's GPUs: a symptom, whose cause is what Sweeper reads itself.

NVIDIA's device plugin marks a GPU unhealthy on any XID but the application errors it skips (13, 31,
43, 45, 68, 109; DP_DISABLE_HEALTHCHECKS adds to them), and keeps the mark until it restarts
(github.com/NVIDIA/k8s-device-plugin: internal/rm/health.go; internal/plugin/server.go, "there is no
way to recover from the Unhealthy state"). The kubelet then reports allocatable below capacity. So
when Sweeper's own readings are clean and the XID behind it is an application or informational one,
the plugin is restarted (its pod deleted; its DaemonSet starts a new one) instead of the node rebooted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeper.actions import ActionContext
from sweeper.errors import KubeError
from sweeper.fleet import NodeView
from sweeper.result import CheckResult, Result
from sweeper.xid import lookup

PLUGIN_WAIT = 300.0  # how long the kubelet may take to report the restarted plugin's devices
BENIGN = ("ignore", "restart_app")  # XID catalogue actions that leave the GPU healthy


@dataclass(frozen=True)
class Restart:
    ok: bool  # allocatable came back to capacity
    detail: str


def xids_seen(docs: list[dict[str, Any]]) -> list[tuple[int, int | None]]:
    """(XID, GPU) of each XID finding in Sweeper's own results (any status but pass)."""
    return [(int(c["code"]), c.get("gpu")) for d in docs for c in d.get("checks") or []
            if c.get("name") == "xid" and str(c.get("code") or "").isdigit() and c.get("status") != "pass"]


def benign(xids: list[tuple[int, int | None]]) -> bool:
    """Every XID is an application or informational one by the catalogue (none at all is benign too)."""
    return all(lookup(code).action in BENIGN for code, _ in xids)


def in_words(xids: list[tuple[int, int | None]]) -> str:
    if not xids:
        return "no XID in the kernel log"
    return ", ".join(f"XID {code} ({lookup(code).meaning}, {lookup(code).action})"
                     + (f" on GPU {gpu}" if gpu is not None else "") for code, gpu in xids)


def failing(docs: list[dict[str, Any]]) -> str:
    """Sweeper's own failed checks in a few words: check, code and GPU."""
    return ", ".join(f"{c.get('name')}" + (f" {c['code']}" if c.get("code") else "")
                     + (f" on GPU {c['gpu']}" if c.get("gpu") is not None else "")
                     for d in docs for c in d.get("checks") or [] if c.get("status") == "fail")


def shortfall(unhealthy: list[dict[str, Any]]) -> str:
    return "; ".join(f"{int(u['capacity']) - int(u['allocatable'])} {u['resource']} unhealthy per the device "
                     f"plugin: allocatable {u['allocatable']} of {u['capacity']}" for u in unhealthy)


def finding(node: str, now: float, status: str, message: str) -> Result:
    """The device plugin's shortfall as a check of its own (`gpu.allocatable`, never a cause of escalation)."""
    return Result(node=node, source="device-plugin", started=now, finished=now, checks=(CheckResult(
        name="gpu.allocatable", status=status, severity="critical" if status == "fail" else "warning",
        code="GPU_UNHEALTHY", message=message),))


def plugin_pods(ctx: ActionContext, node: str) -> list[tuple[str, str]]:
    """(namespace, name) of the device plugin's pods on the node, by the config's device_plugin_pods."""
    out: list[tuple[str, str]] = []
    for entry in ctx.config.device_plugin_pods:
        namespace, _, selector = entry.partition("/")
        for p in ctx.cluster().list_pods(field_selector=f"spec.nodeName={node}", label_selector=selector):
            meta = p["metadata"]
            if meta.get("namespace") == namespace and (namespace, meta["name"]) not in out:
                out.append((namespace, meta["name"]))
    return out


def restart(ctx: ActionContext, node: str) -> Restart:
    """Delete the device plugin's pod on a node Sweeper holds and wait for allocatable to reach capacity."""
    try:
        held = NodeView.from_obj(ctx.cluster().get_node(node)).sweep_taint(ctx.config.taint_key)
        if held is None:  # a busy node's light check: its workloads are never disturbed
            return Restart(False, "the plugin is restarted only on a node Sweeper holds: once this one is idle")
        pods = plugin_pods(ctx, node)
        if not pods:
            return Restart(False, "no device plugin pod on the node matches device_plugin_pods "
                           f"({', '.join(ctx.config.device_plugin_pods)})")
        for namespace, name in pods:
            ctx.intent("delete-pod", "before", f"{namespace}/{name}")
            ctx.cluster().delete_pod(namespace, name)
            ctx.intent("delete-pod", "after", f"{namespace}/{name}")
        names = ", ".join(f"{ns}/{n}" for ns, n in pods)
        ctx.log(f"{node}: restarting the device plugin ({names})")
        deadline = ctx.clock.now() + PLUGIN_WAIT
        while True:
            view = NodeView.from_obj(ctx.cluster().get_node(node), ctx.config.gpu_resources,
                                     ctx.config.gpu_resource_prefixes)
            short = view.short_of_capacity()
            if not short:
                return Restart(True, f"device plugin pod {names} restarted: allocatable "
                               + ", ".join(f"{c} of {c} {r}" for r, c in sorted(view.capacity.items())) + " again")
            if ctx.clock.now() >= deadline or ctx.cancelled():
                return Restart(False, f"device plugin pod {names} restarted, yet allocatable is still "
                               + ", ".join(f"{a} of {c} {r}" for r, a, c in short)
                               + f" after {int(PLUGIN_WAIT)}s")
            ctx.clock.sleep(ctx.config.poll_interval)
    except KubeError as exc:
        return Restart(False, f"could not restart the device plugin: {exc}")
