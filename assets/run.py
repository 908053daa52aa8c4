"""Materialize the whole graph in-process against a persistent Dagster instance (what `cowork run` does)."""
import os
import time
from pathlib import Path
from typing import Callable

import dagster as dg

from assets.definitions import ALL_ASSETS, resources
from resources import LakeResource, ProfileResource

DAGSTER_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    default_limit: 4
nux:
  enabled: false
"""


def ensure_home(home: str | os.PathLike) -> dg.DagsterInstance:
    """A persistent instance under ``home`` (so `cowork ui` shows every run), with the GPU pool limited to 1."""
    home = Path(home).absolute()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    instance = dg.DagsterInstance.get()
    try:
        instance.event_log_storage.set_concurrency_slots("gpu", 1)
    except Exception:  # older storages without pools: the limit is then advisory only
        pass
    return instance


# Unpartitioned assets after synthesis, in dependency order (one run each, for progress output).
DOWNSTREAM = (("environment_splits",), ("teacher_trajectories",), ("demonstrations",), ("sft_checkpoint", "checkpoints"),
              ("rl_rollouts", "rl_checkpoints"), ("benchmark_scores",))


def _asset_keys(names: list[str]) -> list[dg.AssetKey]:
    return [dg.AssetKey(n) for n in names]


def run_all(profile: ProfileResource, lake: LakeResource, instance: dg.DagsterInstance,
            log: Callable[[str], None] = print, capabilities: list[str] | None = None) -> dict:
    """capability_specs -> every capability partition -> everything downstream. Returns per-step timings."""
    res = resources(profile, lake)
    timings: dict[str, float] = {}

    def step(label: str, selection: list[str], partition: str | None = None) -> None:
        t0 = time.perf_counter()
        result = dg.materialize(ALL_ASSETS, selection=_asset_keys(selection), partition_key=partition, instance=instance,
                                resources=res, raise_on_error=False, tags={"cowork/profile": profile.name})
        dt = time.perf_counter() - t0
        timings[label] = dt
        failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
        status = "ok" if result.success and not failed_checks else "FAILED"
        log(f"  {label:<48} {status:>6}  {dt:6.1f}s  run {result.run_id[:8]}")
        for e in failed_checks:
            log(f"    check {e.asset_check_key.name} failed: {e.metadata.get('summary').value if e.metadata.get('summary') else ''}")
        if not result.success:
            for ev in result.all_events:
                if ev.is_failure:
                    log(f"    {ev.message}")
            raise SystemExit(f"step '{label}' failed; see the run {result.run_id} in `cowork ui`")

    log(f"cowork run: profile '{profile.name}', lake {lake.root}")
    step("capability_specs", ["capability_specs"])
    caps = sorted(instance.get_dynamic_partitions("capability"))
    if capabilities:
        caps = [c for c in caps if c in capabilities]
    for cap in caps:
        step(f"synthesize[{cap}]", ["environment_drafts", "repair_log", "validated_environments", "rejected_environments",
                                     "repair_telemetry"], partition=cap)
    for names in DOWNSTREAM:
        step(" + ".join(names), list(names))
    return timings
