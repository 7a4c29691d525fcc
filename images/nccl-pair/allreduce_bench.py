"""A two-node all-reduce benchmark for Sweeper's pair sweeps, launched by torchrun on both pods.

Rank 0 prints a table in the shape nccl-tests' all_reduce_perf prints (the header, one `# Rank`
line per rank, the size/count/type/redop/root/time/algbw/busbw/#wrong columns out-of-place and
in-place, the out-of-bounds and average footer), so that one reader serves both. Bus bandwidth is
nccl-tests' definition for all-reduce, algbw * 2 * (n - 1) / n
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md). Correctness: every rank
fills its buffer with known values and checks the sum; elements that differ are #wrong.

torch.distributed's all_reduce works in place only, so the out-of-place column times a device copy
and then the all-reduce: its bandwidth is below what nccl-tests' out-of-place prints for the same
links, and the reader takes the larger column. With one rank (a single GPU, as in a smoke test)
nothing crosses a link and in place is a no-op; the reader judges no floor on such a table.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_of(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def timed(fn: object, iters: int) -> float:
    """Microseconds per call, on the GPU's own clock."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()  # type: ignore[operator]
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def wrong_values(buf: torch.Tensor, world: int) -> int:
    """Fill with rank + 1, sum across ranks, count elements that are not world * (world + 1) / 2."""
    buf.fill_(float(dist.get_rank() + 1))
    dist.all_reduce(buf)
    expected = world * (world + 1) / 2
    bad = torch.count_nonzero(buf != expected).to(torch.int64)
    dist.all_reduce(bad)
    return int(bad.item())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--min-bytes", default="8")
    parser.add_argument("--max-bytes", default="8G")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    # Under mpirun (the MPIJob form) Open MPI names the ranks; torchrun's names are what
    # init_process_group reads (MASTER_ADDR and MASTER_PORT come with mpirun's -x).
    for ours, ompi in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                       ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")):
        if ours not in os.environ and ompi in os.environ:
            os.environ[ours] = os.environ[ompi]
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    lo, hi = size_of(args.min_bytes), size_of(args.max_bytes)
    props = torch.cuda.get_device_properties(local)
    me = (rank, os.getpid(), socket.gethostname(), local, f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:"
          f"{props.pci_device_id:02x}", props.name)
    ranks: list[object] = [None] * world
    dist.all_gather_object(ranks, me)
    out = sys.stdout if rank == 0 else open(os.devnull, "w")  # noqa: SIM115
    print(f"# nThread 1 nGpus 1 minBytes {lo} maxBytes {hi} step: 2(factor) warmup iters: {args.warmup} "
          f"iters: {args.iters} agg iters: 1 validation: 1 graph: 0", file=out)
    print("#\n# Using devices", file=out)
    for r, pid, host, dev, bus, name in ranks:  # type: ignore[misc]
        print(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10} device {dev:2d} [{bus}] {name}", file=out)
    print("#\n#                                                              out-of-place                       "
          "in-place\n#       size         count      type   redop    root     time   algbw   busbw  #wrong     "
          "time   algbw   busbw  #wrong\n#        (B)    (elements)                               (us)  (GB/s)  "
          "(GB/s)             (us)  (GB/s)  (GB/s)", file=out, flush=True)
    factor = 2 * (world - 1) / world
    total_wrong, busbws = 0, []
    size = lo
    while size <= hi:
        count = max(1, size // 4)
        send = torch.ones(count, dtype=torch.float32, device="cuda")
        recv = torch.empty_like(send)
        cells = []
        for in_place in (False, True):
            def step(in_place: bool = in_place, send: torch.Tensor = send, recv: torch.Tensor = recv) -> None:
                if in_place:
                    dist.all_reduce(send)
                else:
                    recv.copy_(send)
                    dist.all_reduce(recv)
            timed(step, args.warmup)
            us = timed(step, args.iters)
            algbw = count * 4 / us / 1e3  # GB/s
            wrong = wrong_values(send if in_place else recv, world)
            total_wrong += wrong
            busbws.append(algbw * factor)
            cells.append(f"{us:8.2f}  {algbw:6.2f}  {algbw * factor:6.2f}  {wrong:6d}")
        print(f"{count * 4:12d}  {count:12d}     float     sum      -1  {cells[0]}  {cells[1]}", file=out, flush=True)
        del send, recv
        size *= 2
    print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}", file=out)
    print(f"# Avg bus bandwidth    : {sum(busbws) / max(1, len(busbws)):g}\n#", file=out, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # NCCL's and CUDA's own words, for the pair reader
        print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
