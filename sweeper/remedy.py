"""Remediation: what happens to a node after its verdict, behind one interface.

- `replace`: the provider of the node's pool or profile: `karpenter` (delete the node's
  NodeClaim, follow the node out), `asg` (mark the instance unhealthy, or terminate it
  without shrinking the group), or `manual` (keep it held; a person decides).
- `reboot`: a GPU reset Job when every cause is one a reset clears (a pending row remap, the
  driver asking for a reset, an XID whose catalogue action is a GPU reset), else a reboot Job;
  the node stays held and the next sweep checks it again once it is back (a new boot id, Ready).
  Both Jobs are followed by the loop that follows every Job (sweeper.actions.follow); the reboot
  Job until its reboot began (its container ran, the node went NotReady, or its boot id changed).
  A reboot Job that cannot start (an image that cannot be pulled, a pod refused by admission or
  never scheduled) is a fault of the tool, not of the node: the Job is deleted, so that it cannot
  reboot the node later unseen, and the node, not rebooted, is held for a person.
  NVIDIA's own tools hold the GPUs open, and `nvidia-smi --gpu-reset` refuses a GPU in use: on a
  GPU Operator node the reset first pauses the operands that do (device plugin, GPU feature
  discovery, DCGM, dcgm-exporter) through their nvidia.com/gpu.deploy.* labels, waits for their
  pods to leave the node, resets, and puts the labels back as they were, whatever happened.
- `quarantine`: held for a person.

Every provider honours dry-run (it says what it would do and touches nothing), and the
sweep's replacement cap and breaker apply before any of this is called."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeper.actions import ActionContext
from sweeper.actions.follow import PollSource, Shape, follow
from sweeper.actions.jobs import render_job
from sweeper.actions.node import meta_op, patch_node
from sweeper.actions.podstate import job_condition
from sweeper.clock import Clock, iso
from sweeper.config import Config
from sweeper.errors import ConfigError, KubeError, NotFound, SweeperError
from sweeper.fleet import NodeView
from sweeper.rebootjob import JOB_TIMEOUT, follow_reboot
from sweeper.result import CheckResult, Result, tool_result
from sweeper.xid import resets

# The GPU Operator's operands that hold the GPUs open, by the suffix of their deploy label and their
# pods' `app` label. The operator runs an operand on a node whose nvidia.com/gpu.deploy.<operand>
# label is "true" or absent (older releases never set it). NVIDIA's MIG manager pauses the same ones
# around a reconfiguration, leaves a "false" someone else set alone, and waits for their pods to go
# (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html,
# github.com/NVIDIA/mig-parted, its reconfigure step's maybeSetPaused).
GPU_CLIENTS = {"device-plugin": "nvidia-device-plugin-daemonset", "gpu-feature-discovery": "gpu-feature-discovery",
               "dcgm": "nvidia-dcgm", "dcgm-exporter": "nvidia-dcgm-exporter"}
DEPLOY_LABEL = "nvidia.com/gpu.deploy."
OPERANDS_GONE_TIMEOUT = 300.0

# nvidia-smi's word that a GPU was reset (NVIDIA/NVSentinel#1690 shows the line).
RESET_LINE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]) was successfully reset\.",
                        re.MULTILINE)

# Causes a GPU reset clears, without rebooting the node.
RESETTABLE_CODES = {"row_remap|REMAP_PENDING", "gpu.recovery_action|RECOVERY_RESET", "xid|RECOVERY_RESET", "dcgm.software|85",
                    "dcgm.memory|85", "dcgm.software|84"}


@dataclass
class Remedy:
    provider: str  # karpenter, asg, manual, reboot, gpu-reset
    action: str  # what was done, e.g. nodeclaim-deleted, instance-unhealthy, held-for-person, reboot-started
    detail: str
    ok: bool = True
    dry_run: bool = False


def resettable(causes: list[str]) -> bool:
    def one(c: str) -> bool:
        if c in RESETTABLE_CODES:
            return True
        name, _, code = c.partition("|")
        return name == "xid" and code.isdigit() and resets(int(code))
    return bool(causes) and all(one(c) for c in causes)


def providers(cfg: Config) -> set[str]:
    """Every provider the config's `remediation` names."""
    r = cfg.remediation
    return ({str(r.get("default", "manual"))} | {str(p) for p in (r.get("by_pool") or {}).values()}
            | {str(p) for p in (r.get("by_profile") or {}).values()})


