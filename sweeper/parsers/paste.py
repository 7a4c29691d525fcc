"""Tool output as people paste it: what surrounds the output is taken off before a reader looks.

- a runner's prefix: Ansible's ad-hoc one-line form (`host | CHANGED | rc=0 | (stdout) ...`,
  with the newlines of the output escaped as `\\n`) and its plain form (`host | CHANGED | rc=0 >>`
  on a line of its own), pdsh/clush's `host: ` before every line, Open MPI's `[1,0]<stdout>:`
  and `kubectl logs --timestamps`' time before every line;
- a shell prompt line with the command (`$ nvidia-smi -q`, `[root@gpu-7 ~]# ibstat`,
  `user@host:~$ fi_info -p efa`);
- an elision line where rows were cut (`[...]`, `...`, `<snip>`): dropped, and remembered, so that
  a reader does not call the output truncated because rows it was told about are missing;
- terminal escape sequences (ECMA-48 CSI such as SGR `ESC [ 4 m`, and OSC ... BEL/ST): `nvidia-smi topo
  -m` on driver 580 underlines its header row with `ESC[4m` ... `ESC[0m` even when stdout is a file.
  `strip_escapes` takes them off before any reader (of any format) looks; `clean` does too.

The formats of the runners are those their documentation shows (Ansible's `oneline` callback,
https://docs.ansible.com/ansible/latest/collections/ansible/builtin/oneline_callback.html;
pdsh(1), whose output lines are `host: line`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# `host | CHANGED | rc=0 | (stdout) text` (oneline) and `host | CHANGED | rc=0 >>` (minimal)
_ANSIBLE_ONELINE = re.compile(r"^\S+ \| (?:CHANGED|SUCCESS|FAILED!?|UNREACHABLE!?) \| rc=-?\d+ \| \(stdout\) ?(.*)$")
_ANSIBLE_HEAD = re.compile(r"^\S+ \| (?:CHANGED|SUCCESS|FAILED!?|UNREACHABLE!?) \| rc=-?\d+ >>\s*$")
_TOOLS = r"(nvidia-smi|ibv_devinfo|ibv_devices|ibstat|ibstatus|fi_info|kubectl|ssh|pdsh|clush|srun|docker|dmesg|cat|grep)"
_PROMPT = re.compile(r"^\s*(?:\[[^\]\n]{1,80}\][#$]|[\w.@-]{1,80}:[^\s$#]{0,200}[#$]|[$#]|>>>|PS [^>]{1,200}>)\s*"
                     r"(?:sudo\s+)?(?:\S*/)?" + _TOOLS + r"\b(.*)$")
# The command alone on a line, as people paste it above its output (`nvidia-smi -q`).
_ECHO = re.compile(r"^\s*(?:sudo\s+)?(?:\S*/)?(nvidia-smi|ibv_devinfo|ibstat|ibstatus|fi_info)((?:\s+-[-\w=,. ]*)*)\s*$")
_ELISION = re.compile(r"^\s*(?:\[\s*(?:\.\.\.|…|snip(?:ped)?|truncated|cut)\s*\]|\.\.\.+|…|<\s*snip\s*>|"
                      r"\(\s*(?:\.\.\.|snip|truncated)\s*\)|# \.\.\.)\s*$", re.IGNORECASE)
_PDSH = re.compile(r"^([\w.-]{0,40}\d[\w.-]{0,40}): ")  # a host name has a digit; `provider: ` is not one
# Per-line prefixes that a launcher or a log reader puts before every line of a tool's output:
# Open MPI's --tag-output (`[1,0]<stdout>:`, mpirun(1)) and `kubectl logs --timestamps` (RFC 3339).
_LINE_PREFIXES = (re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>: ?"),
                  re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d) "))


# ECMA-48: CSI (ESC [ or the 8-bit 0x9b, parameter bytes 0x30-0x3f, intermediate 0x20-0x2f, a final byte
# 0x40-0x7e), OSC/DCS/APC/PM strings up to BEL or ST, and the two-byte escapes (ESC followed by 0x40-0x5f).
# Each part is bounded, so a hostile paste cannot make the expression backtrack.
_ESCAPE = re.compile(r"(?:\x1b\[|\x9b)[0-?]{0,64}[ -/]{0,8}[@-~]"
                     r"|\x1b[\]PX^_][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)"
                     r"|\x1b[@-Z\\-_]")


_SGR = re.compile(r"\x1b\[[0-9;]{0,64}m")  # colour and underline, nearly all a paste holds: a faster first pass


def strip_escapes(text: str) -> str:
    """`text` without the terminal's escape sequences (colour, underline, titles); the rest untouched."""
    if "\x1b" not in text and "\x9b" not in text:
        return text
    text = _SGR.sub("", text)
    if "\x1b" not in text and "\x9b" not in text:
        return text
    return _ESCAPE.sub("", text)


