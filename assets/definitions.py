"""The code location: every asset, resource, schedule and sensor of cowork-pipeline."""
from __future__ import annotations

import dagster as dg

from assets import evaluation, models, synthesis
from resources import ComputeResource, GeneratorResource, LakeResource, ProfileResource

ALL_ASSETS = [synthesis.capability_specs, synthesis.synthesized_environments, synthesis.environment_splits,
              models.teacher_trajectories, models.demonstrations, models.sft_checkpoint, evaluation.benchmark_scores]


def resources(profile: ProfileResource | None = None, lake: LakeResource | None = None) -> dict:
    return {"lake": lake or LakeResource(), "profile": profile or ProfileResource(), "generator": GeneratorResource(),
            "compute": ComputeResource()}


def build_definitions(profile: ProfileResource | None = None, lake: LakeResource | None = None) -> dg.Definitions:
    return dg.Definitions(assets=ALL_ASSETS, resources=resources(profile, lake))


defs = build_definitions()
