"""kubernetes-validate, with each schema file read once a process: its `validate` opens and parses
the kind's schema and the version's definitions (megabytes of JSON) on every call, some 20 ms, and
the suite validates hundreds of objects. The files do not change while the suite runs, and the
validator only reads what they hold."""

from __future__ import annotations

import functools
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils as _utils

if not hasattr(_utils.schema_contents, "cache_info"):
    _utils.schema_contents = functools.lru_cache(maxsize=32)(_utils.schema_contents)


def validate(data: dict[str, Any], version: str, strict: bool = True) -> str:
    """kubernetes_validate.validate (strict: no field the schema does not name)."""
    return kubernetes_validate.validate(data, version, strict=strict)
