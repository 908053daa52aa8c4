"""A student's episodes in process: turns decoded continuously vs in lockstep rounds (``runner.run_episodes``).

    .venv/bin/python benchmarks/bench_episodes.py [--checkpoint DIR] [--envs 63] [--trials 2] [--batch 16] [--repeats 2]
                                                  [--new-tokens 256] [--sft-steps 150] [--rollouts [--group 4]]

``--checkpoint``: a trained student's folder, e.g. the default run's SFT checkpoint
(``.cowork/lake/models/sft-...``). Without it, a small student is fine-tuned here on the embedded teacher's
episodes of the environments (about a minute), which calls their tools, if less well. The environments are
drafted round-robin over the catalog; each gets ``--trials`` faulted trials and a clean one, as ``evaluate`` runs
them. Both drivers run the same episodes greedily, interleaved, best of ``--repeats``:

- lockstep (the baseline): each round, every episode waiting for its turn is generated in batches of ``--batch``,
  each decoded to its longest turn, and the next round starts when the last batch ends;
- continuous: an episode's next turn joins the running batch as soon as its tools ran (``HFAgent.turns``).

Reported: wall time of the episodes (grading left out: it is the same either way), decode steps, the mean share
of the batch's rows in use per step, and whether every trajectory is the same under both drivers.

``--rollouts``: RL rollouts instead (``training.rl.collect_rollouts``, as an RL step collects them: ``--group``
sampled episodes per environment, temperature 1, no faults, each episode from its own seed; the policy loaded as
``train_rl`` loads it), in lockstep rounds or continuously; the wall time is the whole collection, grading
included (the same either way), and the check is that every rollout (messages, sampled ids, rewards) is the same.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cases(n_envs: int, trials: int):
    from cowork_pipeline.capabilities import load_catalog
    from cowork_pipeline.services import FaultConfig
    from cowork_pipeline.synthesis.embedded import EmbeddedBackend, sub_seed

    catalog, backend = load_catalog(), EmbeddedBackend()
    caps = sorted(catalog)
    envs = [backend.draft(catalog[caps[k % len(caps)]], 1000 + k // len(caps)).spec for k in range(n_envs)]
    out = []
    for env in envs:
        out += [(env, FaultConfig(rate=0.1, seed=sub_seed(0, env.env_id, t))) for t in range(trials)]
        out.append((env, None))
    return out


def warm_student(envs, out: Path, steps: int) -> Path:
    """A small student fine-tuned on the teacher's episodes of ``envs``."""
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.demonstrations import EmbeddedTeacher, _clean
    from cowork_pipeline.runner import run_episode
    from cowork_pipeline.services import tools_for
    from cowork_pipeline.training.sft import SFTSettings, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student

    demos = []
    for env in envs:
        traj = run_episode(env, EmbeddedTeacher(env))
        demos.append({"messages": [_clean(m) for m in traj.messages], "tools": tools_for(env.tools)})
    base = build_student([render_conversation(d["messages"], d["tools"]) for d in demos], out / "base",
                         StudentConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                                       num_kv_heads=1, max_position_embeddings=4096, min_frequency=1, seed=0))
    return train_sft(base, demos, out / "sft", SFTSettings(max_steps=steps, lr=1e-2, batch_size=2, max_length=4096,
                                                           device="cpu", warmup=0.0)).checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--envs", type=int, default=63)
    ap.add_argument("--trials", type=int, default=2, help="faulted trials per environment (plus one clean)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sft-steps", type=int, default=150, help="fine-tuning steps of the student built without --checkpoint")
    ap.add_argument("--rollouts", action="store_true", help="RL rollouts of the environments instead of the evaluation's episodes")
    ap.add_argument("--group", type=int, default=4, help="with --rollouts: rollouts per environment")
    args = ap.parse_args()

    from cowork_pipeline.agents import decoding as decoding_module
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.runner import run_episodes

    episodes = cases(args.envs, args.trials)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        checkpoint = args.checkpoint
        if checkpoint is None:
            t0 = time.perf_counter()
            checkpoint = warm_student(list({id(e): e for e, _f in episodes}.values()), Path(tmp), args.sft_steps)
            print(f"fine-tuned a small student on the teacher's episodes in {time.perf_counter() - t0:.0f} s")
        if args.rollouts:
            import torch

            from cowork_pipeline.training.rl import RLConfig, collect_rollouts
            from cowork_pipeline.validation.sandbox import Sandbox

            # (loaded as train_rl loads its policy: fp32, sampling unconstrained)
            agent = HFAgent(checkpoint, device="cpu", max_new_tokens=args.new_tokens, batch_size=args.batch,
                            temperature=1.0, dtype=torch.float32, strict_tools=False)
            config = RLConfig("bench", group_size=args.group, max_new_tokens=args.new_tokens, gen_batch_size=args.batch)
            envs = list({id(e): e for e, _f in episodes}.values())
            sandbox = stack.enter_context(Sandbox(workers=1))  # closed however the run ends

            def drive(lockstep: bool) -> list:
                rollouts = collect_rollouts(agent, envs, sandbox, config, step=0, seed=0, lockstep=lockstep)
                return [(r.messages, r.reward, r.turn_rewards, [(s["prompt_ids"], s["completion_ids"]) for s in r.steps])
                        for r in rollouts]
        else:
            agent = HFAgent(checkpoint, device="cpu", max_new_tokens=args.new_tokens, batch_size=args.batch)

            def drive(lockstep: bool) -> list:
                trajectories = run_episodes(episodes, agent, lockstep=lockstep)
                return [(t.messages, t.termination, [{k: v for k, v in s.items() if k != "seconds"} for s in t.steps])
                        for t in trajectories]

        counts = {"steps": 0, "rows": 0}
        step = decoding_module.Decoding.step

        def counted(self):
            counts["steps"] += 1
            counts["rows"] += self.live
            return step(self)

        decoding_module.Decoding.step = counted
        drivers = {"lockstep (baseline)": True, "continuous": False}
        best: dict[str, float] = {}
        stats: dict[str, tuple[int, float]] = {}
        outcomes: dict[str, list] = {}
        for _ in range(args.repeats):
            for name, lockstep in drivers.items():
                agent.clear_prefix_cache()  # (each run starts cold, as a fresh evaluation does)
                counts.update(steps=0, rows=0)
                t0 = time.perf_counter()
                outcomes[name] = drive(lockstep)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
                stats[name] = (counts["steps"], counts["rows"] / max(counts["steps"], 1) / args.batch)
    if args.rollouts:
        turns = sum(len(o[3]) for o in outcomes["continuous"])
        print(f"{len(outcomes['continuous'])} RL rollouts ({args.envs} environments x {args.group}, sampled), batch "
              f"{args.batch}, up to {args.new_tokens} tokens a turn, {turns} assistant turns; best of {args.repeats}, "
              f"interleaved; grading included")
    else:
        calls = sum(len(t[2]) for t in outcomes["continuous"])
        print(f"{len(episodes)} episodes ({args.envs} environments x {args.trials} faulted + 1 clean trial), batch "
              f"{args.batch}, up to {args.new_tokens} tokens a turn, {calls} tool calls; best of {args.repeats}, "
              f"interleaved")
    print(f"{'driver':<22}{'wall s':>9}{'decode steps':>14}{'rows in use':>13}{'ratio':>8}")
    base = best["lockstep (baseline)"]
    for name in drivers:
        steps, used = stats[name]
        print(f"{name:<22}{best[name]:>9.1f}{steps:>14,}{used:>12.0%}{best[name] / base:>7.2f}x")
    same = outcomes["continuous"] == outcomes["lockstep (baseline)"]
    print(f"the same {'rollouts' if args.rollouts else 'trajectories'} under both drivers: {'yes' if same else 'NO'}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
