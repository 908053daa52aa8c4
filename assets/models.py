"""Assets: teacher trajectories -> demonstrations -> student -> SFT checkpoint; checkpoints registry."""
import json
import os
from pathlib import Path

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets._io import GATED, check_spec, lineage, plot_md, write_checked
from cowork_pipeline.demonstrations import collect_teacher_trajectories, contamination_audit, curate, sft_records
from cowork_pipeline.lake import Lake, is_remote
from cowork_pipeline.quality import Expect
from cowork_pipeline.spec import EnvironmentSpec
from resources import AgentsResource, ComputeResource, LakeResource, ProfileResource

CHECKPOINT_SCHEMA = {"checkpoint_id": pl.String, "kind": pl.String, "path": pl.String, "base_checkpoint_id": pl.String,
                     "base_model": pl.String, "config_json": pl.String, "data_versions_json": pl.String, "metrics_json": pl.String,
                     "device": pl.String}


def model_dir(lake: Lake, *parts: str) -> Path:
    """Model files live under the lake root when it is a folder; object-store lakes train into, and fetch their
    store's model folders into, COWORK_HOME."""
    root = Path(lake.root) if not is_remote(lake.root) else Path(os.environ.get("COWORK_HOME", ".cowork")).absolute() / "models"
    return root.joinpath("models", *parts)


def publish_model(lake: Lake, local: Path, name: str, folder: str = "models") -> str:
    """The path a checkpoint (``name``: its id) is registered under: its folder for a folder lake; for an object-store
    lake its copy in the store, ``<lake>/models/<checkpoint id>``, so that a step on another machine (a pod per step)
    can load it. (``folder="datasets"``: a dataset export, ``<lake>/datasets/<name>``, the same way.)"""
    from cowork_pipeline.training.model_store import upload

    if not is_remote(lake.root):
        return str(local)

    uri = f"{lake.root.rstrip('/')}/{folder}/{name}"
    upload(local, uri, lake.storage_options)
    return uri


def local_model(lake: Lake, path: str) -> str:
    """A registered checkpoint's folder on this machine: a store folder is fetched into ``model_dir`` (once per
    upload: the machine that trained it, or fetched it before, has it already)."""
    from cowork_pipeline.training.model_store import fetch

    if not is_remote(path):
        return path
    return str(fetch(path, model_dir(lake, path.rstrip("/").rsplit("/", 1)[-1]), lake.storage_options))


def model_trained_at(lake: Lake):
    """``trained_at`` for the registry's paths, store folders included (their upload time)."""
    from cowork_pipeline.training.model_store import written_at
    from cowork_pipeline.training.registry import trained_at

    return lambda path: written_at(path, lake.storage_options) if is_remote(path) else trained_at(path)


def model_files(lake: Lake, path: str) -> list[tuple[str, int, str]] | None:
    """What ``checkpoint_key`` keys a store folder by: its manifest's files (None for a folder on this machine)."""
    from cowork_pipeline.training.model_store import remote_manifest

    if not is_remote(path):
        return None
    manifest = remote_manifest(path, lake.storage_options) or {"files": {}}
    return sorted((rel, int(f["bytes"]), str(f["sha256"])) for rel, f in manifest["files"].items())


def envs_by_split(lake: Lake, splits: tuple[str, ...], per_capability: int | None = None) -> tuple[list[tuple[EnvironmentSpec, str]], dict[str, int]]:
    """Promoted environments in the given splits (optionally the first N per capability, by env id)."""
    envs, v_env = lake.read_promoted("validated_environments")
    sp, v_sp = lake.read_promoted("environment_splits")
    df = envs.join(sp.select("env_id", "split"), on="env_id").filter(pl.col("split").is_in(list(splits))).sort("env_id")
    if per_capability:
        df = df.group_by("capability_id", "split", maintain_order=True).head(per_capability).sort("env_id")
    out = []
    for env_id, spec_json, split in df.select("env_id", "spec_json", "split").iter_rows():
        try:
            out.append((EnvironmentSpec.from_json(spec_json), split))
        except ValueError as e:  # pydantic ValidationError is a ValueError
            raise ValueError(f"validated_environments@{v_env}: environment {env_id} has an invalid spec_json: {e}") from e
    return out, {"validated_environments": v_env, "environment_splits": v_sp}


def register_checkpoints(context, lk: Lake, rows: list[dict], upstream: dict[str, int]):
    """Upsert checkpoint rows (one write, so the registry asset materializes once per step)."""
    df = pl.DataFrame(rows, schema=CHECKPOINT_SCHEMA)
    return write_checked(context, lk, "checkpoints", df, key=["checkpoint_id"], lin=lineage(context, "checkpoints", "1", upstream),
                         suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "checkpoint_id"}),
                                Expect("ExpectColumnValuesToNotBeNull", {"column": "path"})])


