"""The OpenAPI v3 documents of the kinds the simulator serves, and the apiserver's strict field
validation, both built from the JSON schemas that kubernetes-validate ships.

kubectl reads `/openapi/v3` (a map from group-version to a document's URL with a hash), then
`/openapi/v3/<api|apis/group>/<version>?hash=...`, to learn whether a PATCH accepts `fieldValidation`
and `dryRun` and, where it does, leaves validation to the server
(https://kubernetes.io/docs/concepts/overview/kubernetes-api/#openapi-v3,
https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation). The documents carry
the schemas in `components.schemas`, the operations of every path with their
`x-kubernetes-group-version-kind`, as the apiserver's do; `kubectl explain` reads them too.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from sweeper.sim.errors import bad_request
from sweeper.sim.store import RESOURCES, Resource

SCHEMAS = "v1.31.0-local"  # the Kubernetes release the simulator says it is (/version)
_REF = "#/$defs/"
_V3_REF = "#/components/schemas/"
META = "io.k8s.apimachinery.pkg.apis.meta.v1."


@functools.cache
def definitions() -> dict[str, Any]:
    """Every definition of the Kubernetes release, keyed by its OpenAPI name (read from the
    package's data files without importing it: its jsonschema machinery is not needed here)."""
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "kubernetes-json-schema" / SCHEMAS / "_definitions.json"
    try:
        return dict(json.loads(path.read_text())["$defs"])
    except (OSError, ValueError, KeyError):
        return {}


@functools.cache
def _by_kind() -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, schema in definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            out.setdefault((gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")), name)
    return out


def definition_name(res: Resource) -> str | None:
    return _by_kind().get((res.group, res.version, res.kind))


def group_versions() -> dict[str, list[Resource]]:
    """'api/v1' and 'apis/<group>/<version>' to the resources served there."""
    out: dict[str, list[Resource]] = {}
    for r in RESOURCES.values():
        key = f"apis/{r.group}/{r.version}" if r.group else f"api/{r.version}"
        out.setdefault(key, []).append(r)
    return out


# -- the documents -----------------------------------------------------------------------------
def _to_v3(node: Any) -> Any:
    """A JSON-schema (2020-12) node as an OpenAPI 3.0 schema: one type (kubernetes-validate adds
    "null" to each so that absent fields validate), references into components.schemas, and a
    reference with siblings wrapped in allOf, as the apiserver writes them."""
    if isinstance(node, list):
        return [_to_v3(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = value.replace(_REF, _V3_REF)
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            out[key] = types[0] if types else "object"
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _to_v3(s) for name, s in value.items()}
        elif key in ("$schema", "$id"):
            continue
        else:
            out[key] = _to_v3(value)
    if "$ref" in out and len(out) > 1:
        ref = out.pop("$ref")
        out["allOf"] = [{"$ref": ref}]
    return out


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF):
            name = ref[len(_REF):]
            if name not in found:
                found.add(name)
                _refs(definitions().get(name), found)
        for key, value in node.items():
            if key != "$ref":
                _refs(value, found)
    elif isinstance(node, list):
        for x in node:
            _refs(x, found)


def _param(name: str, where: str, description: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "description": description, "required": required or where == "path",
            "schema": {"type": "string", "uniqueItems": True}}


_WRITE_PARAMS = [
    _param("dryRun", "query", "When present, modifications are not persisted. The only valid value is All."),
    _param("fieldManager", "query", "The name of the actor or entity making the changes."),
    _param("fieldValidation", "query", "Ignore, Warn or Strict: what to do with unknown or duplicate fields."),
]
_LIST_PARAMS = [_param(n, "query", n) for n in ("labelSelector", "fieldSelector", "limit", "continue",
                                                  "resourceVersion", "timeoutSeconds", "watch")]


def _content(ref: str, types: tuple[str, ...] = ("application/json", "application/yaml")) -> dict[str, Any]:
    return {t: {"schema": {"$ref": _V3_REF + ref}} for t in types}


def _operations(res: Resource, schema: str, item: bool, all_namespaces: bool = False) -> dict[str, Any]:
    gvk = {"group": res.group, "version": res.version, "kind": res.kind}
    stem = res.kind + ("" if item else "List")
    ok = {"200": {"description": "OK", "content": _content(schema)}}

    def op(action: str, verb: str, params: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"operationId": f"{verb}{stem}", "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk, "parameters": params, **extra}

    ops: dict[str, Any] = {}
    if not item:
        list_ok = {"200": {"description": "OK", "content": _content(schema + "List")}} \
            if schema + "List" in definitions() else ok
        if "list" in res.verbs:
            ops["get"] = op("list", "list", _LIST_PARAMS, responses=list_ok)
        if "create" in res.verbs and not all_namespaces:
            ops["post"] = op("post", "create", _WRITE_PARAMS, requestBody={"content": _content(schema)},
                             responses={**ok, "201": {"description": "Created", "content": _content(schema)}})
        return ops
    if "get" in res.verbs:
        ops["get"] = op("get", "read", [], responses=ok)
    if "update" in res.verbs:
        ops["put"] = op("put", "replace", _WRITE_PARAMS, requestBody={"content": _content(schema)}, responses=ok)
    if "patch" in res.verbs:
        patch_types = ("application/apply-patch+yaml", "application/json-patch+json",
                       "application/merge-patch+json", "application/strategic-merge-patch+json")
        ops["patch"] = op("patch", "patch", _WRITE_PARAMS + [_param("force", "query", "Force an apply.")],
                          requestBody={"content": _content(META + "Patch", patch_types)}, responses=ok)
    if "delete" in res.verbs:
        ops["delete"] = op("delete", "delete", [_param("dryRun", "query", "dryRun"),
                                                _param("propagationPolicy", "query", "propagationPolicy")],
                           responses={"200": {"description": "OK", "content": _content(META + "Status")}})
    return ops


@functools.cache
def document(group_version: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of 'api/v1' or 'apis/<group>/<version>'."""
    served = group_versions().get(group_version)
    if served is None:
        return None
    paths: dict[str, Any] = {}
    wanted = {META + "Status", META + "Patch", META + "DeleteOptions"}
    schemas: dict[str, Any] = {}
    for res in served:
        name = definition_name(res)
        if name is None:  # a kind Kubernetes does not ship (Karpenter's): any object
            name = f"sim.{res.group or 'core'}.{res.version}.{res.kind}"
            schemas[name] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                             "x-kubernetes-group-version-kind": [
                                 {"group": res.group, "version": res.version, "kind": res.kind}]}
        else:
            wanted.add(name)
            if name + "List" in definitions():
                wanted.add(name + "List")
        base = "/" + group_version
        path_params = [_param("name", "path", "name of the " + res.kind)]
        if res.namespaced:
            ns = [_param("namespace", "path", "object name and auth scope")]
            paths[f"{base}/namespaces/{{namespace}}/{res.plural}"] = {
                "parameters": ns, **_operations(res, name, item=False)}
            paths[f"{base}/namespaces/{{namespace}}/{res.plural}/{{name}}"] = {
                "parameters": ns + path_params, **_operations(res, name, item=True)}
            if "list" in res.verbs:
                paths[f"{base}/{res.plural}"] = _operations(res, name, item=False, all_namespaces=True)
        else:
            paths[f"{base}/{res.plural}"] = _operations(res, name, item=False)
            if "get" in res.verbs:
                paths[f"{base}/{res.plural}/{{name}}"] = {"parameters": path_params,
                                                          **_operations(res, name, item=True)}
    closure: set[str] = set(wanted)
    for name in wanted:
        _refs(definitions().get(name), closure)
    for name in sorted(closure):
        if name in definitions():
            schemas[name] = _to_v3(definitions()[name])
    schemas.setdefault(META + "Patch", {"type": "object", "description": "A patch body, in the content type's format."})
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.4-sweeper-sim"},
            "paths": paths, "components": {"schemas": schemas}}


@functools.cache
def _digest(group_version: str) -> str:
    return hashlib.sha512(json.dumps(document(group_version), sort_keys=True).encode()).hexdigest().upper()


def discovery() -> dict[str, Any]:
    """`/openapi/v3`: each group-version and the URL of its document, the hash making it cacheable."""
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={_digest(gv)}"}
                      for gv in group_versions()}}


# -- strict field validation ---------------------------------------------------------------------
def _resolve(schema: Any) -> Any:
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith(_REF):
        schema = definitions().get(schema["$ref"][len(_REF):])
    return schema


def _unknown(value: Any, schema: Any, path: str, out: list[str]) -> None:
    schema = _resolve(schema)
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if isinstance(props, dict) and key in props:
                _unknown(item, props[key], where, out)
            elif isinstance(extra, dict):
                _unknown(item, extra, where, out)
            elif isinstance(props, dict) and extra is None:
                out.append(where)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _unknown(item, schema["items"], f"{path}[{i}]", out)


def unknown_fields(res: Resource, obj: Any) -> list[str]:
    """The fields of an object (or of a patch's object) that its kind does not have, as dotted paths.
    Patch directives (`$patch`, `$setElementOrder/...`) are not fields."""
    name = definition_name(res)
    if name is None:
        return []
    out: list[str] = []
    _unknown(_without_directives(obj), definitions()[name], "", out)
    return out


def _without_directives(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_directives(v) for k, v in node.items() if not k.startswith("$")}
    if isinstance(node, list):
        return [_without_directives(x) for x in node]
    return node


def check_fields(res: Resource, obj: Any, mode: str | None) -> None:
    """fieldValidation=Strict: a 400 naming the unknown fields. Ignore and Warn store the object as
    sent (a simplification: Warn sends no Warning header)."""
    if mode is None or mode == "Ignore" or mode == "Warn":
        return
    if mode != "Strict":
        raise bad_request(f'fieldValidation must be one of "Ignore", "Warn" or "Strict", not {mode!r}')
    unknown = unknown_fields(res, obj)
    if unknown:
        listed = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: '
                          f"strict decoding error: {listed}")
