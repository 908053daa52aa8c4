"""The agent protocol shared by teacher, student and remote endpoints.

Messages and tools are in the OpenAI chat-completions shape, so any harness that
speaks that API can drive our environments and any of our agents can be served.
"""
from __future__ import annotations

import json
from typing import Any, Protocol, Sequence, runtime_checkable

Message = dict[str, Any]
ToolSchema = dict[str, Any]


@runtime_checkable
class Agent(Protocol):
    """``act`` returns one assistant message: ``{"role": "assistant", "content": str|None,
    "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": json-str}}]}``."""

    name: str

    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> Message: ...


@runtime_checkable
class BatchAgent(Agent, Protocol):
    """Agents that generate for many conversations at once (batched, KV-cached, or concurrent requests). An
    item may be the exception that conversation's step ended in: the runner ends that episode with it
    (``agent_error``) and goes on with the others."""

    def act_batch(
        self, conversations: Sequence[tuple[Sequence[Message], Sequence[ToolSchema]]]
    ) -> list[Message | Exception]: ...


class ContinuousTurns(Protocol):
    """Conversations' turns decoded continuously (``agents/decoding.py``'s): ``submit`` queues a turn under a key,
    ``step`` advances the decoding and returns ``(key, message or exception)`` for each turn that ended, and
    ``busy`` says whether any turn is still queued or decoding."""

    busy: bool

    def submit(self, key: Any, messages: Sequence[Message], tools: Sequence[ToolSchema], seed: int | None = None) -> None: ...

    def step(self) -> list[tuple[Any, Message | Exception]]: ...


@runtime_checkable
class ContinuousAgent(Agent, Protocol):
    """Agents whose decoding turns may join while it runs (HFAgent): ``run_episodes`` hands each episode's next turn
    over as soon as the episode is ready for it, instead of in lockstep rounds."""

    def turns(self) -> ContinuousTurns: ...


def tool_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def assistant_message(content: str | None = None, tool_calls: list[dict[str, Any]] | None = None) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg
