"""Assets: RL rollouts and one RL checkpoint per configuration (reward handling x credit assignment)."""
import json

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets._io import check_spec, lineage, plot_md, write_checked
from assets.models import CHECKPOINT_SCHEMA, envs_by_split, local_model, model_dir, model_trained_at, publish_model
from cowork_pipeline.quality import Expect
from resources import ComputeResource, LakeResource, ProfileResource

# 2: each rollout samples from its own seed, its turns decoded continuously; LoRA for a pretrained checkpoint.
RL_CODE_VERSION = "2"
CURVE_SCHEMA = {"config": pl.String, "step": pl.Int64, "mean_reward": pl.Float64, "pass_rate": pl.Float64, "metrics_json": pl.String}


@dg.multi_asset(
    specs=[dg.AssetSpec("rl_rollouts", deps=["checkpoints", "environment_splits"], group_name="training", code_version=RL_CODE_VERSION),
           dg.AssetSpec("rl_checkpoints", group_name="training", code_version=RL_CODE_VERSION)],
    check_specs=[check_spec("rl_rollouts", "unique rollout ids; token log-probs stored"),
                 check_spec("rl_checkpoints", "one checkpoint per configuration")],
    pool="gpu", can_subset=False,
)
def rl_training(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource, compute: ComputeResource):
    """Each configuration starts from the SFT checkpoint and optimizes the checkers' rewards on training environments
    with the same owned GRPO/RLOO-family loop, so the configurations differ only in reward handling and credit assignment."""
    from dataclasses import replace

    from cowork_pipeline.training.rl import DEFAULT_CONFIGS, rollout_schema, train_rl
    from cowork_pipeline.validation.sandbox import Sandbox

    lk = lake.lake()
    ckpts, v_c = lk.read_promoted("checkpoints")
    from cowork_pipeline.training.registry import latest_trained

    # the one trained last, whatever the row order
    base = latest_trained(ckpts.filter(pl.col("kind") == "sft").to_dicts(), model_trained_at(lk))
    if base is None:
        raise dg.Failure("no SFT checkpoint in the promoted checkpoints table to start RL from")
    envs, upstream = envs_by_split(lk, ("train",), max(1, profile.rl_envs // 15) if profile.rl_envs else None)
    envs = envs[: profile.rl_envs] if profile.rl_envs else envs
    upstream["checkpoints"] = v_c
    wanted = [n.strip() for n in profile.rl_configs.split(",") if n.strip()]
    known = {c.name: c for c in DEFAULT_CONFIGS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise dg.Failure(f"unknown RL configuration(s) {unknown}; known: {sorted(known)}")
    device = compute.resolve()
    start = local_model(lk, base["path"])  # (fetched from the store once, when it is not on this machine)
    rows, curves, registry = [], [], []
    with Sandbox(workers=profile.sandbox_workers) as sb:
        for name in wanted:
            cfg = replace(known[name], group_size=profile.rl_group_size, seed=profile.student_seed, max_new_tokens=profile.max_new_tokens)
            ckpt_id = f"rl-{name}-{base['checkpoint_id']}-n{profile.rl_steps}"
            res = train_rl(start, [e for e, _ in envs], sb, cfg, profile.rl_steps, model_dir(lk, ckpt_id), device=device,
                           on_step=lambda r, n=name: context.log.info(f"rl {n} step {r.get('step')}: reward {r.get('mean_reward')}"))
            rows.extend(rollout_rows_with_config(res.rollouts, name))
            for r in res.curve:
                curves.append({"config": name, "step": int(r.get("step", 0)), "mean_reward": float(r.get("mean_reward", 0.0)),
                               "pass_rate": float(r.get("pass_rate", 0.0)), "metrics_json": json.dumps(r, default=str)})
            registry.append({"checkpoint_id": ckpt_id, "kind": "rl", "path": publish_model(lk, res.checkpoint, ckpt_id), "base_checkpoint_id": base["checkpoint_id"],
                             "base_model": base["base_model"], "config_json": json.dumps(res.config.__dict__, default=str),
                             "data_versions_json": json.dumps(upstream), "metrics_json": json.dumps(res.curve[-1] if res.curve else {}, default=str),
                             "device": device})
    schema = rollout_schema()
    roll_df = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    lin = lineage(context, "rl_rollouts", RL_CODE_VERSION, upstream)
    mat, check = write_checked(context, lk, "rl_rollouts", roll_df, lin=lin, key=["rollout_id"],
                               suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "rollout_id"}),
                                      Expect("ExpectColumnValuesToNotBeNull", {"column": "logprobs"})])
    curve_df = pl.DataFrame(curves, schema=CURVE_SCHEMA)
    v_curve = lk.write("rl_curves", curve_df, lineage=lin, key=["config", "step"])
    mat.metadata.update({"configs": ", ".join(wanted), "rl_curves_version": v_curve, "reward_plot": _curve_plot(curve_df)})
    yield mat
    yield check
    mat2, check2 = write_checked(context, lk, "rl_checkpoints", pl.DataFrame(registry, schema=CHECKPOINT_SCHEMA), key=["checkpoint_id"],
                                 lin=lineage(context, "rl_checkpoints", RL_CODE_VERSION, upstream),
                                 suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "checkpoint_id"})])
    yield mat2
    yield check2


def rollout_rows_with_config(rollouts: list, name: str) -> list:
    return [dict(r, config=r.get("config") or name) for r in rollouts]


def _curve_plot(df: pl.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 2.8))
    for name in sorted(set(df["config"].to_list())):
        sub = df.filter(pl.col("config") == name).sort("step")
        ax.plot(sub["step"].to_list(), sub["mean_reward"].to_list(), label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.legend(fontsize=6)
    return plot_md(fig)
