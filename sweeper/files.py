"""Files Sweeper writes for people (report pages, evidence bundles, manifests): written whole or not
at all, and never through a link someone else planted where the file goes.

A plain `open(path, "w")` follows a symlink at `path` and writes to its target: in a shared
output directory, whoever can create a link there chooses what Sweeper overwrites. Here the data goes
to a new temporary file beside `path` (created exclusively under a random name), and then
`os.replace` puts it in place: a rename replaces the link itself and never follows it
(https://docs.python.org/3/library/os.html#os.replace; rename(2): "If newpath is an existing
symbolic link, it will be overwritten"). A failure part way leaves the old file as it was."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, overwrite: bool = True,
                 mode: int = 0o644) -> Path:
    """Write `data` (text as UTF-8) at `path` through a temporary file in the same directory.
    `overwrite=False`: an existing `path` (a link too, even a dangling one) raises FileExistsError
    and is left alone; the file is put in place by a hard link, which never replaces anything."""
    import tempfile  # here: a command that writes no file does not import it

    target = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp's is 0600
        if overwrite:
            os.replace(tmp, target)
        else:
            _link_new(tmp, target, raw, mode)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target


def _link_new(tmp: str, target: Path, raw: bytes, mode: int) -> None:
    """`tmp` at `target`, which must not exist. A file system without hard links gets an exclusive
    create instead (O_EXCL fails on any existing name, a link included)."""
    try:
        os.link(tmp, target, follow_symlinks=False)
        return
    except FileExistsError:
        raise
    except OSError:
        pass
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
