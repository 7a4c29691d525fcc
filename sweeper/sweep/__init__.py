"""One rolling pass, as the data flows through it:

- `run`: the run. Take the sweep lock, fence every write with it, reconcile the runs that died
  (`reconcile`), discover and plan, roll the queue, record the run's row and report. `Sweep`,
  the long-lived object, lives here; one run's own state is a `Run` (`state`).
- `gates`: discovery and what a node passes before it is taken: the plan (due, idle, budget,
  floor), outside signals, the switches people flip (pause, breaker, dismissals), the breaker,
  the attempt window, the busy nodes due a light check. `faults`: a fault of the check itself,
  which stops a run from taking more nodes.
- `queue`: one rolling loop whose units are a node sweep, a light check or a pair, so nodes and
  pairs share it.
- a unit's life: `hold` (taint, look again, hand back or keep held), `play` (play the playbook,
  read its verdict), `unit` (a node sweep and a light check: hold, play, verdict, hand back,
  act), `pair` (the same for two nodes at once, with its re-pair bookkeeping), `gate` (a gated
  node, new or back from a reboot: the deep or soak playbook, and its startup taint off on a pass).
- `record`: what a run writes to (the Recorder, fenced by the lock) and what it hands back
  (outcomes, the report).

Modules import downwards only: run > reconcile, queue > pair, gate > unit > play, hold > gates, faults
> state > record (import-linter keeps it so).
"""

from sweeper.sweep.record import (
    ATTEMPT_VERDICTS,
    EVERY_PAIR_FAILED,
    RECORDER_WRITES,
    FencedRecorder,
    NodeOutcome,
    PairRun,
    Recorder,
    RunReport,
    every_pair_failed,
    new_run_id,
)
from sweeper.sweep.run import Sweep
from sweeper.sweep.state import Run

__all__ = ["ATTEMPT_VERDICTS", "EVERY_PAIR_FAILED", "RECORDER_WRITES", "FencedRecorder", "NodeOutcome", "PairRun",
           "Recorder", "Run", "RunReport", "Sweep", "every_pair_failed", "new_run_id"]
