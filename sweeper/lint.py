"""`sweeper lint`: playbooks, job templates, profiles and config, every problem as file:line."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from jinja2 import TemplateSyntaxError

from sweeper import profiles, window
from sweeper.actions import ActionContext, load_all
from sweeper.actions.jobs import render_job, template_of
from sweeper.actions.pair import mpijob_pods, render_pair
from sweeper.actions.safety import REMEDIATION_TEMPLATES, SWEEPER_VARS
from sweeper.actions.structure import bare_cluster_values
from sweeper.config import UNPUBLISHED, Config, home, load_config
from sweeper.errors import ConfigError, PlaybookError
from sweeper.playbook.model import Task, load_playbook
from sweeper.policy import parse_policy, policy_path
from sweeper.schema import ConfigProblems, locate, read_yaml, safe_load
from sweeper.templating import ENV

K8S_VERSION = "1.31"
IMAGE_KEYS = ("check_image", "dcgm_image", "nccl_image", "pair_image", "reboot_image")
SAMPLE_NODE = {"name": "ip-10-0-12-34.ec2.internal", "gpus": 8, "uid": "00000000-0000-0000-0000-000000000000",
               "labels": {"kubernetes.io/hostname": "ip-10-0-12-34", "node.kubernetes.io/instance-type": "p5.48xlarge"},
               "annotations": {}, "profile": profiles.Profile("p5.48xlarge", gpus=8, gpu_model="H100", nvlinks=18, nic="efa",
                                                 nics=32, nccl_busbw_min=460.0, mtu=9001,
                                                 fabric_resources={"vpc.amazonaws.com/efa": 32},
                                                 fabric_ifaces=("eth0",)).as_vars()}
SAMPLE_PARTNER = {**SAMPLE_NODE, "name": "ip-10-0-12-35.ec2.internal",
                  "labels": {"kubernetes.io/hostname": "ip-10-0-12-35", "node.kubernetes.io/instance-type": "p5.48xlarge"}}


@dataclass
class Report:
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def kind_of(path: Path, raw: Any) -> str:
    if path.suffix == ".j2":
        return "template"
    if isinstance(raw, dict) and "tasks" in raw:
        return "playbook"
    if isinstance(raw, dict) and "gpus" in raw and path.parent.name == "profiles":
        return "profile"
    if path.parent.name == "profiles":
        return "profile"
    if path.parent.name == "policies" or (isinstance(raw, dict) and "findings" in raw):
        return "policy"
    return "unknown"


def lint_paths(paths: list[Path], cfg: Config, config_file: Path | None = None) -> Report:
    report = Report()
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix in (".yaml", ".yml", ".j2") and f.is_file())
        elif p.exists():
            files.append(p)
        else:
            report.problems.append(f"{p}: no such file or directory")
    if config_file is not None:
        report.checked.append(str(config_file))
        try:
            loaded = load_config(config_file)
        except ConfigError as exc:
            report.problems += _all_lines(exc, str(config_file))
        else:
            report.warnings += [f"{config_file}: {key}: {getattr(loaded, key)} carries the unpublished placeholder "
                                "digest; put the pushed image's digest in its place (docs/install-notes.md: Images)"
                                for key in IMAGE_KEYS if getattr(loaded, key).endswith("@" + UNPUBLISHED)]
            report.warnings += [f"{config_file}: dcgm_images.{major}: {image} carries the unpublished placeholder "
                                "digest; put the pushed image's digest in its place (docs/install-notes.md: Images)"
                                for major, image in sorted(loaded.dcgm_images.items())
                                if image.endswith("@" + UNPUBLISHED)]
            report.problems += ladder_problems(loaded, str(config_file))
            report.problems += reference_problems(loaded, config_file)
    for f in files:
        report.checked.append(str(f))
        if f.suffix == ".j2":
            report.problems += lint_template(f, cfg)
            report.warnings += [f"{f}:{line}: warning: {{{{ {what} }}}} is written without | tojson: a value the node can "
                                "write (an annotation, a label) that holds YAML makes the Job refused at run time"
                                for line, what in bare_cluster_values(f.read_text())]
            continue
        try:
            raw = safe_load(f.read_text())
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            report.problems.append(f"{f}:{mark.line + 1 if mark else 1}: YAML syntax error: {exc.problem}")
            continue
        except (OSError, yaml.YAMLError) as exc:
            report.problems.append(f"{f}:1: {exc}")
            continue
        kind = kind_of(f, raw)
        if kind == "playbook":
            report.problems += lint_playbook(f, cfg)
            report.warnings += playbook_warnings(f)
        elif kind == "profile":
            try:
                profiles.load_profile(f)
            except ConfigError as exc:
                report.problems += _all_lines(exc, str(f))
        elif kind == "policy":
            try:
                parse_policy(raw, str(f))
            except ConfigError as exc:
                report.problems.append(_with_line(str(exc), str(f)))
        else:
            report.problems.append(f"{f}:1: not a playbook (no tasks), a profile, a policy or a job template")
    return report


def ladder_problems(cfg: Config, path: str) -> list[str]:
    """The depth ladder's rungs in order (light first), each naming a playbook that exists."""
    try:
        window.ladder(cfg.depth_ladder)
    except ConfigError as exc:
        return [f"{path}: {exc}"]
    out = []
    for r in cfg.depth_ladder:
        try:
            found = cfg.playbook_file(r["playbook"]).is_file()
        except ConfigError as exc:
            out.append(f"{path}: depth_ladder: {r['name']!r}: {exc}")
            continue
        if not found:
            out.append(f"{path}: depth_ladder: {r['name']!r}: no playbook {r['playbook']!r} (playbook_dir, then the "
                       "shipped ones)")
    return out


