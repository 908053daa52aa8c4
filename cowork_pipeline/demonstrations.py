"""Teacher trajectories and curated demonstrations for SFT.

The embedded teacher solves each training environment through the tools the way an agent
does: it looks records up, reads them, acts with the values it observed (the reference
program's bindings), retries calls that hit injected faults, and replies to the user. Only
checker-passing trajectories of *training* environments become demonstrations: held-out
environments and everything from held-out capabilities are refused by a gate that reads
the promoted splits, so re-materializing downstream alone cannot bypass it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

import polars as pl

from cowork_pipeline.agents.program import ProgramAgent
from cowork_pipeline.runner import Limits, run_episode, run_episodes
from cowork_pipeline.services import FaultConfig, tools_for
from cowork_pipeline.spec import EnvironmentSpec, canonical_json
from cowork_pipeline.synthesis.embedded import sub_seed
from cowork_pipeline.validation.grader import grade_many

TRAJ_SCHEMA = {"traj_id": pl.String, "env_id": pl.String, "capability_id": pl.String, "split": pl.String, "teacher": pl.String,
               "fault_rate": pl.Float64, "multi_turn": pl.Boolean, "passed": pl.Boolean, "completion": pl.Float64,
               "safety": pl.Boolean, "failed_items": pl.List(pl.String), "termination": pl.String, "n_tool_calls": pl.Int64,
               "faults_injected": pl.Int64, "messages_json": pl.String, "tools_json": pl.String, "env_spec_hash": pl.String}
DEMO_SCHEMA = {"demo_id": pl.String, "traj_id": pl.String, "env_id": pl.String, "capability_id": pl.String, "split": pl.String,
               "multi_turn": pl.Boolean, "n_chars": pl.Int64, "n_assistant_turns": pl.Int64, "messages_json": pl.String,
               "tools_json": pl.String}


class EmbeddedTeacher(ProgramAgent):
    """Executes the environment's certified reference program as an agent (offline, deterministic)."""

    def __init__(self, env: EnvironmentSpec):
        super().__init__(env.reference, name="teacher-embedded")


def collect_teacher_trajectories(envs: Sequence[tuple[EnvironmentSpec, str]], sandbox: Any, *, fault_rate: float = 0.1,
                                 seed: int = 0, teacher: Any | None = None, limits: Limits = Limits()) -> pl.DataFrame:
    """One teacher episode per environment (with injected faults), graded by the environment's own checkers.
    ``teacher``: one agent for every environment (a model behind an endpoint; its episodes run as one batch, so
    its requests go out concurrently); None: each environment's embedded teacher (its reference, executed)."""
    faults = [FaultConfig(rate=fault_rate, seed=sub_seed("teacher", seed, env.env_id)) if fault_rate > 0 else None for env, _s in envs]
    if teacher is not None:
        trajs = run_episodes([(env, f) for (env, _s), f in zip(envs, faults)], teacher, limits=limits)
    else:
        trajs = [run_episode(env, EmbeddedTeacher(env), faults=f, limits=limits) for (env, _s), f in zip(envs, faults)]
    grades = grade_many(sandbox, [(env, t, None) for (env, _s), t in zip(envs, trajs)])
    rows = []
    for (env, split), t, g in zip(envs, trajs, grades):
        msgs = [_clean(m) for m in t.messages]
        rows.append({"traj_id": f"{env.env_id}:{t.agent}:{seed}", "env_id": env.env_id, "capability_id": env.capability_id,
                     "split": split, "teacher": t.agent, "fault_rate": fault_rate, "multi_turn": env.multi_turn, "passed": g.passed,
                     "completion": g.completion, "safety": g.safety, "failed_items": g.failed_items(), "termination": t.termination,
                     "n_tool_calls": len(t.steps), "faults_injected": len(t.faults), "messages_json": canonical_json(msgs),
                     "tools_json": canonical_json(tools_for(env.tools)), "env_spec_hash": env.content_hash()})
    return pl.DataFrame(rows, schema=TRAJ_SCHEMA)


def _clean(m: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI message shape, nothing else (no parse_error bookkeeping)."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
                                                                               "arguments": c["function"]["arguments"]}} for c in m["tool_calls"]]
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("tool_call_id")
        out["name"] = m.get("name")
    return out


def curate(trajectories: pl.DataFrame, splits: pl.DataFrame, *, max_chars: int = 12000) -> tuple[pl.DataFrame, dict[str, int]]:
    """Checker-passing, training-split, deduplicated, length-capped demonstrations; and why others were dropped.

    The split of each trajectory is taken from ``splits`` (the promoted table), never from the
    trajectory row itself, so a stale or forged split column cannot leak held-out data."""
    split_of = dict(splits.select("env_id", "split").iter_rows())
    heldout_caps = set(splits.filter(pl.col("split") == "heldout_capability")["capability_id"].to_list())
    dropped = {"failed": 0, "not_train": 0, "heldout_lineage": 0, "duplicate": 0, "too_long": 0}
    seen: set[str] = set()
    rows = []
    for r in trajectories.sort("traj_id").iter_rows(named=True):
        if not r["passed"]:
            dropped["failed"] += 1
            continue
        if r["capability_id"] in heldout_caps:
            dropped["heldout_lineage"] += 1
            continue
        if split_of.get(r["env_id"]) != "train":
            dropped["not_train"] += 1
            continue
        msgs = json.loads(r["messages_json"])
        digest = hashlib.sha256(canonical_json([(m["role"], m.get("content"), m.get("tool_calls")) for m in msgs]).encode()).hexdigest()
        if digest in seen:
            dropped["duplicate"] += 1
            continue
        n_chars = len(r["messages_json"]) + len(r["tools_json"])
        if n_chars > max_chars:
            dropped["too_long"] += 1
            continue
        seen.add(digest)
        rows.append({"demo_id": f"demo-{digest[:16]}", "traj_id": r["traj_id"], "env_id": r["env_id"], "capability_id": r["capability_id"],
                     "split": "train", "multi_turn": r["multi_turn"], "n_chars": n_chars,
                     "n_assistant_turns": sum(1 for m in msgs if m["role"] == "assistant"), "messages_json": r["messages_json"],
                     "tools_json": r["tools_json"]})
    return pl.DataFrame(rows, schema=DEMO_SCHEMA), dropped


def contamination_audit(demos: pl.DataFrame, splits: pl.DataFrame) -> pl.DataFrame:
    """Each demonstration with flags the blocking check asserts are all False."""
    heldout_envs = set(splits.filter(pl.col("split") != "train")["env_id"].to_list())
    heldout_caps = set(splits.filter(pl.col("split") == "heldout_capability")["capability_id"].to_list())
    return demos.with_columns(heldout_env=pl.col("env_id").is_in(list(heldout_envs)),
                              heldout_capability=pl.col("capability_id").is_in(list(heldout_caps)))


def sft_records(demos: pl.DataFrame) -> list[dict[str, Any]]:
    """``[{"messages": [...], "tools": [...]}]`` for :func:`cowork_pipeline.training.sft.to_sft_dataset`."""
    return [{"messages": json.loads(m), "tools": json.loads(t)} for m, t in demos.select("messages_json", "tools_json").iter_rows()]
