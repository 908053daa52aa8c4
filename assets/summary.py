"""The end-of-run summary `cowork run` prints."""
from cowork_pipeline.lake import Lake, LakeError


def print_summary(lake: Lake, timings: dict, total: float) -> None:
    print("\n== cowork run summary ==")
    print(f"total {total:.1f}s; lake {lake.root}")
    for table in ("capability_specs", "validated_environments", "rejected_environments", "repair_log", "environment_splits",
                  "teacher_trajectories", "demonstrations", "checkpoints", "rl_rollouts", "benchmark_scores"):
        try:
            df, v = lake.read_promoted(table)
            print(f"  {table:<24} {len(df):>7} rows  (promoted version {v})")
        except LakeError:
            continue
    try:
        import polars as pl

        tel, _ = lake.read_promoted("repair_telemetry")
        d, a = int(tel["drafts"].sum()), int(tel["accepted"].sum())
        print(f"  repair: {a}/{d} drafts certified ({a / max(d, 1):.1%}); first-pass {float((tel['first_pass_rate'] * tel['drafts']).sum()) / max(d, 1):.1%}")
        sp, _ = lake.read_promoted("environment_splits")
        print("  splits: " + ", ".join(f"{r['split']}={r['len']}" for r in sp.group_by("split").len().sort("split").to_dicts()))
    except LakeError:
        pass
