"""Where the shipped playbooks, job templates, profiles and policies are: $SWEEPER_HOME when set,
else the copy an installed wheel carries inside the package (sweeper/_bundled, put there by the
build), else the source tree an editable install runs from."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

# The folders at the repository's root that the build copies into the package.
BUNDLED = ("playbooks", "job-templates", "profiles", "policies")


def home() -> Path:
    env = os.environ.get("SWEEPER_HOME")
    if env:
        return Path(env)
    package = Path(str(files("sweeper")))
    bundled = package / "_bundled"
    return bundled if bundled.is_dir() else package.parent
