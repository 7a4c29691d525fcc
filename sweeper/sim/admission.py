"""ValidatingAdmissionPolicy for the simulated API server: the policies and their Deny bindings of a
manifest, evaluated as the apiserver does, with a real CEL implementation (cel-python, `celpy`).

Per request: a policy applies when a resourceRule matches (group, version, resource, operation)
and every matchCondition is true; then each validation is evaluated, and the first false one, or
one that cannot be evaluated (failurePolicy Fail), denies. Only Deny bindings without matchResources
or paramRef are taken; `variables`, `messageExpression` and the Kubernetes CEL libraries are not
(a policy that uses them is refused at load, not half-evaluated).
https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

REFUSED_FIELDS = ("variables", "paramKind", "auditAnnotations")
REASON_CODES = {"Forbidden": 403, "Invalid": 422, "Unauthorized": 401, "RequestEntityTooLarge": 413}


class UnsupportedPolicy(ValueError):
    """A policy that uses what this evaluator does not implement."""


@dataclass(frozen=True)
class Denial:
    code: int
    reason: str
    message: str


def _matches(values: list[str], x: str) -> bool:
    return "*" in values or x in values


class Policies:
    """The ValidatingAdmissionPolicies of a manifest that a Deny binding enforces."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        import celpy  # the CEL implementation: only needed where policies are enforced

        self._celpy = celpy
        self._env = celpy.Environment()
        policies = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ValidatingAdmissionPolicy"}
        self.enforced: list[tuple[str, dict[str, Any], list[tuple[Any, dict[str, Any]]],
                                  list[tuple[Any, dict[str, Any]]]]] = []
        for b in docs:
            if b.get("kind") != "ValidatingAdmissionPolicyBinding" or "Deny" not in b["spec"].get("validationActions", []):
                continue
            if b["spec"].get("matchResources") or b["spec"].get("paramRef"):
                raise UnsupportedPolicy(f"binding {b['metadata']['name']}: matchResources and paramRef are not simulated")
            policy = policies[b["spec"]["policyName"]]
            spec = policy["spec"]
            for f in REFUSED_FIELDS:
                if spec.get(f):
                    raise UnsupportedPolicy(f"policy {policy['metadata']['name']}: {f} is not simulated")
            conditions = [(self._program(c["expression"]), c) for c in spec.get("matchConditions") or []]
            validations = [(self._program(v["expression"]), v) for v in spec.get("validations") or []]
            if any("messageExpression" in v for _, v in validations):
                raise UnsupportedPolicy(f"policy {policy['metadata']['name']}: messageExpression is not simulated")
            self.enforced.append((b["metadata"]["name"], policy, conditions, validations))

    def _program(self, expression: str) -> Any:
        return self._env.program(self._env.compile(expression))

    def review(self, operation: str, group: str, version: str, resource: str, namespace: str | None, name: str,
               username: str, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> Denial | None:
        """The denial of the first policy that refuses the request, or None."""
        request = {"operation": operation, "namespace": namespace or "", "name": name,
                   "userInfo": {"username": username},
                   "resource": {"group": group, "version": version, "resource": resource.split("/")[0]},
                   "subResource": resource.split("/")[1] if "/" in resource else ""}
        activation = {"object": self._celpy.json_to_cel(copy.deepcopy(obj)),
                      "oldObject": self._celpy.json_to_cel(copy.deepcopy(old)),
                      "request": self._celpy.json_to_cel(request)}
        for binding, policy, conditions, validations in self.enforced:
            if not self._applies(policy, group, version, resource, operation):
                continue
            try:
                if not all(bool(p.evaluate(activation)) for p, _ in conditions):
                    continue
            except self._celpy.CELEvalError as exc:
                return self._deny(policy, binding, "Invalid", f"matchCondition error: {exc}", name, group, resource)
            for program, v in validations:
                try:
                    result = program.evaluate(activation)
                except self._celpy.CELEvalError as exc:  # failurePolicy Fail
                    return self._deny(policy, binding, "Invalid", f"expression '{v['expression']}' resulted in "
                                      f"error: {exc}", name, group, resource)
                if not isinstance(result, self._celpy.celtypes.BoolType) or not bool(result):
                    msg = v.get("message") or f"failed expression: {v['expression']}"
                    return self._deny(policy, binding, v.get("reason", "Invalid"), msg, name, group, resource)
        return None

    @staticmethod
    def _applies(policy: dict[str, Any], group: str, version: str, resource: str, operation: str) -> bool:
        for rule in policy["spec"]["matchConstraints"].get("resourceRules") or []:
            if (_matches(rule.get("apiGroups") or [], group) and _matches(rule.get("apiVersions") or [], version)
                    and _matches(rule.get("resources") or [], resource)
                    and _matches(rule.get("operations") or [], operation)):
                return True
        return False

    @staticmethod
    def _deny(policy: dict[str, Any], binding: str, reason: str, message: str, name: str, group: str,
              resource: str) -> Denial:
        res = resource.split("/")[0] + (f".{group}" if group else "")
        return Denial(REASON_CODES.get(reason, 422), reason,
                      f'{res} "{name}" is forbidden: ValidatingAdmissionPolicy \'{policy["metadata"]["name"]}\' '
                      f"with binding '{binding}' denied request: {message}")
