"""RBAC for the simulated API server: a request's attributes (API group, resource and
subresource, verb, namespace) and whether a set of Role and ClusterRole rules allows it.
Requests that carry a service account's token are authorized; others are the admin's."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<rest>.+)$")

Rule = tuple[str | None, dict[str, Any]]  # (namespace of a Role, or None for a ClusterRole; the rule)

# A request with no service account's token is the cluster's admin.
ADMIN_RULES: list[Rule] = [(None, {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]})]
# Every authenticated user may ask what it may do, and read the discovery and health paths: the
# system:basic-user, system:discovery and system:public-info-viewer ClusterRoles
# (https://kubernetes.io/docs/reference/access-authn-authz/rbac/#default-roles-and-role-bindings).
REVIEWS = ("selfsubjectrulesreviews", "selfsubjectaccessreviews")
BASIC_USER = {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"], "resources": list(REVIEWS)}
PUBLIC_PATHS = {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                                                      "/openapi", "/openapi/*", "/readyz", "/version", "/version/"]}


def attributes(method: str, path: str) -> tuple[str, str, str, str | None] | None:
    """(api group, resource[/subresource], verb, namespace); None for a non-resource path."""
    m = _PATH.match(path)
    if not m:
        return None
    parts = [unquote(p) for p in m.group("rest").split("/")]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else None
    sub = parts[2] if len(parts) > 2 else None
    verb = ("get" if name else "list") if method == "GET" else VERBS.get(method, method.lower())
    if method == "DELETE" and not name:
        verb = "deletecollection"
    ns = m.group("ns")
    return unquote(m.group("group") or ""), resource + (f"/{sub}" if sub else ""), verb, \
        unquote(ns) if ns is not None else None


def object_name(path: str) -> str | None:
    """The name of the object a request addresses; None for a list or a create."""
    m = _PATH.match(path)
    parts = [unquote(p) for p in m.group("rest").split("/")] if m else []
    return parts[1] if len(parts) > 1 else None


def rule_covers(rule: dict[str, Any], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    """A rule with resourceNames covers only requests that name one of them, so never a list or
    a create (https://kubernetes.io/docs/reference/access-authn-authz/rbac/#referring-to-resources)."""
    def has(values: list[str], x: str) -> bool:
        return "*" in values or x in values
    names = rule.get("resourceNames") or []
    return has(rule.get("apiGroups") or [], group) and has(rule.get("resources") or [], resource) \
        and has(rule.get("verbs") or [], verb) and (not names or name in names)


def allowed(rules: list[Rule], group: str, resource: str, verb: str, namespace: str | None,
            name: str | None = None) -> int | None:
    """The index of the first rule allowing the request (Roles before the ClusterRole), or None."""
    order = sorted(range(len(rules)), key=lambda i: rules[i][0] is None)
    for i in order:
        ns, rule = rules[i]
        if (ns is None or ns == namespace) and rule_covers(rule, group, resource, verb, name):
            return i
    return None


def rules_review(rules: list[Rule], namespace: str | None) -> dict[str, Any]:
    """The status of a SelfSubjectRulesReview (`kubectl auth can-i --list`): the rules that apply in
    the namespace, ClusterRoles' everywhere."""
    resource_rules = []
    for ns, rule in rules:
        if ns is None or ns == namespace:
            entry = {k: list(rule.get(k) or []) for k in ("verbs", "apiGroups", "resources")}
            if rule.get("resourceNames"):
                entry["resourceNames"] = list(rule["resourceNames"])
            resource_rules.append(entry)
    if rules is ADMIN_RULES:
        return {"resourceRules": resource_rules, "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                "incomplete": False}
    return {"resourceRules": [BASIC_USER, *resource_rules], "nonResourceRules": [PUBLIC_PATHS], "incomplete": False}


def access_review(rules: list[Rule], spec: dict[str, Any]) -> dict[str, Any]:
    """The status of a SelfSubjectAccessReview (`kubectl auth can-i VERB RESOURCE`)."""
    attrs = spec.get("resourceAttributes")
    if attrs is None:
        return {"allowed": True}  # the simulator serves every non-resource path to everyone
    resource = attrs.get("resource", "") + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
    group, verb, ns = attrs.get("group", ""), attrs.get("verb", ""), attrs.get("namespace") or None
    if resource in REVIEWS and verb == "create" and group == "authorization.k8s.io":
        return {"allowed": True, "reason": "system:basic-user"}
    found = allowed(rules, group, resource, verb, ns, attrs.get("name") or None)
    if found is None:
        return {"allowed": False}
    return {"allowed": True, "reason": "RBAC: allowed by " + ("a ClusterRole" if rules[found][0] is None
                                                                else f'a Role in "{rules[found][0]}"')}


def rules_from_manifests(docs: list[dict[str, Any]], account: str, namespace: str) -> list[Rule]:
    """The rules bound to a service account by the Roles, ClusterRoles and bindings of a manifest."""
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d for d in docs
             if d.get("kind") in ("Role", "ClusterRole")}
    out: list[Rule] = []
    for b in docs:
        if b.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   and s.get("namespace") == namespace for s in b.get("subjects") or []):
            continue
        ref = b["roleRef"]
        bns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        role = roles.get((ref["kind"], ref["name"], bns if ref["kind"] == "Role" else None))
        if role is None:
            continue
        scope = bns if b["kind"] == "RoleBinding" else None
        out += [(scope, r) for r in role.get("rules") or []]
    return out
