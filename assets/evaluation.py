"""Asset: benchmark scores of every agent on the held-out environments, with a comparison report."""

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets._io import GATED, check_spec, lineage, plot_md, write_checked
from assets.models import envs_by_split, local_model, model_dir, model_files, model_trained_at
from cowork_pipeline.evaluation import Contestant, Scoring, comparison_table, markdown_table, rebase, report, score_contestants
from cowork_pipeline.lake import ANY_PUBLISHED, Lake, NotPromoted, PublishConflict, is_remote
from cowork_pipeline.quality import Expect
from cowork_pipeline.training.registry import checkpoint_key, current_checkpoints
from resources import AgentsResource, ComputeResource, LakeResource, ProfileResource

HELDOUT = ("heldout_env", "heldout_capability")
TEACHER_KEY = "teacher:embedded"  # the reference program: what it does is fixed by the environment and the code


def _libraries() -> dict[str, str]:
    """The versions of what runs a student's forward pass: another torch or transformers may decode differently."""
    from importlib.metadata import version

    return {lib: version(lib) for lib in ("torch", "transformers", "peft")}


def _previous_scores(context: AssetExecutionContext, lk) -> tuple[pl.DataFrame | None, int | None]:
    """(the promoted benchmark_scores, their version): (None, None) when there are none yet, (None, ANY_PUBLISHED) when
    they cannot be read (then everything is scored again, and the reason is logged)."""
    if not lk.exists("benchmark_scores"):
        return None, None
    try:
        return lk.read_promoted("benchmark_scores")
    except NotPromoted:  # written once, never promoted: nothing trustworthy to keep
        return None, None
    except Exception as e:  # noqa: BLE001 - a cache: an unreadable table costs a re-score, never the run
        context.log.warning(f"earlier benchmark_scores not reused ({type(e).__name__}: {e}); scoring every agent")
        return None, ANY_PUBLISHED


@dg.asset(group_name="evaluation", code_version="1", deps=["checkpoints", "rl_checkpoints", "environment_splits"],
          check_specs=[check_spec("benchmark_scores", "every trial scored in [0, 1], ids present for lineage")],
          automation_condition=GATED)
