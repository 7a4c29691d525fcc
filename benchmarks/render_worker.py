"""Renders per second in-process and in the render worker (a child process, README "Renders
are bounded"): a bare expression, a `when` condition, a message template, and a shipped job
template with a node's variables; and the time to start a worker.

    python -m benchmarks.render_worker [--n 2000]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeper import render_worker
from sweeper.render_worker import WORKER
from sweeper.templating import condition, render, render_template, resolve_template

NODE = {"name": "ip-10-0-12-34", "gpus": 8, "labels": {"kubernetes.io/hostname": "ip-10-0-12-34"},
        "profile": {"gpus": 8, "gpu_model": "H100"}}
SCOPE: dict[str, Any] = {"node": NODE, "run_id": "sw-0001", "checks": {"results": [{"name": f"c{i}", "status": "pass"}
                                                                                for i in range(200)]}}


def _job_vars() -> dict[str, Any]:
    return {"node": NODE, "run_id": "sw-0001", "job_name": "sweeper-check-ip-10-0-12-34", "namespace": "sweeper-checks",
            "taint_key": "sweeper/hold", "prefix": "sweeper", "timeout": 900, "ttl": 600, "labels": {"a": "b"},
            "affinity": {}, "tolerations": [], "all_gpus": {"nvidia.com/gpu": "8"}, "priority_class": "",
            "platform": "eks", "runtime_class": "", "dcgm_hostengine": "", "default_dcgm_level": 1,
            "image": "check@sha256:0", "dcgm_image": "dcgm@sha256:0", "nccl_image": "nccl@sha256:0",
            "pair_image": "pair@sha256:0", "mpi_image": "pair@sha256:0", "reboot_image": "reboot@sha256:0"}


def cases() -> dict[str, Callable[[], Any]]:
    shipped = Path(__file__).resolve().parent.parent / "job-templates"
    job = resolve_template("sweeper-light.yaml.j2", shipped)
    variables = _job_vars()
    return {
        "expression": lambda: render("{{ node.gpus * 2 }}", SCOPE, "bench"),
        "condition": lambda: condition("checks.results | length > 0", SCOPE, "bench"),
        "message": lambda: render("node {{ node.name }} run {{ run_id }}", SCOPE, "bench"),
        "job template": lambda: render_template(job, variables),
    }


def rate(fn: Callable[[], Any], n: int) -> float:
    fn()  # compiled (and the worker started) before the clock
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    WORKER.stop()
    start = time.perf_counter()
    render("{{ 1 }}", {}, "bench")
    print(f"worker start: {(time.perf_counter() - start) * 1000:.0f} ms")
    print(f"{'render':<14}{'in-process/s':>14}{'worker/s':>12}{'added us':>10}")
    for name, fn in cases().items():
        os.environ[render_worker.ENV_SWITCH] = "thread"
        local = rate(fn, args.n)
        os.environ[render_worker.ENV_SWITCH] = "process"
        child = rate(fn, args.n)
        print(f"{name:<14}{local:>14,.0f}{child:>12,.0f}{(1 / child - 1 / local) * 1e6:>10.0f}")


if __name__ == "__main__":
    main()
