"""`nvidia-smi topo -m`: how GPUs reach each other and the NICs.

The matrix is tab-separated, but wide captures sometimes lose a tab and merge two cells
(`PIXNODE`, `SYSSYS`); merged tokens are split against the legend's vocabulary.

Read as printed or as pasted (a prompt line, a runner's prefix: see `paste`; tabs turned into
spaces; with or without the legend and the affinity columns). Every GPU row must be there; NIC
rows cut off the end of a paste are not needed, since only GPU rows are judged."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sweeper.parsers.paste import clean, unreadable
from sweeper.result import CheckResult, Result, error_result

# From nearest to farthest. NV# (NVLink) is nearer than any PCIe path.
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_TOKEN = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS")
_RUN = re.compile(r"^(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS)+")
_AFFINITY_HEADS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
MAX_BYTES = 1024 * 1024


@dataclass
class Topology:
    columns: list[str]
    rows: dict[str, list[str]] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0

    @property
    def gpus(self) -> list[str]:
        return [c for c in self.columns if c.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        return self.rows[a][self.columns.index(b)]


def rank(path: str) -> int:
    """0 for NVLink or self, then PIX=1 .. SYS=5; unknown paths rank last."""
    if path == "X" or path.startswith("NV"):
        return 0
    return PCIE_PATHS.index(path) + 1 if path in PCIE_PATHS else len(PCIE_PATHS) + 1


def _cells(rest: str, want: int) -> list[str] | None:
    tokens = [t for t in re.split(r"\s+", rest.strip()) if t]
    cells: list[str] = []
    for t in tokens:
        if len(cells) == want:
            break
        m = _RUN.match(t)
        if not m:
            break  # the affinity columns start here (CPU lists, NUMA ids, N/A)
        cells.extend(_TOKEN.findall(m.group(0)))
        if m.end() != len(t):
            break  # a cell merged with the CPU affinity after it
    return cells if len(cells) == want else None


def looks_like(text: str) -> bool:
    lines = clean(text[:200_000]).lines
    return any(re.match(r"^\s*GPU0(?:\s+(?:GPU\d+|NIC\d+|mlx5_\d+|CPU\b))+", ln) for ln in lines) and any(
        re.match(r"^\s*GPU0\s+X\b", ln) for ln in lines)


def parse_matrix(text: str) -> Topology | None:
    lines = clean(text).lines
    header = next((i for i, ln in enumerate(lines) if re.match(r"^\s*GPU0\b", ln) and "GPU" in ln), None)
    if header is None:
        return None
    head = lines[header]
    for h in _AFFINITY_HEADS:
        head = head.split(h)[0]
    columns = [c for c in re.split(r"\s+", head.strip()) if c]
    if not columns or not all(re.fullmatch(r"GPU\d+|NIC\d+|mlx5_\d+|rdmap\w+|\w+", c) for c in columns):
        return None
    topo = Topology(columns)
    for ln in lines[header + 1:]:
        if not ln.strip():
            if topo.rows:
                break
            continue
        name, _, rest = re.sub(r"\s+", " ", ln.strip()).partition(" ")
        if name not in columns:
            break
        cells = _cells(rest, len(columns))
        if cells is None:
            if name.startswith("GPU"):
                return None
            break  # a NIC row cut short: the rows after it are not needed either
        topo.rows[name] = cells
    for ln in lines:
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", ln)
        if m:
            topo.nic_names[m.group(1)] = m.group(2)
    if not set(topo.gpus) <= set(topo.rows):
        return None
    return topo


def parse(text: str, node: str, now: float, nvlinks: int | None = None, nic_affinity: str = "") -> Result:
    """GPU-GPU links (all NVLink when the profile has NVLink) and, when NICs are listed, each
    GPU's nearest NIC no farther than `nic_affinity` (PIX, PXB, PHB, NODE or SYS)."""
    why = unreadable(text, "nvidia-smi topo -m", MAX_BYTES)
    if why:
        return error_result(node, "topo", why, now)
    topo = parse_matrix(text)
    if topo is None:
        lines = clean(text).lines
        if any(re.match(r"^\s*GPU0\s+X\s+(OK|CNS|GNS|TNS|NS|DR|U)\b", ln) for ln in lines):
            return error_result(node, "topo", "a `nvidia-smi topo -p2p` matrix (peer access), not `topo -m` (links)", now)
        return error_result(node, "topo", "no complete topology matrix in the output", now)
    return Result(node=node, source="topo", started=now, finished=now,
                  checks=tuple(judge(topo, nvlinks, nic_affinity)))


def judge(topo: Topology, nvlinks: int | None, nic_affinity: str) -> list[CheckResult]:
    out: list[CheckResult] = []
    gpus = topo.gpus
    kinds = sorted({topo.link(a, b) for a in gpus for b in gpus if a != b})
    if len(gpus) < 2:  # one GPU (a single-GPU VM): no pair, so no link to judge
        ok = not nvlinks
        out.append(CheckResult("topology.gpu_gpu", "pass" if ok else "fail", f"{len(gpus)} GPU, so no GPU pair"
                               + ("" if ok else ": the profile expects NVLink between GPUs"),
                               "info" if ok else "critical", code=None if ok else "NVLINK_TOPOLOGY"))
    elif not nvlinks:
        out.append(CheckResult("topology.gpu_gpu", "pass", f"{len(gpus)} GPUs; GPU pairs over {', '.join(kinds)} "
                               "(nothing expected of them)"))
    else:
        bad = [(a, b, topo.link(a, b)) for a in gpus for b in gpus if a < b and not topo.link(a, b).startswith("NV")]
        if bad:
            a, b, p = bad[0]
            out.append(CheckResult("topology.gpu_gpu", "fail", f"{len(bad)} GPU pairs without NVLink, e.g. {a}-{b} "
                                   f"over {p}", "critical", code="NVLINK_TOPOLOGY"))
        else:
            out.append(CheckResult("topology.gpu_gpu", "pass", f"every GPU pair over NVLink ({', '.join(kinds)})"))
    nics = [c for c in topo.columns if not c.startswith("GPU")]
    if not nic_affinity:
        return out
    if nic_affinity not in PCIE_PATHS:
        out.append(CheckResult("topology.gpu_nic", "error", f"unknown affinity {nic_affinity!r}; one of "
                               f"{', '.join(PCIE_PATHS)}", "warning"))
        return out
    if not nics:
        out.append(CheckResult("topology.gpu_nic", "skip", "the matrix lists no NIC"))
        return out
    limit = rank(nic_affinity)
    for i, g in enumerate(gpus):
        best = min(nics, key=lambda n: rank(topo.link(g, n)))
        path = topo.link(g, best)
        label = topo.nic_names.get(best, best)
        if rank(path) > limit:
            out.append(CheckResult("topology.gpu_nic", "fail", f"{g}'s nearest NIC is {label} over {path}, "
                                   f"farther than {nic_affinity}", "warning", gpu=i, code="NIC_AFFINITY"))
        else:
            out.append(CheckResult("topology.gpu_nic", "pass", f"{g} reaches {label} over {path}", gpu=i))
    return out
