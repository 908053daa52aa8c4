"""RL on a pretrained checkpoint: peak memory of one RL step, the model trained whole against LoRA adapters.

    .venv/bin/python benchmarks/bench_rl_memory.py [--hidden 1024] [--layers 8] [--group 2] [--new-tokens 16]
                                                   [--micro-batch-tokens 2048]

A plain Qwen3 model of the given shape (random weights, the student's tokenizer, no student marker: shaped as a
user's pretrained checkpoint comes) takes one RL step with the KL to its reference policy: ``--group`` rollouts of
the two-turn invoice task of ``tests/test_rl.py``, graded, and one update. Each way runs in a process of its own:

- whole (the baseline): ``RLConfig(lora=False)``: fp32 weights, their gradients, AdamW's two moments and a frozen
  reference copy;
- LoRA: ``lora=True`` (what a pretrained checkpoint gets): the adapters trained, the reference the model with its
  adapters off, each layer recomputed in the backward pass (``gradient_checkpointing``, LoRA's default);
- LoRA without gradient checkpointing (``gradient_checkpointing=False``): what the default saves.

The update's micro-batches hold ``--micro-batch-tokens`` padded tokens (``RLConfig.micro_batch_tokens``): the
activations of a micro-batch grow with it, the weights' share does not, and on a model of a user's size the
weights' share is most of it (an 8B model: 16 bytes a parameter trained whole, plus a 4-byte reference copy).

Reported: each process's peak resident memory (``ru_maxrss``) above the floor, a process that imports the same and
loads the model without training it, and its ratio to the whole model's. On a GPU the same parts are what
``torch.cuda.max_memory_allocated`` would count, in bf16 for LoRA's frozen base.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

WAYS = {"whole (baseline)": {"lora": False}, "LoRA": {"lora": True},
        "LoRA, no checkpointing": {"lora": True, "gradient_checkpointing": False}}


def build(out: Path, hidden: int, layers: int) -> tuple[Path, int]:
    """A pretrained-shaped checkpoint: the student's tokenizer and a plain Qwen3 of this shape, no student marker."""
    from test_rl import small_env, teacher_demo

    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.training.student import STUDENT_MARKER, StudentConfig, build_student

    demo = teacher_demo(small_env())
    path = build_student([render_conversation(demo["messages"], demo["tools"])], out, StudentConfig(
        vocab_size=768, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_layers=layers,
        num_heads=max(2, hidden // 64), num_kv_heads=max(1, hidden // 256), max_position_embeddings=2048,
        min_frequency=1, seed=0, pointer_dim=0))
    (Path(path) / STUDENT_MARKER).unlink()
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return Path(path), params


def child(mode: str, checkpoint: Path, group: int, new_tokens: int, micro_batch_tokens: int, out: Path) -> None:
    """One way, in this process: prints its peak resident memory (KiB) and seconds as JSON."""
    import torch

    torch.set_num_threads(1)
    import peft  # noqa: F401  (every way, the floor included, imports the same)
    from test_rl import small_env

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import RLConfig, train_rl
    from cowork_pipeline.validation.sandbox import Sandbox

    t0 = time.perf_counter()
    if mode == "floor":
        HFAgent(checkpoint, device="cpu", dtype=torch.float32, strict_tools=False)
        result = None
    else:
        cfg = RLConfig("bench", group_size=group, max_new_tokens=new_tokens, max_steps_per_turn=2, kl_coef=0.05,
                       micro_batch_tokens=micro_batch_tokens, **WAYS[mode])
        with Sandbox(workers=1) as sandbox:
            result = train_rl(checkpoint, [small_env()], sandbox, cfg, steps=1, out_dir=out, device="cpu")
    print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "seconds": time.perf_counter() - t0,
                      "lora": None if result is None else result.config.lora}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.checkpoint, args.group, args.new_tokens, args.micro_batch_tokens, args.out)
        return

    with tempfile.TemporaryDirectory(prefix="bench_rl_memory_") as tmp:
        checkpoint, params = build(Path(tmp) / "pretrained", args.hidden, args.layers)
        print(f"a pretrained-shaped Qwen3: hidden {args.hidden}, {args.layers} layers, {params / 1e6:.1f}M parameters "
              f"({params * 4 / 2**20:.0f} MiB in fp32); one RL step: {args.group} rollouts of a two-turn task, up to "
              f"{args.new_tokens} tokens a turn, one update with the KL to the reference in micro-batches of "
              f"{args.micro_batch_tokens:,} tokens; each way in its own process")
        peaks: dict[str, dict] = {}
        for k, mode in enumerate(["floor", *WAYS]):
            proc = subprocess.run([sys.executable, __file__, "--child", mode, "--checkpoint", str(checkpoint),
                                   "--group", str(args.group), "--new-tokens", str(args.new_tokens),
                                   "--micro-batch-tokens", str(args.micro_batch_tokens),
                                   "--out", str(Path(tmp) / f"rl{k}")], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
            peaks[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    floor = peaks["floor"]["maxrss_kib"] / 1024
    base = max(peaks["whole (baseline)"]["maxrss_kib"] / 1024 - floor, 1.0)  # (at a smoke run's size, ~0)
    print(f"floor (imports, the model loaded): {floor:,.0f} MiB")
    print(f"{'way':<24}{'trains':>8}{'peak above floor MiB':>22}{'ratio':>8}{'seconds':>9}")
    for mode in WAYS:
        p = peaks[mode]
        above = p["maxrss_kib"] / 1024 - floor
        print(f"{mode:<24}{'LoRA' if p['lora'] else 'whole':>8}{above:>22,.0f}{above / base:>7.2f}x{p['seconds']:>9.1f}")
    print(f"expected for the whole model: weights' gradients, two AdamW moments and a reference copy, "
          f"4 x {params * 4 / 2**20:,.0f} MiB, plus activations")


if __name__ == "__main__":
    main()
