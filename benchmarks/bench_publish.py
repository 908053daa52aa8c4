"""Write-audit-publish under concurrent runs: what a backfill of many partitions does to the lake.

    .venv/bin/python benchmarks/bench_publish.py [--writers 16] [--writes 5] [--log-rows 1000 100000 1000000]

Every Dagster run that materializes a table writes it and then publishes that Delta version with a
compare-and-set on the lake's one promotion log (``assets/_io.write_checked``), so the runs of a
backfill contend: all of their promotions are exclusive commits to the same log. Two workloads, each
run by ``--writers`` processes at once (started together after their imports) and, as the baseline
in the same run, by one process doing all of their writes one after another:

1. partition: each writer replaces and publishes its own capability partition of one table
   (``validated_environments`` of a backfill), ``--writes`` times;
2. keyed: each writer merges ``--writes`` keyed rows, one at a time, into one table and publishes
   them (``checkpoints``, ``rl_rollouts`` written by concurrent runs).

Printed per workload: publications per second at once and one at a time (the ratio), the conflicts
with other writers retried (lost races), and whether every writer got through with exactly its rows published (the target:
no failed write and nothing lost, however many writers contend).

3. A long-lived lake: its promotion log holds a row per publication ever made (a year of hourly
   backfills of 20 partitions x 6 tables is a million), and every publication reads what is published
   from it. Printed: ms per conditional publication with ``--log-rows`` rows in the log, and the
   replay of the log read row by row (``Published.apply`` in turn, as it once was) as the baseline.
4. Reading what a backfill published: ``--partitions`` partitions of 50 rows, each published at its
   own version. Printed: ms per ``read_promoted``, next to reading the latest version whole and to
   reading each partition at its own version (what read_promoted did before it learnt to tell, from
   the commits' records, which partitions no later commit changed).
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORKLOADS = ("partition", "keyed")


def _writer(root: str, workload: str, writers: range, writes: int, start: Any, out: Any) -> None:
    # Module level, run under spawn: a forked process inheriting live Rust thread pools can hang.
    import polars as pl

    from assets._io import write_checked
    from cowork_pipeline.lake import Lake, Lineage

    lake = Lake(root)
    start.wait()
    t0 = time.perf_counter()
    failed: list[str] = []
    for j in range(writes):
        for w in writers:
            lin = Lineage.local("bench")
            try:
                if workload == "partition":
                    df = pl.DataFrame({"capability_id": [f"cap{w:02d}"] * 4, "env_id": [f"cap{w:02d}-{j}-{i}" for i in range(4)]})
                    write_checked(None, lake, "validated_environments", df, suite=[], lin=lin, partition=("capability_id", f"cap{w:02d}"))
                else:
                    df = pl.DataFrame({"checkpoint_id": [f"w{w:02d}-{j}"], "step": [j]})
                    write_checked(None, lake, "checkpoints", df, suite=[], lin=lin, key=["checkpoint_id"])
            except Exception as exc:  # a failed write is the figure this benchmark exists to catch
                failed.append(f"writer {w}: {type(exc).__name__}: {str(exc)[:200]}")
    out.put((time.perf_counter() - t0, getattr(lake, "retries", -1), failed))


def run(workload: str, writers: int, writes: int, at_once: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as root:
        return _run_in(root, workload, writers, writes, at_once)


def _run_in(root: str, workload: str, writers: int, writes: int, at_once: bool) -> dict[str, Any]:
    from cowork_pipeline.lake import Lake

    ctx = multiprocessing.get_context("spawn")
    groups = [range(w, w + 1) for w in range(writers)] if at_once else [range(writers)]
    start, out = ctx.Barrier(len(groups)), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(root, workload, g, writes, start, out)) for g in groups]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    lake = Lake(root)
    if workload == "partition":
        data, _ = lake.read_promoted("validated_environments")
        want = {f"cap{w:02d}-{writes - 1}-{i}" for w in range(writers) for i in range(4)}  # each partition's last write
        intact = set(data["env_id"]) == want and data.height == len(want)
    else:
        data, _ = lake.read_promoted("checkpoints")
        want = {f"w{w:02d}-{j}" for w in range(writers) for j in range(writes)}
        intact = set(data["checkpoint_id"]) == want and data.height == len(want)
    return {"wall_s": max(r[0] for r in results), "retries": sum(r[1] for r in results),
            "failed": [f for r in results for f in r[2]], "intact": intact}


def long_log(rows: int) -> tuple[float, float]:
    """(ms per conditional publication, ms to replay the log row by row) with ``rows`` in the promotion log."""
    with tempfile.TemporaryDirectory(prefix="bench-publish-log-") as root:
        return _long_log(rows, root)


def _long_log(rows: int, root: str) -> tuple[float, float]:
    from datetime import datetime, timedelta, timezone

    import polars as pl
    from deltalake import write_deltalake

    from cowork_pipeline.lake import _PROMOTIONS_SCHEMA, PROMOTIONS_TABLE, Lake, Lineage, Published

    lake = Lake(root)
    caps = [f"cap{i:02d}" for i in range(20)]
    v = lake.write("validated_environments", pl.DataFrame({"capability_id": caps}), lineage=Lineage.local("bench"), mode="overwrite")
    tables = ["validated_environments", "environment_drafts", "repair_log", "rejected_environments", "demonstrations", "rl_rollouts"]
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    log = pl.DataFrame({"table": [tables[i % 6] for i in range(rows)], "version": [v] * rows, "run_id": ["earlier"] * rows,
                        "promoted_at": [t0 + timedelta(seconds=i) for i in range(rows)], "checks": ["{}"] * rows,
                        "partition": [caps[(i // 6) % 20] for i in range(rows)], "partition_column": ["capability_id"] * rows},
                       schema=_PROMOTIONS_SCHEMA)
    write_deltalake(lake.uri(PROMOTIONS_TABLE), log.to_arrow(), mode="error", configuration={"delta.checkpointInterval": "10"})
    lake.write("validated_environments", pl.DataFrame({"capability_id": caps}), lineage=Lineage.local("bench"), mode="overwrite")
    best, fold = float("inf"), float("inf")
    for i in range(5):  # alternate two versions so that each publication changes what is published
        t = time.perf_counter()
        cap = caps[i % 20]
        lake.promote("validated_environments", v + 1 - i % 2, run_id=f"bench-{i}", partition=cap, partition_column="capability_id",
                     if_published=lake.promoted_version("validated_environments", cap))
        best = min(best, time.perf_counter() - t)
        promotions = lake.promotions("validated_environments")
        t = time.perf_counter()
        state = Published()
        for rec in promotions.iter_rows(named=True):
            state = state.apply(rec["version"], rec["partition"], rec["partition_column"])
        fold = min(fold, time.perf_counter() - t)
        assert state == Published.replay(promotions)
    return best * 1000, fold * 1000


def backfill_read(partitions: int) -> tuple[float, float, float]:
    """(ms per read_promoted, ms per read of the latest version, ms reading each partition at its version)."""
    with tempfile.TemporaryDirectory(prefix="bench-publish-read-") as root:
        return _backfill_read(partitions, root)


def _backfill_read(partitions: int, root: str) -> tuple[float, float, float]:
    import polars as pl

    from cowork_pipeline.lake import Lake, Lineage

    lake = Lake(root)
    published = {}
    for i in range(partitions):
        cap = f"cap{i:03d}"
        df = pl.DataFrame({"capability_id": [cap] * 50, "env_id": [f"{cap}-{j}" for j in range(50)], "spec": ["{...}" * 400] * 50})
        published[cap] = lake.write("validated_environments", df, lineage=Lineage.local("bench"), mode="overwrite",
                                    replace_where=f"capability_id = '{cap}'")
        lake.promote("validated_environments", published[cap], run_id="bench", partition=cap, partition_column="capability_id")

    def best(f: Any) -> float:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return min(times) * 1000

    def each_at_its_version() -> pl.DataFrame:
        # one filtered read per version, as read_promoted did (the filter pushed down to the scan)
        return pl.concat([lake._select("validated_environments", v, None, f"capability_id IN ('{cap}')")
                          for cap, v in published.items()])

    got = lake.read_promoted("validated_environments")[0]
    assert got.sort("env_id").equals(each_at_its_version().sort("env_id"))
    return (best(lambda: lake.read_promoted("validated_environments")), best(lambda: lake.read("validated_environments")),
            best(each_at_its_version))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=16, help="processes writing at once (default 16)")
    ap.add_argument("--writes", type=int, default=5, help="writes per writer (default 5)")
    ap.add_argument("--log-rows", type=int, nargs="*", default=[1_000, 100_000, 1_000_000],
                    help="promotion log sizes to publish with (default 1000 100000 1000000)")
    ap.add_argument("--partitions", type=int, default=200, help="partitions a backfill published (default 200; 0 skips)")
    args = ap.parse_args()
    n = args.writers * args.writes
    print(f"{args.writers} writers x {args.writes} writes each = {n} publications per workload\n")
    print(f"{'workload':<10} {'at once':>12} {'one at a time':>14} {'ratio':>6} {'retries':>8}  all published")
    ok = True
    for workload in WORKLOADS:
        serial = run(workload, args.writers, args.writes, at_once=False)
        parallel = run(workload, args.writers, args.writes, at_once=True)
        good = not serial["failed"] and not parallel["failed"] and serial["intact"] and parallel["intact"]
        ok &= good
        failed = len(serial["failed"]) + len(parallel["failed"])
        verdict = "yes" if good else f"NO ({failed} writes failed)" if failed else "NO (rows lost)"
        print(f"{workload:<10} {n / parallel['wall_s']:>8.1f} /s {n / serial['wall_s']:>10.1f} /s "
              f"{serial['wall_s'] / parallel['wall_s']:>5.2f}x {parallel['retries']:>8}  {verdict}")
        for f in [*serial["failed"], *parallel["failed"]][:5]:
            print("   ", f)
    print("\ntarget: every writer gets through and exactly its rows are published:", "met" if ok else "NOT met")
    if args.log_rows:
        print(f"\n{'log rows':>10} {'publication':>12} {'row-by-row replay alone':>24}")
    for rows in args.log_rows:
        publish_ms, fold_ms = long_log(rows)
        print(f"{rows:>10,} {publish_ms:>9.1f} ms {fold_ms:>21.1f} ms")
    if args.partitions:
        promoted_ms, latest_ms, each_ms = backfill_read(args.partitions)
        print(f"\nread_promoted of {args.partitions} partitions, each published at its own version: {promoted_ms:.0f} ms; "
              f"the latest version read whole: {latest_ms:.0f} ms ({promoted_ms / latest_ms:.1f}x); "
              f"each partition read at its version: {each_ms:.0f} ms ({each_ms / promoted_ms:.0f}x slower)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
