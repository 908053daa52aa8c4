"""Train / held-out splits, disjoint by capability lineage.

Two held-out sets: ``heldout_env`` (unseen worlds and seeds of training capabilities) and
``heldout_capability`` (capabilities marked held-out: nothing derived from them may reach
training). The split of an environment depends only on its id and the split seed, so
adding environments never moves existing ones between splits.
"""
from __future__ import annotations

import hashlib
from typing import Mapping

import polars as pl

from cowork_pipeline.capabilities import Capability

SPLITS = ("train", "heldout_env", "heldout_capability")


def _unit(env_id: str, seed: int) -> float:
    return int.from_bytes(hashlib.sha256(f"{seed}:{env_id}".encode()).digest()[:8], "big") / 2**64


def assign_splits(environments: pl.DataFrame, capabilities: Mapping[str, Capability], heldout_env_fraction: float = 0.15,
                  seed: int = 0) -> pl.DataFrame:
    rows = []
    for env_id, cap_id in environments.select("env_id", "capability_id").iter_rows():
        cap = capabilities.get(cap_id)
        if cap is None:
            raise KeyError(f"environment {env_id} comes from capability '{cap_id}', which is not in the catalog")
        if cap.heldout:
            split = "heldout_capability"
        else:
            split = "heldout_env" if _unit(env_id, seed) < heldout_env_fraction else "train"
        rows.append({"env_id": env_id, "capability_id": cap_id, "split": split})
    return pl.DataFrame(rows, schema={"env_id": pl.String, "capability_id": pl.String, "split": pl.String}).sort("env_id")


def disjointness(splits: pl.DataFrame) -> pl.DataFrame:
    """One row per capability with the splits it appears in; a held-out capability must appear in no other split."""
    return (splits.group_by("capability_id").agg(pl.col("split").unique().sort().alias("splits"))
            .with_columns(leak=pl.col("splits").list.contains("heldout_capability") & (pl.col("splits").list.len() > 1))
            .sort("capability_id"))