def benchmark_scores(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource, compute: ComputeResource,
                     agents: AgentsResource):
    """Base, SFT and RL students, the teacher and any configured endpoint, k trials each on held-out environments
    (Claw-Eval scoring)."""
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.demonstrations import EmbeddedTeacher
    from cowork_pipeline.validation.sandbox import Sandbox

    lk = lake.lake()
    envs, upstream = envs_by_split(lk, HELDOUT, profile.eval_envs_per_capability or None)
    ckpts, v_c = lk.read_promoted("checkpoints")
    upstream["checkpoints"] = v_c
    if lk.exists("rl_checkpoints"):
        try:
            rl_ckpts, v_rl = lk.read_promoted("rl_checkpoints")
            ckpts = pl.concat([ckpts, rl_ckpts.select(ckpts.columns)])
            upstream["rl_checkpoints"] = v_rl
        except Exception as e:  # RL is optional: score what exists, say why RL is missing
            context.log.warning(f"rl_checkpoints not used: {e}")
    device = compute.resolve()
    endpoints = agents.build()
    libs = _libraries()
    students = [Contestant(f"{r['kind']}:{r['checkpoint_id']}", r["checkpoint_id"],
                           checkpoint_key(r, model_files(lk, r["path"]), max_new_tokens=profile.max_new_tokens, device=device, libs=libs),
                           # (a store folder is fetched only when the agent is scored, not when it keeps its trials)
                           build=lambda r=r: HFAgent(local_model(lk, r["path"]), device=device, max_new_tokens=profile.max_new_tokens,
                                                     seed=profile.seed),
                           config={"path": r["path"], "max_new_tokens": profile.max_new_tokens, "device": device})
                for r in current_checkpoints(ckpts.to_dicts(), model_trained_at(lk))]
    # models behind OpenAI-compatible endpoints: scored the same way, every time they are given
    remote = [Contestant(a.name, ckpt_id, a.key(), build=lambda a=a: a, config=a.describe(), always=True) for ckpt_id, a in endpoints]
    teacher = Contestant("teacher:embedded", "teacher-embedded", TEACHER_KEY, per_environment=EmbeddedTeacher)

    previous, _ = _previous_scores(context, lk)
    with Sandbox(workers=profile.sandbox_workers) as sb:
        # an agent unchanged since an earlier run scored it on these very environments keeps those trials
        result = score_contestants([*students, *remote, teacher], envs, sb, run_id=context.run.run_id, trials=profile.eval_trials,
                                   fault_rate=profile.eval_fault_rate, seed=profile.seed, previous=previous,
                                   rescore=agents.rescore, log=context.log.info,
                                   keep_others=agents.keeps_earlier)
    for _, a in endpoints:
        context.log.info(f"{a.name} ({a.model} at {a.client.base_url}): {a.usage['requests']} requests ({a.usage['cached']} replayed)")
        for field, how in a.client.adapted.items():  # (a reasoning model that takes only its own temperature, ...)
            context.log.warning(f"{a.name}: the endpoint refused '{field}', {how}")
    scored = result

    def publish() -> tuple[Scoring, dg.MaterializeResult, dg.AssetCheckResult, str]:
        latest, published = _previous_scores(context, lk)
        result = rebase(scored, previous, latest, agents.keeps_earlier)
        trials = result.trials
        text = report(trials, f"Benchmark report (profile {profile.name}, run {context.run.run_id[:8]})")
        try:
            mat, check = write_checked(context, lk, "benchmark_scores", trials, lin=lineage(context, "benchmark_scores", "1", upstream),
                                       suite=[Expect("ExpectColumnValuesToBeBetween", {"column": "score", "min_value": 0.0, "max_value": 1.0}),
                                              Expect("ExpectColumnValuesToNotBeNull", {"column": "env_id"}),
                                              Expect("ExpectColumnValuesToNotBeNull", {"column": "checkpoint_id"})],
                                       if_published=published)
        except PublishConflict as e:
            context.log.info(f"benchmark_scores changed while this run wrote them; merging again ({e})")
            raise
        return result, mat, check, text

    # another run may have written the table meanwhile (a second `cowork eval`): keep what it added, and publish only
    # on the version that was read, or read and merge again
    result, mat, check, text = lk.until_published("benchmark_scores", publish)
    table = comparison_table(result.trials)
    report_path = write_report(lk, f"benchmark_{context.run.run_id[:8]}.md", text)
    mat.metadata.update({"comparison": dg.MetadataValue.md(markdown_table(table)), "report": dg.MetadataValue.md(text),
                         "report_path": report_path,
                         "plot": _plot(table), "heldout_environments": len(envs), "benchmark_key": result.benchmark_key,
                         "scored": result.scored, "kept": dg.MetadataValue.json(result.kept),
                         "endpoints": [{"agent": a.name, "model": a.model, "base_url": a.client.base_url, **a.usage,
                                        "adapted": a.client.adapted} for _, a in endpoints]})
    yield mat
    yield check


def write_report(lake: Lake, name: str, text: str) -> str:
    """Write a report beside the lake, ``<lake>/reports/<name>`` (an object in the store for an object-store lake,
    which another pod reads as well as this one); returns where."""
    from cowork_pipeline.training.model_store import write_file

    if is_remote(lake.root):
        uri = f"{lake.root.rstrip('/')}/reports/{name}"
        write_file(uri, text.encode(), lake.storage_options)
        return uri
    path = model_dir(lake, "..", "reports", name).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _plot(table: pl.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 2.8))
    agents = table["agent"].to_list()
    x = range(len(agents))
    ax.bar([i - 0.2 for i in x], [v or 0 for v in table["single_turn_pass"].to_list()], 0.4, label="single-turn")
    ax.bar([i + 0.2 for i in x], [v or 0 for v in table["multi_turn_pass"].to_list()], 0.4, label="multi-turn")
    ax.set_xticks(list(x), [a.split(":")[0] for a in agents])
    ax.set_ylabel("pass rate")
    ax.legend()
    return plot_md(fig)