PLAYBOOK_KEYS = ("playbook", "light_playbook", "gate_playbook", "soak_playbook", "claims_pair_playbook")
TEMPLATE_KEYS = ("reboot_template", "gpu_reset_template")
DIR_KEYS = {"playbook_dir": "playbooks", "template_dir": "job-templates", "profile_dir": "profiles",
            "policy_dir": "policies"}


def reference_problems(cfg: Config, path: Path) -> list[str]:
    """Every file and folder the config names, looked up where a sweep looks it up (playbooks by
    Config.playbook_file, job templates by name in template_dir then the shipped ones, the policy in
    policies/ or as a path), each missing one an error at its key's line with the closest names there:
    `playbook: sweep-ligth.yaml` makes every sweep and plan exit 2."""
    marks = read_yaml(path, "config")[1]
    out: list[tuple[int, str]] = []

    def problem(loc: tuple[Any, ...], what: str, near: list[str] | None = None) -> None:
        key = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc))
        close = difflib.get_close_matches(str(_at(cfg, loc)), near or [], n=3)
        line = locate(marks, loc)[0]
        out.append((line, f"{path}:{line}: error: {key}: {what}" + (f" (did you mean {', '.join(close)}?)" if close else "")))

    for key, kind in DIR_KEYS.items():
        if getattr(cfg, key) and not Path(getattr(cfg, key)).is_dir():
            problem((key,), f"no folder {getattr(cfg, key)} (where {kind} are looked up)")
    books: list[tuple[Any, ...]] = [(k,) for k in PLAYBOOK_KEYS if getattr(cfg, k) not in ("", "auto")]
    books += [("schedules", i, "playbook") for i, s in enumerate(cfg.schedules) if s.get("playbook")]
    folders = [Path(cfg.playbook_dir)] * bool(cfg.playbook_dir) + [home() / "playbooks"]
    for loc in books:
        try:
            found = cfg.playbook_file(str(_at(cfg, loc))).is_file()
        except ConfigError as exc:
            problem(loc, str(exc))
            continue
        if not found:
            problem(loc, f"no playbook {_at(cfg, loc)!r} in {' or '.join(map(str, folders))}", _names(folders, "*.y*ml"))
    for key in TEMPLATE_KEYS:
        try:
            template_of(ActionContext(config=cfg), getattr(cfg, key))
        except PlaybookError as exc:
            problem((key,), str(exc), _names([Path(cfg.template_dir or "."), home() / "job-templates"], "*.j2"))
    policy = policy_path(cfg.path("policies"), cfg.policy)  # where a sweep's `decide` reads it
    if not policy.is_file():
        problem(("policy",), f"no policy {policy.name!r} in {policy.parent}", _names([cfg.path("policies")], "*.y*ml"))
    return [text for _, text in sorted(out, key=lambda p: p[0])]


def _at(cfg: Config, loc: tuple[Any, ...]) -> Any:
    """The config's value at a key path (`("schedules", 0, "playbook")`)."""
    value: Any = getattr(cfg, loc[0])
    for part in loc[1:]:
        value = value[part]
    return value


def _names(folders: list[Path], pattern: str) -> list[str]:
    return sorted({f.name for d in folders if d.is_dir() for f in d.glob(pattern)})


def _all_lines(exc: ConfigError, path: str) -> list[str]:
    """Every problem a checked file had (the loader reports them all at once)."""
    if isinstance(exc, ConfigProblems):
        return [_with_line(p, path) for p in exc.problems]
    return [_with_line(str(exc), path)]


