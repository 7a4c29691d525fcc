"""YAML loading that remembers where each mapping came from, and refuses duplicate keys."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import PlaybookError
from sweeper.memo import Recent
from sweeper.schema import NoAliasLoader


class Located(dict):  # type: ignore[type-arg]
    """A mapping that knows its file, line and column, and the line of each key."""

    file: str = ""
    line: int = 0
    col: int = 0
    key_lines: dict[str, int]

    def where(self, key: str | None = None) -> str:
        line = self.key_lines.get(key, self.line) if key is not None else self.line
        return f"{self.file}:{line}"


def _loader(origin: str) -> type[yaml.SafeLoader]:
    class Loader(NoAliasLoader):  # a playbook's aliases could expand its vars to gigabytes
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Located:
        loader.flatten_mapping(node)
        out = Located()
        out.file, out.line, out.col = origin, node.start_mark.line + 1, node.start_mark.column + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in out:
                raise PlaybookError(f"{origin}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1}: "
                                    f"duplicate key {key!r} (first at line {out.key_lines[key]})")
            out[key] = loader.construct_object(value_node, deep=True)
            out.key_lines[key] = key_node.start_mark.line + 1
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)  # type: ignore[arg-type]
    return Loader


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlaybookError(f"{path}: cannot read: {exc}") from exc
    return parse_yaml(text, str(path))


# Parsed playbooks by (origin, text): a sweep loads each of its playbooks (and `sweeper serve` each run
# again) through PyYAML's pure-Python composer, which the line marks need, at some 30 ms a file. The text
# is the key, so an edited file is parsed anew; each caller gets its own deep copy.
_PARSED = Recent(64)


def parse_yaml(text: str, origin: str) -> Any:
    key = (origin, text)
    hit = _PARSED.get(key)
    if hit is None:
        hit = _parse_yaml(text, origin)
        _PARSED.put(key, hit)
    return copy.deepcopy(hit)


def _parse_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.load(text, Loader=_loader(origin))  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark else origin
        raise PlaybookError(f"{loc}: YAML syntax error: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise PlaybookError(f"{origin}: YAML error: {exc}") from exc


def where(obj: Any, key: str | None = None, fallback: str = "") -> str:
    return obj.where(key) if isinstance(obj, Located) else fallback
