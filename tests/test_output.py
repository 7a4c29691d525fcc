"""The terminal output module: tables as kubectl prints them, text never read as anything but text."""

from __future__ import annotations

import io

import pytest

from sweeper.output import ELLIPSIS, Col, Out, ago, cells, clean, iso, shorten, span

RUN = "sw-20261123-072512-4f2a"
WHEN = "2026-11-23T07:25:12Z"
REASON = "xid (GPU 3): XID 79 (GPU has fallen off the bus) on 0000:53:00; action: reboot the node and check again"
COLS = (Col("node"), Col("run"), Col("started"), Col("verdict"), Col("why", cut=True))


def rendered(width: int | None, fmt: str = "table", headers: bool = True, colour: bool = False) -> str:
    out = Out(fmt=fmt, headers=headers, stream=io.StringIO(), width=width, colour=colour, now=0.0)
    rows = [["gpu-p5-04", RUN, WHEN, "reboot", REASON], ["gpu-p5-05", RUN, WHEN, "pass", ""]]
    return out.render(COLS, rows, colour=[3])


def test_on_a_narrow_terminal_identifiers_stay_whole_and_free_text_ends_with_an_ellipsis() -> None:
    text = rendered(width=80)
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "RUN", "STARTED", "VERDICT", "WHY"]
    assert RUN in lines[1] and WHEN in lines[1] and "gpu-p5-04" in lines[1], "never a cut identifier"
    assert lines[1].endswith(ELLIPSIS) and REASON not in text, "what is shortened is marked"
    assert all(cells(line) <= 80 for line in lines)
    assert REASON.startswith(lines[1].split("   ")[-1].strip().rstrip(ELLIPSIS))


def test_in_a_pipe_and_in_wide_nothing_is_shortened() -> None:
    for text in (rendered(width=None), rendered(width=80, fmt="wide")):
        assert REASON in text and ELLIPSIS not in text and len(text.splitlines()) == 3


def test_no_headers_and_columns_align_like_kubectl() -> None:
    text = rendered(width=None, headers=False)
    lines = text.splitlines()
    assert len(lines) == 2 and not lines[0].startswith("NODE")
    assert lines[0].index(RUN) == lines[1].index(RUN), "one column starts at one place"
    assert "   " in lines[0] and not lines[1].endswith(" "), "three spaces apart, no trailing blanks"


def test_colour_only_where_asked_and_the_width_counts_the_text_alone() -> None:
    plain, coloured = rendered(width=None), rendered(width=None, colour=True)
    assert "\x1b[" not in plain
    assert "\x1b[35mreboot\x1b[0m" in coloured
    assert coloured.replace("\x1b[35m", "").replace("\x1b[32m", "").replace("\x1b[0m", "") == plain


@pytest.mark.parametrize("text,shown", [
    ("name=[bold red]python[/bold red]", "name=[bold red]python[/bold red]"),  # rich markup is text here
    ("line one\nline two", "line one\\nline two"),  # one row, one line
    ("\x1b[2J\x1b]0;owned\x07", "\\x1b[2J\\x1b]0;owned\\x07"),  # a terminal escape from a log line, shown
    ("tab\there", "tab\\there"),
    (None, ""),
    (3, "3"),
])
def test_cells_are_text(text: object, shown: str) -> None:
    assert clean(text) == shown


def test_shorten_counts_terminal_columns() -> None:
    assert shorten("abcdef", 6) == "abcdef" and shorten("abcdefg", 6) == "abcde" + ELLIPSIS
    assert cells("日本語") == 6 and cells(shorten("日本語テキスト", 7)) <= 7
    assert shorten("日本語テキスト", 7).endswith(ELLIPSIS)


def test_times() -> None:
    """Relative times as kubectl prints ages (3h, 2d3h); ISO 8601 UTC with a Z elsewhere."""
    assert iso(0) == "1970-01-01T00:00:00Z"
    assert ago(0, 3 * 3600) == "3h ago" and ago(3 * 3600 + 20 * 60, 0) == "in 3h20m"
    assert ago(100.0, 100.2) == "now" and ago(None, 0) == ""
    assert span(45) == "45s" and span(200) == "3m20s" and span(2 * 86400 + 3 * 3600) == "2d3h"
    assert span(40 * 86400 + 5 * 3600) == "40d", "two units only while the first is small"


def test_ten_thousand_rows_are_one_line_each() -> None:
    out = Out(stream=io.StringIO(), width=None)
    rows = [[f"node-{i:05d}", "p5.48xlarge", "3h ago", "pass", ""] for i in range(10_000)]
    text = out.render((Col("node"), Col("profile"), Col("last sweep"), Col("verdict"), Col("held")), rows)
    assert len(text.splitlines()) == 10_001


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_width_and_colour_come_from_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal gets its width (COLUMNS, as shutil reads it) and colour; NO_COLOR (https://no-color.org)
    and TERM=dumb turn colour off; a pipe gets neither."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    tty = Out.to(stream=Terminal())
    assert tty.width == 80 and tty.colour
    monkeypatch.setenv("NO_COLOR", "1")
    assert Out.to(stream=Terminal()).colour is False
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert Out.to(stream=Terminal()).colour is False
    pipe = Out.to(stream=io.StringIO())
    assert pipe.width is None and not pipe.colour


def test_documents_as_json_and_yaml_hold_the_same_data() -> None:
    import json

    import yaml

    doc = {"nodes": [{"node": "gpu-00", "rules": ("a", "b"), "due": None, "held": True, "n": 1.5}]}
    as_json, as_yaml = io.StringIO(), io.StringIO()
    Out(fmt="json", stream=as_json).document(doc)
    Out(fmt="yaml", stream=as_yaml).document(doc)
    assert json.loads(as_json.getvalue()) == yaml.safe_load(as_yaml.getvalue())


def test_the_fleet_table_names_the_rule_history_names() -> None:
    """`nodes` left RULE empty where `history` and the report's node page said `findings` (the
    check's own findings decided, no named policy rule): one wording for all three."""
    from sweeper.cli.printer import _rule

    assert _rule([], "quarantine") == "findings" and _rule(None, "inconclusive") == "findings"
    assert _rule(["corrected-ecc-rising"], "replace") == "corrected-ecc-rising"
    assert _rule([], "pass") == "" and _rule([], None) == ""
