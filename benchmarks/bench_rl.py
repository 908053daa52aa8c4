"""RL configurations compared on one loop: same warm start, same environment, same budget, same seeds.

    .venv/bin/python benchmarks/bench_rl.py [--steps 12] [--seeds 0 1] [--group 8] [--lr 3e-4] [--threads 1]
                                            [--configs binary_traj partial_group ...] [--out results.json]

Environment and warm start are those of ``tests/test_rl.py``: a two-turn invoice task (one completion item per turn)
and a tiny Qwen3 student SFT-trained on four teacher demonstrations that differ only in the status written at each
turn (one rewarded, one not), so the warm policy is roughly 50/50 at two decision points. Each configuration then
runs ``--steps`` RL steps per seed. Reported per configuration and seed: the training-reward curve, the mean reward
of a fixed evaluation (2 x 32 sampled episodes, same sampling seeds for every policy: common random numbers) before
and after, the log-probability margin of the rewarded over the unrewarded action at the two decision points, the
final KL to the initial policy and the wall time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def evaluate(checkpoint: Path, env, sandbox, seeds=(101, 202), n: int = 32) -> float:
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import RLConfig, collect_rollouts

    cfg = RLConfig("eval", group_size=n, max_new_tokens=48, max_steps_per_turn=3)
    policy = HFAgent(checkpoint, device="cpu", dtype=torch.float32, batch_size=n)
    rewards = [r.reward for s in seeds for r in collect_rollouts(policy, [env], sandbox, cfg, step=0, seed=s)]
    return sum(rewards) / len(rewards)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = torch default)")
    ap.add_argument("--configs", nargs="*", default=None)
    ap.add_argument("--sft-steps", type=int, default=120)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from test_rl import _decision_margin, small_env, teacher_demo  # the test's environment and warm start

    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.training.rl import DEFAULT_CONFIGS, train_rl
    from cowork_pipeline.training.sft import SFTSettings, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student
    from cowork_pipeline.validation.sandbox import Sandbox

    env = small_env()
    demos = [teacher_demo(small_env(s0, s1)) for s0 in ("paid", "void") for s1 in ("disputed", "void")]
    with tempfile.TemporaryDirectory(prefix="bench_rl_") as tmp:  # checkpoints of every config: not worth keeping
        work = Path(tmp)
        corpus = [render_conversation(d["messages"], d["tools"]) for d in demos]
        base = build_student(corpus, work / "base", StudentConfig(
            vocab_size=768, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
            max_position_embeddings=2048, min_frequency=1, seed=0))
        warm = train_sft(base, demos * 4, work / "sft", SFTSettings(
            max_steps=args.sft_steps, lr=1e-2, batch_size=2, max_length=1024, device="cpu", warmup=0.0,
            lr_scheduler="constant")).checkpoint
        configs = [c for c in DEFAULT_CONFIGS if not args.configs or c.name in args.configs]
        results = []
        with Sandbox(workers=1) as sandbox:
            warm_eval, warm_margin = evaluate(warm, env, sandbox), _decision_margin(warm, demos)
            print(f"warm start: eval reward {warm_eval:.3f}, decision margin {warm_margin:.2f}", flush=True)
            for config in configs:
                for seed in args.seeds:
                    cfg = dataclasses.replace(config, group_size=args.group, lr=args.lr, seed=seed, max_new_tokens=48,
                                              max_steps_per_turn=3)
                    t0 = time.perf_counter()
                    res = train_rl(warm, [env], sandbox, cfg, args.steps, work / f"{cfg.name}_{seed}", device="cpu")
                    seconds = time.perf_counter() - t0
                    curve = [round(r["mean_reward"], 3) for r in res.curve]
                    row = {"config": cfg.name, "seed": seed, "train_reward": curve,
                           "eval_before": round(warm_eval, 3), "eval_after": round(evaluate(res.checkpoint, env, sandbox), 3),
                           "margin_before": round(warm_margin, 2), "margin_after": round(_decision_margin(res.checkpoint, demos), 2),
                           "final_kl": round(res.curve[-1]["kl"], 4),
                           "zero_adv_steps": sum(r["zero_adv_groups"] == 1.0 for r in res.curve), "seconds": round(seconds, 1)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
    print("\nconfig           seed  eval before->after  margin before->after  kl      train reward curve")
    for r in results:
        print(f"{r['config']:<16} {r['seed']:>4}  {r['eval_before']:.3f} -> {r['eval_after']:.3f}      "
              f"{r['margin_before']:5.2f} -> {r['margin_after']:5.2f}        {r['final_kl']:.4f}  {r['train_reward']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
