"""What the terminal shows: tables as kubectl prints them, and the same data as JSON or YAML.

`-o table` (the default) aligns columns with three spaces, like `kubectl get`; on a terminal
it colours verdicts and shortens free text (messages, reasons) with an ellipsis to fit the
width, but never cuts an identifier (a node, a run id, a time). In a pipe it prints plain text,
one row per line, nothing shortened. `-o wide` adds columns and shows ISO times instead of
"3h ago", never shortening. `-o json` and `-o yaml` print the command's document.

Every cell is text: nothing from a node, a tool or the history is read as markup, and control
characters (a terminal escape hidden in a log line) are shown escaped. This module imports no
rich, so a command that prints a table starts fast and prints 10,000 rows in well under a second.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TextIO

FORMATS = ("table", "wide", "json", "yaml")
GAP = "   "  # kubectl's column gap
ELLIPSIS = "…"
MIN_CUT = 12  # a shortened column keeps at least this many characters

# ANSI SGR codes (ECMA-48) by verdict and status; only on a terminal, and never with NO_COLOR
# (https://no-color.org: "when present and not an empty string, prevents the addition of ANSI color").
COLOURS = {"pass": "32", "ok": "32", "warn": "33", "reboot": "35", "replace": "1;31", "quarantine": "31",
           "fail": "31", "error": "91", "inconclusive": "36", "skip": "2", "held": "31", "yes": "32",
           "unfinished": "2", "open": "31", "closed": "32", "paused": "33", "changed": "33", "failed": "31",
           "ignored": "35", "skipped": "2", "rescued": "36"}

# C0 and C1 control characters and DEL, shown escaped: a cell is one line and cannot drive the terminal.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))}
_CONTROLS.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
# Format characters that reorder or hide what follows (bidirectional overrides and isolates, the
# Arabic letter mark, zero-width marks, line and paragraph separators, the byte-order mark): a node
# name or a log line holding them could show the terminal one thing and mean another (Trojan Source,
# CVE-2021-42574). Shown as \uXXXX.
FORMAT_CHARS = (0x061C, *range(0x200B, 0x2010), *range(0x2028, 0x202F), *range(0x2060, 0x2070), 0xFEFF)
_CONTROLS.update({c: f"\\u{c:04x}" for c in FORMAT_CHARS})
_UNSAFE = frozenset(chr(c) for c in _CONTROLS)


def clean(value: Any) -> str:
    """A cell's text: a string as it is, control characters escaped, None as empty."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    return text.translate(_CONTROLS) if not text.isprintable() else text


def clean_lines(text: str) -> str:
    """Several lines of a message, each cleaned as a cell is: the line breaks kept, nothing else."""
    return "\n".join(clean(line) for line in str(text).split("\n"))


def _json_escape(text: str) -> str:
    """JSON text with C1 controls and format characters as \\uXXXX: the same document, safe to show."""
    if _UNSAFE.isdisjoint(text.replace("\n", "")):
        return text
    return "".join(f"\\u{ord(ch):04x}" if ch in _UNSAFE and ch != "\n" else ch for ch in text)


