"""The `kubernetes` package imported without kubernetes-validate. Importing `kubernetes` imports its
dynamic client, which imports kubernetes-validate and its jsonschema when they are installed (for
`DynamicClient.validate`), about a fifth of the client's import: Sweeper installs them for
`sweeper lint` and never uses the dynamic client, so a sweep, `plan` or `nodes` need not load them.
Imported first by `sweeper.kube`, the only importer of the client; kubernetes-validate itself stays
importable afterwards (the dynamic client only notes that it was missing)."""

from __future__ import annotations

import sys


def import_kubernetes() -> None:
    if "kubernetes" in sys.modules or "kubernetes_validate" in sys.modules:
        return
    hidden = ("kubernetes_validate", "kubernetes_validate.utils")
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import of a None entry is an ImportError
    try:
        import kubernetes  # noqa: F401
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


import_kubernetes()