@dg.asset(group_name="demonstrations", code_version=AgentsResource.from_env().teacher_code_version(), deps=["environment_splits"],
          check_specs=[check_spec("teacher_trajectories", "unique trajectory ids")],
          automation_condition=GATED)
def teacher_trajectories(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource, agents: AgentsResource):
    """The teacher solves every training environment (with injected faults); each run graded by its checkers. The
    embedded teacher executes each environment's reference; ``agents.teacher`` puts a model behind an endpoint there."""
    from cowork_pipeline.validation.sandbox import Sandbox

    lk = lake.lake()
    envs, upstream = envs_by_split(lk, ("train",), profile.demos_per_capability or None)
    teacher = agents.build_teacher()
    with Sandbox(workers=profile.sandbox_workers) as sb:
        df = collect_teacher_trajectories(envs, sb, fault_rate=profile.teacher_fault_rate, seed=profile.seed, teacher=teacher)
    mat, check = write_checked(context, lk, "teacher_trajectories", df,
                               lin=lineage(context, "teacher_trajectories", agents.teacher_code_version(), upstream),
                               suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "traj_id"})])
    mat.metadata.update({"pass_rate": round(float(df["passed"].mean() or 0), 4), "faults_injected": int(df["faults_injected"].sum()),
                         "teacher": agents.teacher_version()})
    if teacher is not None:
        mat.metadata["teacher_usage"] = dict(teacher.usage)
    yield mat
    yield check


@dg.asset(group_name="demonstrations", code_version="1", deps=["teacher_trajectories", "environment_splits"],
          check_specs=[check_spec("demonstrations", "contamination gate: no held-out environment or capability lineage")],
          automation_condition=GATED)
def demonstrations(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource):
    """Checker-passing, deduplicated, length-capped teacher trajectories of training environments; exported as a HF dataset."""
    lk = lake.lake()
    trajs, v_t = lk.read_promoted("teacher_trajectories")
    splits, v_s = lk.read_promoted("environment_splits")
    demos, dropped = curate(trajs, splits, max_chars=profile.max_demo_chars)
    audit = contamination_audit(demos, splits)
    mat, check = write_checked(context, lk, "demonstrations", demos, audit_df=audit,
                               lin=lineage(context, "demonstrations", "1", {"teacher_trajectories": v_t, "environment_splits": v_s}),
                               suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "demo_id"}),
                                      Expect("ExpectColumnValuesToBeInSet", {"column": "split", "value_set": ["train"]}),
                                      Expect("ExpectColumnValuesToBeInSet", {"column": "heldout_env", "value_set": [False]},
                                             "no held-out environment"),
                                      Expect("ExpectColumnValuesToBeInSet", {"column": "heldout_capability", "value_set": [False]},
                                             "no held-out capability lineage")])
    mat.metadata.update({f"dropped_{k}": v for k, v in dropped.items()})
    mat.metadata["multi_turn"] = int(demos["multi_turn"].sum()) if len(demos) else 0
    if mat.metadata["promoted"]:
        mat.metadata["hf_dataset"] = export_dataset(lk, demos, f"demonstrations_v{mat.metadata['delta_version']}")
    yield mat
    yield check


def export_dataset(lake: Lake, demos: pl.DataFrame, name: str) -> str:
    """Save the SFT records of ``demos`` as a Hugging Face dataset (``datasets.load_from_disk``) beside the lake:
    ``<lake>/datasets/<name>``, a folder in the store for an object-store lake (with a manifest, like a checkpoint;
    ``model_store.fetch`` downloads and checks it). Returns where it is."""
    import tempfile

    from cowork_pipeline.training.sft import to_sft_dataset

    dataset = to_sft_dataset(sft_records(demos))
    if not is_remote(lake.root):
        out = model_dir(lake, "..", "datasets", name).resolve()
        dataset.save_to_disk(str(out))
        return str(out)
    with tempfile.TemporaryDirectory(prefix="cowork-export-") as tmp:
        dataset.save_to_disk(tmp)
        return publish_model(lake, Path(tmp), name, folder="datasets")


def _loss_plot(curve: list[dict], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.5))
    ax.plot([r["step"] for r in curve], [r["loss"] for r in curve])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    return plot_md(fig)