def cells(text: str) -> int:
    """Terminal columns a text takes: East Asian wide characters take two, combining marks none."""
    if text.isascii():
        return len(text)
    n = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def shorten(text: str, width: int) -> str:
    """The text in at most `width` columns, ending with an ellipsis where it was cut."""
    if cells(text) <= width:
        return text
    if text.isascii():
        return text[:max(0, width - 1)] + ELLIPSIS
    out, used = [], 0
    for ch in text:
        w = cells(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + ELLIPSIS


def iso(ts: float | None) -> str:
    """UTC, to the second, with a Z: what kubectl's -o wide and the JSON documents show."""
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def ago(ts: float | None, now: float) -> str:
    """A time relative to now, kubectl style: `3h ago`, `in 20m`, `now`."""
    if ts is None:
        return ""
    delta = now - ts
    if abs(delta) < 1:
        return "now"
    return f"{span(abs(delta))} ago" if delta > 0 else f"in {span(-delta)}"


def span(seconds: float) -> str:
    """A duration in its largest units, two at most (`45s`, `3m20s`, `5h`, `2d3h`)."""
    s = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            whole, rest = divmod(s, size)
            part = rest // sub_size
            return f"{whole}{unit}{part}{sub}" if part and whole < 10 else f"{whole}{unit}"
    return f"{s}s"


class Col(NamedTuple):
    """One column: its header, whether it is free text that may be shortened on a terminal, and
    whether it shows only in `-o wide`."""

    header: str
    cut: bool = False
    wide: bool = False


class Out:
    """How one command prints: the format, headers, and what the stream is (terminal or pipe).
    A plain class rather than a dataclass: this module is imported by every command's start."""

    def __init__(self, fmt: str = "table", headers: bool = True, stream: TextIO | None = None,
                 width: int | None = None, colour: bool = False, now: float | None = None) -> None:
        self.fmt, self.headers, self.stream = fmt, headers, stream
        self.width = width  # a terminal's width; None: the stream is not a terminal
        self.colour = colour
        self.now = time.time() if now is None else now

    @classmethod
    def to(cls, fmt: str = "table", headers: bool = True, stream: TextIO | None = None) -> Out:
        """For stdout (or `stream`): width and colour only when it is a terminal."""
        s = stream or sys.stdout
        tty = _isatty(s)
        width = _columns(s) if tty else None
        colour = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        return cls(fmt, headers, stream, width, colour)

    @property
    def file(self) -> TextIO:
        return self.stream or sys.stdout

    @property
    def wide(self) -> bool:
        return self.fmt == "wide"

    @property
    def structured(self) -> bool:
        return self.fmt in ("json", "yaml")

    def when(self, ts: float | None, empty: str = "-") -> str:
        """A time cell: relative in a table, ISO in -o wide."""
        if ts is None:
            return empty
        return iso(ts) if self.wide else ago(ts, self.now)

    def paint(self, text: str, key: str | None = None) -> str:
        code = COLOURS.get(key if key is not None else text.split(" ", 1)[0]) if self.colour else None
        return f"\x1b[{code}m{text}\x1b[0m" if code else text

    def write(self, text: str = "", key: str | None = None) -> None:
        """One line of text (cleaned), coloured by `key` on a terminal."""
        self.file.write(self.paint(clean(text), key) + "\n")

    def title(self, text: str) -> None:
        """A line above a table; left out with --no-headers."""
        if self.headers:
            self.write(text)

    def document(self, doc: Any) -> None:
        """The command's document as JSON (the `--json` of old) or YAML."""
        if self.fmt == "yaml":
            import yaml

            text = yaml.safe_dump(_plain(doc), sort_keys=False, allow_unicode=True, width=1 << 20)
            if not _UNSAFE.isdisjoint(text.replace("\n", "")):  # escaped in double quotes instead
                text = yaml.safe_dump(_plain(doc), sort_keys=False, allow_unicode=False, width=1 << 20)
            self.file.write(text)
        else:
            text = json.dumps(doc, indent=2, default=str, ensure_ascii=False)
            self.file.write(_json_escape(text) + "\n")

    def table(self, cols: Sequence[Col], rows: Iterable[Sequence[Any]], colour: Sequence[int] = ()) -> None:
        """Rows of cells aligned under the headers; `colour`: indexes of cells coloured by value."""
        self.file.write(self.render(cols, rows, colour))

    def render(self, cols: Sequence[Col], rows: Iterable[Sequence[Any]], colour: Sequence[int] = ()) -> str:
        keep = [i for i, c in enumerate(cols) if self.wide or not c.wide]
        heads = [cols[i].header.upper() for i in keep]
        body = [[clean(row[i]) for i in keep] for row in rows]
        plain_ascii = all(h.isascii() for h in heads) and all(c.isascii() for r in body for c in r)
        measure: Callable[[str], int] = len if plain_ascii else cells
        widths = [measure(h) if self.headers else 0 for h in heads]
        for r in body:
            for j, c in enumerate(r):
                w = measure(c)
                if w > widths[j]:
                    widths[j] = w
        cut = [cols[i].cut for i in keep]
        if self.width is not None and not self.wide:
            widths = _fit(widths, cut, self.width)
        painted = {keep.index(i) for i in colour if i in keep} if self.colour else set()
        last = len(keep) - 1
        lines = []
        if self.headers:
            lines.append(_line(heads, widths, last, measure, set(), self))
        for r in body:
            if self.width is not None and not self.wide:
                r = [shorten(c, widths[j]) if cut[j] and measure(c) > widths[j] else c for j, c in enumerate(r)]
            lines.append(_line(r, widths, last, measure, painted, self))
        return "".join(line + "\n" for line in lines)


def _line(row: Sequence[str], widths: Sequence[int], last: int, measure: Callable[[str], int], painted: set[int],
          out: Out) -> str:
    parts = []
    for j, c in enumerate(row):
        pad = "" if j == last else " " * max(0, widths[j] - measure(c))
        parts.append((out.paint(c) if j in painted else c) + pad)
    return GAP.join(parts).rstrip()


def _fit(widths: list[int], cut: list[bool], total: int) -> list[int]:
    """Column widths that fit `total` columns by capping the free-text columns (never the others)."""
    need = sum(widths) + len(GAP) * (len(widths) - 1)
    if need <= total or not any(cut):
        return widths
    room = total - (need - sum(w for w, c in zip(widths, cut, strict=True) if c))
    # each shortened column keeps MIN_CUT characters, or what room is left (4 at least: then the
    # line overflows and the terminal wraps it, but an identifier is still never cut)
    floor = max(4, min(MIN_CUT, room // sum(cut)))
    lo, hi = floor, max(floor, max(w for w, c in zip(widths, cut, strict=True) if c))
    while lo < hi:  # the largest common cap that fits
        mid = (lo + hi + 1) // 2
        if sum(min(w, mid) for w, c in zip(widths, cut, strict=True) if c) <= room:
            lo = mid
        else:
            hi = mid - 1
    return [min(w, lo) if c else w for w, c in zip(widths, cut, strict=True)]


def _columns(stream: TextIO) -> int:
    """The terminal's width: $COLUMNS first, as shutil.get_terminal_size reads it, then the terminal."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(stream.fileno()).columns or 120
    except (AttributeError, ValueError, OSError):
        return 120


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _plain(value: Any) -> Any:
    """JSON-shaped data for YAML (tuples as lists, other objects as text)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


TIME_KEYS = frozenset({"started", "finished", "decided", "ts", "last_sweep", "due", "opened_at", "closed_at", "at",
                        "since", "before"})


def iso_times(value: Any, key: str = "") -> Any:
    """A document with its times (epoch seconds under the keys above, and the first item of a metric
    series) as ISO 8601 UTC, as the JSON and YAML forms show them."""
    if isinstance(value, dict):
        if key == "metrics":  # name to its series of (time, value)
            return {k: [[iso(p[0]), *p[1:]] for p in v] for k, v in value.items()}
        return {k: iso_times(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [iso_times(v, key) for v in value]
    if key in TIME_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return iso(value)
    return value


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """A series as one line of block characters, lowest to highest."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return SPARK[0] * len(values)
    return "".join(SPARK[int((v - lo) / (hi - lo) * (len(SPARK) - 1))] for v in values)


# A URL's password as SQLAlchemy reads it (the text between `user:` and the first `@`, which may hold
# `/` and `:`), and libpq's password parameters in its query (https://www.postgresql.org/docs/current/
# libpq-connect.html#LIBPQ-CONNSTRING-URIS: any connection parameter may be given there, its key
# percent-encoded or not).
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/]*):[^@]*@")
_SECRET_KEYS = frozenset({"password", "sslpassword"})


def hide_password(state: str) -> str:
    """`state` fit to print: a URL's password, in its user part or its query, as `***`; a path as it is."""
    if "://" not in state:
        return state
    masked = _USERINFO.sub(r"\1:***@", state)
    base, sep, query = masked.partition("?")
    if not sep:
        return masked
    from urllib.parse import unquote_plus

    def one(item: str) -> str:
        key, eq, _ = item.partition("=")
        return f"{key}=***" if eq and unquote_plus(key).strip().lower() in _SECRET_KEYS else item

    return base + "?" + "&".join(one(i) for i in query.split("&"))

