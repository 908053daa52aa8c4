"""The assets `cowork run` materializes, in the order it does (no Dagster import: the CLI's parser uses it)."""

SYNTHESIS = ("environment_drafts", "repair_log", "validated_environments", "rejected_environments", "repair_telemetry")
# Unpartitioned assets after synthesis, in dependency order (one run each, for progress output).
DOWNSTREAM = (("environment_splits",), ("teacher_trajectories",), ("demonstrations",), ("sft_checkpoint", "checkpoints"),
              ("rl_rollouts", "rl_checkpoints"), ("benchmark_scores",))
# ``--until`` stops after one of these.
RUN_ORDER = ("capability_specs",) + SYNTHESIS + tuple(n for names in DOWNSTREAM for n in names)
