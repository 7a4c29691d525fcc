"""The one loop that follows every Job (sweeper.actions.follow): its rules hold alike for a check Job,
a pair's Job and an MPIJob, whatever the source it sees the Job through. Here the Job's story is
scripted on a clock that only moves when the loop waits; tests/cluster/ runs the same loop against
the simulated cluster."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sweeper.actions import ActionContext
from sweeper.actions.follow import MPIShape, PairShape, PollSource, Shape, follow
from sweeper.actions.podstate import job_condition
from sweeper.config import Config
from sweeper.errors import NotFound
from sweeper.result import Result, tool_result

RUNNING: dict[str, Any] = {"metadata": {"name": "j"}, "status": {}}
OVER: dict[str, Any] = {"metadata": {"name": "j"}, "status": {"conditions": [
    {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
DONE: dict[str, Any] = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
# The NVIDIA container hook's words when the node's driver and libraries disagree (NVIDIA/gpu-operator#898).
NVML = "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch"


class Manual:
    """A clock that moves only when the loop waits or sleeps."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.t += seconds
        return False


def pod(state: dict[str, Any], name: str = "p", phase: str = "Running", role: str = "") -> dict[str, Any]:
    labels = {"training.kubeflow.org/job-role": role} if role else {}
    return {"metadata": {"name": name, "labels": labels},
            "status": {"phase": phase, "startTime": "2026-01-01T00:00:00Z",
                       "containerStatuses": [{"image": "registry.example/check@sha256:" + "a" * 64, "state": state}]}}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message}}


def source(ctx: ActionContext, job: Any, pods: list[dict[str, Any]]) -> PollSource:
    """The Job as `job(now)` says, with `pods`, seen by polling."""
    def gone(node: str, now: float) -> Result:
        return tool_result(node, now, "JobGone", "deleted")
    return PollSource(ctx, lambda: job(ctx.clock.now()), lambda: pods, job_condition, gone)


def shapes() -> list[Shape]:
    return [Shape("gpu-00"), PairShape("gpu-00", "gpu-01")]


def run(shape: Shape, job: Any, pods: list[dict[str, Any]], cancelled: bool = False,
        read: Any = None) -> Any:
    ctx = ActionContext(config=Config(), clock=Manual(), cancelled=lambda: cancelled)
    return follow(ctx, source(ctx, job, pods), shape, 600, False, read or (lambda cond, p: pytest.fail("read")))


@pytest.mark.parametrize("shape", shapes(), ids=["check", "pair"])
def test_a_deadline_after_the_work_ran_is_a_hung_check_a_fault_of_the_node(shape: Shape) -> None:
    ran = [pod({"running": {}}, f"p{i}") for i in range(shape.need)]
    out = run(shape, lambda now: OVER if now >= 600 else RUNNING, ran)
    (check,) = out.result.checks
    assert (check.name, check.status, check.code) == ("check.deadline", "fail", "DeadlineExceeded")


@pytest.mark.parametrize("shape", shapes(), ids=["check", "pair"])
def test_an_image_that_cannot_be_pulled_is_a_fault_of_the_tool_never_of_the_node(shape: Shape) -> None:
    stuck = [pod(waiting("ErrImagePull", "manifest unknown"), f"p{i}") for i in range(shape.need)]
    out = run(shape, lambda now: RUNNING, stuck)
    (check,) = out.result.checks
    assert (check.name, check.code, out.result.status) == ("check.tool", "ErrImagePull", "error")


@pytest.mark.parametrize("shape", shapes(), ids=["check", "pair"])
def test_a_gpu_stack_that_refuses_the_container_is_a_finding_on_the_node(shape: Shape) -> None:
    stuck = [pod(waiting("RunContainerError", NVML), f"p{i}") for i in range(shape.need)]
    out = run(shape, lambda now: RUNNING, stuck)
    (check,) = out.result.checks
    assert (check.name, check.status) == ("gpu.runtime", "fail") and "driver/library version mismatch" in check.message