def _with_line(message: str, path: str) -> str:
    """Every problem starts with file:line; a message that names only the file gets line 1."""
    if re.match(re.escape(path) + r":\d+", message):
        return message
    if message.startswith(path + ":"):
        return f"{path}:1:{message[len(path) + 1:]}"
    return f"{path}:1: {message}"


def lint_playbook(path: Path, cfg: Config) -> list[str]:
    problems: list[str] = []
    try:
        pb = load_playbook(path, load_all(), problems)
    except PlaybookError as exc:
        return problems + [_with_line(str(exc), str(path))]
    for t in pb.all_tasks():
        if t.action in ("run_job", "run_pair_job"):
            name = t.args.get("template", "nccl-pair.yaml.j2" if t.action == "run_pair_job" else None)
            if isinstance(name, str) and "{{" not in name:
                try:  # found as the runtime finds it: by name, inside its folder
                    template_of(ActionContext(config=cfg), name)
                except PlaybookError as exc:
                    problems.append(f"{t.where}: {t.action}: {exc}")
            given = t.args.get("vars")
            clash = sorted(k for k in given if k in SWEEPER_VARS) if isinstance(given, dict) else []
            if clash:
                problems.append(f"{t.where}: {t.action}: vars may not set {', '.join(clash)}: Sweeper sets them")
    return [_with_line(p, str(path)) for p in problems]


TAKES = ("taint", "cordon", "drain")  # actions that take a node out of scheduling or empty it
GIVES = ("untaint", "uncordon", "hand_back")  # actions that hand it back


def playbook_warnings(path: Path) -> list[str]:
    """A task that takes the node with no enclosing `always` that hands it back: when the play
    breaks after it, the node stays out (Ansible's own advice for cleanup is `always`:
    https://docs.ansible.com/ansible/latest/playbook_guide/playbooks_blocks.html)."""
    try:
        pb = load_playbook(path, load_all())
    except PlaybookError:
        return []  # reported as a problem already
    return [f"{t.where}: warning: {t.action} takes the node, but no enclosing block's `always` hands it back "
            f"({', '.join(GIVES)}); if the play breaks, the node stays out until `sweeper run` or a sweep's "
            "reconcile gives it back" for t in _unguarded(pb.tasks, False)]


def _unguarded(tasks: tuple[Task, ...], guarded: bool) -> list[Task]:
    out: list[Task] = []
    for t in tasks:
        if t.is_block:
            inner = guarded or any(x.action in GIVES for a in t.always for x in a.walk())
            out += _unguarded(t.block, inner) + _unguarded(t.rescue, inner) + _unguarded(t.always, guarded)
        elif t.action in TAKES and not guarded:
            out.append(t)
    return out


def lint_template(path: Path, cfg: Config) -> list[str]:
    text = path.read_text()
    try:
        ENV.parse(text)
    except TemplateSyntaxError as exc:
        return [f"{path}:{exc.lineno}: template syntax error: {exc.message}"]
    # The runtime's own rules (sweeper.actions.safety), with this config's images, namespace and
    # tolerations; a shipped remediation template is rendered as the remediation renders it.
    ctx = ActionContext(config=replace(cfg, template_dir=str(path.parent)),
                        node=SAMPLE_NODE, partner=SAMPLE_PARTNER, run_id="sw-lint-0000")
    try:
        if "pair_affinity" in text:  # a pair template: a Service, then a Job; or an MPIJob
            service, job, _ = render_pair(ctx, path.name, 900, {})
            docs = mpijob_pods(job) if service is None else [service, job]
        else:
            docs = [render_job(ctx, path.name, 900, {}, remediation=path.name in REMEDIATION_TEMPLATES,
                               bound=path.name == cfg.gpu_reset_template)]
    except PlaybookError as exc:
        return [_with_line(str(exc), str(path))]
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            return [f"{path}:{_line_of(text, exc.path)}: {where or 'the ' + str(doc.get('kind'))}: {exc.message}"]
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
            return [f"{path}:1: cannot validate against Kubernetes {K8S_VERSION}: {exc}"]
    return []


def _line_of(text: str, path: Any) -> int:
    """The template line that most likely holds the failing field: the last name in its path."""
    names = [p for p in path if isinstance(p, str)]
    for name in reversed(names):
        for i, line in enumerate(text.splitlines(), 1):
            if re.match(rf"\s*-?\s*{re.escape(name)}\s*:", line):
                return i
    return 1
