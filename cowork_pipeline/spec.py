"""The environment document: everything needed to run, grade and audit one task.

A spec is data (pydantic, JSON-serializable): the world's initial records, the user
turns and the world events that happen between them, the tools exposed, the rubric
(checker *source text* per item) and an executable reference program. Canonical JSON
(sorted keys, no whitespace) makes "same seed -> byte-identical environment" testable.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Event(_Model):
    """A change to the world that is not the agent's doing (an email arrives, a colleague edits a record)."""

    tool: str
    args: dict[str, Any]
    actor: str = "world"


class Turn(_Model):
    user: str
    events: list[Event] = Field(default_factory=list)  # applied before this turn's user message
    # The user asked a question: the agent's final reply of this turn is the deliverable, and graded (elsewhere
    # the reply is a courtesy and never judged). The validator mutates the answer as it mutates a sent message.
    answer: bool = False


class RubricItem(_Model):
    id: str
    kind: Literal["completion", "safety"]
    description: str
    code: str  # Python source defining ``check(ev) -> bool``; run in the sandbox
    weight: float = 1.0
    turn: int | None = None  # for multi-turn tasks: the turn after which this item must hold (per-turn reward)


class Step(_Model):
    """One tool call of a program. Argument values may be ``{"$var": name}``; ``bind`` maps a
    name to a path into this call's result (``"0.id"``), so later steps use observed values."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    bind: dict[str, str] = Field(default_factory=dict)


class ProgramTurn(_Model):
    steps: list[Step] = Field(default_factory=list)
    reply: str = "Done."


class GeneratorInfo(_Model):
    backend: str
    version: str
    prompt_version: str | None = None
    attempt: int = 0
    model: str | None = None


class EnvironmentSpec(_Model):
    env_id: str
    capability_id: str
    seed: int
    title: str
    multi_turn: bool
    generator: GeneratorInfo
    difficulty: dict[str, Any] = Field(default_factory=dict)
    system_prompt: str
    world: dict[str, dict[str, dict[str, Any]]]
    tools: list[str]
    turns: list[Turn]
    rubric: list[RubricItem]
    reference: list[ProgramTurn]
    safety: list[str] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)  # the generator's ground truth (targets, distractors) for audits

    def to_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, text: str) -> "EnvironmentSpec":
        return cls.model_validate_json(text)

    def content_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------------------------------- ids
def environment_id(capability_id: str, seed: int) -> str:
    """The id of the environment a capability's ``seed`` draws, whichever backend drafts it: ``<cap>-000123``."""
    return f"{capability_id}-{seed:06d}"


def attempt_id(capability_id: str, seed: int, attempt: int) -> str:
    """The id of one drafting attempt (round) of that environment: ``<cap>-s123-a1``."""
    return f"{capability_id}-s{seed}-a{attempt}"


_ID_FORMS = (re.compile(r"^(.+)-\d{6}$"), re.compile(r"^(.+)-s\d+-a\d+$"))


def capability_of(any_id: str) -> str | None:
    """The capability (partition) of an environment id or an attempt id; None for any other string."""
    m = next((m for m in (p.match(any_id) for p in _ID_FORMS) if m), None)
    return m.group(1) if m else None
