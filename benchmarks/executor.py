"""The playbook engine's own overhead: time per task for a 200-task playbook of pure actions,
and per item for a 1,000-item loop.

    python -m benchmarks.executor [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sweeper.actions import ActionContext, load_all
from sweeper.playbook.executor import Executor
from sweeper.playbook.model import parse_playbook


def flat_playbook(n: int) -> str:
    tasks = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            tasks.append(f"  - set_fact: {{v{i}: '{{{{ {i} * 2 }}}}'}}")
        elif kind == 1:
            tasks.append(f"  - debug: {{msg: 'task {i} sees {{{{ v{i - 1} }}}}'}}\n    register: r{i}")
        elif kind == 2:
            tasks.append(f"  - assert: {{that: ['v{i - 2} == {2 * (i - 2)}', 'r{i - 1} is succeeded']}}")
        else:
            tasks.append(f"  - debug: {{msg: skipped}}\n    when: v{i - 3} < 0")
    return "name: flat\ntasks:\n" + "\n".join(tasks) + "\n"


LOOP = """
name: loop
tasks:
  - set_fact: {total: 0}
  - debug: {msg: "{{ item * 2 }}"}
    loop: "{{ range(N) | list }}"
    when: item % 7 != 0
    register: looped
  - assert: {that: "looped.results | length == N"}
"""


def time_play(text: str, extra: dict[str, object], repeat: int) -> list[float]:
    actions = load_all()
    pb = parse_playbook(text, actions, "<bench>")
    out = []
    for _ in range(repeat):
        ex = Executor(actions, ActionContext())
        t0 = time.perf_counter()
        result = ex.run(pb, extra)
        out.append(time.perf_counter() - t0)
        assert not result.failed, [o.msg for o in result.outcomes if o.status == "failed"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    flat = time_play(flat_playbook(200), {}, args.repeat)
    loop = time_play(LOOP, {"N": 1000}, args.repeat)
    f, lp = statistics.median(flat), statistics.median(loop)
    print(f"200-task playbook of pure actions: {f * 1000:8.1f} ms   {f / 200 * 1e6:7.1f} us per task "
          f"(median of {args.repeat}; first run, compiling templates: {flat[0] / 200 * 1e6:.1f} us per task)")
    print(f"1,000-item loop:                   {lp * 1000:8.1f} ms   {lp / 1000 * 1e6:7.1f} us per item "
          f"(median of {args.repeat}; first run: {loop[0] / 1000 * 1e6:.1f} us per item)")
    print(f"per-item / per-task ratio: {(lp / 1000) / (f / 200):.2f}")


if __name__ == "__main__":
    main()
