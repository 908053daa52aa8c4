"""The code location: every asset, resource, schedule and sensor of cowork-pipeline."""
from __future__ import annotations

import dagster as dg

from assets import automation, evaluation, maintenance, models, rl, synthesis
from resources import AgentsResource, ComputeResource, GeneratorResource, LakeResource, ProfileResource

ALL_ASSETS = [synthesis.capability_specs, synthesis.synthesized_environments, synthesis.environment_splits,
              models.teacher_trajectories, models.demonstrations, models.sft_checkpoint, rl.rl_training, evaluation.benchmark_scores]


def resources(profile: ProfileResource | None = None, lake: LakeResource | None = None,
              generator: GeneratorResource | None = None, agents: AgentsResource | None = None) -> dict:
    return {"lake": lake or LakeResource(), "profile": profile or ProfileResource.from_env(), "generator": generator or GeneratorResource.from_env(),
            "compute": ComputeResource(), "agents": agents or AgentsResource.from_env()}


def build_definitions(profile: ProfileResource | None = None, lake: LakeResource | None = None) -> dg.Definitions:
    return dg.Definitions(assets=automation.with_automation_conditions(ALL_ASSETS), resources=resources(profile, lake),
                          jobs=[*automation.JOBS, maintenance.lake_vacuum], sensors=automation.SENSORS,
                          schedules=[*automation.SCHEDULES, maintenance.weekly_vacuum])


defs = build_definitions()