@dg.multi_asset(
    specs=[dg.AssetSpec("sft_checkpoint", deps=["demonstrations"], group_name="training", code_version="1",
                        automation_condition=GATED),
           dg.AssetSpec("checkpoints", group_name="training", skippable=True)],
    check_specs=[check_spec("sft_checkpoint", "loss curve recorded and finite"), check_spec("checkpoints", "unique checkpoint ids")],
    pool="gpu", can_subset=True,
)
def sft_checkpoint(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource, compute: ComputeResource):
    """Build the embedded student (or take the configured checkpoint) and fine-tune it on the promoted demonstrations."""
    import math

    from cowork_pipeline.training.sft import SFTSettings, to_sft_dataset, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student

    lk = lake.lake()
    demos, v_d = lk.read_promoted("demonstrations")
    if demos.is_empty():
        raise dg.Failure("no promoted demonstrations to train on")
    records = sft_records(demos)
    device = compute.resolve()
    registry: list[dict] = []
    seed_tag = f"-seed{profile.student_seed}" if profile.student_seed else ""  # another seed's student goes beside, not over
    if profile.base_checkpoint:
        name = profile.base_checkpoint.rstrip("/").rsplit("/", 1)[-1]
        base, base_id, base_model = Path(profile.base_checkpoint), f"external:{name}", profile.base_checkpoint
        if is_remote(profile.base_checkpoint):  # a checkpoint in an object store: this machine trains from a copy
            from cowork_pipeline.training.model_store import ModelStoreError, fetch

            try:
                base = fetch(profile.base_checkpoint, model_dir(lk, "..", "external", name), lk.storage_options, uploaded=False)
            except ModelStoreError as e:
                raise dg.Failure(f"base_checkpoint: {e}") from e
    else:
        cfg = StudentConfig(vocab_size=profile.student_vocab, hidden_size=profile.student_hidden, num_layers=profile.student_layers,
                            intermediate_size=profile.student_hidden * 3, pointer_dim=profile.student_pointer_dim, seed=profile.student_seed)
        base_id = f"student-base-d{v_d}-h{cfg.hidden_size}x{cfg.num_layers}" + (f"-p{cfg.pointer_dim}" if cfg.pointer_dim else "") + seed_tag
        base = model_dir(lk, base_id)
        corpus = [m for m, t in demos.select("messages_json", "tools_json").iter_rows()]
        build_student(corpus, base, cfg)
        base_model = "embedded-qwen3-tiny"
        registry.append({"checkpoint_id": base_id, "kind": "base", "path": publish_model(lk, base, base_id), "base_checkpoint_id": None,
                         "base_model": base_model, "config_json": json.dumps(cfg.__dict__),
                         "data_versions_json": json.dumps({"demonstrations": v_d}), "metrics_json": "{}", "device": device})
    settings = SFTSettings(epochs=profile.sft_epochs, lr=profile.sft_lr, batch_size=profile.sft_batch_size,
                           max_steps=profile.sft_max_steps, seed=profile.student_seed, device=device,
                           assistant_loss_weight=profile.sft_assistant_weight, keys_from_vocab=profile.sft_keys_from_vocab)
    # (the embedded base's id carries the seed already)
    ckpt_id = f"sft-{base_id}-d{v_d}-e{settings.epochs:g}-s{settings.max_steps}" + (seed_tag if profile.base_checkpoint else "")
    out = model_dir(lk, ckpt_id)
    result = train_sft(base, to_sft_dataset(records), out, settings,
                       on_log=lambda r: context.log.info(f"sft step {r.get('step')}: loss {r.get('loss')}"))
    curve = [r for r in result.loss_curve if "loss" in r]
    curve_df = pl.DataFrame([{"checkpoint_id": ckpt_id, "step": int(r["step"]), "loss": float(r["loss"]), "epoch": float(r.get("epoch", 0.0))}
                             for r in curve], schema={"checkpoint_id": pl.String, "step": pl.Int64, "loss": pl.Float64, "epoch": pl.Float64})
    lin = lineage(context, "sft_checkpoint", "1", {"demonstrations": v_d})
    v_curve = lk.write("sft_loss_curve", curve_df, lineage=lin, key=["checkpoint_id", "step"])
    finite = bool(curve) and all(math.isfinite(r["loss"]) for r in curve)
    metrics = {"first_loss": curve[0]["loss"] if curve else None, "last_loss": curve[-1]["loss"] if curve else None,
               "train_tokens": result.train_tokens, "tokens_per_second": round(result.tokens_per_second, 1), "steps": result.steps,
               "runtime_s": round(result.train_runtime_s, 1), "lora": result.lora,
               "max_length": result.max_length, "truncated_demonstrations": result.truncated}
    yield dg.MaterializeResult(asset_key="sft_checkpoint", metadata={
        "checkpoint_id": ckpt_id, "path": str(result.checkpoint), "device": result.device, **{k: v for k, v in metrics.items() if v is not None},
        "loss_curve_table_version": v_curve, "loss_plot": _loss_plot(curve, ckpt_id) if curve else "no loss logged"})
    yield dg.AssetCheckResult(asset_key="sft_checkpoint", check_name="sft_checkpoint_quality", passed=finite,
                              metadata={"points": len(curve)})
    if finite:
        registry.append({"checkpoint_id": ckpt_id, "kind": "sft", "path": publish_model(lk, result.checkpoint, ckpt_id), "base_checkpoint_id": base_id,
                         "base_model": base_model, "config_json": json.dumps(settings.__dict__, default=str),
                         "data_versions_json": json.dumps({"demonstrations": v_d}), "metrics_json": json.dumps(metrics), "device": result.device})
    if registry:
        yield from register_checkpoints(context, lk, registry, {"demonstrations": v_d})
