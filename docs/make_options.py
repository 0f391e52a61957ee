"""Write docs/options.md, the options reference, from the docstrings of `HACPOConfig`, `SharingFields` and `AgentSpec`.

    python docs/make_options.py        # or: make docs

The docstrings of `HACPOConfig` (src/hacpo_trl/config.py), of `SharingFields` (src/hacpo_trl/sharing/settings.py, the
per-learner sharing settings `HACPOConfig` inherits; its entries go where `HACPOConfig`'s docstring names it) and of
`AgentSpec` (src/hacpo_trl/run/resolve.py) are the one home of what each option means; this file only reformats them
(read with `ast`, so nothing is imported: no torch, no trl). A field declared in `HACPOConfig` or `SharingFields`
without an entry in a docstring is listed at the end with its one-line `help`. `tests/test_docs.py` fails when the committed
docs/options.md differs from what this script writes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "src" / "hacpo_trl" / "config.py"
SHARING = ROOT / "src" / "hacpo_trl" / "sharing" / "settings.py"
AGENT = ROOT / "src" / "hacpo_trl" / "run" / "resolve.py"
OPTIONS = ROOT / "docs" / "options.md"
# a HACPOConfig entry: "name (`type`, *optional*, defaults to `x`):", or "a / b (...)" for two names at once
ENTRY = re.compile(r"^(?P<names>\w+(?: / \w+)*) \((?P<kind>.+)\):$")
# the line of HACPOConfig's docstring where the entries of an inherited class's docstring go
INHERITED = re.compile(r"fields of :class:`~hacpo_trl\.sharing\.settings\.(?P<cls>\w+)`")
ARG = re.compile(r"^(?P<name>\w+): (?P<text>.*)$")  # an AgentSpec entry: "name: what it is"


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)


def _paragraph(lines: list[str]) -> str:
    """One Markdown paragraph: reST's ``code`` and :func:`~x.y` roles as Markdown code."""
    text = " ".join(line.strip() for line in lines if line.strip())
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def config_entries(
    doc: str, inherited: dict[str, str] | None = None
) -> list[tuple[str, list[tuple[list[str], str, str]]]]:
    """HACPOConfig's `Parameters:` as [(group, [(names, kind, text), ...]), ...], in the docstring's order; a line
    naming a class of ``inherited`` (name -> docstring) stands for that docstring's entries."""
    groups: list[tuple[str, list[tuple[list[str], str, list[str]]]]] = []
    lines = doc.split("Parameters:", 1)[1].splitlines()
    for name, text in (inherited or {}).items():
        at = next(i for i, line in enumerate(lines) if (m := INHERITED.search(line)) and m["cls"] == name)
        lines[at : at + 1] = text.split("Parameters:", 1)[1].splitlines()
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if indent == 4 and stripped.startswith("> "):
            groups.append((stripped[2:], []))
            continue
        match = ENTRY.match(stripped) if indent == 4 else None
        if match:
            if not groups:
                groups.append(("Options", []))
            groups[-1][1].append((match["names"].split(" / "), match["kind"], []))
        elif groups and groups[-1][1] and stripped:
            groups[-1][1][-1][2].append(stripped)
    return [(g, [(names, kind, _paragraph(text)) for names, kind, text in entries]) for g, entries in groups]


def agent_entries(doc: str) -> list[tuple[str, str]]:
    """AgentSpec's `Args:` as [(name, text), ...]."""
    out: list[tuple[str, list[str]]] = []
    for line in doc.split("Args:", 1)[1].splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        match = ARG.match(stripped) if indent == 4 else None
        if match:
            out.append((match["name"], [match["text"]]))
        elif out and stripped:
            out[-1][1].append(stripped)
    return [(name, _paragraph(text)) for name, text in out]


def _declared(cls: ast.ClassDef) -> dict[str, tuple[str, str]]:
    """The fields a class body declares: name -> (default as written, `help` metadata or '')."""
    fields = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)) or node.target.id[0] == "_":
            continue
        default, help_text = "", ""
        if isinstance(node.value, ast.Call):
            for keyword in node.value.keywords:
                if keyword.arg == "default":
                    default = ast.unparse(keyword.value)
                if keyword.arg == "metadata" and isinstance(keyword.value, ast.Dict):
                    for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "help" and isinstance(value, ast.Constant):
                            help_text = value.value
        elif node.value is not None:
            default = ast.unparse(node.value)
        fields[node.target.id] = (default, help_text)
    return fields


def render(config_source: str, agent_source: str, sharing_source: str) -> str:
    """options.md from the source of config.py (`HACPOConfig`), resolve.py (`AgentSpec`) and sharing_settings.py
    (`SharingFields`)."""
    config, spec = _class(ast.parse(config_source), "HACPOConfig"), _class(ast.parse(agent_source), "AgentSpec")
    learner = _class(ast.parse(sharing_source), "SharingFields")
    groups = config_entries(ast.get_docstring(config) or "", {learner.name: ast.get_docstring(learner) or ""})
    out = [
        "# Options reference",
        "",
        "<!-- Written by `python docs/make_options.py` (`make docs`) from the docstrings of `HACPOConfig` "
        "(src/hacpo_trl/config.py) and `AgentSpec` (src/hacpo_trl/run/resolve.py); edit those, not this file. -->",
        "",
        "Every field below is a key of a YAML recipe, a `--flag` of `hacpo-train` and an argument of `HACPOConfig`. "
        "Every field of TRL's `GRPOConfig` and transformers' `TrainingArguments` works as well (`hacpo-train "
        "--help-all` lists them). Settings an agent may set for itself go into its entry under `agents:` "
        "([`AgentSpec`](#agentspec-one-agent-of-a-run)); `overrides:` takes any other field for that agent only.",
        "",
        "Groups: "
        + ", ".join(f"[{g}](#{_slug(g)})" for g, _ in groups)
        + ", [AgentSpec](#agentspec-one-agent-of-a-run).",
        "",
    ]
    documented: set[str] = set()
    for group, entries in groups:
        out += [f"## {group}", ""]
        for names, kind, text in entries:
            documented.update(names)
            out += [f"### {' / '.join(f'`{n}`' for n in names)}", "", f"{kind}", "", text, ""]
    declared = {**_declared(learner), **_declared(config)}
    missing = {name: found for name, found in declared.items() if name not in documented}
    if missing:
        out += [
            "## Other fields",
            "",
            "Declared by `HACPOConfig` without an entry in its docstring (their `help`):",
            "",
        ]
        out += [f"- `{name}` (default `{default}`): {text or '(no help)'}" for name, (default, text) in missing.items()]
        out += [""]
    out += ["## AgentSpec: one agent of a run", ""]
    out += [f"- `{name}`: {text}" for name, text in agent_entries(ast.get_docstring(spec) or "")]
    return "\n".join(out).rstrip("\n") + "\n"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def main() -> int:
    OPTIONS.write_text(render(CONFIG.read_text(), AGENT.read_text(), SHARING.read_text()))
    print(f"wrote {OPTIONS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
