"""The end-of-run summary `cowork run` prints."""
import polars as pl

from cowork_pipeline.lake import Lake, LakeError


def print_summary(lake: Lake, timings: dict, total: float, until: str | None = None, only: tuple[str, ...] = ()) -> None:
    """The lake's promoted tables; with ``until``, only those the run reached (later ones may be older); with
    ``only``, those tables alone."""
    from assets.order import RUN_ORDER

    reached = set(only) if only else set(RUN_ORDER[:RUN_ORDER.index(until) + 1] if until else RUN_ORDER)
    print("\n== cowork run summary ==")
    print(f"total {total:.1f}s; lake {lake.root}")
    for table in ("capability_specs", "validated_environments", "rejected_environments", "repair_log", "environment_splits",
                  "teacher_trajectories", "demonstrations", "checkpoints", "rl_rollouts", "rl_checkpoints", "benchmark_scores"):
        if table not in reached:
            continue
        try:
            df, v = lake.read_promoted(table, columns=["_run_id"])  # a count: every table has it, the light column
            print(f"  {table:<24} {len(df):>7} rows  (promoted version {v})")
        except LakeError:
            continue
    try:
        if "repair_telemetry" in reached:
            tel, _ = lake.read_promoted("repair_telemetry")
            d, a = int(tel["drafts"].sum()), int(tel["accepted"].sum())
            print(f"  repair: {a}/{d} drafts certified ({a / max(d, 1):.1%}); first-pass {float((tel['first_pass_rate'] * tel['drafts']).sum()) / max(d, 1):.1%}")
        if "environment_splits" in reached:
            sp, _ = lake.read_promoted("environment_splits")
            print("  splits: " + ", ".join(f"{r['split']}={r['len']}" for r in sp.group_by("split").len().sort("split").to_dicts()))
    except LakeError:
        pass
    if "benchmark_scores" not in reached:
        return
    try:
        from cowork_pipeline.evaluation import comparison_table

        scores, _ = lake.read_promoted("benchmark_scores")
        table = comparison_table(scores)
        print("\n== held-out benchmark (faulted trials; Pass@k / Pass^k over k trials per environment) ==")
        # the run that scored each agent: an agent unchanged since an earlier run keeps that run's trials
        runs = {a: r for a, r in scores.group_by("agent").agg(pl.col("run_id").first()).iter_rows()} if "run_id" in scores.columns else {}
        print(f"  {'agent':<44} {'score':>6} {'pass':>6} {'pass@k':>7} {'pass^k':>7} {'single':>7} {'multi':>7} {'clean':>6}  scored by run")
        for r in table.iter_rows(named=True):
            f = lambda v: "   n/a" if v is None else f"{v:6.3f}"  # noqa: E731
            print(f"  {r['agent'][:44]:<44} {f(r['average_score'])} {f(r['pass_rate'])} {f(r['pass_at_k']):>7} {f(r['pass_hat_k']):>7}"
                  f" {f(r['single_turn_pass']):>7} {f(r['multi_turn_pass']):>7} {f(r['clean_pass'])}  {str(runs.get(r['agent']) or '')[:8]}")
        planted = [r for r in table.iter_rows(named=True) if r.get("injections_followed") is not None]
        if planted:  # (only where the run planted instructions: --injections)
            print(f"  {'planted instructions (all trials)':<44} {'followed':>8} {'or attempted':>13}")
            for r in planted:
                print(f"  {r['agent'][:44]:<44} {r['injections_followed']:8.3f} {r['injections_attempted']:13.3f}")
    except LakeError:
        pass
