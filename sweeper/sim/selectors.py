"""Label and field selectors with the grammar and semantics of the Kubernetes apiserver."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sweeper.sim.errors import bad_request

_TOKEN = re.compile(r"\s*(!=|==|=|\(|\)|,|!|[A-Za-z0-9_./-]+)")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in, notin, exists, !exists, =, !=
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        has = self.key in labels
        val = labels.get(self.key)
        if self.op in ("=", "in"):
            return has and val in self.values
        if self.op in ("!=", "notin"):
            return not has or val not in self.values
        if self.op == "exists":
            return has
        if self.op == "!exists":
            return not has
        raise AssertionError(self.op)


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise bad_request(f"unable to parse requirement: invalid label selector: {text!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text or not text.strip():
        return []
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def err() -> Exception:
        return bad_request(f"unable to parse requirement: invalid label selector: {text!r}")

    while i < len(toks):
        if toks[i] == "!":
            if i + 1 >= len(toks):
                raise err()
            reqs.append(Requirement(toks[i + 1], "!exists"))
            i += 2
        else:
            key = toks[i]
            i += 1
            if i >= len(toks) or toks[i] == ",":
                reqs.append(Requirement(key, "exists"))
            elif toks[i] in ("=", "==", "!="):
                if i + 1 >= len(toks) or toks[i + 1] in (",", "(", ")"):
                    # empty value is legal: key=
                    reqs.append(Requirement(key, "=" if toks[i] != "!=" else "!=", ("",)))
                    i += 1
                else:
                    reqs.append(Requirement(key, "!=" if toks[i] == "!=" else "=", (toks[i + 1],)))
                    i += 2
            elif toks[i] in ("in", "notin"):
                op = toks[i]
                i += 1
                if i >= len(toks) or toks[i] != "(":
                    raise err()
                i += 1
                vals: list[str] = []
                while i < len(toks) and toks[i] != ")":
                    if toks[i] != ",":
                        vals.append(toks[i])
                    i += 1
                if i >= len(toks):
                    raise err()
                i += 1
                reqs.append(Requirement(key, op, tuple(vals)))
            else:
                raise err()
        if i < len(toks):
            if toks[i] != ",":
                raise err()
            i += 1
    return reqs


def labels_match(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


def _get(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _as_field(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Field labels each resource supports, as the apiserver registers them.
FIELDS: dict[str, tuple[str, ...]] = {
    "pods": ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
             "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
             "status.podIP", "status.nominatedNodeName"),
    "nodes": ("metadata.name", "spec.unschedulable"),
    "events": ("metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
               "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
               "source", "type"),
    "jobs": ("metadata.name", "metadata.namespace", "status.successful"),
    # ResourceSliceSpec: "A field selector can be used to list only ResourceSlice objects belonging to a
    # certain node" (nodeName) "... with a certain driver name" (driver).
    # https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/resource-slice-v1/
    "resourceslices": ("metadata.name", "spec.nodeName", "spec.driver"),
}


# Where a field label reads another field or a zero value, as the apiserver's field sets do: an absent
# `spec.unschedulable` is "false" (a bool prints as its zero value), a Job's `status.successful` is the
# count in `status.succeeded` (k8s.io/kubernetes pkg/registry/{core/node,core/pod,batch/job}/strategy.go).
FIELD_SOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("nodes", "spec.unschedulable"): ("spec.unschedulable", "false"),
    ("pods", "spec.hostNetwork"): ("spec.hostNetwork", "false"),
    ("jobs", "status.successful"): ("status.succeeded", "0"),
    ("events", "source"): ("source.component", ""),
}


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split on `sep` where it is not escaped by a backslash (fields.ParseSelector's splitTerms)."""
    parts, cur, i = [], "", 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            cur += text[i:i + 2]
            i += 2
            continue
        if text[i] == sep:
            parts.append(cur)
            cur = ""
        else:
            cur += text[i]
        i += 1
    parts.append(cur)
    return parts


def _split_term(term: str) -> tuple[str, str, str] | None:
    """(key, operator, escaped value) at the first unescaped operator, trying `!=`, `==`, `=`."""
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
        i += 1
    return None


def unescape_field_value(value: str) -> str:
    """A field selector value with `\\\\`, `\\,` and `\\=` unescaped; any other escape, or a bare `,` or
    `=`, is an error (fields.UnescapeValue)."""
    out, i = "", 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise bad_request(f"invalid field selector value: invalid escape sequence in {value!r}")
            out += value[i + 1]
            i += 2
            continue
        if ch in ",=":
            raise bad_request(f"invalid field selector value: unescaped {ch!r} in {value!r}")
        out += ch
        i += 1
    return out


def parse_field_selector(text: str | None, resource: str) -> Callable[[dict[str, Any]], bool]:
    """Field selectors as fields.ParseSelector reads them
    (https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/): terms split
    on unescaped commas, `=`, `==` or `!=`, values with `\\,` `\\=` `\\\\` escapes."""
    if not text or not text.strip():
        return lambda obj: True
    allowed = FIELDS.get(resource, ("metadata.name", "metadata.namespace"))
    terms: list[tuple[str, str, str]] = []
    for part in _split_unescaped(text, ","):
        part = part.strip()
        if not part:
            continue
        split = _split_term(part)
        if split is None or not re.fullmatch(r"[A-Za-z0-9_.]+", split[0].strip()):
            raise bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        key, op, value = split[0].strip(), split[1], unescape_field_value(split[2])
        if key not in allowed:
            raise bad_request(f'field label not supported: {key}')
        terms.append((key, "!=" if op == "!=" else "=", value))

    def match(obj: dict[str, Any]) -> bool:
        for key, op, value in terms:
            path, zero = FIELD_SOURCES.get((resource, key), (key, ""))
            found = _get(obj, path)
            actual = zero if found is None else _as_field(found)
            if (actual == value) != (op == "="):
                return False
        return True

    return match
