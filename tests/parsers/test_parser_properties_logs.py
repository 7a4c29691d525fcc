"""Properties of the kernel-log, DCGM and nccl-tests readers, over the real corpus: random
bytes, a sample cut at any line, and a sample with one line corrupted never raise, never end
in bounded time past Hypothesis' deadline, and never turn a failing sample into a pass."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper.ingest import kernel_log
from sweeper.parsers import dcgm, nccl
from sweeper.result import STATUSES, Result

REAL = Path(__file__).parent / "fixtures" / "real"
# Each reader with the sample's `ingest` options (its sidecar's `options`).
READERS: dict[str, Callable[[str, dict[str, Any]], Result]] = {
    "kernel-log": lambda text, o: kernel_log(text, "n1", 0.0),
    "dcgm": lambda text, o: dcgm.parse(text, "n1", 0.0, expect_gpus=o.get("expect-gpus")),
    "nccl": lambda text, o: nccl.parse(text, "n1", 0.0, min_busbw=o.get("min-busbw")),
}
# Generous: a reading takes milliseconds; the deadline catches a reader that goes quadratic.
PROPS = settings(max_examples=25, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])


def _failing_samples() -> list[tuple[str, str, list[str], dict[str, Any]]]:
    out = []
    for side in sorted(REAL.glob("*.yaml")):
        meta = yaml.safe_load(side.read_text())
        if meta["format"] in READERS and meta["verdict"] != "pass":
            data = next(p for p in REAL.glob(side.stem + ".*") if p.suffix != ".yaml")
            out.append((data.name, meta["format"], data.read_text().splitlines(keepends=True),
                        meta.get("options") or {}))
    return out


FAILING = _failing_samples()


def _read(fmt: str, lines: list[str], options: dict[str, Any] | None = None) -> Result:
    r = READERS[fmt]("".join(lines), options or {})
    assert r.status in STATUSES
    return r


@functools.cache
def _spare_lines(name: str) -> list[int]:
    """The lines of a failing sample whose loss alone leaves it failing."""
    _, fmt, lines, opts = next(s for s in FAILING if s[0] == name)
    return [i for i in range(len(lines)) if _read(fmt, lines[:i] + lines[i + 1:], opts).status != "pass"]


@pytest.mark.parametrize("fmt", sorted(READERS))
@PROPS
@given(data=st.binary(max_size=4096))
def test_random_bytes_never_raise_and_never_pass(fmt: str, data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    r = _read(fmt, [text])
    if fmt == "kernel-log" and r.status == "pass":  # only if the bytes happened to hold a kernel line
        assert "line(s)" in r.checks[0].message
    else:
        assert r.status != "pass"


@pytest.mark.parametrize("name,fmt,lines,opts", FAILING, ids=[n for n, *_ in FAILING])
def test_a_failing_sample_cut_at_any_line_stays_failing_once_its_evidence_is_in(
        name: str, fmt: str, lines: list[str], opts: dict[str, Any]) -> None:
    """Cut after every line (the paste lost its end) and before every line (it lost its start):
    once the cut keeps the lines that made it fail, no further line turns it into a pass."""
    assert _read(fmt, lines, opts).status != "pass"
    heads = [_read(fmt, lines[:k], opts).status for k in range(1, len(lines) + 1)]  # never cut to nothing
    tails = [_read(fmt, lines[k:], opts).status for k in range(len(lines))]
    finding = ("fail", "warn")
    if not any(s in finding for s in heads + tails):  # nothing readable in it: no cut of it passes
        assert "pass" not in heads + tails, (name, heads, tails)
        return
    first = next(k for k, s in enumerate(heads) if s in finding)
    assert all(s != "pass" for s in heads[first:]), (name, heads)
    last = max(k for k, s in enumerate(tails) if s in finding)
    assert all(s != "pass" for s in tails[:last + 1]), (name, tails)


@pytest.mark.parametrize("name,fmt,lines,opts", FAILING, ids=[n for n, *_ in FAILING])
@PROPS
@given(data=st.data())
def test_one_corrupted_line_never_turns_a_failing_sample_into_a_pass(
        name: str, fmt: str, lines: list[str], opts: dict[str, Any], data: st.DataObject) -> None:
    """A line whose loss alone would leave the sample failing is replaced with anything at all."""
    spare = _spare_lines(name)
    if not spare:
        return
    i = data.draw(st.sampled_from(spare))
    junk = data.draw(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
    assert _read(fmt, lines[:i] + [junk + "\n"] + lines[i + 1:], opts).status != "pass"
