"""One golden playbook per row of the semantics table (STYLE.md), with its expected outcome
beside it in NAME.expect.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.actions import ActionContext, load_all
from sweeper.errors import PlaybookError
from sweeper.playbook.executor import Executor, PlayResult, TaskOutcome, load

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.stem for p in GOLDEN.glob("*.yaml") if not p.stem.endswith(".expect"))


class ManualClock:
    """Simulated time: sleeping advances it at once."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0
        self.start = self.t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


def dig(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, list):
            value = value[int(part)]
        else:
            value = value[part]
    return value


def run(name: str, expect: dict[str, Any]) -> tuple[PlayResult | None, list[TaskOutcome], ManualClock, Exception | None]:
    clock = ManualClock()
    seen: list[TaskOutcome] = []
    cancel = {"now": False}

    def on_task(o: TaskOutcome) -> None:
        seen.append(o)
        if expect.get("cancel_after") and len([x for x in seen if not x.is_item]) >= expect["cancel_after"]:
            cancel["now"] = True

    ctx = ActionContext(clock=clock, cancelled=lambda: cancel["now"])
    actions = load_all()
    ex = Executor(actions, ctx, on_task, tags=tuple(expect.get("tags", ())), skip_tags=tuple(expect.get("skip_tags", ())))
    try:
        return ex.run(load(GOLDEN / f"{name}.yaml", actions)), seen, clock, None
    except PlaybookError as exc:
        return None, seen, clock, exc


@pytest.mark.parametrize("name", CASES)
def test_golden(name: str) -> None:
    expect = yaml.safe_load((GOLDEN / f"{name}.expect.yaml").read_text())
    result, seen, clock, error = run(name, expect)
    tasks = [[o.name, o.status] for o in seen if not o.is_item]
    if "raises" in expect:
        assert error is not None, f"{name} should have raised"
        assert expect["raises"] in str(error)
        if "outcomes" in expect:
            assert tasks == expect["outcomes"]
        return
    assert error is None, str(error)
    assert result is not None
    assert result.failed is expect["failed"]
    assert result.cancelled is expect.get("cancelled", False)
    assert tasks == expect["outcomes"]
    for task, statuses in (expect.get("items") or {}).items():
        assert [o.status for o in seen if o.is_item and o.name == task] == statuses, task
    for path, value in (expect.get("vars") or {}).items():
        assert dig(result.vars, path) == value, path
    for path, text in (expect.get("contains") or {}).items():
        assert text in str(dig(result.vars, path)), path
    for path in expect.get("absent") or []:
        with pytest.raises((KeyError, IndexError)):
            dig(result.vars, path)
    if "clock" in expect:
        assert clock.t - clock.start == pytest.approx(expect["clock"])


def test_every_row_of_the_semantics_table_has_a_golden() -> None:
    rows = {"when", "loop", "register", "until", "changed_failed_when", "ignore_errors", "rescue", "always",
            "timeout", "attempts"}
    assert rows <= set(CASES)
