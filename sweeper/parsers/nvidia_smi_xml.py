"""`nvidia-smi -q -x`: the XML form of `-q` (what exporters and scripts read), turned into the same
tree of lower-case keys that the `-q` text gives, so that one reader and one set of rules judge both.

The tags are those of nvidia-smi's DTD (`nvsmi_device_v*.dtd`, named in the output's DOCTYPE):
most are the `-q` key with `_` for spaces (`<product_name>` is `Product Name`); the ones that are
not are renamed below. The XML is input someone else wrote: the standard library's parser does not
fetch an external DTD, and a document with an internal DTD subset or an entity declaration (the
"billion laughs" expansion) is refused before it is parsed."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

MAX_DEPTH = 32  # nvidia-smi nests about six levels; deeper is not its output

# nvidia-smi's own DOCTYPE: a name and an external DTD, no internal subset.
_DOCTYPE = re.compile(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"[\w.\-]{1,64}\"\s*>")

# Tags whose `-q` key is not the tag with spaces: (parent key, tag) -> -q key
_RENAME = {
    ("retired pages", "multiple_single_bit_retirement"): "single bit ecc",
    ("retired pages", "double_bit_retirement"): "double bit ecc",
    ("retired pages", "pending_blacklist"): "pending page blacklist",
    ("retired pages", "pending_retirement"): "pending page retirement",
    ("single bit ecc", "retired_count"): "count",
    ("double bit ecc", "retired_count"): "count",
    ("remapped rows", "remapped_row_corr"): "correctable error",
    ("remapped rows", "remapped_row_unc"): "uncorrectable error",
    ("remapped rows", "remapped_row_pending"): "pending",
    ("remapped rows", "remapped_row_failure"): "remapping failure occurred",
    ("pci", "pci_gpu_link_info"): "gpu link info",
    ("gpu link info", "pcie_gen"): "pcie generation",
    ("gpu link info", "link_widths"): "link width",
    ("pcie generation", "current_link_gen"): "current",
    ("pcie generation", "max_link_gen"): "max",
    ("link width", "current_link_width"): "current",
    ("link width", "max_link_width"): "max",
    ("temperature", "gpu_temp"): "gpu current temp",
    ("temperature", "gpu_temp_tlimit"): "gpu t.limit temp",
    ("power readings", "power_draw"): "power draw",
    ("power readings", "enforced_power_limit"): "enforced power limit",
}
# <clocks_event_reason_hw_slowdown> (and the older <clocks_throttle_reason_...>) is -q's `HW Slowdown`
_REASON_PREFIX = re.compile(r"^clocks_(?:event|throttle)_reason_")


class XmlRefused(ValueError):
    """The XML is not nvidia-smi's, or holds what an XML bomb needs."""


def looks_like(text: str) -> bool:
    return "<nvidia_smi_log" in text[:4000]


def _key(parent: str, tag: str) -> str:
    renamed = _RENAME.get((parent, tag))
    if renamed:
        return renamed
    if parent in ("clocks event reasons", "clocks throttle reasons"):
        tag = _REASON_PREFIX.sub("", tag)
    return tag.replace("_", " ").lower()


def _tree(elem: ET.Element, parent: str, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise XmlRefused(f"nested deeper than {MAX_DEPTH} levels: not nvidia-smi's XML")
    out: dict[str, Any] = {}
    for child in elem:
        key = _key(parent, child.tag)
        if len(child):
            out.setdefault(key, _tree(child, key, depth + 1))
        else:
            text = (child.text or "").strip()
            # An empty element (<retired_pages> with nothing under it, <processes></processes>) is a
            # section with nothing in it, as -q prints a heading with no lines below.
            out.setdefault(key, text if text else {})
    return out


def parse_tree(text: str) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """(top-level keys, one mapping per <gpu id="bus id">), keyed as `-q` keys them; raises
    XmlRefused for a document this reader will not parse."""
    body = text.lstrip("\ufeff")
    if "<!ENTITY" in body:
        raise XmlRefused("an XML entity declaration: nvidia-smi declares none, and entities are how an XML "
                         "bomb expands")
    doctype = body.find("<!DOCTYPE")
    if doctype >= 0:
        m = _DOCTYPE.match(body, doctype)
        if not m:
            raise XmlRefused("a DOCTYPE other than nvidia-smi's own (an internal DTD subset is refused)")
        body = body[:m.start()] + body[m.end():]
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise XmlRefused(f"not well-formed XML ({exc}): cut, or not nvidia-smi -q -x") from exc
    if root.tag != "nvidia_smi_log":
        raise XmlRefused(f"the root element is <{root.tag[:40]}>, not <nvidia_smi_log>")
    top: dict[str, Any] = {}
    gpus: list[tuple[str, dict[str, Any]]] = []
    for child in root:
        if child.tag == "gpu":
            gpus.append((str(child.get("id", ""))[:32], _tree(child, "", 1)))
        elif not len(child):
            top.setdefault(_key("", child.tag), (child.text or "").strip())
    return top, gpus
