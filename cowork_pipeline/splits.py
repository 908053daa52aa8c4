"""Train / held-out splits, disjoint by capability lineage.

Two held-out sets: ``heldout_env`` (unseen worlds and seeds of training capabilities) and
``heldout_capability`` (capabilities marked held-out: nothing derived from them may reach
training). The split of an environment depends only on its id and the split seed, so
adding environments never moves existing ones between splits; except that environments posing the same task
(:func:`task_fingerprint`: the same values and calls, in any words) share one split, that of the first of them by id,
so that no held-out environment is a task the student was trained on.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

import polars as pl

from cowork_pipeline.capabilities import Capability

SPLITS = ("train", "heldout_env", "heldout_capability")


def _unit(env_id: str, seed: int) -> float:
    return int.from_bytes(hashlib.sha256(f"{seed}:{env_id}".encode()).digest()[:8], "big") / 2**64


# The values a text gives, whatever its words: an email address, an ISO date (and time), a time of day, an identifier
# (INV-1458, tkt_12, #eng-team), a number, and a capitalised word (a name, a city, a title; see text_values)
_PROSE_WORDS = 5  # a string of this many words or more is prose, judged by its values; a shorter one (a name, a title, a query) is a value
_CAPITALISED = r"\b[A-Z][\w'\u2019-]*"
_VALUE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\d{4}-\d{2}-\d{2}(?:T[\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)?|(?<![\d:])\d{1,2}:\d{2}(?![\d:])"
                    r"|#[\w-]+|\b[A-Za-z]+[-_]?\d[\w-]*|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|" + _CAPITALISED)


def _opens_sentence(text: str, at: int) -> bool:
    # whether the word at ``at`` opens a sentence (a line, a clause after a colon: "Quick one: Cancel the ..."),
    # read back over spaces, quotes and brackets only
    while at > 0 and text[at - 1] in " \t\"'\u201c(":
        at -= 1
    return at == 0 or text[at - 1] in ".!?:;\n"


def _pronoun(word: str) -> bool:
    return word == "I" or word.startswith(("I'", "I\u2019"))  # (I, I'm, I'll: capitalised, but no name)


def _capitalised(text: str, opening: bool) -> set[str]:
    # the capitalised words of ``text``, with or without those that open a sentence (not the pronoun)
    return {m.group(0).lower() for m in re.finditer(_CAPITALISED, text)
            if not any(c.isdigit() for c in m.group(0)) and not _pronoun(m.group(0)) and (opening or not _opens_sentence(text, m.start()))}


def names_in(spec: Any) -> frozenset[str]:
    """The words ``spec`` (any JSON value: an environment's world and events) writes as names: every capitalised word
    of a short string (a person's, a company's, a meeting's name) and of prose where it does not open a sentence."""
    out: set[str] = set()
    stack = [spec]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and any(c.isupper() for c in v):
            out |= _capitalised(v, opening=len(v.split()) < _PROSE_WORDS)
    return frozenset(out)


def text_values(text: str, names: frozenset[str] = frozenset()) -> list[str]:
    """The values ``text`` gives (:data:`_VALUE`), lower-cased, numbers as plain figures ("19,000" and "19000.00" are
    one), each once, sorted: two wordings of one request give the same list. A capitalised word is a value only
    among ``names`` (:func:`names_in` of the environment's world), wherever it stands: "Kwame" is; "Please" opening a
    sentence is not, nor an ordinary word a rewording capitalises ("this is Urgent")."""
    out: set[str] = set()
    for m in _VALUE.finditer(text):
        t = m.group(0)
        if t[0].isupper() and not any(c.isdigit() for c in t):
            if _pronoun(t) or t.lower() not in names:
                continue  # (the pronoun, a capitalised word that names nothing in the world: wording, not a value)
        elif t[0].isdigit() and re.fullmatch(r"[\d,]+(?:\.\d+)?", t):
            t = format(float(t.replace(",", "")), ".2f")
        out.add(t.lower())
    return sorted(out)


def task_fingerprint(spec_json: str) -> str:
    """The task as a student meets it, whatever its words: the values of the user's turns, the world's events between
    them, and the reference's calls (tool and arguments) and answers, with prose (a message's body, an answer) read
    for its values (:func:`text_values`) and the world's record ids left out, as are where in a list of results the
    reference found its record and the replies to turns that ask nothing. Environments alike in these differ only in
    words or in records the reference never had to tell apart (a world drawn again around the same question and
    answer, an LLM's rewording of a draft it wrote before), so a student that learnt one by heart passes the other:
    they are one task, not a seen and an unseen one."""
    spec = json.loads(spec_json)
    ids = {rid for name, coll in (spec.get("world") or {}).items() if not name.startswith("_") and isinstance(coll, dict) for rid in coll}
    ids |= {e["args"]["id"] for t in spec.get("turns") or [] for e in t.get("events") or []
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get("id"), str)}

    def norm(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: norm(x) for k, x in sorted(v.items())}
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, str):
            return "<id>" if v in ids else text_values(v, names) if len(v.split()) >= _PROSE_WORDS else " ".join(v.lower().split())
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return format(float(v), ".2f")
        return v

    # (names are what the world names: the turns' and the reference's own capitals are wording)
    names = names_in([spec.get("world") or {}, [t.get("events") or [] for t in spec.get("turns") or []]])
    turns = spec.get("turns") or []
    asked = [bool(t.get("answer")) for t in turns]
    blob = {"turns": [{"user": text_values(t.get("user") or "", names), "events": norm(t.get("events") or []), "answer": a}
                      for t, a in zip(turns, asked)],
            "reference": [{"steps": [[st.get("tool"), norm(st.get("args") or {})] for st in r.get("steps") or []],
                           "answer": text_values(r.get("reply") or "", names) if i < len(asked) and asked[i] else None}
                          for i, r in enumerate(spec.get("reference") or [])]}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:20]


