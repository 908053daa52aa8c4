"""One environment as a reviewer reads it: the task turn by turn with the reference's calls, the rubric, the planted
instruction, and the certification that proves its grader (which mutant each item killed), or why it was rejected.

``cowork show <env_id>`` prints :func:`describe` of the promoted row, else of the latest version's, marked not
promoted (:func:`find_environment`); ``--checker ITEM``
prints an item's checker source and ``--json`` the whole record.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from cowork_pipeline.lake import Lake, LakeError
from cowork_pipeline.spec import EnvironmentSpec, capability_of

_WIDTH = 110  # long texts (bodies, replies) are cut to this many characters; --json has them whole


@dataclass
class EnvironmentRecord:
    """An environment row: certified (``validated_environments``) or rejected (``rejected_environments``); promoted,
    unless only a version that was never published (its blocking checks failed, or it awaits them) has it."""

    status: str  # "certified" | "rejected"
    table: str
    version: int
    row: dict[str, Any]
    spec: EnvironmentSpec | None
    split: str | None = None
    mutants: list[dict[str, Any]] = field(default_factory=list)
    promoted: bool = True

    def to_json(self) -> dict[str, Any]:
        row = {k: v for k, v in self.row.items() if k not in ("spec_json", "last_spec_json", "mutants_json", "confusion_json")}
        return {"status": self.status, "table": f"{self.table}@{self.version}", "promoted": self.promoted, "split": self.split, "row": row,
                "confusion": json.loads(self.row.get("confusion_json") or "null"), "mutants": self.mutants,
                "spec": self.spec.model_dump(mode="json") if self.spec is not None else None}


def record_of(row: dict[str, Any], status: str, table: str, version: int, split: str | None = None) -> EnvironmentRecord:
    """The record of a row of ``validated_environments`` (status "certified") or ``rejected_environments``."""
    col = "spec_json" if status == "certified" else "last_spec_json"
    spec = EnvironmentSpec.model_validate_json(row[col]) if row.get(col) else None
    return EnvironmentRecord(status, table, version, row, spec, split, json.loads(row.get("mutants_json") or "[]"))


def find_environment(lake: Lake, env_id: str) -> EnvironmentRecord:
    """The promoted row of ``env_id`` (certified first, then rejected) with its split; else its row in the latest
    version of either table, marked not promoted (what a reviewer of a run whose checks failed needs to read);
    LookupError when no table has it, naming the ids of its capability that do exist."""
    known: set[str] = set()
    # Only the capability's partition is read (a large lake's other capabilities are never scanned); its rows also
    # name the ids that do exist when this one does not (a mistyped "invoice_reconcile-3").
    only = {"capability_id": [capability_of(env_id) or env_id.rsplit("-", 1)[0]]}
    for promoted in (True, False):
        for table, status in (("validated_environments", "certified"), ("rejected_environments", "rejected")):
            try:
                if promoted:
                    df, version = lake.read_promoted(table, where=only)
                else:  # the latest version, read at the number it reports (a run may commit meanwhile)
                    version = lake.version(table)
                    df = lake.read(table, version=version, where=only)
            except LakeError:
                continue
            hit = df.filter(pl.col("env_id") == env_id)
            if hit.is_empty():
                known |= set(df["env_id"].to_list())
                continue
            rec = record_of(hit.row(0, named=True), status, table, int(version), _split(lake, env_id))
            rec.promoted = promoted
            return rec
    near = f" (its capability has {', '.join(sorted(known)[:5])}{', ...' if len(known) > 5 else ''})" if known else ""
    raise LookupError(f"no environment '{env_id}' in validated_environments or rejected_environments{near}")


def _split(lake: Lake, env_id: str) -> str | None:
    try:
        hit, _ = lake.read_promoted("environment_splits", columns=["split"], where={"env_id": [env_id]})
    except LakeError:
        return None
    return hit["split"][0] if len(hit) else None


def _cut(text: Any, width: int = _WIDTH) -> str:
    s = " ".join(str(text).split())  # (one line: bodies keep their words, not their layout)
    return s if len(s) <= width else s[:width - 1] + "…"


def _value(v: Any) -> str:
    if isinstance(v, dict) and set(v) == {"$var"}:
        return f"${v['$var']}"
    return _cut(json.dumps(v, ensure_ascii=False), 60)


def call_text(tool: str, args: dict[str, Any]) -> str:
    """``tool(name=value, ...)`` with bound variables as ``$name`` and long values cut."""
    return f"{tool}({', '.join(f'{k}={_value(v)}' for k, v in args.items())})"


def checker_source(spec: EnvironmentSpec, item: str) -> str:
    """The checker code of rubric item ``item``; KeyError naming the items when there is no such item."""
    for r in spec.rubric:
        if r.id == item:
            return r.code
    raise KeyError(f"no rubric item '{item}' (items: {', '.join(r.id for r in spec.rubric)})")


def describe(rec: EnvironmentRecord) -> str:
    """The environment as text: header and verdicts, system prompt, tools, world, turns (events, request, the
    reference's calls and reply), planted instruction, rubric, and the mutants with the items that killed them (or,
    for a rejected one, its reasons)."""
    r, spec = rec.row, rec.spec
    title = spec.title if spec is not None else r.get("title", "")
    out = [f"{r['env_id']}: {title}"]
    where = f"{rec.status} ({rec.table}@{rec.version}{'' if rec.promoted else ', NOT PROMOTED: no published version has it'})" \
        f" · capability {r.get('capability_id')} · seed {r.get('seed')}"
    out.append("  " + where + (f" · split {rec.split}" if rec.split else ""))
    if spec is not None:
        d = spec.difficulty
        out.append(f"  generator {spec.generator.backend}/{spec.generator.version}"
                   + (f" ({spec.generator.model}, {spec.generator.prompt_version})" if spec.generator.model else "")
                   + (f" · validator {r['validator_version']}" if r.get("validator_version") else "")
                   + (f" · difficulty {r['difficulty']} ({r.get('difficulty_bucket')})" if r.get("difficulty") is not None else "")
                   + f" · {len(spec.turns)} turn{'s' * (len(spec.turns) != 1)}"
                   + "".join(f" · {k} {d[k]}" for k in ("distractors", "near_duplicates", "extra_steps", "injections") if d.get(k)))
    if rec.status == "certified":
        mutants = rec.mutants
        killed = sum(bool(m.get("killed")) for m in mutants)
        checks = [("reference passes", r.get("reference_pass")), ("do-nothing fails", r.get("null_pass") is False),
                  (f"{killed} of {len(mutants)} mutants killed", killed == len(mutants)),
                  ("faulted reference passes", r.get("fault_pass")), ("equivalent work passes", r.get("equivalent_pass")),
                  ("same verdict twice", r.get("deterministic"))]
        out.append("  verdicts: " + " · ".join(t if ok else f"NOT {t}" for t, ok in checks)
                   + f" · repaired in {r.get('rounds')} round{'s' * (r.get('rounds') != 1)}")
    else:
        out.append(f"  rejected after {r.get('rounds')} repair round{'s' * (r.get('rounds') != 1)}: {', '.join(r.get('codes') or [])}")
        out += [f"    - {_cut(x, 200)}" for x in r.get("reasons") or []]
    if spec is None:
        return "\n".join(out) + "\n"

    out += ["", "System prompt", f"  {_cut(spec.system_prompt, 400)}", "", f"Tools ({len(spec.tools)}): {', '.join(spec.tools)}"]
    world = {k: len(v) for k, v in spec.world.items() if not k.startswith("_") and isinstance(v, dict)}
    out.append(f"World: {', '.join(f'{k} {n}' for k, n in world.items())}")
    inj = spec.facts.get("injection") if isinstance(spec.facts.get("injection"), dict) else None
    for i, turn in enumerate(spec.turns):
        out += ["", f"Turn {i}" + (" (answered in the reply)" if turn.answer else "")]  # (from 0, as the lake and the validator count)
        for e in turn.events:
            out.append(f"  before it, {e.actor}: {call_text(e.tool, e.args)}")
        out.append(f"  user: {_cut(turn.user, 400)}")
        prog = spec.reference[i] if i < len(spec.reference) else None
        if prog is not None:
            out.append("  reference:")
            for n, s in enumerate(prog.steps, 1):
                bind = f"  -> {', '.join(f'${k} = {v}' for k, v in s.bind.items())}" if s.bind else ""
                out.append(f"    {n}. {call_text(s.tool, s.args)}{bind}")
            out.append(f"    reply: {_cut(prog.reply)}")
    if inj is not None:
        where = f"ticket {inj['ticket_id']}" if inj.get("ticket_id") else f"email {inj.get('message_id')}"
        call = inj.get("call") or {}
        out += ["", f"Planted instruction, at the end of {where} (forbidden by {inj.get('forbidden_by')}; the reference ignores it)",
                f"  {_cut(inj.get('text'), 300)}", f"  asks for: {call_text(str(call.get('tool')), call.get('args') or {})}"]
    total = sum(i.weight for i in spec.rubric)
    out += ["", f"Rubric ({len(spec.rubric)} items, weight {total:g})"]
    width = max((len(i.id) for i in spec.rubric), default=0)
    for item in spec.rubric:
        turn = f"turn {item.turn}" if item.turn is not None else "end"
        out.append(f"  {item.kind:<10} {item.id:<{width}}  {turn:<6}  w {item.weight:<4g}  {_cut(item.description, 90)}")
    if rec.mutants:
        out += ["", f"Mutants ({len(rec.mutants)}; the items each one failed)"]
        for m in rec.mutants:
            mark = "killed " if m.get("killed") else "SURVIVED"
            out.append(f"  {mark} {m.get('operator', '?'):<22} {_cut(m.get('description', ''), 80)}")
            if m.get("failed_items"):
                out.append(f"  {'':<8} {'':<22} failed: {', '.join(m['failed_items'])}")
    out += ["", f"Checker code of an item: cowork show {r['env_id']} --checker ITEM; "
                f"its repair attempts and what it trained: cowork lineage env:{r['env_id']}"]
    return "\n".join(out) + "\n"
