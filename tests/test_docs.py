"""The commands the README and docs/ show are commands the CLI has: every `cowork <subcommand> --option` (and
`scripts/run.sh --option`, which passes them to `cowork run`) they write is an option of that subcommand (or of `cowork`
itself), so a renamed or dropped option cannot leave the docs behind."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from assets.cli import parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# "cowork <sub>" then the rest of that command: up to the end of its code span, line, table cell or shell comment
# (scripts/run.sh passes its arguments to `cowork run`)
COMMAND = re.compile(r"\b(?:cowork (?:--home \S+ )?([a-z]+)|scripts/(run)\.sh)\b([^`\n#|]*)")
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _subcommands() -> tuple[dict[str, argparse.ArgumentParser], set[str]]:
    p = parser()
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices), set(p._option_string_actions)


def commands_in(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, the options written after it) for every `cowork <word>` (or scripts/run.sh) in ``text``."""
    return [(m.group(1) or m.group(2), OPTION.findall(m.group(3))) for m in COMMAND.finditer(text)]


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(doc file, subcommand, options) for every command in the docs."""
    return [(doc.name, sub, options) for doc in DOCS for sub, options in commands_in(doc.read_text(encoding="utf-8"))]


def test_every_documented_cowork_command_and_option_exists() -> None:
    subs, top = _subcommands()
    found = documented_commands()
    assert {s for _, s, _ in found} >= {"run", "ui", "eval", "serve", "lineage", "show", "vacuum"}  # the scan finds them
    wrong = []
    for doc, sub, options in found:
        if sub not in subs:
            wrong.append(f"{doc}: `cowork {sub}` is no subcommand (there are {', '.join(sorted(subs))})")
            continue
        known = set(subs[sub]._option_string_actions) | top
        wrong += [f"{doc}: `cowork {sub}` has no option {o}" for o in options if o not in known]
    assert not wrong, "\n".join(wrong)


def test_the_scan_reads_options_as_the_docs_write_them() -> None:
    # what the scan sees in the forms the docs use: a code span, a shell line with a comment, a bracketed synopsis
    text = ("Run `cowork run --catalog DIR --injections some` first.\n"
            ".venv/bin/cowork vacuum [--dry-run] [--retain-hours 168]   # --not-an-option\n"
            "| `cowork show <env_id>` | --json elsewhere |\n"
            "`bash scripts/run.sh --profile smoke`\n")
    assert commands_in(text) == [("run", ["--catalog", "--injections"]), ("vacuum", ["--dry-run", "--retain-hours"]), ("show", []),
                   ("run", ["--profile"])]
