"""Cluster data cannot shape a Job (docs/security.md, Jobs a playbook cannot aim). A Node's
annotations and labels are written by its own kubelet too (the NodeRestriction admission plugin
lets a kubelet modify its own Node object: https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction),
so an author's template that writes one bare, without `| tojson`, would let that text add YAML of
its own to the Job: a `command` in a check container, on the held node and, in a pair, on its
healthy partner. Every Job is rendered a second time with the cluster's strings replaced by plain
words, and refused when the two differ in shape (sweeper.actions.structure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.actions.pair import render_pair
from sweeper.config import Config
from sweeper.errors import PlaybookError
from sweeper.lint import lint_paths
from sweeper.profiles import load_profile
from sweeper.schema import safe_load
from sweeper.templating import render_template, resolve_template

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.name for p in (ROOT / "job-templates").glob("*.j2"))
REMEDIATION = {"reboot.yaml.j2", "gpu-reset.yaml.j2"}
ARGS = '          args: {{ (["--node", node.name, "--host-root", "/host"] + node.profile.check_args'
# what a hostile kubelet writes into its Node's annotation: YAML that lands at the container's indentation
INJECTED = "/tmp\n          command: [sh, -c, evil]"
BROKEN_OUT = '/tmp"\n          command: [sh, -c, evil]\n          terminationMessagePath: "/dev/termination-log'
EVIL = ["sh", "-c", "evil"]


def node(name: str = "gpu-1", note: str = "") -> dict[str, Any]:
    return {"name": name, "gpus": 8, "labels": {"kubernetes.io/hostname": name}, "annotations": {"x": note},
            "profile": load_profile(ROOT / "profiles" / "p5.48xlarge.yaml").as_vars(), "driver_version": note}


def ctx(folder: Path | None = None, note: str = "", partner_note: str = "", platform: str = "generic") -> ActionContext:
    cfg = Config(template_dir=str(folder) if folder else "", platform=platform)
    return ActionContext(config=cfg, node=node(note=note), partner=node("gpu-2", partner_note), run_id="sw-1")


def authors_check(tmp_path: Path, line: str) -> Path:
    """The shipped check template with one more line in its container, after command and args."""
    text = (ROOT / "job-templates" / "sweeper-check.yaml.j2").read_text()
    head, sep, tail = text.partition("          env:\n")
    assert sep and ARGS in head
    (tmp_path / "mine.yaml.j2").write_text(head + line + "\n" + sep + tail)
    return tmp_path


def container(job: dict[str, Any]) -> dict[str, Any]:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


@pytest.mark.parametrize(("line", "note"), [
    ("          workingDir: {{ node.annotations['x'] }}", INJECTED),
    ("          workingDir: {{ node.annotations['x'] }}", "x\ncommand: [sh, -c, evil]"),
    ('          workingDir: "{{ node.annotations[\'x\'] }}"', BROKEN_OUT),
    ("          workingDir: {{ node.driver_version }}", INJECTED),
    # concatenated and filtered: the value's newline survives both
    ('          workingDir: {{ "/tmp/" ~ node.annotations.x | lower }}', INJECTED),
    ("          workingDir: {{ node.annotations['x'] | replace('tmp', 'var') }}", INJECTED),
])
def test_a_bare_cluster_value_that_carries_yaml_is_refused(tmp_path: Path, line: str, note: str) -> None:
    folder = authors_check(tmp_path, line)
    c = ctx(folder, note)
    # The attack is real: rendered once and read, the node's text would be the container's command
    # (or a key of the Job's own).
    variables = {"node": c.node, "partner": c.partner, "affinity": {}, "tolerations": [], "image": "i",
                 "namespace": "sweeper", "job_name": "j", "labels": {}, "ttl": 1, "timeout": 1, "all_gpus": {},
                 "gpu_claims": [], "runtime_class": "", "priority_class": "", "platform": "generic"}
    if "          command" in note:
        once = safe_load(render_template(resolve_template("mine.yaml.j2", ROOT / "job-templates", folder), variables))
        assert container(once)["command"] == EVIL
    with pytest.raises(PlaybookError, match="unsafe Job") as err:
        render_job(c, "mine.yaml.j2", 900, {})
    message = str(err.value)
    assert "mine.yaml.j2" in message and "structure" in message
    assert "node['annotations']['x']" in message or "node['driver_version']" in message, message


def test_a_cluster_value_written_with_tojson_stays_one_value(tmp_path: Path) -> None:
    folder = authors_check(tmp_path, "          workingDir: {{ node.annotations['x'] | tojson }}")
    job = render_job(ctx(folder, INJECTED), "mine.yaml.j2", 900, {})
    assert container(job)["workingDir"] == INJECTED and container(job)["command"] == ["sweeper", "check"]


def test_a_bare_plain_value_still_renders(tmp_path: Path) -> None:
    folder = authors_check(tmp_path, "          workingDir: /tmp/{{ node.annotations['x'] }}")
    job = render_job(ctx(folder, "scratch-1"), "mine.yaml.j2", 900, {})
    assert container(job)["workingDir"] == "/tmp/scratch-1"


def test_a_branch_on_cluster_data_is_refused(tmp_path: Path) -> None:
    """The node may not choose the Job's shape between the author's own branches either."""
    folder = authors_check(tmp_path, "{%- if node.annotations['x'] == 'debug' %}\n          tty: true\n{%- endif %}")
    with pytest.raises(PlaybookError, match="unsafe Job.*keys \\['tty'\\]"):
        render_job(ctx(folder, "debug"), "mine.yaml.j2", 900, {})
    render_job(ctx(folder, "quiet"), "mine.yaml.j2", 900, {})  # the branch not taken changes nothing


def test_a_playbooks_vars_carrying_node_text_are_checked_too(tmp_path: Path) -> None:
    folder = authors_check(tmp_path, "          workingDir: {{ note }}")
    with pytest.raises(PlaybookError, match="unsafe Job.*the value of note"):
        render_job(ctx(folder), "mine.yaml.j2", 900, {"note": INJECTED})
    for plain in ("scratch", "--level=3", "-q"):  # a plain word or a flag is the playbook's, kept as it is
        job = render_job(ctx(folder), "mine.yaml.j2", 900, {"note": plain})
        assert container(job)["workingDir"] == plain
    with pytest.raises(PlaybookError, match="unsafe Job"):
        render_job(ctx(folder), "mine.yaml.j2", 900, {"note": "- x"})  # a list item of its own


@pytest.mark.parametrize(("value", "note"), [("{{ partner.annotations['x'] }}", INJECTED),
                                             ("\"{{ partner.annotations['x'] }}\"", BROKEN_OUT)])
def test_a_pair_template_with_the_partners_annotation_bare_is_refused(tmp_path: Path, value: str, note: str) -> None:
    """In a pair the same command would run on the healthy partner as well."""
    text = (ROOT / "job-templates" / "nccl-pair.yaml.j2").read_text()
    old = '          command: ["pair-allreduce"]\n'
    assert old in text
    (tmp_path / "pair.yaml.j2").write_text(text.replace(old, old + f"          workingDir: {value}\n", 1))
    with pytest.raises(PlaybookError, match="unsafe Job.*partner\\['annotations'\\]\\['x'\\]"):
        render_pair(ctx(tmp_path, partner_note=note), "pair.yaml.j2", 900, {})
    service, job, _ = render_pair(ctx(tmp_path, partner_note="scratch"), "pair.yaml.j2", 900, {})
    assert service is not None and container(job)["command"] == ["pair-allreduce"]


@pytest.mark.parametrize("platform", ["generic", "eks", "aks", "gke"])
@pytest.mark.parametrize("template", SHIPPED)
def test_every_shipped_template_renders_with_hostile_node_text(template: str, platform: str) -> None:
    c = ctx(note=BROKEN_OUT, partner_note=INJECTED, platform=platform)
    if "pair_affinity" in (ROOT / "job-templates" / template).read_text():
        render_pair(c, template, 900, {})
    else:
        render_job(c, template, 900, {}, remediation=template in REMEDIATION, bound=template == "gpu-reset.yaml.j2")


def test_lint_warns_of_a_bare_cluster_value(tmp_path: Path) -> None:
    folder = authors_check(tmp_path, "          workingDir: {{ node.annotations['x'] }}")
    report = lint_paths([folder / "mine.yaml.j2"], Config())
    assert any("node.annotations.x" in w and "without | tojson" in w for w in report.warnings), report.warnings
    report = lint_paths([ROOT / "job-templates"], Config())
    assert not report.warnings and not report.problems, (report.warnings, report.problems)


def test_a_checked_render_is_remembered_only_for_the_same_text_variables_and_limits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """render_checked keeps a render that passed (the admission policy's generator asks for the same
    Jobs for each overlay): asked again with the same template text, variables and limits it renders
    nothing; another text, another value (True is not 1), other limits or a refusal render afresh."""
    from dataclasses import replace

    from sweeper.actions import structure
    from sweeper.templating import JobTemplate, Limits, bounds

    renders: list[dict[str, Any]] = []
    real_render = structure.render_template

    def counted(found: JobTemplate, variables: dict[str, Any]) -> str:
        renders.append(variables)
        return real_render(found, variables)

    monkeypatch.setattr(structure, "render_template", counted)
    monkeypatch.setattr(structure, "CHECKED", structure.Recent(8))
    (tmp_path / "t.yaml.j2").write_text("kind: Job\nvalue: {{ node.annotations.x | tojson }}\nn: {{ n }}\n")
    found = resolve_template("t.yaml.j2", ROOT / "job-templates", tmp_path)
    variables = {"node": node(note="a"), "n": 1}
    first = structure.render_checked(found, variables)
    assert len(renders) == 2  # the real render and the one with placeholders
    assert structure.render_checked(found, dict(variables)) == first and len(renders) == 2
    assert structure.render_checked(found, {**variables, "n": True}) != first and len(renders) == 4
    assert structure.render_checked(replace(found, text=found.text + "# more\n"), variables) and len(renders) == 6
    monkeypatch.setattr(bounds, "LIMITS", Limits(output=1 << 19))
    assert structure.render_checked(found, variables) == first and len(renders) == 8
    # a value that is not plain data (its repr may not say what it holds) is never remembered
    class Opaque:
        def __str__(self) -> str:
            return "o"
    for _ in range(2):
        structure.render_checked(found, {**variables, "n": Opaque()})
    assert len(renders) == 12
    (tmp_path / "b.yaml.j2").write_text("kind: Job\n{% if node.annotations.x == 'a' %}extra: 1\n{% endif %}")
    branch = resolve_template("b.yaml.j2", ROOT / "job-templates", tmp_path)
    for _ in range(2):
        with pytest.raises(PlaybookError, match="unsafe Job"):
            structure.render_checked(branch, variables)
    assert len(renders) == 16, "a refusal is worked out each time"


def test_a_remembered_parse_gives_each_caller_its_own_job(tmp_path: Path) -> None:
    """load_rendered keeps the parse of a rendered text; what one caller changes in its Job (render_job
    sets the remediation account) never reaches the next caller's."""
    from sweeper.actions.jobs import load_rendered

    text = "kind: Job\nspec: {template: {spec: {containers: [{name: c, args: [a]}]}}}\n"
    first = load_rendered(text, tmp_path / "t")
    first["spec"]["template"]["spec"]["serviceAccountName"] = "other"
    first["spec"]["template"]["spec"]["containers"][0]["args"].append("b")
    again = load_rendered(text, tmp_path / "t")
    assert again == {"kind": "Job", "spec": {"template": {"spec": {"containers": [{"name": "c", "args": ["a"]}]}}}}
    assert load_rendered(text, tmp_path / "t", many=True) == [again]
