"""Job templates by name: found in the author's folder or the shipped job-templates/, never
outside them, and rendered whole with errors that name the file and line, never its text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError, UndefinedError

from sweeper.errors import PlaybookError
from sweeper.templating.deadline import _guarded
from sweeper.templating.environment import ENV
from sweeper.templating.rendering import _in_worker, _needed, _template, _to_worker


@dataclass(frozen=True)
class JobTemplate:
    """A job template found by name: its file, its text, and whether it is one Sweeper ships
    (only a shipped template may be a privileged remediation Job)."""

    name: str
    path: Path
    text: str
    shipped: bool


def resolve_template(name: str, shipped: Path, author: Path | None = None) -> JobTemplate:
    """The template `name` (a `.j2` file name, or a relative path inside a folder), found in the
    author's folder (config `template_dir`) first, then in the shipped job-templates/. An absolute
    path, a `..`, or a file whose real path (symlinks followed) leaves its folder is refused, and
    the refusal never shows what the file holds."""
    why = _bad_name(name)
    if why:
        raise PlaybookError(f"job template {name!r}: {why}")
    folders = [(author, False)] if author is not None and author.resolve() != shipped.resolve() else []
    for folder, is_shipped in [*folders, (shipped, True)]:
        assert folder is not None
        candidate = folder / name
        if not candidate.exists() and not candidate.is_symlink():
            continue
        root, real = folder.resolve(), candidate.resolve()
        if not real.is_relative_to(root):
            raise PlaybookError(f"job template {name!r}: {candidate} leaves its folder {folder} (it points at another "
                                "place); a template must be a file inside the folder")
        if not real.is_file():
            raise PlaybookError(f"job template {name!r}: {candidate} is not a file")
        try:
            text = real.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PlaybookError(f"job template {name!r}: cannot read {candidate}: {type(exc).__name__}") from None
        return JobTemplate(name, candidate, text, is_shipped and folder.resolve() == shipped.resolve())
    where = " or ".join(str(f) for f, _ in [*folders, (shipped, True)] if f is not None)
    raise PlaybookError(f"job template {name!r}: not found in {where}")


def _bad_name(name: str) -> str:
    if not name or "\x00" in name or "\\" in name:
        return "not a template name"
    parts = PurePosixPath(name)
    if parts.is_absolute() or name.startswith("~"):
        return "an absolute path; name a template of job-templates/ or of the config's template_dir"
    if ".." in parts.parts:
        return "'..' leaves the template folder; name a template inside it"
    if not name.endswith(".j2"):
        return "a job template's name ends in .j2"
    return ""


def render_template(template: JobTemplate, variables: dict[str, Any]) -> str:
    """A job template rendered whole. Errors name the file and line, never its text: a file that is
    not a template (or holds a secret) is not echoed back."""
    where = str(template.path)
    if _to_worker():
        done, out = _in_worker("template", (template, _needed(template.text, variables)), where,
                               f"<the template {template.name}>")
        if done:
            return str(out)
    try:
        compiled = _template(template.text)  # compiled once per text: the worker lives long
    except TemplateSyntaxError as exc:
        raise PlaybookError(f"{where}:{exc.lineno}: template syntax error: {exc.message}") from None
    try:
        return str(_guarded(where, f"<the template {template.name}>",
                            lambda: ENV.concat(compiled.root_render_func(compiled.new_context(variables)))))
    except UndefinedError as exc:
        raise PlaybookError(f"{where}: undefined variable: {exc.message}") from None
    except TemplateError as exc:
        raise PlaybookError(f"{where}: template error: {type(exc).__name__}") from None
