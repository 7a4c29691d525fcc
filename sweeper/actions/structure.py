"""Cluster data cannot shape a Job. A template renders `node` and `partner` (a Node's labels,
annotations, taints, conditions, the driver it reports: text that the node's own kubelet or another
tool may write) as data; one that interpolates such a value bare (`{{ node.annotations['x'] }}`,
no `| tojson`) would let a newline or a quote in it add YAML of its own: a `command`, an `env`.

So every Job is rendered twice: once with the real values, once with each string of the cluster's
replaced by a placeholder of letters and digits, which no YAML reads as anything but a plain
scalar. Both must parse to the same tree: the same keys, the same list lengths, a mapping where
a mapping was and a list where a list was; a scalar may differ only where the placeholder sits in
it (a cluster value inside a string). Anything else is refused as an unsafe Job, before anything
reaches the cluster. A playbook's `vars` may carry cluster text too (`vars: {note: "{{
node.annotations.x }}"}`): each of their strings that is more than a plain word (letters, digits,
`.`, `_`, `/`, `=`, `+`, `-` and spaces, starting with a letter or digit, or a flag such as `--level=3`)
is replaced as well.

The check does not depend on the author's `tojson`: a value that arrives bare, concatenated or
filtered (`~`, `upper`, `replace`) is followed by its placeholder, and a value that changes what
the template does (a branch, a loop, a key taken from cluster data) makes the two renders differ.

A render that passed is remembered (CHECKED) for the same template text, variables and render
limits, and a rendered text's parse by the text (PARSED): the admission policy's generator and a
fleet's sweep ask for the same Jobs many times. A refusal is always worked out afresh.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from jinja2 import TemplateError, nodes

from sweeper.actions.safety import SWEEPER_VARS
from sweeper.errors import PlaybookError
from sweeper.memo import Recent
from sweeper.schema import safe_load_all
from sweeper.templating import ENV, JobTemplate, bounds, render_template

CLUSTER_VARS = ("node", "partner")  # the held node(s) as the cluster reports them
# ... except their profile: Sweeper's own file (profiles/), chosen by the node's labels, in which the
# cluster changes only counts (the NICs the node advertises); a template may branch on it (`nic`)
OWN_PARTS = frozenset({"profile"})
MARK = "zqsweepercluster"  # every placeholder starts with it: letters only, no YAML reads it as more
# a plain word, or a flag (`-q`, `--level=3`): YAML reads it as one plain scalar wherever it lands
_PLAIN = re.compile(r"(?:--?)?[A-Za-z0-9][A-Za-z0-9 ._/=+-]*\Z")


class _Placeholders:
    """Each distinct string gets its own placeholder (equal values stay equal), and each
    placeholder remembers the first variable path it stood for."""

    def __init__(self) -> None:
        self.by_value: dict[str, str] = {}
        self.paths: dict[str, str] = {}  # value -> first path

    def of(self, value: str, path: str) -> str:
        if value not in self.by_value:
            self.by_value[value] = f"{MARK}{len(self.by_value)}x"
            self.paths[value] = path
        return self.by_value[value]

    def replace(self, value: Any, path: str, every: bool) -> Any:
        """`value` with its strings replaced (every one, or only those that are more than a plain
        word); mapping keys stay (a template looks values up by them) and are Kubernetes' label and
        annotation keys, qualified names."""
        if isinstance(value, str):
            return self.of(value, path) if value and (every or not _PLAIN.match(value)) else value
        if isinstance(value, dict):
            return {k: v if path in CLUSTER_VARS and k in OWN_PARTS else self.replace(v, f"{path}[{k!r}]", every)
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.replace(v, f"{path}[{i}]", every) for i, v in enumerate(value)]
        return value


class _Unkeyed(Exception):
    """A value that is not plain data: its render is not remembered."""


def _key(value: Any) -> Any:
    """A hashable form of plain data (strings, numbers, booleans, None, lists, tuples, dicts) that
    two values share only when they render alike: types are kept (1, 1.0 and True differ) and so is
    the order of a mapping's keys. Anything else raises _Unkeyed (its repr may not say what it holds)."""
    if isinstance(value, str):
        return value
    if value is None or type(value) in (int, float, bool):
        return (type(value), value)
    if type(value) is dict:
        return ("d", tuple((_key(k), _key(v)) for k, v in value.items()))
    if type(value) in (list, tuple):
        return ("l" if type(value) is list else "t", tuple(_key(v) for v in value))
    raise _Unkeyed


