"""Assets: capability specs -> drafts / repair log / validated / rejected environments -> splits."""


import json

import dagster as dg
from dagster import AssetExecutionContext
import polars as pl

from assets._io import GATED, check_spec, lineage, plot_md, write_checked
from assets.order import SYNTHESIS
from cowork_pipeline.capabilities import CATALOG_DIR, load_catalog, parse_capability
from cowork_pipeline.describe import describe, record_of
from cowork_pipeline.quality import Expect
from cowork_pipeline.splits import SPLITS, assign_splits, disjointness, repeated_tasks, with_tasks
from cowork_pipeline.synthesis.tables import run_synthesis
from cowork_pipeline.validation.certify import Validator
from resources import GeneratorResource, LakeResource, ProfileResource

capability_partitions = dg.DynamicPartitionsDefinition(name="capability")
SYNTH_TABLES = SYNTHESIS  # one multi-asset: a capability partition writes all five


@dg.asset(group_name="synthesis", code_version="1", check_specs=[check_spec("capability_specs", "ids unique, every file valid")],
          description="The capability catalog (YAML files validated by pydantic) as a table; registers one partition per capability.")
def capability_specs(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource):
    folder = profile.catalog_dir or str(CATALOG_DIR)
    caps = [profile.capability(c, open(f"{folder}/{c.id}.yaml", encoding="utf-8").read())
            for c in load_catalog(folder).values()]  # (as the profile drafts them: the text says what it changed)
    rows = [{"capability_id": c.id, "title": c.title, "services": c.services, "tools": c.tools, "multi_turn": c.multi_turn,
             "heldout": c.heldout, "composer": c.composer, "fingerprint": c.fingerprint(), "yaml": text} for c, text in caps]
    df = pl.DataFrame(rows).with_columns(pl.col("composer").cast(pl.String))  # all None: a model-only catalog
    new = [c.id for c, _ in caps if not context.instance.has_dynamic_partition("capability", c.id)]
    if new:
        context.instance.add_dynamic_partitions("capability", new)
    mat, check = write_checked(context, lake.lake(), "capability_specs", df, lin=lineage(context, "capability_specs", "1", {}),
                               suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "capability_id"}, "capability ids are unique"),
                                      Expect("ExpectColumnValuesToNotBeNull", {"column": "yaml"})])
    mat.metadata.update({"capabilities": len(df), "multi_turn": int(df["multi_turn"].sum()), "heldout": int(df["heldout"].sum()),
                         "new_partitions": ", ".join(new), "injections": profile.injections or "each file's own"})
    yield mat
    yield check


def _synth_suites(max_rounds: int) -> dict[str, list[Expect]]:
    return {
        "environment_drafts": [Expect("ExpectColumnValuesToBeUnique", {"column": "attempt_id"})],
        "repair_log": [Expect("ExpectColumnValuesToBeUnique", {"column": "attempt_id"}),
                       Expect("ExpectColumnValuesToBeBetween", {"column": "round", "min_value": 0, "max_value": max_rounds})],
        "validated_environments": [
            Expect("ExpectColumnValuesToBeUnique", {"column": "env_id"}, "environment ids are unique"),
            Expect("ExpectColumnValuesToBeInSet", {"column": "reference_pass", "value_set": [True]}, "100% reference pass"),
            Expect("ExpectColumnValuesToBeInSet", {"column": "null_pass", "value_set": [False]}, "0% null pass"),
            Expect("ExpectColumnValuesToBeBetween", {"column": "kill_rate", "min_value": 1.0, "max_value": 1.0}, "every mutant killed"),
            Expect("ExpectColumnValuesToBeInSet", {"column": "deterministic", "value_set": [True]}, "same trajectory, same verdict"),
            Expect("ExpectColumnValuesToBeInSet", {"column": "fault_pass", "value_set": [True]}, "reference survives injected faults"),
            Expect("ExpectColumnValuesToBeInSet", {"column": "equivalent_pass", "value_set": [True]}, "correct work done another way passes"),
        ],
        "rejected_environments": [Expect("ExpectColumnValuesToBeUnique", {"column": "env_id"})],
        "repair_telemetry": [Expect("ExpectColumnValuesToBeBetween", {"column": "survival_rate", "min_value": 0.0, "max_value": 1.0})],
    }