@pytest.mark.parametrize("shape,what", [(Shape("gpu-00"), "the check"), (PairShape("gpu-00", "gpu-01"), "the pair")],
                         ids=["check", "pair"])
def test_a_stopped_sweep_is_no_verdict(shape: Shape, what: str) -> None:
    out = run(shape, lambda now: RUNNING, [], cancelled=True)
    assert out.result is None and out.inconclusive == f"the sweep was stopped before {what} finished"


@pytest.mark.parametrize("shape", shapes(), ids=["check", "pair"])
def test_a_finished_job_is_read(shape: Shape) -> None:
    done = [pod({"terminated": {"exitCode": 0}}, f"p{i}", phase="Succeeded") for i in range(shape.need)]
    seen: list[Any] = []

    def read(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        seen.append((cond["type"], len(pods)))
        return Result(node="gpu-00", source="test", started=0, finished=0)

    assert run(shape, lambda now: DONE, done, read=read).result is not None
    assert seen == [("Complete", shape.need)]


def test_an_mpijob_deleted_under_the_run_is_said_so() -> None:
    ctx = ActionContext(config=Config(), clock=Manual())

    def missing(now: float) -> dict[str, Any]:
        raise NotFound("gone")

    shape = MPIShape("gpu-00", "gpu-01", role=lambda p: p["metadata"]["labels"].get("training.kubeflow.org/job-role", ""))
    out = follow(ctx, source(ctx, missing, []), shape, 600, False, lambda cond, p: pytest.fail("read"))
    assert out.result is not None and out.result.checks[0].code == "JobGone"


def test_an_mpijob_past_its_deadline_whose_launcher_never_ran_is_not_a_hung_check() -> None:
    """Only the launcher's container running makes a deadline a hung check (the workers wait for it)."""
    shape = MPIShape("gpu-00", "gpu-01", role=lambda p: p["metadata"]["labels"].get("training.kubeflow.org/job-role", ""))
    pods = [pod({"running": {}}, "w0", role="worker"), pod({"running": {}}, "w1", role="worker"),
            pod(waiting("ContainerCreating"), "l", role="launcher")]
    out = run(shape, lambda now: OVER if now >= 600 else RUNNING, pods)
    (check,) = out.result.checks
    assert check.name != "check.deadline" and out.result.status == "error", out.result


class Decided(Shape):
    """A shape whose outcome a container that ran decides (sweeper.remedy.RebootShape's rule)."""

    need = 0
    decided_by_run = True
    part = "reboot Job"


FAILED = {"metadata": {"name": "j"}, "status": {"conditions": [
    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}


def test_a_container_that_ran_decides_whatever_the_job_says_after() -> None:
    """A reboot's pod fails as its node goes down, and a Job with backoffLimit 0 is then Failed
    (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-backoff-failure-policy): once
    its container ran, `read` decides, with the Job's condition, or {} while it has none."""
    seen: list[Any] = []

    def read(cond: dict[str, Any], pods: list[dict[str, Any]]) -> Result:
        seen.append(cond.get("reason"))
        return Result(node="gpu-00", source="test", started=0, finished=0)

    for job, reason in ((lambda now: RUNNING, None), (lambda now: FAILED, "BackoffLimitExceeded")):
        run(Decided("gpu-00"), job, [pod({"terminated": {"exitCode": 137, "reason": "Error"}}, phase="Failed")],
            read=read)
        assert seen.pop() == reason
    # A start that failed is no run: the fault of the tool is named in the shape's words.
    out = run(Decided("gpu-00"), lambda now: RUNNING, [pod(waiting("ImagePullBackOff", 'Back-off pulling image "x"'))])
    (check,) = out.result.checks
    assert (check.status, check.code) == ("error", "ErrImagePull") and "a fault of the reboot Job" in check.message
    assert check.message.startswith('the reboot Job image "registry.example/check@sha256:')
