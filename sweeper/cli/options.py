"""What every command shares: the output, state and cluster options, the error-to-exit-code
mapping, and the objects a command builds (config, Kubernetes client, history). Nothing heavy is
imported here: a command imports the config's pydantic, the Kubernetes client and the history's
sqlite-utils when it runs, so `--help` and the reading commands start in well under 150 ms
(benchmarks/cli.py measures it)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sweeper.clock import parse_duration
from sweeper.errors import ConfigError, Interrupted, SweeperError
from sweeper.output import FORMATS, Out, clean_lines

if TYPE_CHECKING:
    from sweeper.config import Config


def stderr_out() -> Out:
    return Out.to(stream=sys.stderr)


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`-o table|wide|json|yaml`, `--no-headers`, and `--json` (kept for scripts: `-o json`); the
    command receives them as one `out`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, output_format: str, as_json: bool, no_headers: bool, **kwargs: Any) -> Any:
        return fn(*args, out=Out.to("json" if as_json else output_format, not no_headers), **kwargs)

    for opt in reversed([
            click.option("-o", "--output", "output_format", type=click.Choice(FORMATS), default="table",
                         show_default=True, help="table; wide (more columns, ISO times); json or yaml (the document)."),
            click.option("--json", "as_json", is_flag=True, help="Same as -o json."),
            click.option("--no-headers", is_flag=True, help="Tables without their header and title lines.")]):
        wrapper = opt(wrapper)
    return wrapper


def examples(*lines: str) -> str:
    """A command's epilog: copy-paste examples, kept as written (click's \\b)."""
    return "Examples:\n\n\b\n" + "\n".join("  " + line for line in lines)



def history_exists(state: str) -> bool:
    """A history to read at `state`: a SQLite file that exists, or a PostgreSQL URL."""
    from sweeper.history import state_exists

    return state_exists(state)


STATE_HELP = ("history: a SQLite file or a postgresql:// URL (default: $SWEEPER_STATE, else the config's "
              "`state`, else state/<kubeconfig context>.db, in a pod without a kubeconfig state/sweeper.db).")


def shown(state: str | None) -> str:
    """`state` fit to print: a URL's password masked (`postgresql://u:***@host/db`, and in its query), a
    path as it is. Plain string work: the reading commands print it before any database library is imported."""
    from sweeper.output import hide_password

    return hide_password(state or "")


def config_state(config_path: str | None) -> str | None:
    """The `state` key of the config file, read as plain YAML (the command checks the whole file when it
    loads it): the history when neither --state nor $SWEEPER_STATE names one."""
    if not config_path:
        return None
    import yaml

    try:
        doc = yaml.safe_load(Path(config_path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the config's own loading says what is wrong with it
    value = doc.get("state") if isinstance(doc, dict) else None
    return value if isinstance(value, str) and value else None


def state_option() -> Callable[..., Any]:
    return click.option("--state", default=None, help=STATE_HELP)


def with_state(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Fill in `state` when --state is not given: named for the kubeconfig context (sweeper.kubeconfig),
    so two clusters never share a history; say so on stderr. Drops --kubeconfig and --context for a
    command that only reads the history."""
    import inspect

    takes = set(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("state") is None:
            from sweeper.kubeconfig import default_state

            kwargs["state"], context = default_state(kwargs.get("kubeconfig"), kwargs.get("context"),
                                                     config_state(kwargs.get("config_path")))
            ctx = click.get_current_context(silent=True)
            if ctx is not None:
                ctx.params["state"] = kwargs["state"]
                ctx.meta["sweeper.state_context"] = context
            if context and (history_exists(kwargs["state"]) or not getattr(fn, "reads_the_cluster", False)):
                click.echo(clean_lines(f"history {shown(kwargs['state'])}: named for the kubeconfig context {context} "
                                       "(--state or SWEEPER_STATE to choose another)"), err=True)
        for name in ("kubeconfig", "context"):
            if name not in takes:
                kwargs.pop(name, None)
        return fn(*args, **kwargs)
    return wrapper


def reads_the_cluster(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a reading command that, with no local history for the context, reads the cluster's."""
    fn.reads_the_cluster = True  # type: ignore[attr-defined]
    return fn


def no_local_history(state: str) -> bool:
    """Whether the history named for the kubeconfig context (no --state, no SWEEPER_STATE) is not
    here: a person on a laptop, whose cluster keeps its history itself (sweeper.remote)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get("sweeper.state_context")) and not history_exists(state)


def state_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--state, and the --kubeconfig and --context that name it, for a command that reads the history
    without asking the cluster."""
    fn = with_state(fn)
    for opt in reversed([
            click.option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig whose current context names the "
                         "history file (default: ~/.kube/config)."),
            click.option("--context", help="kubeconfig context whose history to read (state/<context>.db)."),
            state_option()]):
        fn = opt(fn)
    return fn


EXIT_BUG = 70  # EX_SOFTWARE of BSD's sysexits.h: an internal error, never confused with 1 (findings)
EXIT_INTERRUPTED = Interrupted.exit_code  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
DEBUG = {"on": False}  # `sweeper --debug`: an error shows its traceback


def run_cli(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map the error tree to exit codes with one clear line on stderr (`--debug`: the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
            sys.stdout.flush()  # a reader that closed the pipe is found here, not at the interpreter's exit
            return out
        except BrokenPipeError:  # `sweeper history NODE | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's "Note on SIGPIPE"
            sys.exit(0)
        except SweeperError as exc:
            _fail(exc, exc.exit_code, str(exc))  # one unwrapped line, so file:line stays greppable
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C: what the command took was handed back as it unwound
            click.echo("error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except (RecursionError, MemoryError, OverflowError) as exc:
            _fail(exc, 2, f"{_inputs()}: too large or too deeply nested to handle ({_what(exc)})")
        except ValueError as exc:  # a value a file or an argument carried (a template's format, a number)
            _fail(exc, 2, f"{_inputs()}: {_what(exc)}")
        except Exception as exc:
            if type(exc).__module__ == "sqlite3":  # the CLI never imports sqlite3; the history should have mapped it
                _fail(exc, 3, f"history {shown(_param('state'))}: {_what(exc)}")
            if type(exc).__name__ == "MarkupError":  # text from a file or a node taken for rich markup
                _fail(exc, 2, f"{_inputs()}: could not print: {_what(exc)}")
            _fail(exc, EXIT_BUG, f"internal error, a bug in Sweeper (please report it): {_what(exc)}")
    return wrapper


def _fail(exc: BaseException, code: int, line: str) -> None:
    if DEBUG["on"]:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    else:
        line += "" if code in (1, 3, 4) or isinstance(exc, SweeperError) else "; --debug shows the traceback"
    click.echo(f"error: {clean_lines(line)}", err=True)  # a message may quote a file or a node: shown, never obeyed
    sys.exit(code)


def _what(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200] + '...' if len(text) > 200 else text}"


def _param(name: str) -> Any:
    ctx = click.get_current_context(silent=True)
    return ctx.params.get(name) if ctx else None


def _inputs() -> str:
    """The files the failing command was given, to name in its one line."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return "sweeper"
    files = [str(v) for v in ctx.params.values() if isinstance(v, str) and v and Path(v).is_file()]
    return f"sweeper {ctx.info_name}" + (f" ({', '.join(files)})" if files else "")


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[threading.Event]:
    """An event SIGTERM sets while the block runs (the handler before is put back after)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def config_for(path: str | None, **overrides: Any) -> Config:
    """The config file, with what the command line overrides (`sweep --max-nodes`) checked by the
    rules of those keys, as the file's values are: a problem names the option (`--max-nodes: -1 is
    too small; allowed: integer >= 0`)."""
    import re

    from sweeper.config import Config, file_model, load_config
    from sweeper.schema import check

    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        if given:
            check(file_model(), given, "", None, Config)
    except ConfigError as exc:
        lines = getattr(exc, "problems", None) or [str(exc)]
        raise ConfigError("; ".join(re.sub(r"^:\d+: ([a-z_]+):", lambda m: f"--{m[1].replace('_', '-')}:", line)
                                    for line in lines)) from None
    return load_config(path).with_overrides(**given)


def kube_for(kubeconfig: str | None, context: str | None, cfg: Config, once: bool = False) -> Any:
    """The cluster under the config's retry policy; `once`: each call asked once, for a reader that
    does not wait on a cluster (or a Sweeper in it) that is not there."""
    from sweeper.kubeconfig import missing as kubeconfig_missing

    missing = kubeconfig_missing(kubeconfig)
    if missing:
        raise ConfigError(missing)
    from sweeper.kube import Kube, RetryPolicy

    kube = Kube.from_config(kubeconfig, context)
    kube.retry = RetryPolicy(attempts=1 if once else max(1, cfg.api_attempts), read_timeout=cfg.api_timeout)
    return kube


def history_at(state: str, create: bool = True, cluster: str | None = None) -> Any:
    """The history at `state`, writing as `cluster` (the config's cluster_name; None: $SWEEPER_CLUSTER,
    else the kubeconfig context). create=False (plan, --dry-run): a missing file is not created; an
    empty history in memory stands in for it, so a command that changes nothing leaves no file."""
    from sweeper.history import History

    if not create and not history_exists(state):
        return History(":memory:", cluster or None)
    return History(state, cluster or None)


ALL_CLUSTERS = ("all", "*")


def cluster_choice(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--cluster NAME|all`: whose rows a reading command shows, in a history several clusters share."""
    return click.option("--cluster", "cluster", metavar="NAME|all",
                        help="The cluster whose rows to read, in a history several clusters share; `all` (or `*`) "
                        "reads every cluster, with a CLUSTER column (default: the config's cluster_name, else "
                        "$SWEEPER_CLUSTER, else every cluster the history holds).")(fn)


def scoped(hist: Any, cluster: str | None, cfg: Config | None = None) -> tuple[Any, bool]:
    """The history as `--cluster` reads it, and whether every cluster is read. A name the history does
    not hold is bad input (exit 2), naming those it does."""
    if cluster is not None and not cluster.strip():
        raise ConfigError("--cluster: empty; name a cluster, or `all`")
    if cluster in ALL_CLUSTERS:
        return hist.for_cluster(None), True
    name = cluster or (cfg.cluster_name if cfg is not None else "") or hist.scope
    if name is None:
        return hist.for_cluster(None), True
    if cluster is not None:
        known = hist.clusters()
        if known and name not in known:
            raise ConfigError(f"--cluster: no cluster {name!r} in the history at {shown(hist.state)} "
                              f"(it holds {', '.join(known)}; or `all`)")
    return hist.for_cluster(name), False


common_cluster = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SWEEPER_CONFIG",
                 help="Sweeper config YAML (default: $SWEEPER_CONFIG)."),
    click.option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig file (default: in-cluster or ~/.kube/config)."),
    click.option("--context", help="kubeconfig context."),
    state_option(),
]


def cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = with_state(fn)
    for opt in reversed(common_cluster):
        fn = opt(fn)
    return fn



def need_state(state: str) -> None:
    if not history_exists(state):
        raise ConfigError(f"no history at {shown(state)} (set --state, SWEEPER_STATE or the config's `state`)")


def since_window(since: str | None) -> str:
    """The window `--since` names, as read: its own words, and its seconds where a number alone
    (sweeper.clock.parse_duration reads `7` as seven seconds, as the config's durations)."""
    if not since:
        return ""
    from sweeper.output import span

    text = since.strip()
    return f"{span(parse_duration(text))} (--since {text}: a number alone is seconds)" if text[-1:].isdigit() else text


def since_cutoff(since: str | None, default: float | None = None) -> float | None:
    try:
        if since:
            return time.time() - parse_duration(since)
    except ValueError as exc:
        raise ConfigError(f"--since: not a duration: {since!r}") from exc
    return None if default is None else time.time() - default