def _checked_key(found: JobTemplate, variables: dict[str, Any]) -> Any:
    """What a checked render depends on: the template's text (its path only names it in errors), the
    variables and the render limits; None when the variables are not plain data."""
    try:
        return (found.name, found.text, found.shipped, bounds.LIMITS, id(ENV), _key(variables))
    except _Unkeyed:
        return None


# The Jobs that passed the check lately: a fleet's sweep, and the admission policy's generator (every
# template on every platform, profile and overlay), ask for the same render many times. Only a render
# that passed is kept, so a refusal is always worked out afresh.
CHECKED = Recent(1024)


def render_checked(found: JobTemplate, variables: dict[str, Any]) -> str:
    """The template rendered with the real variables, once its render with the cluster's strings
    replaced has the same shape; otherwise an unsafe Job (PlaybookError), refused as any other.
    A render that passed for the same template, variables and limits is not repeated (CHECKED)."""
    key = _checked_key(found, variables)
    known = None if key is None else CHECKED.get(key)
    if known is not None:
        return known
    real = _render_checked(found, variables)
    if key is not None:
        CHECKED.put(key, real)
    return real


def _render_checked(found: JobTemplate, variables: dict[str, Any]) -> str:
    real = render_template(found, variables)
    swapped, marks = neutral(variables)
    try:
        other = render_template(found, swapped)
    except PlaybookError as exc:
        raise PlaybookError(f"{found.path}: unsafe Job: the template {found.name} does not render with the cluster's "
                            f"values replaced by plain words ({exc}); cluster data may only fill a value, written "
                            "with | tojson (docs/security.md, Jobs a playbook cannot aim)") from None
    check_structure(found.path, found.name, real, other, marks)
    return real


def neutral(variables: dict[str, Any], sweeper_own: frozenset[str] = SWEEPER_VARS) -> tuple[dict[str, Any], _Placeholders]:
    """The variables with the cluster's strings replaced: every string of `node` and `partner`,
    and the non-plain strings of what a playbook passed (`vars`); Sweeper's own values stay."""
    marks = _Placeholders()
    out: dict[str, Any] = {}
    for key, value in variables.items():
        if key in CLUSTER_VARS:
            out[key] = marks.replace(value, key, every=True)
        elif key in sweeper_own:
            out[key] = value
        else:
            out[key] = marks.replace(value, key, every=False)
    return out, marks


def differences(real: Any, neutral_: Any, where: str = "") -> str:
    """The first place where the two renders differ in shape ('' when they do not)."""
    here = where or "the document"
    if isinstance(neutral_, dict) or isinstance(real, dict):
        if not (isinstance(neutral_, dict) and isinstance(real, dict)):
            return f"{here}: a mapping in one render and not in the other"
        if set(map(str, real)) != set(map(str, neutral_)):
            extra = sorted(set(map(str, real)) ^ set(map(str, neutral_)))
            return f"{here}: keys {extra[:4]} come from cluster data"
        neutral_keys = {str(k): v for k, v in neutral_.items()}
        for k, v in real.items():
            found = differences(v, neutral_keys[str(k)], f"{where}.{k}" if where else str(k))
            if found:
                return found
        return ""
    if isinstance(neutral_, list) or isinstance(real, list):
        if not (isinstance(neutral_, list) and isinstance(real, list)):
            return f"{here}: a list in one render and not in the other"
        if len(real) != len(neutral_):
            return f"{here}: {len(real)} items, {len(neutral_)} without the cluster's values"
        for i, (a, b) in enumerate(zip(real, neutral_, strict=True)):
            found = differences(a, b, f"{where}[{i}]")
            if found:
                return found
        return ""
    if real == neutral_ and type(real) is type(neutral_):
        return ""
    if isinstance(neutral_, str) and MARK in neutral_:
        return ""  # a cluster value inside one scalar: data, as it should be
    return f"{here}: a value that cluster data changed without standing in it"


# Rendered texts parsed lately, by text: the renders of one template differ in a name or a count far
# more often than in their text (the nodes of one profile, the platforms that share a runtime), and
# parsing costs many times what a copy does. Read-only here; load_rendered copies what it hands out.
PARSED = Recent(256)


