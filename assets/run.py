"""Materialize the whole graph in-process against a persistent Dagster instance (what `cowork run` does)."""
import os
import time
from pathlib import Path
from typing import Callable

import dagster as dg

from assets.definitions import ALL_ASSETS, resources
from assets.order import DOWNSTREAM, RUN_ORDER, SYNTHESIS
from cowork_pipeline.capabilities import CapabilityError, load_catalog
from resources import AgentsResource, GeneratorResource, LakeResource, ProfileResource

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


def _asset_keys(names: list[str]) -> list[dg.AssetKey]:
    return [dg.AssetKey(n) for n in names]


def run_all(profile: ProfileResource, lake: LakeResource, instance: dg.DagsterInstance,
            log: Callable[[str], None] = print, capabilities: list[str] | None = None,
            generator: GeneratorResource | None = None, until: str | None = None, agents: AgentsResource | None = None) -> dict:
    """capability_specs -> every capability partition -> everything downstream (through ``until``, an asset
    of ``RUN_ORDER``; default: all). Returns per-step timings."""
    if until is not None and until not in RUN_ORDER:
        raise ValueError(f"unknown asset {until!r} to stop after (one of: {', '.join(RUN_ORDER)})")
    last = RUN_ORDER.index(until) if until is not None else len(RUN_ORDER) - 1
    # The partitions of this catalog, not every one the instance has seen (an earlier run may have used
    # another catalog folder). A bad file or an unknown id stops here, before anything runs.
    catalog = load_catalog(profile.catalog_dir or None)
    profile.injections_range()  # (a bad setting stops here too)
    caps = sorted(catalog)
    if capabilities:
        unknown = sorted(set(capabilities) - set(caps))
        if unknown:
            raise CapabilityError(f"unknown capabilities {', '.join(unknown)} (the catalog has: {', '.join(caps)})")
        caps = [c for c in caps if c in capabilities]
    generator = generator or GeneratorResource.from_env()
    check = getattr(generator.build(), "unsupported", None) if last > 0 else None
    refused = [why for c in caps if check is not None and (why := check(catalog[c]))]
    if refused:
        raise CapabilityError("the generator cannot draft these capabilities:\n  " + "\n  ".join(refused))
    step = _Stepper(profile, instance, resources(profile, lake, generator, agents), log)
    timings = step.timings
    log(f"cowork run: profile '{profile.name}', lake {lake.root}" + (f", until {until}" if until else ""))
    step("capability_specs", ["capability_specs"])
    if last == 0:
        return timings
    for cap in caps:
        step(f"synthesize[{cap}]", list(SYNTHESIS), partition=cap)
    for names in DOWNSTREAM:
        if RUN_ORDER.index(names[0]) > last:
            break
        step(" + ".join(names), list(names))
    return timings


def run_benchmark(profile: ProfileResource, lake: LakeResource, instance: dg.DagsterInstance, agents: AgentsResource,
                  log: Callable[[str], None] = print) -> dict:
    """Materialize ``benchmark_scores`` alone, on the environments and checkpoints already in the lake, with the
    endpoints of ``agents`` scored beside the students (what `cowork eval` does). Returns its timing."""
    agents.build()  # a bad URL or setting stops here, before anything runs
    missing = [t for t in ("environment_splits", "validated_environments", "checkpoints") if not lake.lake().exists(t)]
    if missing:
        raise ValueError(f"the lake {lake.root} has no {', '.join(missing)} yet: run `cowork run` first")
    step = _Stepper(profile, instance, resources(profile, lake, agents=agents), log)
    log(f"cowork eval: profile '{profile.name}', lake {lake.root}, endpoints: "
        + (", ".join(f"{e.label()} ({e.model} at {e.base_url})" for e in agents.endpoints) or "none"))
    step("benchmark_scores", ["benchmark_scores"])
    return step.timings


class _Stepper:
    """Materializes a selection in one run and logs its outcome; a failed run stops with SystemExit."""

    def __init__(self, profile: ProfileResource, instance: dg.DagsterInstance, res: dict, log: Callable[[str], None]):
        self.profile, self.instance, self.res, self.log = profile, instance, res, log
        self.timings: dict[str, float] = {}

    def __call__(self, label: str, selection: list[str], partition: str | None = None) -> None:
        t0 = time.perf_counter()
        result = dg.materialize(ALL_ASSETS, selection=_asset_keys(selection), partition_key=partition, instance=self.instance,
                                resources=self.res, raise_on_error=False, tags={"cowork/profile": self.profile.name})
        dt = time.perf_counter() - t0
        self.timings[label] = dt
        failed_checks = [e for e in result.get_asset_check_evaluations() if not e.passed]
        status = "ok" if result.success and not failed_checks else "FAILED"
        self.log(f"  {label:<48} {status:>6}  {dt:6.1f}s  run {result.run_id[:8]}")
        for e in failed_checks:
            self.log(f"    check {e.asset_check_key.name} failed: {e.metadata.get('summary').value if e.metadata.get('summary') else ''}")
        if not result.success:
            for ev in result.all_events:
                if ev.is_failure:
                    self.log(f"    {ev.message}")
            raise SystemExit(f"step '{label}' failed; see the run {result.run_id} in `cowork ui`")