def with_tasks(environments: pl.DataFrame) -> pl.DataFrame:
    """``environments`` with a ``task`` column, the :func:`task_fingerprint` of each ``spec_json`` (computed once:
    a frame that has the column already is returned as it is)."""
    if "task" in environments.columns:
        return environments
    return environments.with_columns(task=pl.col("spec_json").map_elements(task_fingerprint, return_dtype=pl.String))


def assign_splits(environments: pl.DataFrame, capabilities: Mapping[str, Capability], heldout_env_fraction: float = 0.15,
                  seed: int = 0) -> pl.DataFrame:
    """One split per environment (``env_id``, ``capability_id``; with ``spec_json`` or ``task`` (:func:`with_tasks`),
    environments posing the same task go together: the split of the first by id, and never training when one of
    them is a held-out capability's)."""
    ids = environments.select("env_id", "capability_id").rows()
    group: dict[str, str] = {env_id: env_id for env_id, _ in ids}  # env -> the first env (by id) of its task
    held_task: set[str] = set()  # tasks that a held-out capability's environment poses
    if "spec_json" in environments.columns or "task" in environments.columns:
        first: dict[str, str] = {}
        prints = dict(with_tasks(environments).select("env_id", "task").iter_rows())
        for env_id in sorted(prints):
            group[env_id] = first.setdefault(prints[env_id], env_id)
        held_task = {group[e] for e, c in ids if c in capabilities and capabilities[c].heldout}
    rows = []
    for env_id, cap_id in ids:
        cap = capabilities.get(cap_id)
        if cap is None:
            raise KeyError(f"environment {env_id} comes from capability '{cap_id}', which is not in the catalog")
        if cap.heldout:
            split = "heldout_capability"
        elif group[env_id] in held_task:
            split = "heldout_env"  # (its task is a held-out capability's: it may not reach training)
        else:
            split = "heldout_env" if _unit(group[env_id], seed) < heldout_env_fraction else "train"
        rows.append({"env_id": env_id, "capability_id": cap_id, "split": split})
    return pl.DataFrame(rows, schema={"env_id": pl.String, "capability_id": pl.String, "split": pl.String}).sort("env_id")


def repeated_tasks(environments: pl.DataFrame, splits: pl.DataFrame) -> pl.DataFrame:
    """Per environment (``env_id`` and ``spec_json`` or ``task``; its ``split``): its task fingerprint, how many
    environments pose it, and whether a held-out one poses a task that a training environment poses too
    (``seen_in_training``)."""
    df = with_tasks(environments).select("env_id", "task").join(splits.select("env_id", "split"), on="env_id")
    trained = set(df.filter(pl.col("split") == "train")["task"])
    return (df.with_columns(task_envs=pl.len().over("task"),
                            seen_in_training=(pl.col("split") != "train") & pl.col("task").is_in(list(trained)))
            .sort("env_id"))


def disjointness(splits: pl.DataFrame) -> pl.DataFrame:
    """One row per capability with the splits it appears in; a held-out capability must appear in no other split."""
    return (splits.group_by("capability_id").agg(pl.col("split").unique().sort().alias("splits"))
            .with_columns(leak=pl.col("splits").list.contains("heldout_capability") & (pl.col("splits").list.len() > 1))
            .sort("capability_id"))
