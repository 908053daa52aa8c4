"""Train / held-out splits, disjoint by capability lineage.

Two held-out sets: ``heldout_env`` (unseen worlds and seeds of training capabilities) and
``heldout_capability`` (capabilities marked held-out: nothing derived from them may reach
training). The split of an environment depends only on its id and the split seed, so
adding environments never moves existing ones between splits; except that environments posing the same task
(:func:`task_fingerprint`) share one split, that of the first of them by id, so that no held-out environment is a
task the student was trained on.
"""
from __future__ import annotations

import hashlib
import json
from typing import Mapping

import polars as pl

from cowork_pipeline.capabilities import Capability

SPLITS = ("train", "heldout_env", "heldout_capability")


def _unit(env_id: str, seed: int) -> float:
    return int.from_bytes(hashlib.sha256(f"{seed}:{env_id}".encode()).digest()[:8], "big") / 2**64


def task_fingerprint(spec_json: str) -> str:
    """The task as a student meets it: the user's turns (with the world's events between them) and what the
    reference calls and answers. Environments alike in these differ only in records the reference never had to
    tell apart (a world drawn again around the same question and answer), so a student that learnt one by heart
    passes the other: they are one task, not a seen and an unseen one."""
    spec = json.loads(spec_json)
    blob = json.dumps({"turns": spec.get("turns"), "reference": spec.get("reference")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


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
