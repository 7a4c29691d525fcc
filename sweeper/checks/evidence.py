"""The evidence a held node leaves behind: a bounded bundle of what an engineer asks for first
(the kernel log of this boot, `nvidia-smi -q`, the NVLink status, DCGM's and the fabric manager's
logs, `nvidia-bug-report.sh` where the image has it), collected on the node by `sweeper evidence`
inside a short Job and printed to the pod's log between two marker lines, base64 of a tar.gz.

Every part is capped (the last bytes of a log are kept), the whole bundle is capped compressed,
and a manifest (the tar's first member) says what was collected, what was missing and why, and
what was cut. A missing tool or file is noted, never a failure of the node. docs/evidence.md says
why the log and not the termination message (4096 bytes) carries it."""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
import re
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.checks import merge_kernel_logs, read_journal
from sweeper.checks.host import Host

SCHEMA = "sweeper.evidence/v1"
BEGIN, END = "-----BEGIN SWEEPER EVIDENCE-----", "-----END SWEEPER EVIDENCE-----"
MANIFEST = "manifest.json"
MiB = 1024 * 1024
# The compressed bundle's default cap: its base64 (4/3 of it) stays far under the kubelet's
# containerLogMaxSize (10 MiB by default), past which the log the API serves is rotated away.
DEFAULT_CAP = 2 * MiB
LEAST_CUT = 64 * 1024  # a part cut below this is dropped instead
BUG_REPORT_TIMEOUT = 240.0
# Where a host service writes its log: DCGM's nv-hostengine (DCGM's packages, --log-filename default)
# and NVIDIA Fabric Manager (fabricmanager.cfg LOG_FILE_NAME default).
# https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/getting-started.html
# https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html
DCGM_LOG, FM_LOG = "/var/log/nv-hostengine.log", "/var/log/fabricmanager.log"


@dataclass
class Part:
    """One file of the bundle: what it is, where it came from, its bytes, and how it went."""

    name: str
    source: str
    cap: int
    data: bytes = b""
    status: str = "missing"  # collected | missing | error | cut | dropped
    why: str = ""
    original: int = 0
    priority: int = 0  # lower is kept longer when the bundle is over its cap

    def keep(self, data: bytes, status: str = "collected", why: str = "") -> None:
        self.original = len(data)
        self.data = data[-self.cap:] if len(data) > self.cap else data
        self.status = "cut" if len(data) > self.cap else status
        self.why = why or (f"the last {self.cap} of {len(data)} bytes kept" if len(data) > self.cap else "")

    def entry(self) -> dict[str, Any]:
        return {"file": self.name, "source": self.source, "status": self.status, "bytes": len(self.data),
                "original_bytes": self.original, "why": self.why}


@dataclass
class Collected:
    """What `collect` made: the tar.gz and its manifest."""

    bundle: bytes
    manifest: dict[str, Any] = field(default_factory=dict)


def _command(host: Host, part: Part, argv: list[str], timeout: float = 120.0) -> None:
    try:
        code, out, err = host.run(argv, timeout=timeout)
    except FileNotFoundError:
        part.status, part.why = "missing", f"{argv[0]} is not in the image"
        return
    except OSError as exc:
        part.status, part.why = "error", f"cannot run {argv[0]}: {exc}"
        return
    text = out + (f"\n--- stderr ---\n{err}" if err.strip() else "")
    # An empty answer is an answer: `nvidia-smi nvlink -s` prints nothing for a GPU without NVLink
    # (a PCIe H100, exit 0); said in the manifest, never taken for a failure.
    part.keep(text.encode(errors="replace"), "collected" if code == 0 else "error",
              f"{argv[0]} exited {code}: {err.strip()[:200]}" if code != 0 else "" if text.strip()
              else f"{' '.join(argv)} printed nothing")


