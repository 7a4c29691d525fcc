"""Commands of the simulated cluster: sim serve (an HTTP API server with a kubeconfig) and demo."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from sweeper.cli import printer
from sweeper.cli.app import main
from sweeper.cli.options import examples, run_cli, stderr_out
from sweeper.errors import ConfigError


@main.group()
def sim() -> None:
    """The simulated GPU cluster (an HTTP Kubernetes API with a fault model)."""


@sim.command("serve", epilog=examples(
    "sweeper sim serve --port 8443 --kubeconfig-out state/sim.kubeconfig",
    "sweeper sim serve --fleet my-fleet.yaml --speed 60"))
@click.option("--fleet", "fleet_path", type=click.Path(exists=True, dir_okay=False),
              help="Fleet YAML (default: the demo's fleet).")
@click.option("--port", type=int, default=8443, show_default=True, help="Port on 127.0.0.1.")
@click.option("--kubeconfig-out", type=click.Path(dir_okay=False), default="state/sim.kubeconfig",
              show_default=True, help="Where to write a kubeconfig that points at the server.")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Simulated seconds per real second (default: the fleet file's `speed` where it sets one, "
                   "else 1). At 1 the simulated clock is the wall clock, the only one kubectl and a Sweeper "
                   "in another process read; faster, their timestamps fall behind.")
@run_cli
def sim_serve(fleet_path: str | None, port: int, kubeconfig_out: str, speed: float | None) -> None:
    """Serve the simulated cluster until interrupted; point kubectl or Sweeper at it."""
    from sweeper.clock import ScaledClock
    from sweeper.sim.cluster import SimCluster
    from sweeper.sim.fleet import DEMO_FLEET, load_fleet, parse_fleet
    from sweeper.sim.server import ApiServer

    fleet = load_fleet(Path(fleet_path)) if fleet_path else parse_fleet(DEMO_FLEET, "demo fleet")
    if speed is None:  # the file's own speed, as the embedded simulator uses it; the demo's fleet at 1x
        speed = fleet.speed if fleet_path and fleet.speed_given else 1.0
    cluster = SimCluster(fleet, ScaledClock(speed))
    try:
        server = ApiServer(cluster, port=port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on 127.0.0.1:{port}: {exc}") from exc
    # The handler goes in before anything is served: a SIGTERM that came between the kubeconfig (the sign
    # that the server listens) and the handler would end the process unflushed, its banner lost.
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__("now", True))
    server.start()
    err = stderr_out()
    err.write(f"simulated cluster {fleet.name!r}: {len(fleet.nodes)} nodes at {server.url}, "
              f"{cluster.clock.speed:g}x real time")
    kc = server.write_kubeconfig(Path(kubeconfig_out), namespace=fleet.namespace)
    err.write(f"kubeconfig: {kc}   (export KUBECONFIG={kc})")
    try:
        while not stopping["now"]:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@main.command(epilog=examples("sweeper demo", "sweeper demo --cycles 8 --hours-between 12 --state demo.db",
                              "sweeper demo --state postgresql://postgres@127.0.0.1/sweeper --cluster-name east "
                              "--report east.html"))
@click.option("--cycles", type=int, default=5, show_default=True, help="Sweep cycles to run.")
@click.option("--hours-between", type=float, default=6.0, show_default=True,
              help="Simulated hours between cycles.")
@click.option("--state", help="History: a SQLite file or a postgresql:// URL (default: a fresh temporary file).")
@click.option("--cluster-name", "cluster", help="The cluster name on the history's rows, so that several demos share "
              "one history (default: $SWEEPER_CLUSTER, else the kubeconfig context, else `default`).")
@click.option("--report", "report", type=click.Path(dir_okay=False), help="Where to write the HTML report "
              "(default: report.html beside the history file; for a URL, in a temporary directory).")
@run_cli
def demo(cycles: int, hours_between: float, state: str | None, cluster: str | None, report: str | None) -> None:
    """The whole product on the embedded simulated cluster: a 16-node p5 fleet in a Karpenter pool
    with injected faults, several sweep cycles in simulated time (checks, verdicts, reboots and
    re-checks, a GPU reset, a replacement), then the fleet, a held node's history and the fleet
    report (an HTML file)."""
    import tempfile

    from rich.console import Console

    from sweeper.demo import run_demo
    from sweeper.history import is_url

    if cluster is not None and not cluster.strip():
        raise ConfigError("--cluster-name: empty")
    where: Path | str = (state if is_url(state) else Path(state)) if state else \
        Path(tempfile.mkdtemp(prefix="sweeper-demo-")) / "history.db"
    console = Console(highlight=False)
    run_demo(console, where, cycles=cycles, hours_between=hours_between, printer=printer.progress(console),
             print_history=printer.print_history, cluster_name=cluster, report_file=Path(report) if report else None)

