"""Incremental re-synthesis: one new capability file re-runs only its own partition (+ what depends on it).

    .venv/bin/python benchmarks/bench_incremental.py [--envs-per-capability 16] [--source invoice_reconcile] [--keep]

In a temporary home (Dagster instance + lake) and with ``ProfileResource(catalog_dir=<a copy of the catalog>)``:

1. **full run** of the synthesis part of the graph: ``capability_specs``, every capability partition of the
   synthesis multi-asset, ``environment_splits`` (one in-process run each, as ``cowork run`` does);
2. a fresh ``capability_catalog_sensor`` evaluation on that state must request nothing (the catalog is unchanged);
3. ONE new capability file is added to the catalog copy (``--source``'s file under a new id);
4. **incremental run**: the sensor is ticked until it has nothing left to request, and every run it requests is
   executed in-process (first ``capability_specs_job`` plus the new dynamic partition, then
   ``synthesize_capability`` for the new partition only), then ``environment_splits`` (what the eager automation
   condition runs next). The nightly schedule's pure selection is printed alongside as a cross-check (after the
   specs refresh it must be exactly the new partition, afterwards nothing).

Printed: full-run time, incremental time (sensor ticks included), their ratio (target <= 15%), and the
verification that every row of the unchanged partitions is untouched: same ``_run_id`` and ``spec_hash`` (and key)
in the promoted and in the latest version of every synthesis table.
"""
from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TQDM_DISABLE", "1")

import dagster as dg  # noqa: E402
import polars as pl  # noqa: E402

from assets import automation as auto  # noqa: E402
from assets.definitions import ALL_ASSETS, resources  # noqa: E402
from assets.run import ensure_home  # noqa: E402
from assets.synthesis import SYNTH_TABLES  # noqa: E402
from cowork_pipeline.capabilities import CATALOG_DIR  # noqa: E402
from cowork_pipeline.lake import Lake  # noqa: E402
from resources import LakeResource, ProfileResource  # noqa: E402

# table -> (row key, columns that must not change for an untouched row)
CHECKED = {"validated_environments": ("env_id", ["_run_id", "spec_hash"]),
           "environment_drafts": ("attempt_id", ["_run_id", "spec_hash"]),
           "repair_log": ("attempt_id", ["_run_id", "_upstream_versions"]),
           "rejected_environments": ("env_id", ["_run_id"]),
           "repair_telemetry": ("capability_id", ["_run_id", "drafts", "accepted"])}


def cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the sandbox workers of finished runs)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def snapshot(lake: Lake, promoted: bool) -> dict[str, pl.DataFrame]:
    out = {}
    for table, (key, cols) in CHECKED.items():
        columns = list(dict.fromkeys([key, "capability_id", *cols]))
        df = lake.read_promoted(table, columns=columns)[0] if promoted else lake.read(table, columns=columns)
        out[table] = df.sort(key)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs-per-capability", type=int, default=16)
    ap.add_argument("--source", default="invoice_reconcile", help="the capability file the new one is copied from")
    ap.add_argument("--keep", action="store_true", help="keep the temporary home (printed) for inspection")
    args = ap.parse_args()
    logging.getLogger("dagster").setLevel(logging.WARNING)

    tmp = Path(tempfile.mkdtemp(prefix="cowork-bench-incremental-"))
    catalog = tmp / "catalog"
    shutil.copytree(CATALOG_DIR, catalog)
    instance = ensure_home(tmp / "dagster_home")
    profile = ProfileResource(name="bench-incremental", catalog_dir=str(catalog), envs_per_capability=args.envs_per_capability)
    lake_res = LakeResource(root=str(tmp / "lake"))
    lake = lake_res.lake()
    res = resources(profile, lake_res)
    print(f"home {tmp}; catalog copy {catalog} ({len(list(catalog.glob('*.yaml')))} capabilities); "
          f"envs_per_capability={args.envs_per_capability}; {os.cpu_count()} cpus", flush=True)

    def run(label: str, keys, partition: str | None = None, tags: dict | None = None) -> float:
        t0 = time.perf_counter()
        r = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey(k) if isinstance(k, str) else k for k in keys],
                           partition_key=partition, instance=instance, resources=res, raise_on_error=False,
                           tags={"cowork/profile": profile.name, **(tags or {})})
        dt = time.perf_counter() - t0
        failed = [e.asset_check_key.name for e in r.get_asset_check_evaluations() if not e.passed]
        print(f"  {label:<60} {'ok' if r.success and not failed else 'FAILED':>6} {dt:7.1f}s  run {r.run_id[:8]}", flush=True)
        if not r.success:
            raise SystemExit(f"{label} failed (run {r.run_id})")
        return dt

    def tick(cursor: str | None):
        ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources=res)  # whatever the sensor asks for
        return auto.capability_catalog_sensor(ctx)

    def schedule_selection() -> dict[str, str]:
        return auto.plan_regeneration(instance.get_dynamic_partitions("capability"), auto.published_fingerprints(lake),
                                      auto.partition_states(lake)).selection

    # 0. warm-up (not timed): imports and first-run costs (Great Expectations, Delta, Dagster execution) are paid by
    # whichever run comes first; pay them on a scratch lake so both timed phases start equally warm.
    scratch = tmp / "warmup"
    dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("capability_specs")], instance=dg.DagsterInstance.ephemeral(),
                   resources=resources(profile, LakeResource(root=str(scratch / "lake"))), raise_on_error=False)
    shutil.rmtree(scratch, ignore_errors=True)

    # 1. full run ------------------------------------------------------------------------------------------
    print("full run (capability_specs, every partition, environment_splits):", flush=True)
    c0, t0 = cpu_s(), time.perf_counter()
    run("capability_specs", ["capability_specs"])
    caps = sorted(instance.get_dynamic_partitions("capability"))
    for cap in caps:
        run(f"synthesize[{cap}]", SYNTH_TABLES, cap)
    run("environment_splits", ["environment_splits"])
    full, full_cpu = time.perf_counter() - t0, cpu_s() - c0
    before = {True: snapshot(lake, True), False: snapshot(lake, False)}

    # 2. unchanged catalog: nothing to do -------------------------------------------------------------------
    r0 = tick(None)
    assert not r0.run_requests and not r0.dynamic_partitions_requests, r0
    assert not schedule_selection(), schedule_selection()
    print(f"sensor on the unchanged catalog: {r0.skip_reason.skip_message if r0.skip_reason else 'no requests'}")
    cursor = r0.cursor

    # 3. one new capability file -------------------------------------------------------------------------------
    new_id = f"{args.source}_incr"
    text = (catalog / f"{args.source}.yaml").read_text()
    (catalog / f"{new_id}.yaml").write_text(text.replace(f"id: {args.source}", f"id: {new_id}", 1))
    print(f"added {new_id}.yaml (copy of {args.source}.yaml)")

    # 4. incremental run: exactly what the sensor requests, then the eager downstream ---------------------------------
    print("incremental run (the sensor's requests, then environment_splits):", flush=True)
    c1, t1 = cpu_s(), time.perf_counter()
    executed: list[tuple[str, str | None]] = []
    for _ in range(5):
        result = tick(cursor)
        cursor = result.cursor
        for req in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            print(f"  sensor: added partition(s) {', '.join(req.partition_keys)}")
        if not result.run_requests:
            break
        for rr in result.run_requests:
            label = rr.job_name + (f"[{rr.partition_key}]" if rr.partition_key else "")
            run(f"sensor -> {label}", auto.selection_keys(rr.job_name), rr.partition_key, dict(rr.tags))
            executed.append((rr.job_name, rr.partition_key))
            if rr.job_name == auto.capability_specs_job.name:
                print(f"  schedule's selection now: {schedule_selection()}")
    run("environment_splits (eager downstream)", ["environment_splits"])
    inc, inc_cpu = time.perf_counter() - t1, cpu_s() - c1
    assert executed == [(auto.capability_specs_job.name, None), (auto.synthesis_job.name, new_id)], executed
    assert not schedule_selection(), schedule_selection()

    # 5. verification: the unchanged partitions' rows are untouched ------------------------------------------------
    problems, compared = [], 0
    for promoted in (True, False):
        after = snapshot(lake, promoted)
        for table, df in after.items():
            old = before[promoted][table]
            kept = df.filter(pl.col("capability_id") != new_id)
            compared += len(kept)
            if not kept.equals(old):
                problems.append(f"{table} ({'promoted' if promoted else 'latest'}): {len(old)} rows before, {len(kept)} after, "
                                f"or a _run_id / spec_hash changed")
            if table == "validated_environments" and promoted and df.filter(pl.col("capability_id") == new_id).is_empty():
                problems.append(f"no validated environment for the new capability {new_id}")
    splits, _ = lake.read_promoted("environment_splits")
    n_new = int((splits["capability_id"] == new_id).sum())

    ratio = inc / full
    print("\n== incremental re-synthesis ==")
    print(f"full run:        {full:7.1f}s wall  {full_cpu:7.1f}s cpu (incl. sandbox workers)  {len(caps)} partitions + specs + splits")
    print(f"incremental run: {inc:7.1f}s wall  {inc_cpu:7.1f}s cpu (incl. sandbox workers)  runs: "
          + ", ".join(j + (f"[{p}]" if p else "") for j, p in executed) + ", environment_splits")
    print(f"ratio:           {ratio:.1%} of the full run (target <= 15%: {'met' if ratio <= 0.15 else 'NOT met'}); "
          f"cpu ratio {inc_cpu / max(full_cpu, 1e-9):.1%}")
    print(f"new partition:   {new_id}, {n_new} environments in environment_splits")
    if problems:
        print("verification FAILED:\n  " + "\n  ".join(problems))
    else:
        print(f"verification:    OK, {compared} rows of {len(caps)} unchanged partitions identical (key, _run_id, spec_hash) "
              f"in the promoted and latest versions of {', '.join(CHECKED)}")
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
