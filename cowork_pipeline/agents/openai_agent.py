"""An agent behind any OpenAI-compatible chat-completions endpoint: a hosted model, vLLM or SGLang serving a
checkpoint, or ``cowork serve``. The benchmark scores it like the students (same runner, tools and graders).

Each step POSTs the conversation so far with the environment's ``tools`` and reads back one assistant message.
What the endpoint gets wrong is the agent's mistake, recorded in the trajectory, never a crash: a tool call with
arguments that are not JSON becomes a failed step (the runner's rule for every agent), a model served without a
tool-call parser that writes ``<tool_call>{...}</tool_call>`` into its text has those calls read by the same
parser our student's output goes through (a text that is nothing but calls as JSON, Llama's or Mistral's way or
the API's own shape, is read as those calls: :func:`bare_calls`), and an endpoint that gives no usable answer after
its retries ends that episode as ``agent_error`` with the reason (other episodes of the batch go on). Conversations
of a batch are sent concurrently (``concurrency`` requests in flight).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from cowork_pipeline.agents.base import Message, ToolSchema
from cowork_pipeline.agents.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_assistant_output
from cowork_pipeline.chat_client import ChatClient, TransportError, message_text, split_reasoning

# What an OpenAI-compatible server accepts per message role (our trajectories carry bookkeeping beside it:
# a tool message's name, an unparseable output's parse_error).
_KEYS = {"system": ("content",), "developer": ("content",), "user": ("content",), "assistant": ("content", "tool_calls"),
         "tool": ("content", "tool_call_id")}


class EndpointError(RuntimeError):
    """The endpoint answered, but with no assistant message in it."""


def request_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """``messages`` as the chat-completions API takes them: the keys its schema knows, tool-call arguments as
    JSON strings, an assistant message with neither text nor calls given empty text."""
    out = []
    for m in messages:
        role = m.get("role")
        msg: dict[str, Any] = {"role": role}
        for k in _KEYS.get(str(role), ("content",)):
            if m.get(k) is not None:
                msg[k] = m[k]
        if role == "assistant":
            calls = [_call(c, i) for i, c in enumerate(msg.pop("tool_calls", None) or []) if isinstance(c, dict)]
            if calls:
                msg["tool_calls"] = calls
            elif msg.get("content") is None:
                msg["content"] = ""
        elif msg.get("content") is None:
            msg["content"] = ""
        elif not isinstance(msg["content"], (str, list)):
            msg["content"] = json.dumps(msg["content"], ensure_ascii=False)
        out.append(msg)
    return out


def _call(c: dict[str, Any], i: int) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c.get("function"), dict) else {}
    args = fn.get("arguments", "{}")
    return {"id": str(c.get("id") or f"call_{i}"), "type": "function",
            "function": {"name": fn.get("name") or "", "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def response_message(body: dict[str, Any], *, id_offset: int = 0, text_tool_calls: bool = True,
                     tool_names: frozenset[str] = frozenset()) -> Message:
    """The assistant message of a chat-completions response, in the runner's shape. Raises EndpointError when
    there is none. With ``tool_names`` (the offered tools), a content that is nothing but a call of one of them as
    JSON is that call (see :func:`bare_calls`)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError(f"no choices in the response: {json.dumps(body)[:300]}")
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        raise EndpointError(f"choice 0 has no message: {json.dumps(choices[0])[:300]}")
    # the model's reasoning is not its reply (nor a tool call it thought of): the endpoint's reasoning parser puts it
    # apart, else it leads the content; the transcript keeps it under "reasoning", and it is never sent back
    content, reasoning = message_text(msg)
    if content:
        content, thought = split_reasoning(content)
        reasoning = thought if thought is not None else reasoning
    seen = {"reasoning": reasoning} if reasoning else {}
    out = _response_message(choices[0], content, id_offset, text_tool_calls, tool_names)
    return {**out, **seen}


_FENCED = re.compile(r"```(?:json)?\s*\n?(.*?)\n?```", re.S)


