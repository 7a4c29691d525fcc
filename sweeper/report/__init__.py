"""`sweeper report`: the fleet at a glance as one self-contained HTML file (inline CSS and SVG,
no script, nothing fetched): coverage over every GPU node of the cluster, per profile; every
sweep on a time axis; the nodes held and why, and those that left the cluster; the trends
behind decisions; per-profile NCCL bandwidth; pair sweeps (failed pairs, culprits, suspects
waiting for a re-pair); and a page per node (an anchor in the same file) with its sweeps, pair
runs, findings, actions and metric trends per GPU.

`fleet` is the page over every cluster a shared history holds, linking to each cluster's report.

The package: `data` reads the history, `svg` draws, `sections` builds each part of the page,
`page` puts the page together. Every name stays importable from `sweeper.report`.
"""

from sweeper.report.data import (
    BANDWIDTH,
    MAX_NODE_PAGES,
    MAX_TREND_CARDS,
    ReportData,
    cluster_gpu_nodes,
    coverage,
    coverage_by_profile,
    coverage_window,
    gather,
    last_run_gpu_nodes,
    node_states,
)
from sweeper.report.fleet import overview, page_name, render_fleet
from sweeper.report.page import CSP, CSS, render, render_node
from sweeper.report.sections import MAX_PAIR_ROWS, MAX_TIMELINE_NODES
from sweeper.report.svg import COLORS, GPU_COLORS, STATE_COLORS, TICKS, anchor

__all__ = ["BANDWIDTH", "COLORS", "CSP", "CSS", "GPU_COLORS", "MAX_NODE_PAGES", "MAX_PAIR_ROWS", "MAX_TIMELINE_NODES",
           "MAX_TREND_CARDS", "STATE_COLORS", "TICKS", "ReportData", "anchor", "cluster_gpu_nodes", "coverage",
           "coverage_by_profile", "coverage_window", "gather", "last_run_gpu_nodes", "node_states", "overview", "page_name",
           "render", "render_fleet", "render_node"]
