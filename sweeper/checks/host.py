"""What the node-local checks read besides NVML: sysfs files, commands, the environment.

`RealHost` reads the machine the check runs on (under a root, so a check Job can mount the
host's /sys elsewhere); `checks.fake.FakeHost` answers from a table for tests and the
simulated kubelet. Missing is not the same as unreadable: `read` returns None for a file that
does not exist and raises OSError for one that cannot be read. The check Job mounts no host root
and has no CAP_SYS_CHROOT, so every program `run` starts is the check image's own (journalctl reads
the host's journal files through `--root`); nothing runs with the host's libraries."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Protocol


class Host(Protocol):
    def read(self, path: str) -> str | None: ...

    def listdir(self, path: str) -> list[str] | None: ...

    def exists(self, path: str) -> bool: ...

    def resolve(self, path: str) -> str:
        """The path as the check process can open or run it."""
        ...

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); raises FileNotFoundError when the program is missing.
        `env` adds to the environment."""
        ...

    def env(self) -> dict[str, str]: ...

    def machine(self) -> str: ...

    def boot_id(self) -> str | None:
        """The running kernel's boot ID (32 hex digits), or None where it cannot be read."""
        ...


# The kernel's boot ID, not namespaced: a pod reads its host's (https://docs.kernel.org/admin-guide/sysctl/kernel.html#random).
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Where journald keeps its files, persistent then volatile; `journalctl --root=R` searches these under R.
# https://www.freedesktop.org/software/systemd/man/latest/systemd-journald.service.html (FILES)
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")


class RealHost:
    def __init__(self, root: str = "/") -> None:
        self.root = Path(root)

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        try:
            return self._p(path).read_text(errors="replace")
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self._p(path)))
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return self._p(path).exists()

    def resolve(self, path: str) -> str:
        return str(self._p(path))

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                                  env={**os.environ, **env} if env else None)
        except subprocess.TimeoutExpired as exc:
            return 124, str(exc.stdout or ""), f"timed out after {timeout:g}s"
        return proc.returncode, proc.stdout, proc.stderr

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def machine(self) -> str:
        return platform.machine()

    def boot_id(self) -> str | None:
        try:
            raw = Path(BOOT_ID).read_text().strip().replace("-", "").lower()
        except OSError:
            return None
        return raw if len(raw) == 32 and all(ch in "0123456789abcdef" for ch in raw) else None
