"""Every benchmark runs, at its smallest size, and cleans up after itself.

The figures are the benchmarks' business (run them full size, see the README); this only keeps them runnable: two
of them had broken on renames elsewhere (a private class made public, a resource the sensor came to require)
without a test noticing. Nothing here is timed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# script -> (smallest arguments, what its output must say). The markers are the lines a reader looks for, and the
# correctness verdicts that a benchmark checks on the side (identical outcomes, nothing lost), never a speed target.
SMOKE = {
    "bench_workspace.py": (["--quick"], [r"target <= 10 µs per tool call env-side: ", r"snapshot\(\) \+ restore\(\) +[\d.]+ +[\d.]+ +\d+x"]),
    "bench_certify.py": (["--envs", "21", "--repeats", "1"],
                         [r"ratio certification / drafting \(cpu\) +[\d.]+", r"worker: checker calls", r"target <= 2 ms per certified env per core: "]),
    "bench_sandbox.py": (["--batches", "3"], [r"in-process baseline \(calls only\) .* 1\.0x", r"sandbox 2 workers, default"]),
    "bench_publish.py": (["--writers", "2", "--writes", "1", "--log-rows", "100", "--partitions", "3"],
                         [r"exactly its rows are published: met", r"read_promoted of 3 partitions"]),
    "bench_llm_drafting.py": (["--seeds", "3", "--latency", "0.01", "--concurrency", "1,3"],
                              [r"outcomes identical across concurrencies: True"]),
    "bench_endpoint_eval.py": (["--envs", "2", "--trials", "1", "--latency", "0.01", "--concurrency", "1,2"],
                               [r"scores identical across concurrencies"]),
    "bench_incremental.py": (["--envs-per-capability", "1"], [r"ratio: +[\d.]+% of the full run", r"verification: +OK"]),
    "bench_generation.py": (["--batch", "2", "--new-tokens", "4", "--repeats", "1", "--steps", "2"],
                            [r"speed-up ours / naive: [\d.]+x", r"identical completions \d+/4"]),
    "bench_episodes.py": (["--envs", "2", "--trials", "1", "--new-tokens", "8", "--batch", "2", "--repeats", "1", "--sft-steps", "1"],
                          [r"continuous +[\d.]+ +[\d,]+ +\d+% +[\d.]+x", r"the same trajectories under both drivers: yes"]),
    "bench_serving.py": (["--clients", "2", "--new-tokens", "4", "--repeats", "1", "--turns", "2"],
                         [r"streamed / whole: throughput x[\d.]+", r"streamed texts identical to the whole answers: True",
                          r"continuous / static: throughput x[\d.]+", r"same answers in every run: 4/4"]),
    "bench_sft.py": (["--steps", "1", "--batch", "2"], [r"speed-up ours / TRL defaults: [\d.]+x"]),
    "bench_rl_memory.py": (["--hidden", "64", "--layers", "2", "--new-tokens", "8"],
                           [r"whole \(baseline\) +whole +[\d,-]+ +1\.00x", r"LoRA, no checkpointing +LoRA +[\d,-]+ +[\d.-]+x"]),
    "bench_rl.py": (["--steps", "1", "--seeds", "0", "--group", "2", "--sft-steps", "2", "--configs", "binary_traj"],
                    [r"warm start: eval reward", r"binary_traj +0 +[\d.]+ -> [\d.]+"]),
}

# Further modes of a benchmark, each run as its own smoke run.
VARIANTS = {
    "bench_sft.py": [(["--mask", "--steps", "2", "--batch", "2"],
                      [r"speed-up without the mask: [\d.]+x", r"the same weights both ways: True"])],
    "bench_episodes.py": [(["--rollouts", "--group", "2", "--envs", "2", "--new-tokens", "8", "--batch", "2", "--repeats",
                            "1", "--sft-steps", "1"],
                           [r"continuous +[\d.]+ +[\d,]+ +\d+% +[\d.]+x", r"the same rollouts under both drivers: yes"])],
}
RUNS = [pytest.param(script, args, markers, id=f"{script} {args[0]}" if k else script) for script in sorted(SMOKE)
        for k, (args, markers) in enumerate([SMOKE[script], *VARIANTS.get(script, [])])]


def test_every_benchmark_has_a_smoke_run() -> None:
    on_disk = {p.name for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert on_disk == set(SMOKE), f"add the new benchmark to SMOKE (or drop the deleted one): {on_disk ^ set(SMOKE)}"


@pytest.mark.parametrize("script,args,markers", RUNS)
def test_benchmark_runs_and_leaves_no_files(script: str, args: list[str], markers: list[str], tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"  # the benchmark's temporary folders go here, and must be gone when it exits
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out[-4000:]}"
    for marker in markers:
        assert re.search(marker, proc.stdout), f"{script} did not print /{marker}/:\n{proc.stdout[-4000:]}"
    # torch keeps its kernel cache in $TMPDIR/torchinductor_<user> by design, for every later process
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))
    assert not left, f"{script} left {left} behind"
