"""`sweeper ingest`: a tool's output parsed into the common result and recorded in the node's
history. Its own module, so that the parsers it names are imported only by it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from sweeper.cli import printer
from sweeper.cli.app import main
from sweeper.cli.options import (
    config_for,
    examples,
    history_at,
    kube_for,
    output_options,
    run_cli,
    shown,
    state_options,
)
from sweeper.errors import ConfigError
from sweeper.formats import FORMATS as READ_FORMATS
from sweeper.output import Out


@main.command("ingest", epilog=examples(
    "dcgmi diag -r 3 -j > diag.json; sweeper ingest gpu-p5-04 diag.json --exit-code $?",
    "dmesg | sweeper ingest gpu-p5-04 - --format kernel-log",
    "sweeper ingest gpu-p5-04 all_reduce.txt --format nccl --profile p5.48xlarge --no-record"))
@click.argument("node")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(READ_FORMATS),
              help="What the file holds; auto detects it. nvidia-smi takes both -q and --query-gpu CSV.")
@click.option("--profile", "profile_name", help="Judge against this hardware profile (GPU count and model, "
              "NVLinks, NICs, NCCL floor); the flags below override it.")
@click.option("--exit-code", type=int, help="The tool's exit code, as a cross-check (dcgm, nccl, fi-info).")
@click.option("--expect-gpus", type=int, help="GPU count the node should have (dcgm, nvidia-smi).")
@click.option("--expect-nics", type=int, help="EFA or InfiniBand device count (ibv-devinfo, fi-info).")
@click.option("--min-busbw", type=float, help="Bus bandwidth floor in GB/s at the largest size (nccl).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
              help="Config file (for --profile; default: $SWEEPER_CONFIG).")
@state_options
@click.option("--no-record", is_flag=True, help="Parse and print only.")
@click.option("--new-node", is_flag=True, help="Record it even when neither the history nor the cluster knows "
              "the node (a node never swept, with no cluster to ask).")
@output_options
@run_cli
def ingest_cmd(node: str, file: str, fmt: str, profile_name: str | None, exit_code: int | None,
               expect_gpus: int | None, expect_nics: int | None, min_busbw: float | None, config_path: str | None,
               kubeconfig: str | None, context: str | None, state: str, no_record: bool, new_node: bool,
               out: Out) -> None:
    """Parse a tool's output produced outside Sweeper (a Slurm prolog, a manual DCGM run) into the
    common result, print it, and record it in the node's history. Exit 1 when it holds a failure.

    A result is recorded only under a node the history knows (one that has left the cluster
    included), or else one the cluster (--kubeconfig, --context) has: a name neither knows is exit 2,
    naming the closest names, before the file is read. Where the cluster cannot be asked, the history
    alone decides, and the error says so. --new-node records it anyway; --no-record asks neither."""
    from contextlib import nullcontext

    from sweeper.ingest import expectations, ingest_stream, known_node, record

    if not no_record and not new_node:  # before the file is read; a history that is not there is not created
        cfg = config_for(config_path)
        known_node(node, history_at(state, create=False, cluster=cfg.cluster_name),
                   lambda: _cluster_nodes(kubeconfig, context, cfg), f"the history at {shown(state)}")
    expect: dict[str, Any] = {}
    if profile_name:
        from sweeper import profiles as prof

        catalogue = prof.load_profiles(config_for(config_path).path("profiles"))
        if profile_name not in catalogue:
            raise ConfigError(f"no profile {profile_name!r}; known: {', '.join(sorted(catalogue))}")
        expect = expectations(catalogue[profile_name])
    expect.update({k: v for k, v in (("expect_gpus", expect_gpus), ("expect_nics", expect_nics),
                                     ("min_busbw", min_busbw)) if v is not None})
    try:
        with (nullcontext(sys.stdin.buffer) if file == "-" else Path(file).open("rb")) as stream:
            found, result = ingest_stream(stream, node, fmt, exit_code=exit_code, **expect)
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    except RecursionError as exc:  # json.loads on a document nested thousands deep
        raise ConfigError(f"{file}: nested too deeply to read (deeper than Python's recursion limit)") from exc
    if not no_record:
        record(history_at(state, cluster=config_for(config_path).cluster_name), node, found, result, file)
    printer.result_document(out, f"{node}: {found} -> {result.status}", result)
    sys.exit(0 if result.status in ("pass", "warn", "skip") else 1)


def _cluster_nodes(kubeconfig: str | None, context: str | None, cfg: Any) -> list[str]:
    """The names of the cluster's nodes, asked once (one LIST, no retry: the cluster may be away)."""
    kube = kube_for(kubeconfig, context, cfg, once=True)
    return [str((n.get("metadata") or {}).get("name")) for n in kube.list_nodes("", page_size=cfg.page_size, devices=False)]
