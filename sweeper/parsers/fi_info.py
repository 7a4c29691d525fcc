"""`fi_info -p efa` output: the EFA devices libfabric can open.

Devices are counted as the distinct domain prefixes (`rdmap16s27` of `rdmap16s27-rdm`) over
the `FI_EP_RDM` blocks; counting `provider: efa` lines over-counts, since each device shows up
once per endpoint type and fabric (libfabric 2.x lists each device under the `efa` and the
`efa-direct` fabrics too).

Read as printed or as pasted (a prompt line, a runner's prefix: see `paste`). `fi_getinfo: -61
(No data available)` is libfabric finding no EFA device, a failure; a provider list without any
`efa` block says the same."""

from __future__ import annotations

import re

from sweeper.parsers.paste import Paste, clean, unreadable
from sweeper.result import CheckResult, Metric, Result, error_result

SOURCE = "fi-info"

_KV = re.compile(r"^\s*(provider|fabric|domain|version|type|protocol):\s*(\S+)\s*$")
MAX_BYTES = 1024 * 1024  # 32 EFA devices in every fabric and endpoint type is about 20 KB


def efa_devices(text: str) -> list[str] | None:
    """The EFA device names, sorted; None when the text is not fi_info output at all."""
    return _efa_devices(clean(text).lines)


def _efa_devices(lines: list[str]) -> list[str] | None:
    blocks: list[dict[str, str]] = []
    for line in lines:
        m = _KV.match(line)
        if not m:
            continue
        key, value = m.groups()
        if key == "provider":
            blocks.append({"provider": value})
        elif blocks:
            blocks[-1][key] = value
    if not blocks:
        return None
    devices = set()
    for b in blocks:
        if b.get("provider") != "efa" or "domain" not in b:
            continue
        if b.get("type", "FI_EP_RDM") != "FI_EP_RDM" and not b["domain"].endswith("-rdm"):
            continue
        devices.add(re.sub(r"-(rdm|dgrm)$", "", b["domain"]))
    return sorted(devices)


def _nodata(paste: Paste) -> list[str]:
    """Lines saying libfabric found nothing: `fi_getinfo: -61 (No data available)`, or a bare `-61`
    (-FI_ENODATA, fi_getinfo(3)) under an `fi_info` prompt."""
    out = [ln.strip() for ln in paste.lines if re.match(r"^\s*fi_getinfo\b", ln)]
    if paste.command.startswith("fi_info"):
        out += [ln.strip() for ln in paste.lines if re.fullmatch(r"\s*-61\b.*", ln)]
    return out


def looks_like(text: str) -> bool:
    paste = clean(text[:200_000])
    lines = paste.lines
    if paste.command.startswith("fi_info"):
        return True
    return any(re.match(r"^\s*fi_getinfo\b", ln) for ln in lines) or (
        any(re.match(r"^\s*provider:\s*\S", ln) for ln in lines)
        and any(re.match(r"^\s*(fabric|domain):\s*\S", ln) for ln in lines))


def parse(text: str, node: str, now: float, expect: int | None = None, exit_code: int | None = None) -> Result:
    why = unreadable(text, "fi_info", MAX_BYTES)
    if why:
        return error_result(node, SOURCE, why, now)
    paste = clean(text)
    lines = paste.lines
    failed = _nodata(paste)
    if failed and not any(re.match(r"^\s*provider:", ln) for ln in lines):
        return Result(node=node, source=SOURCE, started=now, finished=now,
                      checks=(CheckResult("efa.fi_info", "fail", f"libfabric finds no EFA device: "
                                          f"{failed[-1][:120]}", "critical", code="EFA_NONE"),))
    devices = _efa_devices(lines)
    if devices is None:
        return error_result(node, SOURCE, "no provider block in the output: not fi_info output", now)
    metric = Metric("efa.fi_info_devices", len(devices), "devices")
    if exit_code not in (None, 0):
        check = CheckResult("efa.fi_info", "error", f"fi_info exited {exit_code}", "warning")
    elif expect is not None and len(devices) != expect:
        check = CheckResult("efa.fi_info", "fail", f"libfabric opens {len(devices)} EFA devices, "
                            f"the profile expects {expect}", "critical", code="EFA_COUNT")
    elif not devices:
        check = CheckResult("efa.fi_info", "fail", "libfabric lists no EFA RDM endpoint", "critical", code="EFA_NONE")
    else:
        check = CheckResult("efa.fi_info", "pass", f"{len(devices)} EFA devices: {', '.join(devices[:4])}"
                            + (" ..." if len(devices) > 4 else ""))
    return Result(node=node, source=SOURCE, started=now, finished=now, checks=(check,), metrics=(metric,))
