"""Drafts, diagnostics and the generator-backend protocol shared by every backend."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from cowork_pipeline.capabilities import Capability
from cowork_pipeline.spec import EnvironmentSpec, attempt_id


@dataclass(frozen=True)
class Diagnostic:
    """One finding of the validator; ``code`` is stable (the repair loop and telemetry key on it)."""

    code: str
    message: str
    item: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "item": self.item, "detail": self.detail}


@dataclass
class Draft:
    capability_id: str
    seed: int
    attempt: int  # 0 for the first draft, n for the n-th revision
    backend: str
    spec: EnvironmentSpec | None  # None when the backend's output could not be parsed
    knobs: dict[str, Any] = field(default_factory=dict)  # the backend's repair state
    raw: str | None = None  # raw model output (LLM backends)
    parse_diagnostics: list[Diagnostic] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)  # what this revision changed, for the repair log
    cost: dict[str, float] = field(default_factory=dict)  # tokens / seconds spent producing it
    capability: Capability | None = field(default=None, repr=False)  # what it was drafted from (revise needs it)

    @property
    def draft_id(self) -> str:
        return attempt_id(self.capability_id, self.seed, self.attempt)


class GeneratorBackend(Protocol):
    name: str
    version: str

    def draft(self, capability: Capability, seed: int) -> Draft: ...

    def revise(self, draft: Draft, diagnostics: list[Diagnostic]) -> Draft: ...

    # Optional: ``unsupported(capability) -> str | None``, why a capability cannot be drafted at all, and
    # ``concurrency: int``, how many draft/revise calls may run at once (see ``repair.synthesize``).
