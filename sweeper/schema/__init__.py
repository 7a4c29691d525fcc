"""One description of a YAML file's keys (type, range, unit, help) that drives its loader, its
`file:line: key: what is wrong; allowed: ...` messages, `sweeper lint` and docs/configuration.md.

The keys are declared once, on the frozen dataclass the rest of the code uses, with `setting()`.
A pydantic v2 model is derived from that declaration to check a file. pydantic rather than
msgspec: pydantic reports every problem of a file in one pass (msgspec stops at the first), each
with a structured location (`loc`) that maps onto the YAML line of the key; it has per-field
range constraints, strict scalars (so `"4"` is not an integer) and `extra="forbid"` for unknown
keys. The runtime objects stay plain dataclasses, so `dataclasses.replace` and attribute access
are unchanged and cost nothing.

The package: `declaration` (the keys, and the model derived from them), `yamlfile` (reading a
file without aliases, with its lines) and `messages` (checking it, its problems in words, and the
table in docs/configuration.md).
"""

from __future__ import annotations

from sweeper.schema.declaration import (
    DURATION_WORDS,
    Deferred,
    Spec,
    duration_type,
    model_of,
    runtime_values,
    setting,
    spec_of,
    to_seconds,
)
from sweeper.schema.messages import allowed_words, check, human_seconds, problems_of, reference_table
from sweeper.schema.yamlfile import (
    ConfigProblems,
    Marks,
    NoAliasLoader,
    NodeRef,
    locate,
    own_load_all,
    read_yaml,
    safe_load,
    safe_load_all,
)

__all__ = ["DURATION_WORDS", "ConfigProblems", "Deferred", "Marks", "NoAliasLoader", "NodeRef", "Spec",
           "allowed_words", "check", "duration_type", "human_seconds", "locate", "model_of", "own_load_all",
           "problems_of", "read_yaml", "reference_table", "runtime_values", "safe_load", "safe_load_all", "setting",
           "spec_of", "to_seconds"]
