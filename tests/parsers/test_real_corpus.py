"""Outputs that real tools printed and people published, each judged as its note says.

Every sample in `fixtures/real/` has a sidecar `<sample>.yaml`:

    source: where the output was published (a URL, or `owner/repo:path`)
    format: the `--format` name a reader must detect
    verdict: what a correct reader concludes (pass, warn, fail, error, skip)
    contains: [optional] words each of which some check's message or code must hold
    options: [optional] `sweeper ingest` flags, e.g. {profile: p5, expect-gpus: 8}
    note: what the sample shows, in our own words

The sample is read twice, by `--format auto` and by its named format; both must agree
with the sidecar, and a sample whose verdict is not `pass` must never come back `pass`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main

REAL = Path(__file__).parent / "fixtures" / "real"
VERDICTS = {"pass", "warn", "fail", "error", "skip"}


def _samples() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for side in sorted(REAL.glob("*.yaml")):
        meta = yaml.safe_load(side.read_text())
        data = [p for p in REAL.glob(side.stem + ".*") if p.suffix != ".yaml"]
        assert len(data) == 1, f"{side.name}: expected one sample file beside it, found {data}"
        out.append((data[0], meta))
    return out


SAMPLES = _samples()


def _ingest(path: Path, fmt: str, options: dict[str, Any]) -> dict[str, Any]:
    args = ["ingest", "corpus-node", str(path), "--format", fmt, "--no-record", "--json"]
    for k, v in (options or {}).items():
        args += [f"--{k}", str(v)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code in (0, 1), f"{path.name} --format {fmt}: exit {res.exit_code}\n{res.output}"
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@pytest.mark.parametrize("path,meta", SAMPLES, ids=[p.name for p, _ in SAMPLES])
def test_a_real_sample_is_judged_as_its_note_says(path: Path, meta: dict[str, Any]) -> None:
    assert meta.get("source") and meta.get("note"), f"{path.name}: every sample names its source and says what it shows"
    assert meta["verdict"] in VERDICTS
    for fmt in ("auto", meta["format"]):
        doc = _ingest(path, fmt, meta.get("options") or {})
        assert doc["source"] == meta["format"], f"{path.name} --format {fmt}: read as {doc['source']}"
        if meta["verdict"] != "pass":
            assert doc["status"] != "pass", f"{path.name}: a {meta['verdict']} sample came back pass"
        assert doc["status"] == meta["verdict"], (
            f"{path.name} --format {fmt}: {doc['status']}, expected {meta['verdict']}: "
            + "; ".join(c["message"] for c in doc["checks"] if c["status"] != "pass")[:600])
        text = " ".join(f"{c['name']} {c.get('code') or ''} {c['message']}" for c in doc["checks"])
        for word in meta.get("contains") or []:
            assert str(word).lower() in text.lower(), f"{path.name} --format {fmt}: no {word!r} in {text[:600]}"


def test_the_corpus_is_large_and_mostly_faults() -> None:
    """At least 80 published samples across the formats, no more than a quarter of them healthy."""
    formats = {meta["format"] for _, meta in SAMPLES}
    healthy = sum(1 for _, meta in SAMPLES if meta["verdict"] == "pass")
    assert len(SAMPLES) >= 80, len(SAMPLES)
    assert healthy * 4 <= len(SAMPLES), f"{healthy} of {len(SAMPLES)} healthy"
    assert formats >= {"kernel-log", "dcgm", "nccl", "nvidia-smi", "ibv-devinfo", "fi-info", "topo"}, formats
