"""Parallel partitions on one machine: two synthesis partitions run at the same time (two runs, each on the
multiprocess executor, so each step is its own OS process) against one persistent instance, writing into the same
Delta tables. Both partitions' rows must end up written and promoted; nothing lost, nothing duplicated."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from resources import SMOKE_PROFILE, LakeResource, ProfileResource

CAPABILITIES = ("invoice_reconcile", "ticket_triage_followup")
JOB_NAME = "parallel_synthesis"
RUN_TIMEOUT_S = 240
# one row per key in each synthesis table
KEYS = {"environment_drafts": "attempt_id", "repair_log": "attempt_id", "validated_environments": "env_id",
        "rejected_environments": "env_id", "repair_telemetry": "capability_id"}
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
    return defs.resolve_job_def(JOB_NAME)


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


# One run per OS process: Dagster's run setup reconfigures Python logging (logging.config.dictConfig), which is not
# safe to do from two threads of one process at once (it deadlocks), so the runs are launched as two processes.
DRIVER = r"""
import json, pathlib, sys, time
sys.path.insert(0, sys.argv[2])
import dagster as dg
import assets.definitions, test_executor  # noqa: E401,F401 - the slow imports, before the barrier

# Start barrier: imports take seconds and vary with load, so both drivers wait for each other before launching.
barrier = pathlib.Path(sys.argv[3])
(barrier / f"ready-{sys.argv[1]}").touch()
deadline = time.monotonic() + 120
while len(list(barrier.glob("ready-*"))) < int(sys.argv[4]) and time.monotonic() < deadline:
    time.sleep(0.05)

instance = dg.DagsterInstance.get()
# reconstructable(test_executor.parallel_synthesis_job), but with the tests folder as the working directory, so the
# step processes (spawned by the multiprocess executor) can import this module too
recon = dg.build_reconstructable_job("test_executor", "parallel_synthesis_job", reconstructor_working_directory=sys.argv[2])
res = dg.execute_job(recon, instance=instance,
                     tags={"dagster/partition": sys.argv[1]}, raise_on_error=False)
events = res.all_events
out = {
    "run_id": res.run_id, "success": res.success, "partition": res.dagster_run.tags.get("dagster/partition"),
    "failures": [e.message for e in events if e.is_failure],
    "checks": {e.asset_check_key.name: e.passed for e in res.get_asset_check_evaluations()},
    "mats": {e.asset_key.path[-1]: {k: e.materialization.metadata[k].value for k in ("delta_version", "rows", "promoted")}
             for e in res.get_asset_materialization_events()},
}
instance.dispose()
print("RESULT " + json.dumps(out), flush=True)
"""


def _step_window(instance: dg.DagsterInstance, run_id: str) -> tuple[float, float, int]:
    """(start, end, pid) of the run's synthesis step, from the instance's event log."""
    start = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)
    end = instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE})
    assert len(start) == 1 and len(end) == 1, (run_id, start, end)
    return start[0].timestamp, end[0].timestamp, start[0].dagster_event.pid


def _launch(cap: str, log_dir: Path) -> tuple[subprocess.Popen, Path]:
    log = log_dir / f"run-{cap}.log"
    barrier = log_dir / "barrier"
    barrier.mkdir(exist_ok=True)
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, cap, str(Path(__file__).resolve().parent), str(barrier),
                                 str(len(CAPABILITIES))],
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    return proc, log


def _collect(proc: subprocess.Popen, log: Path, deadline: float) -> dict:
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"run did not finish in time; log: {log.read_text()[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"driver failed (exit {proc.returncode}): {log.read_text()[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_two_partitions_in_parallel_into_the_same_delta_tables(persistent_instance, tmp_path):
    from assets.definitions import ALL_ASSETS, resources
    from assets.synthesis import SYNTH_TABLES

    instance = persistent_instance
    lake_res = LakeResource(root=os.environ["COWORK_LAKE"])
    specs = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("capability_specs")], instance=instance,
                           resources=resources(ProfileResource(**SMOKE_PROFILE), lake_res))
    assert specs.success
    assert set(CAPABILITIES) <= set(instance.get_dynamic_partitions("capability"))

    deadline = time.monotonic() + RUN_TIMEOUT_S
    procs = {cap: _launch(cap, tmp_path) for cap in CAPABILITIES}
    try:
        results = {cap: _collect(proc, log, deadline) for cap, (proc, log) in procs.items()}
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    for cap, res in results.items():
        assert res["success"], f"{cap}: {res['failures']}"
        assert res["partition"] == cap
        assert res["checks"] == {f"{t}_quality": True for t in SYNTH_TABLES}, (cap, res["checks"])

    # really parallel: separate step processes whose executions overlap in time
    windows = {cap: _step_window(instance, res["run_id"]) for cap, res in results.items()}
    (s1, e1, pid1), (s2, e2, pid2) = windows.values()
    assert pid1 != pid2 and os.getpid() not in (pid1, pid2)
    assert max(s1, s2) < min(e1, e2), f"the two partitions' steps did not overlap: {windows}"

    lake = lake_res.lake()
    for table in SYNTH_TABLES:
        mats = {cap: res["mats"][table] for cap, res in results.items()}
        promotions = lake.promotions(table)
        assert sorted(promotions["partition"].to_list()) == sorted(CAPABILITIES), table
        assert set(promotions["partition_column"]) == {"capability_id"}
        for cap, meta in mats.items():
            assert meta["promoted"] is True, (table, cap)
            version = meta["delta_version"]
            assert promotions.filter(pl.col("partition") == cap)["version"].to_list() == [version], (table, cap)
        # the two runs committed distinct versions of the same table
        assert len({m["delta_version"] for m in mats.values()}) == 2, table

        df, _ = lake.read_promoted(table)
        for cap, res in results.items():
            part = df.filter(pl.col("capability_id") == cap)
            assert len(part) == mats[cap]["rows"], (table, cap)  # nothing lost
            if len(part):
                assert set(part["_run_id"]) == {res["run_id"]}, (table, cap)
        assert set(df["capability_id"]) <= set(CAPABILITIES), table
        latest = lake.read(table)
        assert len(latest) == len(df), f"{table}: latest and promoted differ"  # no stray / duplicated rows
        key = KEYS[table]
        assert latest[key].n_unique() == len(latest), f"{table}: duplicate {key}"

    envs, _ = lake.read_promoted("validated_environments")
    assert set(envs["capability_id"]) == set(CAPABILITIES)
    assert envs["env_id"].n_unique() == len(envs)
    telemetry, _ = lake.read_promoted("repair_telemetry")
    assert sorted(telemetry["capability_id"].to_list()) == sorted(CAPABILITIES)
    up = {json.loads(u)["capability_specs"] for u in envs["_upstream_versions"]}
    assert up == {lake.promoted_version("capability_specs")}

    # both runs are on the persistent instance, as partitioned materializations
    for cap, res in results.items():
        record = instance.get_run_by_id(res["run_id"])
        assert record is not None and record.job_name == JOB_NAME and record.is_success
    materialized = instance.get_materialized_partitions(dg.AssetKey("validated_environments"))
    assert set(CAPABILITIES) <= set(materialized)
