"""Properties of the nvidia-smi, ibv_devinfo, fi_info and topo readers over real failing outputs
(`fixtures/real/`): random bytes, a sample cut after any of its lines, and a sample with one line
replaced by noise never come back `pass`, never raise, and each reading ends within Hypothesis'
deadline.

A cut sample is read with the counts the full sample shows (GPUs, NICs), as a profile would give
them: a capture that lost whole devices is then short of the profile, not healthy. Samples whose
paste already elides rows (`[...]`) are left out of the cut property: a further cut cannot be told
apart from the author's own. Hypothesis runs derandomised, so a run is the same run every time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper.parsers import fi_info, ibv_devinfo, nvidia_smi, topo
from sweeper.parsers.paste import clean
from sweeper.result import STATUSES, Result

REAL = Path(__file__).parent / "fixtures" / "real"
NOW = 1_800_000_000.0
MINE = ("nvidia-smi", "ibv-devinfo", "fi-info", "topo")
PROPS = settings(max_examples=40, deadline=5000, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _reader(fmt: str, full: str, options: dict[str, object]) -> Callable[[str], Result]:
    """The format's reader with the expectations the whole sample implies."""
    if fmt == "nvidia-smi":
        got = nvidia_smi.readings(full)
        gpus = len(got[1]) if not isinstance(got, str) and got[1] else None
        return lambda t: nvidia_smi.parse(t, "n", NOW, expect_gpus=gpus)
    if fmt == "ibv-devinfo":
        devs = ibv_devinfo.devices(full)
        return lambda t: ibv_devinfo.parse(t, "n", NOW, expect=len(devs) if devs else None)
    if fmt == "fi-info":
        efa = fi_info.efa_devices(full)
        return lambda t: fi_info.parse(t, "n", NOW, expect=len(efa) if efa else None)
    nvlinks = 18 if options.get("profile") == "p5.48xlarge" else None
    return lambda t: topo.parse(t, "n", NOW, nvlinks=nvlinks)


def _failing() -> list[tuple[str, str, Callable[[str], Result]]]:
    out = []
    for side in sorted(REAL.glob("*.yaml")):
        meta = yaml.safe_load(side.read_text())
        if meta["format"] not in MINE or meta["verdict"] != "fail":
            continue
        text = next(p for p in REAL.glob(side.stem + ".*") if p.suffix != ".yaml").read_text()
        out.append((side.stem, text, _reader(meta["format"], text, meta.get("options") or {})))
    return out


FAILING = _failing()
READERS: dict[str, Callable[[str], Result]] = {
    "nvidia-smi": lambda t: nvidia_smi.parse(t, "n", NOW, expect_gpus=8),
    "ibv-devinfo": lambda t: ibv_devinfo.parse(t, "n", NOW, expect=8),
    "fi-info": lambda t: fi_info.parse(t, "n", NOW, expect=4),
    "topo": lambda t: topo.parse(t, "n", NOW, nvlinks=18),
}


def test_there_are_failing_samples_of_every_format() -> None:
    assert len(FAILING) >= 20
    assert {stem.split("-")[0] for stem, _, _ in FAILING} >= {"nvidia", "ibv", "fi", "topo"}


@pytest.mark.parametrize("fmt", MINE)
@PROPS
@given(data=st.binary(max_size=4096))
def test_random_bytes_never_pass(fmt: str, data: bytes) -> None:
    for text in (data.decode("utf-8", errors="replace"), data.decode("latin-1")):
        r = READERS[fmt](text)
        assert r.status in STATUSES and r.status != "pass", (fmt, text[:200], r.checks)


CUTTABLE = [(stem, text, read) for stem, text, read in FAILING if not clean(text).elided]


@pytest.mark.parametrize("stem,text,read", CUTTABLE, ids=[s for s, _, _ in CUTTABLE])
def test_a_failing_sample_cut_after_any_line_never_passes(stem: str, text: str,
                                                           read: Callable[[str], Result]) -> None:
    lines = text.splitlines(keepends=True)
    for n in range(len(lines) + 1):
        r = read("".join(lines[:n]))
        assert r.status != "pass", f"{stem} cut after line {n}: {[c.message for c in r.checks][:4]}"


# Noise: a line with at least one character no tool here prints in a key (control characters,
# symbols, non-ASCII), as a corrupted transfer or a stray terminal sequence leaves it.
NOISE = st.text(min_size=1, max_size=80).filter(lambda s: "\n" not in s and "\r" not in s).filter(
    lambda s: any(not (c.isascii() and (c.isalnum() or c in " ._:()/+-#&',=[]")) for c in s))


@PROPS
@given(which=st.integers(min_value=0, max_value=len(FAILING) - 1), at=st.integers(min_value=0),
       noise=NOISE)
def test_one_corrupted_line_never_makes_a_failing_sample_pass(which: int, at: int, noise: str) -> None:
    stem, text, read = FAILING[which]
    lines = text.splitlines()
    lines[at % len(lines)] = noise
    r = read("\n".join(lines) + "\n")
    assert r.status in STATUSES and r.status != "pass", (stem, at % len(lines), noise, r.checks)
