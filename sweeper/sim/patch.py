"""The three patch types the apiserver accepts: JSON merge, strategic merge and JSON patch."""

from __future__ import annotations

import copy
import json
from typing import Any

from sweeper.sim.errors import ApiError, bad_request

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSONPATCH = "application/json-patch+json"

# Lists that strategic merge patch merges by a key (patchStrategy=merge) in the types Sweeper touches;
# every other list is atomic and replaced whole, as the Go struct tags say.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "addresses": "type",
}
PRIMITIVE_MERGE = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in PRIMITIVE_MERGE:
            merged = list(result.get(key) or [])
            merged += [v for v in value if v not in merged]
            result[key] = merged
        elif isinstance(value, dict):
            merged_value = strategic_merge_patch(result.get(key), value)
            if merged_value is None:
                result.pop(key, None)
            else:
                result[key] = merged_value
        else:
            result[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(f"strategic merge patch: list items of merge key {key!r} must be objects")
        directive = item.get("$patch")
        idx = next((i for i, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item.get(key)),
                   None)
        if directive == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if directive == "replace":
            return [copy.deepcopy({k: v for k, v in i.items() if k != "$patch"}) for i in patch]
        if idx is None:
            out.append(strategic_merge_patch({}, item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise _unprocessable(f"jsonpatch: doc is missing path: {path!r}")
    return cur


def _unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902. A failed `test` answers 422, as the apiserver does."""
    if not isinstance(ops, list):
        raise bad_request("json patch: body must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"json patch: malformed operation {op!r}")
        kind = op["op"]
        parts = _pointer(op["path"])
        if kind == "test":
            actual = _walk(doc, parts, op["path"])
            if json.dumps(actual, sort_keys=True) != json.dumps(op.get("value"), sort_keys=True):
                raise _unprocessable(f"the server rejected our request due to an error in our request: "
                                     f"Testing value {op['path']} failed")
            continue
        if kind in ("add", "replace"):
            if "value" not in op:
                raise bad_request(f"json patch: {kind} needs a value")
            doc = _set(doc, parts, copy.deepcopy(op["value"]), kind, op["path"])
        elif kind == "remove":
            doc = _remove(doc, parts, op["path"])[0]
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = copy.deepcopy(_walk(doc, src, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, src, op["from"])[0]
            doc = _set(doc, parts, value, "add", op["path"])
        else:
            raise bad_request(f"json patch: unknown operation {kind!r}")
    return doc


def _set(doc: Any, parts: list[str], value: Any, kind: str, path: str) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if kind == "replace" and last not in parent:
            raise _unprocessable(f"jsonpatch replace operation does not apply: doc is missing key: {path}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            if kind == "replace":
                raise _unprocessable(f"jsonpatch replace: bad index in {path}")
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if kind == "replace" else 0):
            if kind == "replace":
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise _unprocessable(f"jsonpatch {kind} operation does not apply: index out of range in {path}")
    else:
        raise _unprocessable(f"jsonpatch {kind} operation does not apply: doc is missing path: {path}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> tuple[Any, Any]:
    if not parts:
        raise _unprocessable("jsonpatch remove: cannot remove the root")
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return doc, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return doc, parent.pop(int(last))
    raise _unprocessable(f"jsonpatch remove operation does not apply: doc is missing path: {path}")


def apply_patch(content_type: str, target: dict[str, Any], body: bytes) -> dict[str, Any]:
    ctype = content_type.split(";")[0].strip().lower()
    try:
        patch = json.loads(body or b"null")
    except ValueError as exc:
        raise bad_request(f"error decoding patch: {exc}") from exc
    if ctype == JSONPATCH:
        out = json_patch(target, patch)
    elif ctype == MERGE:
        out = merge_patch(target, patch)
    elif ctype == STRATEGIC:
        out = strategic_merge_patch(target, patch)
    elif ctype == "application/apply-patch+yaml":
        raise ApiError(415, "UnsupportedMediaType", "server-side apply is not supported by the simulated cluster")
    else:
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
    if not isinstance(out, dict):
        raise _unprocessable("patch must produce an object")
    return out
