"""Write-audit-publish under concurrent runs: what a backfill of many partitions does to the lake.

    .venv/bin/python benchmarks/bench_publish.py [--writers 16] [--writes 5]

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
    from cowork_pipeline.lake import Lake

    ctx = multiprocessing.get_context("spawn")
    root = tempfile.mkdtemp(prefix="bench-publish-")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=16, help="processes writing at once (default 16)")
    ap.add_argument("--writes", type=int, default=5, help="writes per writer (default 5)")
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
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
