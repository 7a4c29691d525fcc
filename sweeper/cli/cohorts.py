"""`sweeper cohorts`: failures read by a fact the nodes share (driver, VBIOS, zone, rack...)."""

from __future__ import annotations

import click

from sweeper.cli.app import main
from sweeper.cli.options import (
    examples,
    history_at,
    need_state,
    output_options,
    run_cli,
    since_cutoff,
    state_options,
)
from sweeper.output import Col, Out, iso_times

BY_HELP = ("The fact to group nodes by: driver, cuda, vbios, board, dcgm, zone, rack, block, instance-type, product, "
           "or any fact key the sweeps recorded (e.g. gpu.0.vbios); a name no sweep recorded otherwise is exit 2, "
           "naming the facts recorded.")


@main.command("cohorts", short_help="Failure rate by a shared fact (driver, rack): who stands apart.",
              epilog=examples("sweeper cohorts --by driver", "sweeper cohorts --by rack --since 14d -o json",
                              "sweeper cohorts --by driver --backtest 580.65.06"))
@state_options
@click.option("--by", default="driver", show_default=True, help=BY_HELP)
@click.option("--since", default="30d", show_default=True, help="The window read (a duration back from now).")
@click.option("--cluster", default=None, help="Read one cluster of a shared history (default: every cluster).")
@click.option("--backtest", "backtest", metavar="VALUE", default=None,
              help="Replay the rollout of this cohort (e.g. a driver version) day by day: the day it first stood "
                   "apart, and how many nodes that joined it after that day failed (would not have, had the "
                   "rollout stopped then).")
@output_options
@run_cli
def cohorts_cmd(state: str, by: str, since: str, cluster: str | None, backtest: str | None, out: Out) -> None:
    """Failure rate per node-day of each cohort of nodes that share a fact, and the cohorts that stand
    apart from the rest of the fleet.

    A node-day is a node on a UTC day with a conclusive sweep; it failed when a sweep ended reboot,
    replace or quarantine; a node counts one failure a cohort (its later days there are not at risk).
    Rate: failed node-days / node-days at risk, with a 95% Wilson score interval. A cohort is flagged
    when a one-sided Fisher exact test (hypergeometric upper tail) of its failed node-days against the
    rest of the fleet's, Holm-corrected over the cohorts with at least 30 node-days, is below 0.001
    (and it has 3 or more failed node-days). Details: docs/cohorts.md. Changes nothing."""
    from sweeper.cohorts import cohort_report, known_fact

    need_state(state)
    history = history_at(state).for_cluster(cluster) if cluster else history_at(state)
    doc = cohort_report(history, known_fact(history, by), since_cutoff(since) or 0.0, backtest=backtest)
    if out.structured:
        out.document(iso_times(doc))
        return
    out.title(f"{doc['node_days']} node-days, {doc['failures']} failed, by {doc['by']}; flagged: "
              f"{', '.join(doc['flagged']) or 'none'}")
    out.table((Col("cohort", cut=True), Col("nodes"), Col("node-days"), Col("failed"), Col("rate"), Col("95% CI"),
               Col("p (Holm)"), Col("flag"), Col("failing checks", cut=True)),
              [[c["value"], c["nodes"], c["node_days"], c["failures"], f"{c['rate']:.2%}",
                f"{c['low']:.2%}-{c['high']:.2%}", f"{c['p_adjusted']:.2g}" if c["tested"] else "not tested",
                "STANDS APART" if c["flagged"] else "", ", ".join(f"{x['check']} ({x['node_days']})" for x in c["causes"])]
               for c in doc["cohorts"]])
    bt = doc.get("backtest")
    if bt:
        when = out.when(bt["at"], "never") if bt["at"] is not None else "never"
        out.title(f"backtest {bt['value']}: flagged {when}; {bt['nodes']} nodes joined it, {bt['failed_nodes']} failed; "
                  f"stopped then, {bt['spared']} of the {bt['joined_after']} nodes that joined after would not have "
                  f"failed ({bt['failed_anyway']} failed anyway)")
