"""An agent that executes a tool *program* (the reference solution, or a mutation of it).

The program is data (:class:`~cowork_pipeline.spec.ProgramTurn`): per user turn, tool calls
whose arguments may use values bound from earlier results (look up, read, then act with
what was observed), and a final reply. The agent derives its position from the
conversation alone, so one instance serves any number of episodes, and it retries a
call that hit a transient fault, as a careful agent would.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from cowork_pipeline.agents.base import Message, ToolSchema, assistant_message
from cowork_pipeline.spec import ProgramTurn, Step

TRANSIENT = {"rate_limit", "server_error", "timeout"}
_ARGS_JSON = json.JSONEncoder(sort_keys=True)  # what tool_call's json.dumps(args, sort_keys=True) builds per call


class ProgramError(Exception):
    """A program refers to a variable or result path that does not exist."""


def resolve(value: Any, env: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and "$var" in value:
            name = value["$var"]
            if name not in env:
                raise ProgramError(f"unbound variable '{name}'")
            return env[name]
        return {k: resolve(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    return value


def extract(result: Any, path: str) -> Any:
    cur = result
    for part in path.split(".") if path else []:
        if isinstance(cur, list):
            try:
                cur = cur[int(part)]
            except (ValueError, IndexError):
                raise ProgramError(f"path '{path}': no element '{part}' in a list of {len(cur)}") from None
        elif isinstance(cur, dict):
            if part not in cur:
                raise ProgramError(f"path '{path}': no key '{part}' (keys: {sorted(cur)[:8]})")
            cur = cur[part]
        else:
            raise ProgramError(f"path '{path}': cannot index {type(cur).__name__} with '{part}'")
    return cur


class ProgramAgent:
    def __init__(self, program: Sequence[ProgramTurn], name: str = "program", max_retries: int = 4):
        self.program = list(program)
        self.name = name
        self.max_retries = max_retries
        # Resume the replay where the last call stopped when the runner hands us the same,
        # grown conversation list (the common case), instead of re-reading it every step.
        self._memo: tuple[Any, int, tuple[int, int, dict[str, Any], int, str, int]] | None = None

    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> Message:
        turn, pos, env, retries, last_error, n_calls = self._position(messages)
        if turn >= len(self.program):
            return assistant_message("I have nothing more to do for this request.")
        steps = self.program[turn].steps
        if retries > self.max_retries:
            return assistant_message(f"I could not complete the request: {last_error}")
        if pos >= len(steps):
            return assistant_message(self.program[turn].reply)
        step = steps[pos]
        try:
            args = resolve(step.args, env)
        except ProgramError as e:
            return assistant_message(f"I could not complete the request: {e}")
        call = {"id": f"call_{n_calls}", "type": "function", "function": {"name": step.tool, "arguments": _ARGS_JSON.encode(args)}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}  # = assistant_message(None, [tool_call(...)])

    def _position(self, messages: Sequence[Message]) -> tuple[int, int, dict[str, Any], int, str, int]:
        """Replay the conversation: current turn, next step index, bound variables, retries of that
        step, tool calls the assistant has made so far."""
        memo = self._memo
        if memo is not None and memo[0] is messages and memo[1] <= len(messages):
            start, (turn, pos, env, retries, last_error, n_calls) = memo[1], memo[2]
            copied = False  # the memo's bindings were returned: copied before the first new one
        else:
            start, turn, pos, retries, env, last_error, n_calls = 0, -1, 0, 0, {}, "", 0
            copied = True
        for m in messages[start:]:
            role = m.get("role")
            if role == "assistant":
                n_calls += len(m.get("tool_calls") or ())
            elif role == "user":
                turn, pos, retries = turn + 1, 0, 0
            elif role == "tool" and 0 <= turn < len(self.program):
                steps = self.program[turn].steps
                if pos >= len(steps):
                    continue
                content = m.get("content")
                if not steps[pos].bind and type(content) is str and '"error"' not in content and "\\" not in content:
                    # Nothing to bind, and the text cannot decode to an {"error": ...} object (a key spelled
                    # "error" needs those characters, or an escape): the step succeeded, no need to parse.
                    pos, retries = pos + 1, 0
                    continue
                try:
                    payload = json.loads(content or "null")
                except ValueError:
                    payload = None
                err = payload.get("error") if isinstance(payload, dict) and set(payload) == {"error"} else None
                if err and err.get("type") in TRANSIENT:
                    retries += 1
                    last_error = err.get("message", "")
                    continue
                step: Step = steps[pos]
                if err is None and step.bind:
                    if not copied:
                        env, copied = dict(env), True
                    for name, path in step.bind.items():
                        try:
                            env[name] = extract(payload, path)
                        except ProgramError:
                            pass  # left unbound: a later use reports it
                pos, retries = pos + 1, 0
        self._memo = (messages, len(messages), (turn, pos, env, retries, last_error, n_calls))
        return max(turn, 0), pos, env, retries, last_error, n_calls
