"""Reading a YAML file of Sweeper's: without aliases (`NoAliasLoader`), with its node tree kept for
line numbers (`read_yaml`, `locate`), and its problems raised together (`ConfigProblems`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import ConfigError

# -- YAML without aliases ------------------------------------------------------------------
_NO_ALIASES_WORDS = "YAML aliases (*name) are not allowed"


class NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases (`*name`): a few hundred bytes of nested aliases
    ("billion laughs") expand to gigabytes once anything walks the data, and no file Sweeper
    reads needs them."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, _NO_ALIASES_WORDS, event.start_mark)
        return super().compose_node(parent, index)  # type: ignore[no-any-return]


# libyaml's loader, where PyYAML was built with it: the same safe constructor over a parser in C,
# about ten times faster than the pure-Python one (a rendered Job is parsed on every check, and the
# admission policy's generator parses every template on every platform). Its composer is C code
# that a subclass cannot hook, so aliases are refused by a pass over the parser's events first,
# made only when the text holds a `*` at all.
_CLOADER: Any = getattr(yaml, "CSafeLoader", None)
def _refuse_aliases(text: str) -> None:
    if "*" not in text:
        return
    for event in yaml.parse(text, Loader=_CLOADER):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, _NO_ALIASES_WORDS, event.start_mark)  # type: ignore[arg-type]


def safe_load(text: str) -> Any:
    """One YAML document, as `yaml.safe_load` reads it, but refusing aliases."""
    if _CLOADER is not None and isinstance(text, str):
        _refuse_aliases(text)
        return yaml.load(text, Loader=_CLOADER)  # noqa: S506 - libyaml's SafeLoader
    return yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def safe_load_all(text: str) -> list[Any]:
    """Every YAML document of `text`, refusing aliases."""
    if _CLOADER is not None and isinstance(text, str):
        _refuse_aliases(text)
        return list(yaml.load_all(text, Loader=_CLOADER))  # noqa: S506 - libyaml's SafeLoader
    return list(yaml.load_all(text, Loader=NoAliasLoader))  # noqa: S506 - a SafeLoader subclass


def own_load_all(text: str) -> list[Any]:
    """Every YAML document of a file Sweeper wrote itself (deploy/), as `yaml.safe_load_all` reads it,
    aliases included (`yaml.safe_dump` writes one for a value shared in the data), with libyaml where
    present: the manifests' generator reads its own output again for each overlay."""
    return list(yaml.load_all(text, Loader=_CLOADER or yaml.SafeLoader))  # noqa: S506 - a SafeLoader


class ConfigProblems(ConfigError):
    """A file with one or more problems; `problems` holds each as `file:line: key: ...`."""

    def __init__(self, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more problem(s); `sweeper lint` lists each)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)
        self.problems = problems


# -- reading a file with line marks -----------------------------------------------------
class Marks:
    """A file's node tree, for the line a problem is on: composed by PyYAML's pure-Python composer on
    first use, which only a problem needs (about ten times the cost of libyaml's load, and a sweep
    reads a dozen profile files)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._node: yaml.Node | None = None
        self._composed = False

    @property
    def node(self) -> yaml.Node | None:
        if not self._composed:
            self._composed = True
            try:
                self._node = yaml.compose(self._text, Loader=NoAliasLoader)
            except (yaml.YAMLError, RecursionError):
                self._node = None  # the data loaded, so this is not reached in practice; line 1 then
        return self._node


NodeRef = yaml.Node | Marks | None


def read_yaml(path: Path, what: str) -> tuple[Any, Marks]:
    """The file's data and its node tree (for line numbers), composed when a problem asks."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    try:
        try:
            data = safe_load(text)
        except (yaml.YAMLError, RecursionError):
            # Told in the words and at the line of PyYAML's own parser, as `sweeper lint` has always told it.
            data = yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigProblems([f"{path}:{mark.line + 1 if mark else 1}: YAML syntax error: {exc.problem}"]) from exc
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigProblems([f"{path}:1: not readable as YAML: {type(exc).__name__}"]) from exc
    return data, Marks(text)


def locate(ref: NodeRef, loc: tuple[Any, ...]) -> tuple[int, yaml.Node | None]:
    """The 1-based line of the deepest key of `loc` present in the YAML, and the node there."""
    node = ref.node if isinstance(ref, Marks) else ref
    if node is None:
        return 1, None
    line = node.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            # the last of repeated keys, as PyYAML keeps the last value
            hit = next(((k, v) for k, v in reversed(node.value) if str(getattr(k, "value", "")) == str(part)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return line + 1, node