@dg.multi_asset(
    specs=[dg.AssetSpec(t, deps=["capability_specs"], group_name="synthesis", partitions_def=capability_partitions,
                        # the configured generator's (`cowork ui` sets it in the code location's environment), so
                        # code_version_changed() sees a generator switch; rows record the generator actually used
                        code_version=GeneratorResource.from_env().code_version()) for t in SYNTH_TABLES],
    check_specs=[check_spec(t, "GX suite; rows are promoted only when it passes") for t in SYNTH_TABLES],
    partitions_def=capability_partitions, can_subset=False,
)
def synthesized_environments(context: AssetExecutionContext, lake: LakeResource, generator: GeneratorResource, profile: ProfileResource):
    """Draft environments for one capability, certify them both ways in the sandbox, repair failures."""
    from cowork_pipeline.validation.sandbox import Sandbox

    cap_id = context.partition_key
    lk = lake.lake()
    row, spec_version = lk.read_promoted("capability_specs", where={"capability_id": [cap_id]})
    if row.is_empty():
        raise dg.Failure(f"capability '{cap_id}' is not in the promoted capability_specs (version {spec_version})")
    cap = parse_capability(row["yaml"][0], f"capability_specs@{spec_version}:{cap_id}")
    backend = generator.build()
    with Sandbox(workers=profile.sandbox_workers) as sandbox:
        validator = Validator(sandbox, fault_rate=profile.validation_fault_rate)
        out = run_synthesis(cap, profile.seeds_for(cap), backend, validator, max_rounds=profile.max_repair_rounds,
                            log=context.log.info)
    tel = out.telemetry
    tel_df = pl.DataFrame([{"capability_id": cap_id, "drafts": tel["drafts"], "accepted": tel["accepted"],
                            "survival_rate": tel["survival_rate"], "first_pass_rate": tel["first_pass_rate"],
                            "mean_rounds_accepted": tel["mean_rounds_accepted"], "attempts": tel["attempts"],
                            "seconds_per_accepted": tel["seconds_per_accepted"] or 0.0,
                            "wall_seconds_per_accepted": tel["wall_seconds_per_accepted"] or 0.0,
                            "llm_tokens_per_accepted": tel["llm_tokens_per_accepted"] or 0.0,
                            "accepted_by_round_json": json.dumps(tel["accepted_by_round"]),
                            "diagnostic_counts_json": json.dumps(tel["diagnostic_counts"])}])
    frames = {"environment_drafts": out.drafts, "repair_log": out.repair_log, "validated_environments": out.validated,
              "rejected_environments": out.rejected, "repair_telemetry": tel_df}
    suites = _synth_suites(profile.max_repair_rounds)
    upstream = {"capability_specs": spec_version}
    for table, df in frames.items():
        mat, check = write_checked(context, lk, table, df, suite=suites[table], partition=("capability_id", cap_id),
                                   lin=lineage(context, table, generator.code_version(), upstream))
        if table == "validated_environments":
            mat.metadata.update({"survival_rate": tel["survival_rate"], "accepted_by_round": dg.MetadataValue.json(tel["accepted_by_round"]),
                                 "diagnostics": dg.MetadataValue.json(tel["diagnostic_counts"]), "repair_plot": _repair_plot(cap_id, tel)})
            if len(df):  # what one of them looks like, as `cowork show` prints it
                version = mat.metadata["delta_version"]
                rec = record_of(df.row(0, named=True), "certified", table, getattr(version, "value", version))
                mat.metadata["example"] = dg.MetadataValue.md(f"`cowork show {rec.row['env_id']}`\n\n```text\n{describe(rec)}```")
        yield mat
        yield check


def _repair_plot(cap_id: str, tel: dict) -> dg.MetadataValue:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.5))
    rounds = sorted(tel["accepted_by_round"], key=int)
    ax.bar([f"round {r}" for r in rounds] + ["rejected"], [tel["accepted_by_round"][r] for r in rounds] + [tel["rejected"]],
           color=["#4c9a2a"] * len(rounds) + ["#b33"])
    ax.set_title(f"{cap_id}: accepted by repair round")
    return plot_md(fig)


@dg.asset(group_name="synthesis", code_version="3", deps=["validated_environments", "capability_specs"],
          check_specs=[check_spec("environment_splits", "unique ids, known splits, held-out capabilities disjoint from training, "
                                                        "no held-out environment posing a training environment's task")],
          automation_condition=GATED)
def environment_splits(context: AssetExecutionContext, lake: LakeResource, profile: ProfileResource):
    """Train / held-out environments / held-out capabilities, disjoint by capability lineage; environments that pose
    the same task (the same values and calls in the turns, the reference and its answers, in any words and in
    another world) share a split (code version 3: capitals the world does not name are wording; 2: any capitalised
    word inside a sentence was a value; 1: the same words and calls)."""
    lk = lake.lake()
    envs, v_env = lk.read_promoted("validated_environments")
    specs, v_spec = lk.read_promoted("capability_specs")
    caps = {cid: parse_capability(y, f"capability_specs@{v_spec}:{cid}") for cid, y in specs.select("capability_id", "yaml").iter_rows()}
    envs = with_tasks(envs.filter(pl.col("capability_id").is_in(list(caps))))  # (fingerprinted once, for both)
    df = assign_splits(envs, caps, profile.heldout_env_fraction, profile.split_seed)
    leaks = disjointness(df).filter(pl.col("leak"))["capability_id"].to_list()
    tasks = repeated_tasks(envs, df)
    audit = df.with_columns(capability_leak=pl.col("capability_id").is_in(leaks)).join(
        tasks.select("env_id", "seen_in_training"), on="env_id", how="left")
    mat, check = write_checked(context, lk, "environment_splits", df, audit_df=audit,
                               lin=lineage(context, "environment_splits", "3", {"validated_environments": v_env, "capability_specs": v_spec}),
                               suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "env_id"}),
                                      Expect("ExpectColumnValuesToBeInSet", {"column": "split", "value_set": list(SPLITS)}),
                                      Expect("ExpectColumnValuesToBeInSet", {"column": "capability_leak", "value_set": [False]},
                                             "no held-out capability appears in another split"),
                                      Expect("ExpectColumnValuesToBeInSet", {"column": "seen_in_training", "value_set": [False]},
                                             "no held-out environment poses a task a training environment poses")])
    counts = {s: int((df["split"] == s).sum()) for s in SPLITS}
    mat.metadata.update({f"n_{k}": v for k, v in counts.items()})
    # environments that pose a task another one poses too (kept together in one split)
    mat.metadata["n_repeated_task_envs"] = int((tasks["task_envs"] > 1).sum())
    mat.metadata["n_distinct_tasks"] = int(tasks["task"].n_unique())
    # per capability that repeats itself: a narrow capability (or a generator that rewrites its own drafts) shows here
    per_cap = envs.group_by("capability_id").agg(environments=pl.len(), distinct_tasks=pl.col("task").n_unique())
    mat.metadata["repeated_tasks_by_capability"] = dg.MetadataValue.json(
        {c: {"environments": n, "distinct_tasks": k} for c, n, k in per_cap.sort("capability_id").iter_rows() if k < n})
    yield mat
    yield check
