"""Parallel partitions on one machine: two synthesis partitions run at the same time (two runs, each on the
multiprocess executor, so each step is its own OS process) against one persistent instance, writing into the same
Delta tables. Both partitions' rows must end up written and promoted; nothing lost, nothing duplicated."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from resources import SMOKE_PROFILE, LakeResource, ProfileResource

CAPABILITIES = ("invoice_reconcile", "ticket_triage_followup")
JOB_NAME = "parallel_synthesis"
DAGSTER_YAML_FALLBACK = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"


def parallel_synthesis_job() -> dg.JobDefinition:
    """The synthesis assets as a job on the multiprocess executor. Module-level so ``reconstructable`` can rebuild it
    in every step process; the lake root comes from $COWORK_LAKE, which the step processes inherit."""
    from assets.definitions import ALL_ASSETS, resources
    from assets.synthesis import SYNTH_TABLES

    job = dg.define_asset_job(JOB_NAME, selection=dg.AssetSelection.assets(*SYNTH_TABLES),
                              executor_def=dg.multiprocess_executor.configured({"max_concurrent": 2}))
    defs = dg.Definitions(assets=ALL_ASSETS, jobs=[job],
                          resources=resources(ProfileResource(**SMOKE_PROFILE), LakeResource(root=os.environ["COWORK_LAKE"])))
    return defs.get_job_def(JOB_NAME)


@pytest.fixture
def persistent_instance(tmp_path, monkeypatch):
    try:
        from assets.run import DAGSTER_YAML
    except ImportError:  # pragma: no cover - keep the test independent of run.py's layout
        DAGSTER_YAML = DAGSTER_YAML_FALLBACK
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("COWORK_LAKE", str(tmp_path / "lake"))
    with dg.DagsterInstance.get() as instance:
        yield instance


def _step_window(result: dg.ExecutionResult) -> tuple[float, float, int]:
    """(start, end, pid) of the run's single synthesis step, from the event log."""
    events = result.all_events
    start = next(e for e in events if e.event_type_value == "STEP_START")
    end = next(e for e in events if e.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE"))
    return start.timestamp, end.timestamp, start.pid


def test_two_partitions_in_parallel_into_the_same_delta_tables(persistent_instance):
    from assets.definitions import ALL_ASSETS, resources
    from assets.synthesis import SYNTH_TABLES

    instance = persistent_instance
    lake_res = LakeResource(root=os.environ["COWORK_LAKE"])
    specs = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("capability_specs")], instance=instance,
                           resources=resources(ProfileResource(**SMOKE_PROFILE), lake_res))
    assert specs.success
    assert set(CAPABILITIES) <= set(instance.get_dynamic_partitions("capability"))

    recon = dg.reconstructable(parallel_synthesis_job)

    def run(cap: str) -> dg.ExecutionResult:
        return dg.execute_job(recon, instance=instance, tags={"dagster/partition": cap}, raise_on_error=False)

    with ThreadPoolExecutor(max_workers=len(CAPABILITIES)) as pool:
        results = dict(zip(CAPABILITIES, pool.map(run, CAPABILITIES)))

    for cap, res in results.items():
        failures = [e.message for e in res.all_events if e.is_failure]
        assert res.success, f"{cap}: {failures}"
        assert res.dagster_run.tags["dagster/partition"] == cap
        checks = {e.asset_check_key.name: e.passed for e in res.get_asset_check_evaluations()}
        assert checks == {f"{t}_quality": True for t in SYNTH_TABLES}, (cap, checks)

    # really parallel: separate step processes whose executions overlap in time
    windows = {cap: _step_window(res) for cap, res in results.items()}
    (s1, e1, pid1), (s2, e2, pid2) = windows.values()
    assert pid1 != pid2 and os.getpid() not in (pid1, pid2)
    assert max(s1, s2) < min(e1, e2), f"the two partitions' steps did not overlap: {windows}"

    lake = lake_res.lake()
    for table in SYNTH_TABLES:
        mats = {cap: next(e.materialization.metadata for e in res.get_asset_materialization_events()
                          if e.asset_key == dg.AssetKey(table)) for cap, res in results.items()}
        promotions = lake.promotions(table)
        assert sorted(promotions["partition"].to_list()) == sorted(CAPABILITIES), table
        assert set(promotions["partition_column"]) == {"capability_id"}
        for cap, meta in mats.items():
            assert meta["promoted"].value is True, (table, cap)
            version = meta["delta_version"].value
            assert promotions.filter(pl.col("partition") == cap)["version"].to_list() == [version], (table, cap)
        # the two runs committed distinct versions of the same table
        assert len({m["delta_version"].value for m in mats.values()}) == 2, table

        df, _ = lake.read_promoted(table)
        for cap, res in results.items():
            part = df.filter(pl.col("capability_id") == cap)
            assert len(part) == mats[cap]["rows"].value, (table, cap)  # nothing lost
            if len(part):
                assert set(part["_run_id"]) == {res.run_id}, (table, cap)
        assert set(df["capability_id"]) <= set(CAPABILITIES), table
        latest = lake.read(table)
        assert len(latest) == len(df), f"{table}: latest and promoted differ"  # no stray / duplicated rows
        assert latest.drop(["_upstream_versions"]).is_duplicated().sum() == 0, table

    envs, _ = lake.read_promoted("validated_environments")
    assert set(envs["capability_id"]) == set(CAPABILITIES)
    assert envs["env_id"].n_unique() == len(envs)
    telemetry, _ = lake.read_promoted("repair_telemetry")
    assert sorted(telemetry["capability_id"].to_list()) == sorted(CAPABILITIES)
    up = {json.loads(u)["capability_specs"] for u in envs["_upstream_versions"]}
    assert up == {lake.promoted_version("capability_specs")}

    # both runs are on the persistent instance, as partitioned materializations
    for cap, res in results.items():
        record = instance.get_run_by_id(res.run_id)
        assert record is not None and record.job_name == JOB_NAME and record.is_success
    materialized = instance.get_materialized_partitions(dg.AssetKey("validated_environments"))
    assert set(CAPABILITIES) <= set(materialized)
