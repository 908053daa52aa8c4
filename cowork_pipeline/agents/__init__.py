"""Agents (policies): anything with ``act(messages, tools) -> assistant message``."""
from cowork_pipeline.agents.base import Agent, BatchAgent, ContinuousAgent, assistant_message, tool_call

__all__ = ["Agent", "BatchAgent", "ContinuousAgent", "assistant_message", "tool_call"]