def _file(host: Host, part: Part, path: str) -> None:
    try:
        text = host.read(path)
    except OSError as exc:
        part.status, part.why = "error", f"cannot read {path}: {exc.strerror or exc}"
        return
    if text is None:
        part.status, part.why = "missing", f"{path} is not on the host (or not mounted)"
        return
    part.keep(text.encode(errors="replace"))


def _kernel(host: Host, part: Part) -> None:
    """The ring buffer (`dmesg`), preceded by what the journal kept of this boot's kernel lines."""
    ring, why = "", ""
    try:
        code, out, err = host.run(["dmesg"], timeout=60)
        ring, why = (out, "") if code == 0 else ("", f"dmesg exited {code}: {err.strip()[:160]}")
    except FileNotFoundError:
        why = "dmesg is not in the image"
    journal, jwhy = read_journal(host, window=10 ** 9)  # this boot, all of it
    text = merge_kernel_logs(ring, journal) if journal else ring
    if not text:
        part.status, part.why = "missing", "; ".join(w for w in (why, jwhy) if w) or "the kernel log is empty"
        return
    part.keep(text.encode(errors="replace"), "collected", "; ".join(w for w in (why, jwhy) if w))


def _bug_report(host: Host, part: Part, scratch: str, timeout: float) -> None:
    """nvidia-bug-report.sh, where the image has it, into scratch space; its own .gz kept whole."""
    out = Path(scratch) / "nvidia-bug-report.log"
    try:
        code, _, err = host.run(["nvidia-bug-report.sh", "--safe-mode", "--output-file", str(out)], timeout=timeout)
    except FileNotFoundError:
        part.status, part.why = "missing", "nvidia-bug-report.sh is not in the image"
        return
    gz = out.with_suffix(".log.gz")
    try:
        data = gz.read_bytes()
    except OSError:
        part.status, part.why = "error", f"nvidia-bug-report.sh exited {code} and wrote no report: {err.strip()[:200]}"
        return
    if len(data) > part.cap:  # a compressed file is not cut: a tail of it reads as nothing
        part.status, part.why, part.original = "dropped", f"{len(data)} bytes, over its cap of {part.cap}", len(data)
        return
    part.keep(data, "collected" if code == 0 else "error", "" if code == 0 else f"exited {code}")


