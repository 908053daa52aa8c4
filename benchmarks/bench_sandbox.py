"""Per-call cost of the checker sandbox vs calling the same functions in-process.

Run: .venv/bin/python benchmarks/bench_sandbox.py [--batches N]

A batch is one environment: 6 checker sources x 10 trajectories (each argument a
~50-record dict), i.e. 60 calls.  The baseline compiles the same sources in this
process and calls them directly, with no isolation at all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cowork_pipeline.validation.sandbox import Sandbox, SandboxLimits, static_check  # noqa: E402

SOURCES = {
    "all_tools_ok": """
def check(ev):
    recs = ev["records"]
    failed = [r["id"] for r in recs if not r["ok"]]
    return {"passed": len(failed) <= len(recs) // 2, "failed": len(failed)}
""",
    "mentions_answer": """
import re
PAT = re.compile(r"\\banswer\\b", re.I)
def check(ev):
    return bool(PAT.search(ev["final"]["answer"])) or any(PAT.search(r["text"]) for r in ev["records"])
""",
    "score_stats": """
import statistics
def check(ev):
    scores = [r["score"] for r in ev["records"]]
    return {"mean": round(statistics.fmean(scores), 4), "max": max(scores), "ok": statistics.fmean(scores) > 1.0}
""",
    "tool_counts": """
from collections import Counter
def check(ev):
    counts = Counter(r["tool"] for r in ev["records"])
    return counts.most_common(1)[0][0] == "search" and counts["write"] >= 1
""",
    "files_written": """
def check(ev):
    files = set(ev["final"]["files"])
    written = {r["args"].get("path") for r in ev["records"] if r["tool"] == "write"}
    return sorted(f for f in files if f in written)
""",
    "query_lengths": """
def check(ev):
    qs = [r["args"]["q"] for r in ev["records"] if "q" in r["args"]]
    if not qs:
        return 0.0
    return sum(len(q) for q in qs) / len(qs)
""",
}


def make_argument(i: int) -> dict:
    tools = ["search", "read", "write", "search", "run"]
    records = []
    for j in range(50):
        tool = tools[(i + j) % len(tools)]
        args = {"q": f"query {i}-{j} about topic {j % 7}", "k": 5} if tool != "write" else {"path": f"out/{j % 4}.md", "content": "lorem " * 8}
        records.append({"id": j, "tool": tool, "args": args, "ok": (i * j) % 7 != 0, "score": (j % 10) * 0.25, "text": f"step {j}: the answer may be {j * i}"})
    return {"trajectory_id": f"traj-{i}", "records": records, "final": {"answer": f"final answer {i}", "files": [f"out/{k}.md" for k in range(3)]}}


ARGS = [make_argument(i) for i in range(10)]
CALLS = [(key, arg) for arg in ARGS for key in SOURCES]  # 60 calls


def _compile_all() -> dict:
    fns = {}
    for key, src in SOURCES.items():
        g: dict = {"__name__": "checker"}
        exec(compile(src, "<checker>", "exec"), g)
        fns[key] = g["check"]
    return fns


def baseline(batches: int, compile_each_batch: bool) -> tuple[float, float]:
    """(wall µs/call median, CPU µs/call) calling the functions directly in-process."""
    fns = _compile_all()
    samples = []
    cpu0 = time.process_time()
    for _ in range(batches):
        t0 = time.perf_counter()
        if compile_each_batch:
            fns = _compile_all()
        for key, arg in CALLS:
            fns[key](arg)
        samples.append((time.perf_counter() - t0) / len(CALLS) * 1e6)
    cpu = (time.process_time() - cpu0) / (batches * len(CALLS)) * 1e6
    return statistics.median(samples), cpu


def _worker_cpu_s(box: Sandbox) -> float:
    """utime+stime of the live workers (benchmark-only peek at private state)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for w in box._workers:  # noqa: SLF001
        if w.proc is None:
            continue
        with open(f"/proc/{w.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def sandbox_run(box: Sandbox, batches: int, cold: bool = False, sources: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(wall µs/call median, CPU µs/call parent+workers, ms/batch median)."""
    base = sources or SOURCES
    box.evaluate(base, CALLS)  # warm-up: worker ready, caches primed
    samples = []
    cpu_parent0, cpu_workers0 = time.process_time(), _worker_cpu_s(box)
    for b in range(batches):
        if cold:  # unique source text per batch defeats the static-check and code caches
            sources = {k: f"{v}\n# batch {b} {time.perf_counter_ns()}\n" for k, v in base.items()}
        else:
            sources = base
        t0 = time.perf_counter()
        results = box.evaluate(sources, CALLS)
        samples.append(time.perf_counter() - t0)
        if b == 0:
            bad = [r for r in results if not r.ok]
            assert not bad, bad[:3]
    cpu = (time.process_time() - cpu_parent0) + (_worker_cpu_s(box) - cpu_workers0)
    per_batch = statistics.median(samples)
    return per_batch / len(CALLS) * 1e6, cpu / (batches * len(CALLS)) * 1e6, per_batch * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    n = args.batches
    for src in SOURCES.values():
        assert static_check(src) == [], static_check(src)

    print(f"batch: {len(SOURCES)} sources x {len(ARGS)} arguments = {len(CALLS)} calls, "
          f"argument ~{len(json.dumps(ARGS[0])) // 1024} KB JSON; {n} batches; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rows = [
        ("in-process baseline (calls only)", *baseline(n, False), 0.0),
        ("in-process baseline (compile per batch + calls)", *baseline(n, True), 0.0),
    ]
    rows[0] = (rows[0][0], rows[0][1], rows[0][2], rows[0][1] * len(CALLS) / 1e3)
    rows[1] = (rows[1][0], rows[1][1], rows[1][2], rows[1][1] * len(CALLS) / 1e3)
    base_wall, base_cpu = rows[0][1], rows[0][2]
    limits = SandboxLimits()
    with Sandbox(workers=1, limits=limits) as box:
        rows.append(("sandbox 1 worker, default (read-only calls share)", *sandbox_run(box, n)))
        rows.append(("sandbox 1 worker, default, cold sources", *sandbox_run(box, n, cold=True)))
        private = {k: v.replace("def check(ev):", "def check(ev):\n    ev = dict(ev)\n    ev['seen'] = 1", 1) for k, v in SOURCES.items()}
        rows.append(("sandbox 1 worker, writing checkers (private copy)", *sandbox_run(box, n, sources=private)))
    with Sandbox(workers=1, limits=limits, copy_arguments=False) as box:
        rows.append(("sandbox 1 worker, arg shared within batch", *sandbox_run(box, n)))
    with Sandbox(workers=2, limits=limits) as box:
        rows.append(("sandbox 2 workers, default", *sandbox_run(box, n)))
    print()
    print(f"{'variant':50s} {'wall µs/call':>12s} {'CPU µs/call':>11s} {'ms/batch':>9s} {'wall ratio':>10s} {'CPU overhead µs/call':>21s}")
    for name, wall, cpu, ms in rows:
        print(f"{name:50s} {wall:12.1f} {cpu:11.1f} {ms:9.2f} {wall / base_wall:9.1f}x {cpu - base_cpu:21.1f}")
    print("\nwall = median batch latency / 60; CPU = parent + worker CPU time / calls (load-independent).")


if __name__ == "__main__":
    main()
