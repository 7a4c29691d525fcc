"""What taking terminal escapes off costs `sweeper ingest`: a kernel log of `--mib` MiB as
`dmesg --color=always` prints it (SGR colour around the stamp and the facility), streamed through
`ingest_stream` as `sweeper ingest NODE FILE` streams it, against the same log without colour; and
`strip_escapes` alone on the coloured text.

    python -m benchmarks.escapes [--mib 64] [--repeat 3]

The median of `--repeat` runs is printed, with the fastest in brackets."""

from __future__ import annotations

import argparse
import io
import statistics
import time

from sweeper.ingest import ingest_stream
from sweeper.parsers.paste import strip_escapes

COLOURED = ("\x1b[32m[{n:12.6f}]\x1b[0m \x1b[33mNVRM: \x1b[0mXid (PCI:0000:18:00): 13, pid=1, name=python, "
            "Graphics Exception: ESR 0x514730=0x1000f\n")


def timed(fn, repeat: int) -> str:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return f"{statistics.median(times):6.2f} s  (fastest {min(times):.2f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    lines, size, n = [], 0, 0
    while size < args.mib * 2**20:
        line = COLOURED.format(n=1000 + n * 0.001)
        lines.append(line)
        size, n = size + len(line), n + 1
    coloured = "".join(lines)
    plain = strip_escapes(coloured)
    cb, pb = coloured.encode(), plain.encode()
    print(f"{len(cb) / 2**20:.0f} MiB coloured ({n} lines), {len(pb) / 2**20:.0f} MiB without colour")
    print("strip_escapes, coloured          ", timed(lambda: strip_escapes(coloured), args.repeat))
    print("strip_escapes, no escape in it   ", timed(lambda: strip_escapes(plain), args.repeat))
    print("ingest kernel-log, coloured      ", timed(lambda: ingest_stream(io.BytesIO(cb), "n", "kernel-log", 0.0),
                                                     args.repeat))
    print("ingest kernel-log, without colour", timed(lambda: ingest_stream(io.BytesIO(pb), "n", "kernel-log", 0.0),
                                                     args.repeat))


if __name__ == "__main__":
    main()
