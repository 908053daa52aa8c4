"""Composers for the embedded generator; importing this package registers them all."""
from cowork_pipeline.synthesis.composers import answers, core, office, ops  # noqa: F401
