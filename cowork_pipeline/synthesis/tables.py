"""Synthesis results as lake tables (polars frames): drafts, repair log, validated, rejected, telemetry."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import polars as pl

from cowork_pipeline.capabilities import Capability
from cowork_pipeline.spec import environment_id
from cowork_pipeline.synthesis.draft import GeneratorBackend
from cowork_pipeline.synthesis.repair import Outcome, synthesize, telemetry
from cowork_pipeline.validation.certify import VALIDATOR_VERSION, Validator

DRAFT_SCHEMA = {"attempt_id": pl.String, "env_id": pl.String, "capability_id": pl.String, "seed": pl.Int64, "round": pl.Int64,
                "backend": pl.String, "generator_version": pl.String, "spec_json": pl.String, "spec_hash": pl.String, "raw": pl.String,
                # What produced the draft (an LLM's rendered prompt, its hashes, model and sampling; the embedded
                # backend's repair state) and what it cost (tokens, seconds, HTTP attempts).
                "knobs_json": pl.String, "cost_json": pl.String}
LOG_SCHEMA = {"attempt_id": pl.String, "env_id": pl.String, "capability_id": pl.String, "seed": pl.Int64, "round": pl.Int64,
              "backend": pl.String, "certified": pl.Boolean, "codes": pl.List(pl.String), "diagnostics_json": pl.String,
              "changes": pl.List(pl.String), "kill_rate": pl.Float64, "seconds": pl.Float64, "llm_tokens": pl.Float64}
ENV_SCHEMA = {"env_id": pl.String, "capability_id": pl.String, "seed": pl.Int64, "title": pl.String, "multi_turn": pl.Boolean,
              "n_turns": pl.Int64, "n_items": pl.Int64, "rounds": pl.Int64, "spec_json": pl.String, "spec_hash": pl.String,
              "capability_fingerprint": pl.String, "generator_backend": pl.String, "generator_version": pl.String,
              "validator_version": pl.String, "reference_pass": pl.Boolean, "null_pass": pl.Boolean, "fault_pass": pl.Boolean, "equivalent_pass": pl.Boolean,
              "deterministic": pl.Boolean, "mutants": pl.Int64, "kill_rate": pl.Float64, "confusion_json": pl.String,
              "mutants_json": pl.String, "difficulty": pl.Float64, "difficulty_bucket": pl.String, "final_attempt_id": pl.String}
REJ_SCHEMA = {"env_id": pl.String, "capability_id": pl.String, "seed": pl.Int64, "rounds": pl.Int64, "codes": pl.List(pl.String),
              "reasons": pl.List(pl.String), "last_spec_json": pl.String, "final_attempt_id": pl.String}


@dataclass
class SynthesisTables:
    drafts: pl.DataFrame
    repair_log: pl.DataFrame
    validated: pl.DataFrame
    rejected: pl.DataFrame
    telemetry: dict[str, Any]


def run_synthesis(capability: Capability, seeds: Sequence[int], backend: GeneratorBackend, validator: Validator,
                  max_rounds: int = 3, log: Callable[[str], None] | None = None) -> SynthesisTables:
    t0 = time.perf_counter()
    outcomes = synthesize(backend, validator, capability, seeds, max_rounds=max_rounds, log=log)
    return tables_from(capability, outcomes, backend, wall_seconds=time.perf_counter() - t0)


def tables_from(capability: Capability, outcomes: Sequence[Outcome], backend: GeneratorBackend,
                wall_seconds: float | None = None) -> SynthesisTables:
    drafts, logs, valid, rej = [], [], [], []
    for o in outcomes:
        for a in o.attempts:
            d, spec = a.draft, a.draft.spec
            drafts.append({"attempt_id": d.draft_id, "env_id": spec.env_id if spec else environment_id(d.capability_id, d.seed),
                           "capability_id": d.capability_id, "seed": d.seed, "round": d.attempt, "backend": d.backend,
                           "generator_version": getattr(backend, "version", "?"), "spec_json": spec.to_json() if spec else None,
                           "spec_hash": spec.content_hash() if spec else None, "raw": d.raw,
                           "knobs_json": json.dumps(d.knobs, sort_keys=True, default=str), "cost_json": json.dumps(d.cost, sort_keys=True)})
            row = a.log_row()
            logs.append({k: row[k] for k in LOG_SCHEMA if k != "diagnostics_json"} | {"diagnostics_json": json.dumps(row["diagnostics"], sort_keys=True)})
        fin = o.final
        c, spec = fin.certification, fin.draft.spec
        if o.accepted and spec is not None:
            valid.append({
                "env_id": spec.env_id, "capability_id": spec.capability_id, "seed": spec.seed, "title": spec.title,
                "multi_turn": spec.multi_turn, "n_turns": len(spec.turns), "n_items": len(spec.rubric), "rounds": o.rounds,
                "spec_json": spec.to_json(), "spec_hash": spec.content_hash(), "capability_fingerprint": capability.fingerprint(),
                "generator_backend": spec.generator.backend, "generator_version": spec.generator.version,
                "validator_version": VALIDATOR_VERSION, "reference_pass": c.reference_pass, "null_pass": c.null_pass,
                "fault_pass": c.fault_pass, "equivalent_pass": c.equivalent_pass, "deterministic": c.deterministic, "mutants": len(c.mutants), "kill_rate": c.kill_rate,
                "confusion_json": json.dumps(c.confusion, sort_keys=True), "mutants_json": json.dumps(c.mutants, sort_keys=True),
                "difficulty": c.difficulty, "difficulty_bucket": c.difficulty_bucket, "final_attempt_id": fin.draft.draft_id,
            })
        else:
            rej.append({"env_id": c.env_id, "capability_id": o.capability_id, "seed": o.seed, "rounds": o.rounds,
                        "codes": sorted({d.code for d in c.diagnostics}), "reasons": [d.message for d in c.diagnostics][:20],
                        "last_spec_json": spec.to_json() if spec else None, "final_attempt_id": fin.draft.draft_id})
    return SynthesisTables(
        pl.DataFrame(drafts, schema=DRAFT_SCHEMA), pl.DataFrame(logs, schema=LOG_SCHEMA), pl.DataFrame(valid, schema=ENV_SCHEMA),
        pl.DataFrame(rej, schema=REJ_SCHEMA), {"capability_id": capability.id, **telemetry(outcomes, wall_seconds)},
    )
