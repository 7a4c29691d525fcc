"""One sandboxed Jinja2 environment with strict undefined variables and bounded renders.

Values that come from the cluster (labels, annotations, logs) are data: they are passed in as
variables and never rendered themselves, so `{{ ... }}` inside a label stays literal text.

A render may not build more than `LIMITS` allows (output, string and list sizes, integer
sizes, formatting widths) nor run longer than its deadline: past a bound the playbook is broken
(PlaybookError with the expression and the task's file:line), found before the memory is spent.
Renders run in the render worker (sweeper.render_worker), a child process under RLIMIT_AS that
is killed at the deadline, so what these bounds miss still cannot reach the controller.
The bounds follow Jinja2's own advice for untrusted templates, which points at
`intercepted_binops`, `call` and `MAX_RANGE` as the places to do it:
https://jinja.palletsprojects.com/en/stable/sandbox/

The package, by what each module holds: `bounds` (LIMITS and the size checks), `environment`
(the sandbox that routes every allocation through them), `deadline` (the render deadline and
the errors), `rendering` (render, condition and the hand-off to the render worker) and
`job_templates` (finding and rendering a Job's template by name).
"""

from __future__ import annotations

import sys
import types

from sweeper.templating import bounds, deadline
from sweeper.templating.bounds import LIMITS, LimitExceeded, Limits, value_size
from sweeper.templating.deadline import _IN_WORKER as _IN_WORKER  # noqa: F401 - see _Package
from sweeper.templating.deadline import RenderTimeout, render_deadline
from sweeper.templating.environment import ENV, BoundedEnvironment
from sweeper.templating.job_templates import JobTemplate, render_template, resolve_template
from sweeper.templating.rendering import check_fact, check_syntax, condition, render

__all__ = ["ENV", "LIMITS", "BoundedEnvironment", "JobTemplate", "LimitExceeded", "Limits", "RenderTimeout",
           "check_fact", "check_syntax", "condition", "render", "render_deadline", "render_template",
           "resolve_template", "value_size"]


class _Package(types.ModuleType):
    """`templating.LIMITS = ...` (the render worker sets the controller's bounds; tests set
    their own) and `templating._IN_WORKER = True` (the render worker) reach the one module that
    holds each value and reads it at every render, as they did when this was one module."""

    @property
    def LIMITS(self) -> Limits:
        return bounds.LIMITS

    @LIMITS.setter
    def LIMITS(self, value: Limits) -> None:
        bounds.LIMITS = value

    @property
    def _IN_WORKER(self) -> bool:
        return deadline._IN_WORKER

    @_IN_WORKER.setter
    def _IN_WORKER(self, value: bool) -> None:
        deadline._IN_WORKER = value


sys.modules[__name__].__class__ = _Package