def bare_calls(content: str, tool_names: frozenset[str]) -> list[dict[str, Any]] | None:
    """The calls (``{"name", "arguments"}``) a content holds when it is nothing but calls written as JSON, as models
    served without a tool-call parser write them: ``{"name": ..., "parameters": {...}}`` (Llama 3, after its
    ``<|python_tag|>`` too, several joined by ``;``), ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` (Mistral),
    the API's own shape (``{"type": "function", "function": {...}}``, or a ``{"tool_calls": [...]}`` wrapping them),
    a list of them, optionally in a ``json`` fence. Every one must name an offered tool and have nothing but its
    arguments beside it; else None (the content is a reply). The arguments are checked where ``<tool_call>`` blocks
    are (:func:`parse_assistant_output`)."""
    text = content.strip()
    fenced = _FENCED.fullmatch(text)
    text = (fenced.group(1) if fenced else text).strip()
    text = text.removeprefix("[TOOL_CALLS]").removeprefix("<|python_tag|>").strip()
    items: list[Any] = []
    decoder, at = json.JSONDecoder(), 0
    while at < len(text):  # one JSON value, or several joined by ";" or new lines (Llama's parallel calls)
        if text[at] not in "{[":
            return None
        try:
            obj, at = decoder.raw_decode(text, at)
        except (json.JSONDecodeError, RecursionError):
            return None
        if isinstance(obj, dict) and set(obj) == {"tool_calls"}:
            obj = obj["tool_calls"]
        items += obj if isinstance(obj, list) else [obj]
        sep = _BETWEEN_CALLS.match(text, at)
        at = sep.end() if sep else at
    calls = []
    for c in items:
        if isinstance(c, dict) and isinstance(c.get("function"), dict) and set(c) <= {"function", "type", "id"}:
            c = c["function"]  # the API's shape, as a model that has seen it in its context imitates it
        if not (isinstance(c, dict) and c.get("name") in tool_names and set(c) <= {"name", "arguments", "parameters", "type", "id"}
                and len({"arguments", "parameters"} & set(c)) == 1):
            return None
        calls.append({"name": c["name"], "arguments": c.get("arguments", c.get("parameters"))})
    return calls or None


_BETWEEN_CALLS = re.compile(r"\s*;?\s*")


def _response_message(choice: dict[str, Any], content: str | None, id_offset: int, text_tool_calls: bool,
                      tool_names: frozenset[str]) -> Message:
    msg = choice["message"]
    calls = msg.get("tool_calls")
    if not calls and isinstance(msg.get("function_call"), dict):  # the deprecated single-call field
        calls = [{"id": f"call_{id_offset}", "type": "function", "function": msg["function_call"]}]
    if calls:
        if not isinstance(calls, list):
            return {"role": "assistant", "content": content, "parse_error": f"tool_calls is a {type(calls).__name__}, not a list"}
        # ids the endpoint left out are made unique within the conversation, as our students' are
        return {"role": "assistant", "content": content or None,
                "tool_calls": [_call({**c, "id": (c.get("id") if isinstance(c, dict) else None) or f"call_{id_offset + i}"}, i)
                               if isinstance(c, dict) else c for i, c in enumerate(calls)]}
    truncated = choice.get("finish_reason") == "length"
    text = content if text_tool_calls and content and TOOL_CALL_OPEN in content else None
    if text is None and text_tool_calls and content and tool_names and not truncated:
        bare = bare_calls(content, tool_names)  # (read as the same calls in <tool_call> blocks would be)
        text = None if bare is None else "".join(f"{TOOL_CALL_OPEN}{json.dumps(c, ensure_ascii=False)}{TOOL_CALL_CLOSE}" for c in bare)
    if text is not None:
        parsed = parse_assistant_output(text, truncated=truncated, id_offset=id_offset)
        return {"role": "assistant", **{k: v for k, v in parsed.items() if k != "role"}}
    if truncated:  # the turn ended at the token (or context) limit, not where the model ended it: say so in the transcript
        return {"role": "assistant", "content": content or "", "parse_error": "truncated: the endpoint stopped at its token limit"}
    return {"role": "assistant", "content": content or ""}


