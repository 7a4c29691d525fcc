"""Templates are sandboxed; values from the cluster are data and never run."""

import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.errors import PlaybookError
from sweeper.templating import LIMITS, condition, render, render_deadline

HOSTILE = {"node": {"labels": {"team": "{{ 7 * 7 }}", "evil": "{{ lookup('pipe', 'id') }}",
                               "loop": "{% for x in range(10**9) %}x{% endfor %}"}}}


def test_label_values_render_as_literal_text() -> None:
    assert render("{{ node.labels.team }}", HOSTILE) == "{{ 7 * 7 }}"
    assert render("team={{ node.labels.evil }}", HOSTILE) == "team={{ lookup('pipe', 'id') }}"
    assert render("{{ node.labels.loop }}", HOSTILE) == HOSTILE["node"]["labels"]["loop"]
    assert render(["{{ node.labels.team }}"], HOSTILE) == ["{{ 7 * 7 }}"]


def test_the_sandbox_refuses_attribute_escapes() -> None:
    with pytest.raises(PlaybookError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", {})


def test_strict_undefined_and_native_types() -> None:
    with pytest.raises(PlaybookError, match="undefined"):
        render("{{ nope }}", {})
    assert render("{{ [1, 2] }}", {}) == [1, 2]
    assert render("{{ '15m' | duration }}", {}) == 900.0


def test_conditions_must_be_booleans() -> None:
    assert condition("x > 1", {"x": 2}) is True
    with pytest.raises(PlaybookError, match="not a boolean"):
        condition("x", {"x": "yes"})


# -- limits ------------------------------------------------------------------------------------
# Each of these, unbounded, takes gigabytes (issue 11); bounded, each stops at its first
# oversized step. Peak memory is measured with tracemalloc; no test asserts a time.
BOMBS = {
    "string repetition": "{{ 'a' * 10**9 }}",
    "list repetition": "{{ [0] * 10**9 }}",
    "printf width": "{{ '%0999999999d' % 1 }}",
    "printf precision": "{{ '%.999999999f' % 1.5 }}",
    "center method": "{{ 'x'.center(10**9) }}",
    "ljust method": "{{ 'x'.ljust(10**9) }}",
    "zfill method": "{{ 'x'.zfill(10**9) }}",
    "expandtabs method": "{{ ('\t' * 1000).expandtabs(10**6) }}",
    "format width": "{{ '{:>999999999}'.format(1) }}",
    "format nested width": "{{ '{0:>{1}}'.format('a', 10**9) }}",
    "int to_bytes": "{{ (1).to_bytes(10**9, 'big') }}",
    "integer power": "{{ 7 ** 1000000000 }}",
    "range": "{% for i in range(10**9) %}{% endfor %}",
    "join filter": "{{ ['a', 'b', 'c'] | join('x' * 600000) }}",
    "join method": "{{ ('x' * 10**6).join(['a', 'b', 'c']) }}",
    "replace filter": "{{ ('a' * 10**6) | replace('', 'bb') }}",
    "replace method": "{{ ('a' * 10**6).replace('a', 'bbbbbbbbbb') }}",
    "format filter": "{{ '%0999999999d' | format(1) }}",
    "center filter": "{{ 'a' | center(10**9) }}",
    "indent filter": "{{ ('a\n' * 1000) | indent(10**6) }}",
    "wordwrap filter": "{{ ('a' * 500000) | wordwrap(1, wrapstring='x' * 100) }}",
    "batch filter": "{{ [1] | batch(10**9, 0) | list }}",
    "slice filter": "{{ [1] | slice(10**9) | list }}",
    "tojson indent": "{{ {'a': 1} | tojson(indent=10**9) }}",
    "sum of lists": "{{ ([[1] * 100000] * 100000) | sum(start=[]) }}",
    "concatenation doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "addition doubling": "{% set ns = namespace(s=[0]) %}{% for i in range(64) %}"
                         "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
    "shared list nesting": "{% set ns = namespace(a=['x' * 1000]) %}{% for i in range(40) %}"
                           "{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
    "output size": "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
    "set block": "{% set x %}{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}{% endset %}{{ x | length }}",
    "macro output": "{% macro m() %}{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}{% endmacro %}"
                    "{{ m() | length }}",
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_render_past_a_bound_is_a_broken_playbook_in_bounded_memory(name: str) -> None:
    """Bounds on what Jinja2's sandbox leaves open (binary operators, calls, range; see
    https://jinja.palletsprojects.com/en/stable/sandbox/): a PlaybookError naming the task's
    file:line and the expression, raised before more than a few MiB are allocated."""
    source = BOMBS[name]
    tracemalloc.start()
    try:
        with pytest.raises(PlaybookError) as info:
            render(source, {}, "pb.yaml:7: debug.msg")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert message.startswith("pb.yaml:7: debug.msg: template limit: "), message
    assert repr(source)[:60] in message or source[:60] in message, message
    assert "\n" not in message
    assert peak < 24 * 2**20, f"{name}: peak {peak / 2**20:.1f} MiB"


def test_bounds_leave_ordinary_templates_alone() -> None:
    scope = {"xs": list(range(1000)), "name": "gpu-00"}
    assert render("{{ 'ab' * 3 }} {{ [1] * 2 }} {{ '%05d|%-4s|' % (42, 'x') }} {{ '{:>6}'.format(name) }}", scope) \
        == "ababab [1, 1] 00042|x   | gpu-00"
    assert render("{{ xs | join(',') | length }}", scope) == 3889
    assert render("{{ range(3) | list }}", {}) == [0, 1, 2]
    assert render("{{ 2 ** 64 }}", {}) == 2**64
    assert render("{{ 'a b c'.split() }}", {}) == ["a", "b", "c"]
    assert render("{{ {'a': [1]} | tojson(indent=2) }}", {}) == '{\n  "a": [\n    1\n  ]\n}'
    assert render("{{ 'x' | center(5) }}|{{ 'a\nb' | indent(2) }}", {}) == "  x  |a\n  b"
    assert render("{{ xs | default(2000000) | length }}", scope) == 1000


@pytest.mark.parametrize("source", ["{{ 1 / 0 }}", "{{ 2.0 ** 10000 }}", "{{ 'a' + 1 }}", "{{ '%d' % 'x' }}",
                                    "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
                                    "{{ '{'.format(1) }}"])
def test_python_errors_while_rendering_are_broken_playbooks(source: str) -> None:
    """ZeroDivisionError, OverflowError, TypeError, ValueError, RecursionError: one line with file:line."""
    with pytest.raises(PlaybookError, match=r"^pb\.yaml:3: msg: cannot render .*Error: "):
        render(source, {}, "pb.yaml:3: msg")
    if source.startswith("{{"):
        with pytest.raises(PlaybookError, match=r"^pb\.yaml:3: when: cannot render "):
            condition(source.strip("{} "), {}, "pb.yaml:3: when")


SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def test_a_deadline_stops_loops_inside_a_template() -> None:
    with render_deadline(0.2), pytest.raises(PlaybookError, match=r"^pb\.yaml:9: x: rendering .* ran past the task's "
                                                                   r"timeout \(0\.2s\)"):
        render(SPIN, {}, "pb.yaml:9: x")
    # 100 passes over 100,000 items (the sandbox's largest range; seconds of work), in a chain
    # shallow enough for the compiler:
    # each filter nests the compiled call one level, and CPython's parser refuses more than 200
    # nested parentheses ("too many nested parentheses"); a long `and` chain nests one level per
    # operand and ends in a RecursionError instead
    slow = "(range(100000)" + " | map('string')" * 100 + " | list | length) > 1"
    with render_deadline(0.2), pytest.raises(PlaybookError, match="ran past the task's timeout"):
        condition(slow, {}, "pb.yaml:9: when")


def test_a_deadline_never_fires_into_later_code() -> None:
    """Deadlines that expire around the end of their renders are cleared, never delivered to
    the code that runs next; the generous ones let their renders finish."""
    source = "{% for i in range(20000) %}{{ i % 7 }}{% endfor %}"
    outcomes = []
    for i in range(60):
        with render_deadline([0.001, 0.005, 0.01, 0.02, 60.0][i % 5]):
            try:
                outcomes.append(len(render(source, {}, "pb.yaml:1")))
            except PlaybookError:
                outcomes.append(-1)
    total, until = 0, time.monotonic() + 0.3  # well past every deadline armed above
    while time.monotonic() < until:
        total += sum(range(1000))
    assert total > 0
    assert -1 in outcomes and 20000 in outcomes


# -- through `sweeper run` -----------------------------------------------------------------------
def _playbook(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pb.yaml"
    path.write_text("name: limits\ntasks:\n" + body)
    return path


ISSUE = {  # issue 11's examples, each as a task of its own
    "string": "  - debug: {msg: \"{{ 'a' * 10**9 }}\"}\n",
    "list": "  - debug: {msg: \"{{ [0] * 10**9 }}\"}\n",
    "printf": "  - debug: {msg: \"{{ '%0999999999d' % 1 }}\"}\n",
    "center": "  - debug: {msg: \"{{ 'x'.center(10**9) }}\"}\n",
    "set_fact": "  - set_fact: {x: \"{{ 'a' * 600000 }}\"}\n"
                "  - set_fact: {x: [\"{{ x }}\", \"{{ x }}\"]}\n"
                "  - set_fact: {x: [\"{{ x }}\", \"{{ x }}\"]}\n",
    "when": "  - debug: {msg: hi}\n    when: \"('a' * 10**9) | length > 0\"\n",
    "loop": "  - debug: {msg: \"{{ item }}\"}\n    loop: \"{{ range(10**9) | list }}\"\n",
}


@pytest.mark.parametrize("name", sorted(ISSUE))
def test_run_refuses_a_template_past_a_bound_with_one_line(tmp_path: Path, name: str) -> None:
    path = _playbook(tmp_path, ISSUE[name])
    tracemalloc.start()
    try:
        res = CliRunner().invoke(main, ["run", str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {path}:") and "template limit" in lines[-1], res.stderr
    assert "Traceback" not in res.output
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_a_tasks_timeout_stops_its_renders(tmp_path: Path) -> None:
    """STYLE.md's `timeout` bounds the task; a render of that task is part of it."""
    path = _playbook(tmp_path, f"  - debug: {{msg: \"{SPIN}\"}}\n    timeout: 0.3s\n")
    res = CliRunner().invoke(main, ["run", str(path)])
    assert res.exit_code == 2, res.output
    assert f"error: {path}:3: debug.msg: rendering" in res.stderr
    assert "ran past the task's timeout (0.3s)" in res.stderr


def _bounded_run(path: Path) -> subprocess.CompletedProcess[str]:
    """`sweeper run` in a child limited to 1 GiB of address space; the timeout exists only so
    that a regression cannot hang the suite."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([sys.executable, "-c", "from sweeper.cli import main; main()", "run", str(path)],
                          capture_output=True, text=True, timeout=300, preexec_fn=limit, check=False)


def test_run_stops_at_the_default_render_deadline(tmp_path: Path) -> None:
    """No task timeout: the default render deadline still ends nested loops in a template."""
    path = _playbook(tmp_path, f"  - debug: {{msg: \"{SPIN}\"}}\n")
    proc = _bounded_run(path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}:3: debug.msg: rendering {SPIN!r} ran past the render deadline ({LIMITS.seconds:g}s)"]


def test_run_refuses_a_gigabyte_string_within_a_memory_limit(tmp_path: Path) -> None:
    path = _playbook(tmp_path, ISSUE["list"] + ISSUE["string"])
    proc = _bounded_run(path)
    assert proc.returncode == 2, proc.stderr
    assert "template limit: a sequence of 1,000,000,000" in proc.stderr and "Traceback" not in proc.stderr


def test_lint_reports_a_job_template_past_a_bound(tmp_path: Path) -> None:
    """`sweeper lint` renders Job templates with a sample node: a bomb there is one problem line."""
    path = tmp_path / "bomb.yaml.j2"
    path.write_text("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ 'a' * 10**9 }}\n")
    res = CliRunner().invoke(main, ["lint", str(path)])
    assert res.exit_code == 1, res.output
    assert f"{path}:" in res.stdout and "template limit: a string of 1,000,000,000" in res.stdout, res.stdout
    assert "Traceback" not in res.output