@dataclass
class Paste:
    """The tool's own lines, and what was taken away around them."""

    lines: list[str]
    elided: bool = False
    prefixed: bool = False
    command: str = ""  # the first command a prompt line (or an echoed command line) named, with its arguments

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _unescape_oneline(rest: str) -> list[str]:
    text = rest.split(" (stderr) ", 1)[0]
    return text.replace("\\r", "").replace("\\t", "\t").replace("\\n", "\n").split("\n")


def _strip_pdsh(lines: list[str]) -> list[str] | None:
    """pdsh/clush output, when every one of two or more non-blank lines starts with the same `host: `."""
    hosts = {m.group(1) for ln in lines if ln.strip() for m in [_PDSH.match(ln)] if m}
    body = [ln for ln in lines if ln.strip()]
    if len(hosts) != 1 or len(body) < 2 or not all(_PDSH.match(ln) for ln in body):
        return None
    host = next(iter(hosts))
    return [ln[len(host) + 2:] if ln.startswith(host + ": ") else ln for ln in lines]


MAX_LINE = 64 * 1024  # no tool read here prints a line this long; a longer one is not its output


def longest_line(text: str) -> int:
    """The length of the longest line, without splitting a large text into a list."""
    longest, start = 0, 0
    while True:
        end = text.find("\n", start)
        if end < 0:
            return max(longest, len(text) - start)
        longest, start = max(longest, end - start), end + 1


def _prompt(line: str) -> re.Match[str] | None:
    head = line.lstrip()[:1]
    start = line[:300]
    if head in ("$", "#", "[", ">", "P") or (":" in start and ("$" in start or "#" in start)):
        return _PROMPT.match(line)
    if head in ("n", "i", "f", "s", "/"):
        return _ECHO.match(line)
    return None


def clean(text: str) -> Paste:
    """The lines of `text` without a runner's prefix, prompt lines and elision markers."""
    raw = strip_escapes(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    paste = Paste(out)
    for line in raw:
        if " | " in line and "rc=" in line:
            m = _ANSIBLE_ONELINE.match(line)
            if m:
                out.extend(_unescape_oneline(m.group(1)))
                paste.prefixed = True
                continue
            if _ANSIBLE_HEAD.match(line):
                paste.prefixed = True
                continue
        m = _prompt(line)
        if m:
            paste.prefixed = True
            paste.command = paste.command or (m.group(1) + m.group(2)).strip()
            continue
        if len(line) < 24 and _ELISION.match(line):
            paste.elided = True
            continue
        out.append(line)
    for prefix in _LINE_PREFIXES:
        body = [ln for ln in out if ln.strip()]
        if body and all(prefix.match(ln) for ln in body):
            out[:] = [prefix.sub("", ln, count=1) for ln in out]
            paste.prefixed = True
    pdsh = _strip_pdsh(out)
    if pdsh is not None:
        paste.lines, paste.prefixed = pdsh, True
    return paste


def binary(text: str) -> bool:
    """More than one in twenty characters a terminal would not print: not a tool's text output."""
    sample = text[:65536]
    if not sample:
        return False
    bad = sum(1 for ch in sample if (ord(ch) < 32 and ch not in "\t\n\r") or 0x7f <= ord(ch) < 0xa0 or ch == "\ufffd")
    return bad * 20 > len(sample)


def unreadable(text: str, tool: str, max_bytes: int) -> str:
    """Why `text` cannot be `tool`'s output at all (nothing, too much, binary, a line no tool
    prints), or "" when a reader may look at it."""
    if not text or not text.strip():
        return f"{tool} printed nothing"
    if len(text) > max_bytes:
        return f"{len(text)} bytes of output is over the {max_bytes} limit"
    if binary(text):
        return f"binary data, not {tool}'s text output"
    if longest_line(text) > MAX_LINE:
        return f"a line over {MAX_LINE} characters: not {tool} output"
    return ""