def collect(host: Host, node: str, cap: int = DEFAULT_CAP, now: float | None = None, scratch: str | None = None,
            bug_report_timeout: float = BUG_REPORT_TIMEOUT) -> Collected:
    """Collect every part from `host` and pack them, the whole under `cap` bytes compressed."""
    parts = [Part("kernel.log", "dmesg + journalctl -k -b (this boot)", 8 * MiB, priority=0),
             Part("nvidia-smi-q.txt", "nvidia-smi -q", 4 * MiB, priority=1),
             Part("nvlink-status.txt", "nvidia-smi nvlink -s", MiB, priority=2),
             Part("fabricmanager.log", FM_LOG, 4 * MiB, priority=3),
             Part("nv-hostengine.log", DCGM_LOG, 4 * MiB, priority=4),
             Part("nvidia-bug-report.log.gz", "nvidia-bug-report.sh --safe-mode", cap // 2, priority=5)]
    _kernel(host, parts[0])
    _command(host, parts[1], ["nvidia-smi", "-q"])
    _command(host, parts[2], ["nvidia-smi", "nvlink", "-s"])
    _file(host, parts[3], FM_LOG)
    _file(host, parts[4], DCGM_LOG)
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        _bug_report(host, parts[5], tmp, bug_report_timeout)
    manifest = {"schema": SCHEMA, "node": node, "collected_at": time.time() if now is None else now,
                "boot_id": host.boot_id(), "cap_bytes": cap, "parts": []}
    return Collected(*fit(parts, manifest, cap))


def pack(parts: list[Part], manifest: dict[str, Any]) -> bytes:
    """The tar.gz: the manifest first (a reader needs no other member), then each part with data."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1).encode())] + \
                [(p.name, p.data) for p in parts if p.data]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(manifest["collected_at"])
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def fit(parts: list[Part], manifest: dict[str, Any], cap: int) -> tuple[bytes, dict[str, Any]]:
    """Pack, and while over `cap`, halve the largest part (keeping its tail; the least needed first
    among equals), or drop it once it is small or compressed: a flooding log is cut, and the small
    parts beside it (nvidia-smi -q) stay whole."""
    while True:
        manifest["parts"] = [p.entry() for p in parts]
        bundle = pack(parts, manifest)
        if len(bundle) <= cap:
            return bundle, manifest
        victims = sorted((p for p in parts if p.data), key=lambda p: (-len(p.data), -p.priority))
        if not victims:
            return bundle, manifest  # the manifest alone: nothing more can go
        v = victims[0]
        if len(v.data) // 2 < LEAST_CUT or v.name.endswith(".gz"):
            v.data, v.status = b"", "dropped"
            v.why = f"dropped: the bundle was over its cap of {cap} bytes compressed"
        else:
            v.data, v.status = v.data[len(v.data) // 2:], "cut"
            v.why = f"the last {len(v.data)} of {v.original} bytes kept (the bundle's cap is {cap} bytes compressed)"


def emit(bundle: bytes) -> str:
    """The bundle as the pod's log carries it: base64 lines between the markers."""
    body = base64.encodebytes(bundle).decode()
    return f"{BEGIN}\n{body}{END}\n"


class BundleError(ValueError):
    """A pod log that holds no readable bundle."""


def extract(log: str, cap: int) -> bytes:
    """The bundle between the markers of a pod's log, checked: base64, gzip, at most `cap` bytes."""
    m = re.search(re.escape(BEGIN) + r"\n([A-Za-z0-9+/=\n]*)" + re.escape(END), log)
    if m is None:
        raise BundleError("no evidence bundle in the log (its markers are missing: cut, or never printed)")
    if len(m.group(1)) > cap * 4 // 3 + cap // 38 + 16:  # base64 of `cap` bytes with its newlines
        raise BundleError(f"the bundle is over its cap of {cap} bytes")
    try:
        data = base64.b64decode(m.group(1).replace("\n", ""), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BundleError(f"the bundle is not base64: {exc}") from None
    if len(data) > cap:
        raise BundleError(f"the bundle is {len(data)} bytes, over its cap of {cap}")
    if data[:2] != b"\x1f\x8b":
        raise BundleError("the bundle is not gzip")
    return data


MANIFEST_LIMIT = 256 * 1024


def read_manifest(bundle: bytes) -> dict[str, Any]:
    """The manifest, the tar's first member, read in memory from the first 512-byte header as it is
    and at most MANIFEST_LIMIT bytes after it (nothing is extracted, no other member is read). No
    extension header is followed: tarfile reads a GNU long name's or a PAX header's data in one read
    of the size it claims, so a few kilobytes that claim a terabyte would exhaust the controller."""
    try:
        head = zlib.decompressobj(wbits=31).decompress(bundle, tarfile.BLOCKSIZE + MANIFEST_LIMIT)
        first = tarfile.TarInfo.frombuf(head[:tarfile.BLOCKSIZE], "utf-8", "strict")
    except (tarfile.TarError, zlib.error, UnicodeError, ValueError) as exc:
        raise BundleError(f"the bundle's manifest is unreadable: {exc}") from None
    if first.name != MANIFEST or not first.isfile() or first.size > MANIFEST_LIMIT \
            or len(head) < tarfile.BLOCKSIZE + first.size:
        raise BundleError("the bundle's first member is not its manifest")
    try:
        doc = json.loads(head[tarfile.BLOCKSIZE:tarfile.BLOCKSIZE + first.size])
    except (ValueError, RecursionError) as exc:  # RecursionError: `[` nested past the parser's depth
        raise BundleError(f"the bundle's manifest is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("parts"), list):
        raise BundleError("the bundle's manifest is not a Sweeper evidence manifest")
    return doc