def preflight(cfg: Config, injected_autoscaling: bool = False) -> None:
    """Raise (exit 3, one line) when a provider the config names cannot act: asg without AWS credentials."""
    if "asg" in providers(cfg) and not injected_autoscaling:
        from sweeper.aws import require_credentials

        require_credentials("remediation names the asg provider")


class Remediator:
    def __init__(self, kube: Any, cfg: Config, clock: Clock, *, dry_run: bool = False,
                 autoscaling: Callable[[str], Any] | None = None, log: Callable[[str], None] = lambda m: None,
                 cancelled: Callable[[], bool] = lambda: False) -> None:
        self.kube, self.cfg, self.clock, self.dry_run = kube, cfg, clock, dry_run
        self._autoscaling = autoscaling
        self.log = log
        self.cancelled = cancelled

    def preflight(self) -> None:
        """Before any node is taken: the providers the config names can act (AWS credentials for asg)."""
        preflight(self.cfg, self._autoscaling is not None)

    # -- which provider ------------------------------------------------------------------
    def provider_for(self, view: NodeView, profile: str) -> str:
        r = self.cfg.remediation
        pool = view.labels.get("karpenter.sh/nodepool", "")
        if pool and pool in r.get("by_pool", {}):
            return str(r["by_pool"][pool])
        if profile in r.get("by_profile", {}):
            return str(r["by_profile"][profile])
        return str(r.get("default", "manual"))

    def remediate(self, run_id: str, view: NodeView, profile: str, verdict: str,
                  decision: dict[str, Any] | None, node_vars: dict[str, Any]) -> Remedy | None:
        decision = decision or {}
        if verdict == "replace":
            provider = self.provider_for(view, profile)
            if provider == "karpenter":
                return self.karpenter(view)
            if provider == "asg":
                return self.asg(view)
            return self.manual(view, "replace")
        if verdict == "reboot" and self.cfg.remediate_reboots:
            causes = list(decision.get("causes") or [])
            gpus = [int(g) for g in decision.get("gpus") or []]
            if self.cfg.gpu_reset and gpus and resettable(causes):
                return self.gpu_reset(run_id, view, node_vars, gpus)
            return self.reboot(run_id, view, node_vars)
        if verdict in ("reboot", "quarantine"):
            return self.manual(view, verdict)
        return None

    # -- replace -------------------------------------------------------------------------
    def karpenter(self, view: NodeView) -> Remedy:
        claims = [c for c in self.kube.list_nodeclaims() if (c.get("status") or {}).get("nodeName") == view.name]
        if not claims:
            return Remedy("karpenter", "no-nodeclaim", f"no NodeClaim names {view.name}; held for a person", ok=False)
        name = claims[0]["metadata"]["name"]
        if self.dry_run:
            return Remedy("karpenter", "would-delete-nodeclaim", f"would delete NodeClaim {name}", dry_run=True)
        self.kube.delete_nodeclaim(name)
        self.log(f"deleted NodeClaim {name}; Karpenter drains and replaces {view.name}")
        gone = self._wait_gone(view.name)
        return Remedy("karpenter", "nodeclaim-deleted",
                      f"NodeClaim {name} deleted; node {'terminated' if gone else 'still terminating'}")

    def _wait_gone(self, node: str) -> bool:
        deadline = self.clock.now() + self.cfg.replacement_wait
        while self.clock.now() < deadline and not self.cancelled():
            try:
                self.kube.get_node(node)
            except NotFound:
                return True
            self.clock.sleep(self.cfg.poll_interval)
        return False

    def asg(self, view: NodeView) -> Remedy:
        from sweeper.aws import AutoScaling, instance_of, region_of

        try:
            zone, iid = instance_of(view.provider_id)
        except ConfigError as exc:
            return Remedy("asg", "no-instance", f"{exc}; held for a person", ok=False)
        region = self.cfg.aws_region or region_of(zone)
        client = self._autoscaling(region) if self._autoscaling else AutoScaling(region)
        try:
            group = client.group_of(iid)
            if group is None:
                return Remedy("asg", "no-group", f"{iid} is in no Auto Scaling group; held for a person", ok=False)
            verb = "terminate" if self.cfg.asg_action == "terminate" else "mark unhealthy"
            if self.dry_run:
                return Remedy("asg", f"would-{self.cfg.asg_action}", f"would {verb} {iid} in {group} ({region})",
                              dry_run=True)
            if self.cfg.asg_action == "terminate":
                client.terminate(iid)
                return Remedy("asg", "instance-terminated", f"{iid} terminated in {group}; the group replaces it")
            client.set_unhealthy(iid)
            return Remedy("asg", "instance-unhealthy", f"{iid} marked Unhealthy in {group}; the group replaces it")
        except SweeperError as exc:
            return Remedy("asg", "failed", f"{exc}; held for a person", ok=False)

    def manual(self, view: NodeView, verdict: str) -> Remedy:
        return Remedy("manual", "held-for-person", f"{verdict}: held (tainted) with its reason; a person decides",
                      dry_run=self.dry_run)

    # -- reboot and GPU reset ------------------------------------------------------------------
    def _context(self, run_id: str, node_vars: dict[str, Any]) -> ActionContext:
        return ActionContext(config=self.cfg, clock=self.clock, kube=self.kube, node=node_vars, run_id=run_id)

    def _follow_context(self) -> ActionContext:
        return ActionContext(config=self.cfg, clock=self.clock, kube=self.kube, log=self.log, cancelled=self.cancelled)

    def _remediation_job(self, run_id: str, node_vars: dict[str, Any], template: str,
                         extra: dict[str, Any], bound: bool = False) -> dict[str, Any]:
        """A reboot or GPU reset Job: in its own namespace (remediation_namespace, apart from the
        check Jobs'), under its own service account, which has no RBAC and no token mounted."""
        return render_job(self._context(run_id, node_vars), template, JOB_TIMEOUT, extra, remediation=True,
                          bound=bound or template == self.cfg.gpu_reset_template)

    def reboot(self, run_id: str, view: NodeView, node_vars: dict[str, Any]) -> Remedy:
        job = self._remediation_job(run_id, node_vars, self.cfg.reboot_template, {})
        name = job["metadata"]["name"]
        if self.dry_run:
            return Remedy("reboot", "would-reboot", f"would run {name}", dry_run=True)
        self._mark(view.name, "reboot", view.boot_id, recheck=True)  # before the create: a reboot is never unsaid
        try:
            self.kube.create_job(self.cfg.remediation_namespace, job)
        except KubeError as exc:  # refused (RBAC, a missing namespace): no reboot for discovery to wait for
            self._mark(view.name, "reboot-failed", view.boot_id, recheck=False)
            return Remedy("reboot", "failed", f"the reboot Job {name} could not be created (a fault of the tool, not "
                          f"of the node): {exc}; the node, not rebooted, is held (tainted) for a person", ok=False)
        began, words, tool = follow_reboot(self._follow_context(), self.cfg.remediation_namespace, name, view)
        if began:
            return Remedy("reboot", "reboot-started", f"Job {name}: the reboot began ({words}); the node is "
                          "checked again when it is back")
        if self.cancelled():
            # The sweep is stopping: the Job is left to reboot the node, as before it was followed, and the
            # node waits for its reboot (the next run checks it again once it is back).
            return Remedy("reboot", "reboot-requested", f"Job {name} created; the sweep stopped before its reboot "
                          "was seen to begin; the node is checked again when it is back")
        try:
            self.kube.delete_job(self.cfg.remediation_namespace, name)  # it must not reboot the node later, unseen
        finally:
            self._mark(view.name, "reboot-failed", view.boot_id, recheck=False)  # no reboot for discovery to wait for
        return Remedy("reboot", "failed", f"the reboot Job {name} " + ("could not start (a fault of the tool, not of "
                      "the node)" if tool else "did not start") + ": the Job was deleted, and the node, not rebooted, "
                      f"is held (tainted) for a person; {words}", ok=False)

    def gpu_reset(self, run_id: str, view: NodeView, node_vars: dict[str, Any], gpus: list[int]) -> Remedy:
        ids = ",".join(str(g) for g in sorted(gpus))
        job = self._remediation_job(run_id, node_vars, self.cfg.gpu_reset_template, {"gpu_ids": ids}, bound=True)
        name = job["metadata"]["name"]
        operator_node = any(k.startswith(DEPLOY_LABEL) for k in view.labels)
        # label -> its value now (None: absent), to be put back as it was
        paused: dict[str, str | None] = {
            f"{DEPLOY_LABEL}{op}": view.labels.get(f"{DEPLOY_LABEL}{op}") for op in GPU_CLIENTS
            if operator_node and view.labels.get(f"{DEPLOY_LABEL}{op}") != "false"}
        pausing = f" after pausing {', '.join(sorted(k.removeprefix(DEPLOY_LABEL) for k in paused))}" if paused else ""
        if self.dry_run:
            return Remedy("gpu-reset", "would-reset", f"would reset GPU(s) {ids} with {name}{pausing}", dry_run=True)
        try:
            if paused:
                self._set_labels(view.name, dict.fromkeys(paused, "false"))
                holders = self._wait_operands_gone(view.name)
                if holders:
                    self.log(f"GPU reset: {', '.join(holders)} still on the node: rebooting instead")
                    return self.reboot(run_id + "-r", view, node_vars)
            self.kube.create_job(self.cfg.remediation_namespace, job)
            status = self._wait_job(name, JOB_TIMEOUT, view.name)
            if status == "Complete":
                status = self._confirm_reset(name, gpus)
            try:
                self.kube.delete_job(self.cfg.remediation_namespace, name)
            except KubeError:
                pass
        finally:
            if paused:  # the operands come back, on every path: a reset, a failure, a stop
                self._set_labels(view.name, paused)
        if status.startswith("Stopped"):
            # The sweep is stopping: no reboot in its place; the next run checks the node again.
            self._mark(view.name, "gpu-reset", view.boot_id, recheck=True)
            return Remedy("gpu-reset", "reset-stopped", f"the sweep stopped during the GPU reset {name} "
                          f"({status}); the node is checked again next sweep")
        if status != "Complete":
            # The reset did not take, or did not say it did: fall back to rebooting the node.
            self.log(f"GPU reset {status.lower()}: rebooting instead")
            return self.reboot(run_id + "-r", view, node_vars)
        self._mark(view.name, "gpu-reset", view.boot_id, recheck=True)
        return Remedy("gpu-reset", "gpus-reset", f"GPU(s) {ids} reset by {name}{pausing}; checked again next sweep")

    def _confirm_reset(self, job: str, gpus: list[int]) -> str:
        """'Complete' when the reset's log has nvidia-smi's "GPU <bus id> was successfully reset."
        for every GPU asked for, else why not: an exit 0 alone is no proof the GPUs were reset."""
        try:
            pods = self.kube.list_pods(label_selector=f"job-name={job}")
            ns = self.cfg.remediation_namespace  # where the reset Job runs
            logs = "".join(self.kube.pod_log(ns, p["metadata"]["name"]) for p in pods
                           if p["metadata"].get("namespace", ns) == ns)
        except KubeError as exc:
            return f"Unconfirmed (the reset's log could not be read: {exc})"
        done = len({bus.lower() for bus in RESET_LINE.findall(logs)})  # each GPU once, by its bus id
        return "Complete" if done >= len(gpus) else f"Unconfirmed ({done} of {len(gpus)} GPU(s) said reset)"

    def _set_labels(self, node: str, values: dict[str, str | None]) -> None:
        patch_node(self.kube, node, lambda obj: meta_op(obj, "labels", dict(values)))

    def _wait_operands_gone(self, node: str) -> list[str]:
        """Wait for the paused operands' pods to leave the node; those still there at the deadline."""
        apps = set(GPU_CLIENTS.values())
        deadline = self.clock.now() + OPERANDS_GONE_TIMEOUT
        while True:
            pods = self.kube.list_pods(field_selector=f"spec.nodeName={node}")
            holders = [p["metadata"]["name"] for p in pods
                       if (p["metadata"].get("labels") or {}).get("app") in apps
                       and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            if not holders or self.clock.now() >= deadline or self.cancelled():
                return holders
            self.clock.sleep(self.cfg.poll_interval)

    def _wait_job(self, name: str, timeout: float, node: str = "") -> str:
        """Follow the reset Job with the loop that follows every Job (sweeper.actions.follow):
        'Complete' when it completed, else what became of it ('Lost': deleted under the run)."""
        ns, kube = self.cfg.remediation_namespace, self.kube
        ctx = ActionContext(config=self.cfg, clock=self.clock, kube=kube, log=self.log, cancelled=self.cancelled)

        def ended(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
            now = self.clock.now()
            if cond.get("type") == "Complete":
                return Result(node=node, source="gpu-reset", started=now, finished=now,
                              checks=(CheckResult("gpu.reset", "pass", "the reset Job completed"),))
            return tool_result(node, now, str(cond.get("reason") or "Failed"), "the reset Job failed",
                               str(cond.get("message") or ""))

        source = PollSource(ctx, lambda: kube.get_job(ns, name), lambda: kube.namespaced_pods(ns, f"job-name={name}"),
                            job_condition, lambda at, now: tool_result(at, now, "Lost", f"Job {ns}/{name} was deleted"))
        outcome = follow(ctx, source, Shape(node), timeout, False, ended)
        if outcome.result is None:
            return f"Stopped ({outcome.inconclusive})"
        if outcome.result.status == "pass":
            return "Complete"
        bad = outcome.result.failed_checks[0] if outcome.result.failed_checks else None
        return "Lost" if bad is not None and bad.code == "Lost" else f"Failed ({bad.message if bad else ''})"

    def _mark(self, node: str, how: str, boot_id: str, recheck: bool) -> None:
        p = self.cfg.prefix

        def build(obj: dict[str, Any]) -> list[dict[str, Any]] | None:
            ann = dict(obj["metadata"].get("annotations") or {})
            ann.update({f"{p}/remediation": how, f"{p}/remediated-at": iso(self.clock.now()),
                        f"{p}/boot-id": boot_id, f"{p}/recheck": "true" if recheck else "false"})
            ops = [{"op": "add", "path": "/metadata/annotations", "value": ann}]
            taints = (obj.get("spec") or {}).get("taints") or []
            if self.cfg.gate_taint and recheck and not any(t.get("key") == self.cfg.gate_taint for t in taints):
                # Gated again: the soak (soak_playbook) validates it under load before it is handed back.
                ops.append({"op": "add", "path": "/spec/taints",
                            "value": taints + [{"key": self.cfg.gate_taint, "value": how, "effect": "NoSchedule"}]})
            return ops

        patch_node(self.kube, node, build)
