"""The repair loop: generate, execute, fix the spec.

Every draft is certified; a failing draft's diagnostics go back to its backend's
``revise`` for up to ``max_rounds`` revisions. Every attempt is logged (round,
diagnostics, what changed), so repair telemetry (survival, success by round, cost per
surviving environment) is computed from data, not estimated.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

from cowork_pipeline.capabilities import Capability
from cowork_pipeline.synthesis.draft import Diagnostic, Draft, GeneratorBackend
from cowork_pipeline.validation.certify import Certification, Validator


@dataclass
class Attempt:
    draft: Draft
    certification: Certification
    seconds: float

    def log_row(self) -> dict[str, Any]:
        d, c = self.draft, self.certification
        return {
            "attempt_id": d.draft_id, "env_id": c.env_id, "capability_id": d.capability_id, "seed": d.seed, "round": d.attempt,
            "backend": d.backend, "certified": c.certified, "codes": sorted({x.code for x in c.diagnostics}),
            "diagnostics": [x.to_dict() for x in c.diagnostics], "changes": list(d.changes), "kill_rate": c.kill_rate,
            "seconds": round(self.seconds, 6), "llm_tokens": float(d.cost.get("llm_tokens", 0.0)),
        }


@dataclass
class Outcome:
    capability_id: str
    seed: int
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]

    @property
    def accepted(self) -> bool:
        return self.final.certification.certified

    @property
    def rounds(self) -> int:
        return len(self.attempts) - 1

    def rejection_reasons(self) -> list[Diagnostic]:
        return [] if self.accepted else list(self.final.certification.diagnostics)


def synthesize(backend: GeneratorBackend, validator: Validator, capability: Capability, seeds: Sequence[int],
               max_rounds: int = 3, batch: int = 64, log: Callable[[str], None] | None = None) -> list[Outcome]:
    """Draft one environment per seed and repair each up to ``max_rounds`` times.

    A backend with ``concurrency`` > 1 (a remote model: its latency dominates) gets that many draft or
    revise requests in flight at once; outcomes and attempts are the same, in the same order, either way.
    A backend that cannot draft the capability at all (``unsupported``) raises ValueError before any draft.
    ``log`` receives one line per round (a model's rounds take minutes: this is the progress a user sees)."""
    check = getattr(backend, "unsupported", None)
    why = check(capability) if check is not None else None
    if why:
        raise ValueError(why)
    outcomes = [Outcome(capability.id, s) for s in seeds]
    t_round = time.perf_counter()
    drafts = _call_all(backend, [partial(_safe, partial(backend.draft, capability, o.seed), capability, o.seed, backend)
                                 for o in outcomes])
    pending = list(zip(outcomes, drafts))
    for round_ in range(max_rounds + 1):
        if not pending:
            break
        failed: list[tuple[Outcome, Draft, Certification]] = []
        for i in range(0, len(pending), batch):
            chunk = pending[i:i + batch]
            t0 = time.perf_counter()
            certs = validator.certify_many([d for _, d in chunk])
            per = (time.perf_counter() - t0) / len(chunk)
            for (o, d), c in zip(chunk, certs):
                o.attempts.append(Attempt(d, c, per + d.cost.get("seconds", 0.0)))
                if not c.certified and round_ < max_rounds:
                    failed.append((o, d, c))
        if log is not None:
            certified = sum(o.accepted for o, _ in pending)
            rest = f"revising {len(failed)}" if failed else f"{len(pending) - certified} rejected" if certified < len(pending) else "done"
            log(f"{capability.id} round {round_}: {certified}/{len(pending)} certified, {rest} ({time.perf_counter() - t_round:.1f} s)")
            t_round = time.perf_counter()
        revised = _call_all(backend, [partial(_safe, partial(backend.revise, d, c.diagnostics), capability, o.seed, backend,
                                              d.attempt + 1) for o, d, c in failed])
        pending = [(o, r) for (o, _, _), r in zip(failed, revised)]
    return outcomes


def _call_all(backend: GeneratorBackend, calls: Sequence[Callable[[], Draft]]) -> list[Draft]:
    """Every call's draft, in order; up to ``backend.concurrency`` calls at once (default 1: in this thread)."""
    n = int(getattr(backend, "concurrency", 1) or 1)
    if n <= 1 or len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=min(n, len(calls)), thread_name_prefix="generator") as pool:
        return list(pool.map(lambda c: c(), calls))


def _safe(fn: Any, capability: Capability, seed: int, backend: GeneratorBackend, attempt: int = 0) -> Draft:
    """A backend that raises becomes a failed draft with a diagnostic; one bad seed never stops a batch."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported as a diagnostic
        return Draft(capability.id, seed, attempt, getattr(backend, "name", "?"), None, capability=capability,
                     parse_diagnostics=[Diagnostic("generator_error", f"{type(e).__name__}: {e}")])


def telemetry(outcomes: Sequence[Outcome], wall_seconds: float | None = None) -> dict[str, Any]:
    """Survival rate, success by round, mean rounds, cost per surviving environment. ``seconds_*`` add up each
    attempt's drafting and certification time (request-seconds: with requests in flight at once they exceed the
    elapsed time); ``wall_seconds_*`` is the elapsed time of the whole synthesis, when the caller measured it."""
    n = len(outcomes)
    accepted = [o for o in outcomes if o.accepted]
    by_round: dict[int, int] = {}
    for o in accepted:
        by_round[o.rounds] = by_round.get(o.rounds, 0) + 1
    seconds = sum(a.seconds for o in outcomes for a in o.attempts)
    tokens = sum(a.draft.cost.get("llm_tokens", 0.0) for o in outcomes for a in o.attempts)
    codes: dict[str, int] = {}
    for o in outcomes:
        for a in o.attempts:
            for c in {d.code for d in a.certification.diagnostics}:
                codes[c] = codes.get(c, 0) + 1
    return {
        "drafts": n, "accepted": len(accepted), "rejected": n - len(accepted),
        "survival_rate": round(len(accepted) / n, 4) if n else 0.0,
        "accepted_by_round": {str(k): v for k, v in sorted(by_round.items())},
        "first_pass_rate": round(by_round.get(0, 0) / n, 4) if n else 0.0,
        "mean_rounds_accepted": round(sum(o.rounds for o in accepted) / len(accepted), 4) if accepted else 0.0,
        "attempts": sum(len(o.attempts) for o in outcomes),
        "seconds_total": round(seconds, 4), "seconds_per_accepted": round(seconds / len(accepted), 6) if accepted else None,
        "wall_seconds": round(wall_seconds, 4) if wall_seconds is not None else None,
        "wall_seconds_per_accepted": round(wall_seconds / len(accepted), 6) if accepted and wall_seconds is not None else None,
        "llm_tokens_per_accepted": round(tokens / len(accepted), 2) if accepted else None,
        "diagnostic_counts": dict(sorted(codes.items())),
    }
