"""docs/actions.md, generated from the action registry (the one place arguments are declared).

    python -m sweeper.actions.docs > docs/actions.md
"""

from __future__ import annotations

from sweeper.actions import load_all


def markdown() -> str:
    lines = ["# Playbook actions", "",
             "Generated from the action registry by `python -m sweeper.actions.docs`; a test keeps it true.", "",
             "Every task also takes the common keywords: `name`, `when`, `loop` (with `loop_control`), `register`, "
             "`until`/`retries`/`delay`, `changed_when`, `failed_when`, `ignore_errors`, `timeout`, `tags`, "
             "`vars`; `block`/`rescue`/`always` group tasks and `include` pulls in another playbook.", ""]
    for name, act in sorted(load_all().items()):
        needs = " Needs a target node (`--node`)." if act.needs_node else ""
        lines += [f"## `{name}`", "", act.help + needs, ""]
        if act.free_form:
            lines += ["Arguments: any names; each becomes a variable.", ""]
            continue
        if not act.args:
            lines += ["No arguments.", ""]
            continue
        lines += ["| argument | type | required | default | meaning |", "|---|---|---|---|---|"]
        for a in act.args:
            default = "" if a.required or a.default is None else f"`{a.default}`"
            meaning = a.help + (f" One of: {', '.join(f'`{c}`' for c in a.choices if c is not None)}."
                                if a.choices else "")
            if a.raw:
                meaning = meaning.rstrip(".") + ". Not templated: evaluated by the action."
            lines.append(f"| `{a.name}` | {a.type_name} | {'yes' if a.required else ''} | {default} | {meaning.strip()} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