class OpenAIAgent:
    """``act``/``act_batch`` over ``{base_url}/chat/completions`` (see the module docstring).

    Sampling (a temperature above 0, or one the endpoint refused, so its own), each episode sends its own seed, mixed
    from ``seed`` and the episode's (the runner's ``seeds``): otherwise every trial of an environment would open
    with the same request, one sample (from a server that honours seeds, and from the response cache) repeated."""

    per_episode_seeds = True

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, name: str | None = None,
                 temperature: float = 0.0, top_p: float | None = None, max_tokens: int | None = None, seed: int | None = 0,
                 timeout_s: float = 120, max_retries: int = 2, backoff_s: float = 1.0, concurrency: int = 8,
                 cache_dir: str | Path | None = None, text_tool_calls: bool = True, extra_body: dict[str, Any] | None = None):
        if int(concurrency) < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if not model:
            raise ValueError("model is required (the name the endpoint serves, as /v1/models lists it)")
        self.client = ChatClient(base_url, api_key, timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                 cache_dir=cache_dir)
        self.model = model
        self.name = name or f"endpoint:{model}"
        self.temperature, self.top_p, self.max_tokens, self.seed = temperature, top_p, max_tokens, seed
        self.concurrency = int(concurrency)
        self.text_tool_calls = text_tool_calls
        self.extra_body = dict(extra_body or {})
        self._lock = threading.Lock()
        self.usage = {"requests": 0, "http_attempts": 0, "cached": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def describe(self) -> dict[str, Any]:
        """The model and how it is asked (no API key, no concurrency): kept with its scores, so a score names its model."""
        out = {"model": self.model, "base_url": self.client.base_url, "temperature": self.temperature, "top_p": self.top_p,
               "max_tokens": self.max_tokens, "seed": self.seed, "text_tool_calls": self.text_tool_calls, "extra_body": self.extra_body}
        # (greedy agents' keys stay as they were, so their scored trials are kept)
        return out | ({"seed_per_episode": True} if self.temperature > 0 else {})

    def key(self) -> str:
        """A trial row's agent_key: the hash of ``describe()``."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True, default=str).encode()).hexdigest()[:20]

    def _seed(self, episode_seed: int | None) -> int | None:
        """The request's seed: ``seed``, mixed with the episode's where the agent samples."""
        if self.seed is None or episode_seed is None or not (self.temperature > 0 or "temperature" in self.client.adapted):
            return self.seed
        return int.from_bytes(hashlib.sha256(f"{self.seed}:{episode_seed}".encode()).digest()[:4], "big") >> 1

    def payload(self, messages: Sequence[Message], tools: Sequence[ToolSchema],
                episode_seed: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": request_messages(messages), "temperature": self.temperature}
        if tools:
            body["tools"] = list(tools)
            body["tool_choice"] = "auto"
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        if (seed := self._seed(episode_seed)) is not None:
            body["seed"] = seed
        return {**body, **self.extra_body}

    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema], episode_seed: int | None = None) -> Message:
        try:
            body, attempts = self.client.post(self.payload(messages, tools, episode_seed),
                                              optional=("seed", "tool_choice", "temperature", "top_p"))
        except TransportError as e:
            with self._lock:
                self.usage["requests"] += 1
                self.usage["http_attempts"] += e.attempts
            raise
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        with self._lock:
            self.usage["requests"] += 1
            self.usage["http_attempts"] += attempts
            self.usage["cached"] += int(attempts == 0)
            if attempts:  # a cached answer was paid for by an earlier run
                self.usage["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
                self.usage["completion_tokens"] += int(usage.get("completion_tokens") or 0)
        earlier = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
        offered = frozenset(str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, dict))
        return response_message(body, id_offset=earlier, text_tool_calls=self.text_tool_calls, tool_names=offered)

    def act_batch(self, conversations: Sequence[tuple[Sequence[Message], Sequence[ToolSchema]]],
                  seeds: Sequence[int] | None = None) -> list[Message | Exception]:
        """One message per conversation, or the exception its request ended in (the runner ends that episode
        with it and goes on with the others); ``seeds``: each conversation's episode seed."""
        def one(conv: tuple[Sequence[Message], Sequence[ToolSchema]], seed: int | None) -> Message | Exception:
            try:
                return self.act(*conv, episode_seed=seed)
            except Exception as e:  # noqa: BLE001 - one endpoint failure is one episode's, not the batch's
                return e

        episode_seeds = list(seeds) if seeds is not None else [None] * len(conversations)
        if len(conversations) <= 1 or self.concurrency == 1:
            return [one(c, s) for c, s in zip(conversations, episode_seeds)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(one, conversations, episode_seeds))


__all__ = ["EndpointError", "OpenAIAgent", "bare_calls", "request_messages", "response_message"]
