"""What a Job's pods say about the work in them: whether a container ran, whether a pod landed or
finished, and, when a container cannot start, whose fault that is (the check's image or spec, or the
node's GPU stack). Read by the one loop that follows every Job (sweeper.actions.follow) and by the
readers of a finished Job's pods."""

from __future__ import annotations

import re
from typing import Any

from sweeper.actions import ActionContext
from sweeper.errors import KubeError, NotFound
from sweeper.result import CheckResult, Result, error_result, tool_result

# The most of a check pod's log that is read (limitBytes, and no further on Sweeper's side either):
# a log that fills it was cut, and what was read of it is no verdict.
# https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#get-read-log-of-the-specified-pod
LOG_LIMIT = 8 * 1024 * 1024
LOG_CUT = "LogTruncated"

# Why a container waits without ever having run; each is a fault of the check (its image, its
# spec, the cluster's config), not of the node's hardware.
# https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting
PULL_WAITING = ("ErrImagePull", "ImagePullBackOff")
TOOL_WAITING = (*PULL_WAITING, "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                "CreateContainerError", "RunContainerError")
# The shell's "command not found" and "not executable", and a container runtime that cannot exec the
# entrypoint at all (containerd reports StartError with 128).
TOOL_EXIT = {126: "a program the check calls is not executable in its image",
             127: "a program the check calls is not in its image (command not found)"}
# The node's own GPU stack refusing to start a container: NVIDIA's container hook (nvidia-container-cli:
# "initialization error: nvml error: driver/library version mismatch", "detection error: nvml error: ...",
# "GPU is lost"), NVML itself, or CDI device injection ("unresolvable CDI devices"). containerd reports
# them as StartError, exit 128, or the kubelet's CreateContainerError/RunContainerError, with the hook's
# words in the message (NVIDIA/gpu-operator#898, NVIDIA/k8s-device-plugin#1431,
# NVIDIA/nvidia-container-toolkit#416 and #1239). These are faults of the node, never of the check.
GPU_STACK = re.compile(r"nvidia-container-cli|nvidia-container-runtime|\bnvml\b|driver/library version mismatch|"
                       r"GPU is lost|CDI devices?\b|CDI device injection", re.IGNORECASE)
# ...except the hook's requirement check: the check image asks for a newer CUDA than the node's driver
# ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4"): the image's to fix.
NOT_GPU_STACK = re.compile(r"requirement error", re.IGNORECASE)
RUNTIME_CHECK, RUNTIME_CODE = "gpu.runtime", "GPU_RUNTIME"


def gpu_stack_words(text: str) -> str:
    """The runtime's words when a container could not start because of the node's GPU stack (the
    line that names it, at most 300 characters), else ''."""
    if not text or NOT_GPU_STACK.search(text):
        return ""
    for line in text.splitlines():
        if GPU_STACK.search(line):
            return line.strip()[-300:]
    return ""


def runtime_result(node: str, now: float, reason: str, words: str, on: str = "") -> Result:
    """A node finding: the container runtime could not start the check because of the node's GPU stack
    (`on`: the node whose runtime said so, where it is not `node`, as in a pair)."""
    where = f" on {on}" if on and on != node else ""
    return Result(node=node, source="container-runtime", started=now, finished=now, checks=(CheckResult(
        RUNTIME_CHECK, "fail", f"the container runtime{where} could not start the check ({reason}): {words}; the node's "
        "GPU stack (driver, NVML, NVIDIA container toolkit or CDI) is broken, not the check", "critical",
        code=RUNTIME_CODE, host=on or None),))


def start_failure(node: str, now: float, statuses: list[dict[str, Any]], tail: str, what: str, on: str = "",
                  gpu_stack: bool = True) -> Result | None:
    """A finished pod's first container that never got to run its work, else None: the node's GPU stack
    refused to start it (a finding on the node `on`, where `gpu_stack`), or it could not start or exec
    its program (StartError, exit 126 or 127: a fault of the tool, `what` when no exit code says more).
    `tail`: the output's last line, kept with a fault of the tool."""
    term = ((statuses[0].get("state") or {}).get("terminated") or {}) if statuses else {}
    code = term.get("exitCode")
    words = gpu_stack_words(term.get("message") or "") if gpu_stack and term.get("reason") == "StartError" else ""
    if words:
        return runtime_result(node, now, f"StartError, exit {code}", words, on)
    if term.get("reason") == "StartError" or code in TOOL_EXIT:
        image = statuses[0].get("image", "") if statuses else ""
        return tool_result(node, now, "StartError" if term.get("reason") == "StartError" else f"exit {code}",
                           f"{TOOL_EXIT.get(code) or what} (image {image}, exit {code})",  # type: ignore[arg-type]
                           tail[:500])
    return None


def job_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    """The Job's Complete or Failed condition, once it has one."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c
    return None


def unscheduled(pods: list[dict[str, Any]]) -> str:
    """The scheduler's word on a pod that cannot land, else ''."""
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return c.get("message", "unschedulable")
    return ""


def finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def node_gone(ctx: ActionContext, node: str) -> str:
    """What to add to an outcome when the node was deleted while under test, else ''."""
    try:
        ctx.kube.get_node(node)
    except NotFound:
        return "; the node is gone (deleted while under test)"
    return ""


def log_cut(node: str, now: float, log: str, limit: int = LOG_LIMIT) -> Result | None:
    """An `error` when a pod's log filled the limit it was read with: its end was never read, so
    neither a document cut short nor one followed by more output is a verdict on the node."""
    if len(log.encode("utf-8")) < limit:  # a cut mid-character decodes to U+FFFD: never fewer bytes
        return None
    return error_result(node, "sweeper", f"the pod's log filled the {limit}-byte read limit and was cut: "
                        "what was read of it is no verdict", now, code=LOG_CUT)


def hung_result(node: str, now: float, timeout: float) -> Result:
    """A node finding: the check ran and did not finish before its deadline."""
    return Result(node=node, source="sweeper", started=now, finished=now, checks=(CheckResult(
        "check.deadline", "fail", f"the check did not finish within {int(timeout)}s: a hung check is a node fault",
        "critical", code="DeadlineExceeded"),))


def container_ran(pod: dict[str, Any]) -> bool:
    """A container of the pod is running or has run (a start that failed is not running)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state or ("terminated" in state and state["terminated"].get("reason") != "StartError"):
            return True
    return False


class Fault:
    """What keeps a check from running, as first seen: a container's waiting reason and message
    from the pod's status, or the Job controller's FailedCreate Event (admission refused the pod).
    `what` is what its words name ("the check image ...", "a fault of the check")."""

    def __init__(self, what: str = "check") -> None:
        self.what = what
        self.code = ""
        self.summary = ""
        self.detail = ""
        self.since = 0.0
        self.node_words = ""  # the runtime's words when the node's GPU stack is what fails the start
        self.on = ""  # the node of the pod whose start failed so

    def _set(self, code: str, summary: str, detail: str, now: float, node_words: str = "") -> None:
        if code != self.code:
            self.since = now
        self.code, self.summary, self.detail, self.node_words = code, summary, detail, node_words

    def see(self, pods: list[dict[str, Any]], now: float) -> None:
        for p in pods:
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                w = (cs.get("state") or {}).get("waiting") or {}
                reason, msg = w.get("reason", ""), w.get("message", "")
                if reason in PULL_WAITING:
                    # ErrImagePull carries the registry's answer; ImagePullBackOff only says it waits.
                    detail = f"{reason}: {msg}" if reason == "ErrImagePull" or not self.detail else self.detail
                    self._set("ErrImagePull", f'the {self.what} image "{cs.get("image", "")}" cannot be pulled', detail, now)
                    return
                last = (cs.get("lastState") or {}).get("terminated") or {}
                words = gpu_stack_words(msg) if reason in TOOL_WAITING else \
                    gpu_stack_words(last.get("message", "")) if last.get("reason") == "StartError" else ""
                if words:  # the node's GPU stack, however the kubelet words the wait
                    self._set(reason or "StartError", "", "", now, words)
                    self.on = str((p.get("spec") or {}).get("nodeName") or "")
                    return
                if reason in TOOL_WAITING:
                    self._set(reason, f"the {self.what} container cannot start: {reason}: {msg}", "", now)
                    return
        if pods and self.code and self.code != "FailedCreate":
            self.code, self.node_words = "", ""  # the container got past it

    def see_events(self, ctx: ActionContext, namespace: str, job: str, now: float) -> None:
        """Admission (Pod Security, a missing RuntimeClass, a policy webhook) refuses the pod: the Job
        has no pod at all, only the job controller's FailedCreate Event with the apiserver's 403."""
        try:
            events = ctx.kube.list_events(namespace, f"involvedObject.kind=Job,involvedObject.name={job},"
                                                     "reason=FailedCreate")
        except KubeError as exc:
            ctx.log(f"cannot read the events of Job {job}: {exc}")
            return
        if not events:
            return
        last = max(events, key=lambda e: e.get("lastTimestamp") or "")
        text = str(last.get("message") or "")
        words = re.sub(r'^(?:Error creating: )?pods "[^"]*" is forbidden: ', "", text)
        self._set("FailedCreate", f"the {self.what} pod was refused at creation: {words}", text, now)

    def result(self, node: str, now: float) -> Result:
        if self.node_words:
            return runtime_result(node, now, self.code, self.node_words, self.on)
        return tool_result(node, now, self.code, self.summary + f"; a fault of the {self.what}, not of the node",
                           self.detail)

    def never_ran(self, node: str, now: float, pods: list[dict[str, Any]]) -> Result:
        return never_ran_result(node, now, pods, self.what)


def waiting_states(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each container's `state.waiting` ({} for one not waiting), as the kubelet last posted it."""
    return [((cs.get("state") or {}).get("waiting") or {}) for p in pods
            for cs in (p.get("status") or {}).get("containerStatuses") or []]


def never_ran_result(node: str, now: float, pods: list[dict[str, Any]], what: str = "check") -> Result:
    """The pod was accepted by the kubelet but its container never ran before the deadline (for
    instance a volume that never mounted): the check's fault (`what`'s), not a hung check."""
    waiting = waiting_states(pods)
    reason = next((w.get("reason") for w in waiting if w.get("reason")), "ContainerCreating")
    msg = next((w.get("message") for w in waiting if w.get("message")), "")
    return tool_result(node, now, str(reason), f"the {what} container never started before its deadline ({reason}); "
                       f"a fault of the {what}, not of the node", str(msg))