def rendered_docs(text: str) -> list[Any]:
    """The documents of a rendered text but the empty ones (yaml.YAMLError when it is not YAML); the
    list is shared: copy before changing it."""
    docs = PARSED.get((text, True))
    if docs is None:
        docs = [d for d in safe_load_all(text) if d is not None]
        PARSED.put((text, True), docs)
    return docs  # type: ignore[no-any-return]


def check_structure(path: Path, template: str, real_text: str, neutral_text: str, marks: _Placeholders) -> None:
    """Refuse (PlaybookError, 'unsafe Job') when cluster data changed the rendered documents' shape."""
    try:
        real = rendered_docs(real_text)
    except yaml.YAMLError:
        real = None
    try:
        neutral_docs = rendered_docs(neutral_text)
    except yaml.YAMLError:
        neutral_docs = None
    if real is None and neutral_docs is None:
        return  # not YAML either way: the caller says so, with the line
    if real is None or neutral_docs is None:
        found = "YAML in one render and not in the other"
    elif len(real) != len(neutral_docs):
        found = f"{len(real)} documents, {len(neutral_docs)} without the cluster's values"
    else:
        found = next((d for d in (differences(a, b, "") for a, b in zip(real, neutral_docs, strict=True)) if d), "")
    if not found:
        return
    suspects = [p for v, p in marks.paths.items() if not _PLAIN.match(v) and _shows(v, real_text)][:3]
    named = (f"the value of {', '.join(suspects)}" if suspects else
             "a value of node, partner or the playbook's vars (a branch, loop or key on it)")
    raise PlaybookError(f"{path}: unsafe Job: the template {template} lets cluster data change the Job's structure "
                        f"({found}): {named}; cluster data may only fill a value, written with | tojson "
                        "(docs/security.md, Jobs a playbook cannot aim)")


def _shows(value: str, text: str) -> bool:
    """Whether the rendered text holds the value, or one of its lines (a filter may have changed the rest)."""
    return value in text or any(len(line.strip()) > 3 and line.strip() in text for line in value.splitlines())


def bare_cluster_values(text: str) -> list[tuple[int, str]]:
    """(line, expression) of each `{{ ... }}` that reads `node` or `partner` (beyond the profile, the
    GPU count and the name, which are Sweeper's or a DNS name) and does not end in `| tojson`: the
    render check refuses the Job if such a value ever carries YAML, so `sweeper lint` says it before."""
    try:
        tree = ENV.parse(text)
    except TemplateError:
        return []  # a syntax error is reported as such
    out: list[tuple[int, str]] = []
    for output in tree.find_all(nodes.Output):
        for expr in output.nodes:
            if isinstance(expr, nodes.TemplateData) or (isinstance(expr, nodes.Filter) and expr.name in _QUOTING):
                continue
            read = [_dotted(g) for g in expr.find_all(nodes.Getattr | nodes.Getitem)]  # type: ignore[arg-type]
            names = {n.name for n in expr.find_all(nodes.Name)}
            if isinstance(expr, nodes.Name | nodes.Getattr | nodes.Getitem):
                read.append(_dotted(expr))
            if names & set(CLUSTER_VARS) and not all(r.startswith(_HARMLESS) for r in read if r.split(".")[0] in CLUSTER_VARS):
                out.append((expr.lineno, max((r for r in read if r.split(".")[0] in CLUSTER_VARS), key=len, default="node")))
    return out


_QUOTING = ("tojson", "to_json")
_HARMLESS = tuple(f"{v}.{k}" for v in CLUSTER_VARS for k in ("profile", "gpus", "name"))


def _dotted(expr: Any) -> str:
    """`node.annotations.x` for node.annotations['x'] or node.annotations.x; '' for what is no path."""
    parts: list[str] = []
    while isinstance(expr, nodes.Getattr | nodes.Getitem):
        if isinstance(expr, nodes.Getattr):
            parts.append(expr.attr)
        else:
            parts.append(str(expr.arg.value) if isinstance(expr.arg, nodes.Const) else "?")
        expr = expr.node
    if isinstance(expr, nodes.Name):
        parts.append(expr.name)
        return ".".join(reversed(parts))
    return ""
