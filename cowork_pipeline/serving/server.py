"""Minimal OpenAI-compatible chat-completions server (starlette + uvicorn).

``POST /v1/chat/completions`` and ``GET /v1/models``. Any ``Agent`` can be served; agents exposing
``generate(conversations, temperature=, top_p=, max_new_tokens=, seed=)`` (``HFAgent``) honour per-request
sampling settings and report token usage, other agents are called through ``act``. Requests are served one at a
time (a lock around the model): generation is CPU/GPU bound and the agent's batching, not HTTP concurrency, is
where throughput comes from.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cowork_pipeline.agents.base import Agent

_ROLES = {"system", "developer", "user", "assistant", "tool"}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _error(status: int, message: str, err_type: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": err_type, "param": param, "code": None}}, status_code=status)


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise BadRequest(f"'{key}' must be a number in [{lo}, {hi}]", key)
    return float(value)


def _validate(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Return (messages, tools, generation options) or raise BadRequest."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a valid 'role'", f"messages[{i}]")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise BadRequest(f"messages[{i}]: tool messages need a 'tool_call_id'", f"messages[{i}].tool_call_id")
        for j, call in enumerate(m.get("tool_calls") or []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"messages[{i}].tool_calls[{j}] must have function.name", f"messages[{i}].tool_calls")
    # OpenAI's "developer" role is a system message for our template.
    messages = [dict(m, role="system") if m["role"] == "developer" else m for m in messages]

    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise BadRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]")
    tool_choice = body.get("tool_choice")
    if tool_choice == "none":
        tools = []
    elif tool_choice not in (None, "auto"):
        raise BadRequest("only tool_choice 'auto' and 'none' are supported", "tool_choice")
    if body.get("stream"):
        raise BadRequest("streaming is not supported", "stream")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")

    opts: dict[str, Any] = {}
    if (t := _number(body, "temperature", 0.0, 2.0)) is not None:
        opts["temperature"] = t
    if (p := _number(body, "top_p", 0.0, 1.0)) is not None:
        if p <= 0.0:
            raise BadRequest("'top_p' must be > 0", "top_p")
        opts["top_p"] = p
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("'max_tokens' must be a positive integer", "max_tokens")
        opts["max_new_tokens"] = max_tokens
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest("'seed' must be an integer", "seed")
        opts["seed"] = seed
    return messages, tools, opts


def _run(agent: Agent, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
         opts: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, int]]:
    generate = getattr(agent, "generate", None)
    if callable(generate):
        g = generate([(messages, tools)], **opts)[0]
        usage = {"prompt_tokens": len(g.prompt_ids), "completion_tokens": len(g.completion_ids)}
        message, finish = g.message, g.finish_reason
    else:
        message, finish, usage = agent.act(messages, tools), "stop", {"prompt_tokens": 0, "completion_tokens": 0}
    if message.get("tool_calls"):
        finish = "tool_calls"
    elif finish not in ("stop", "length"):
        finish = "length" if finish == "context_overflow" else "stop"
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return message, finish, usage


def make_app(agent: Agent, model_name: str | None = None) -> Starlette:
    """ASGI app serving ``agent``; ``model_name`` defaults to ``agent.name``."""
    name = model_name or getattr(agent, "name", "agent")
    created = int(time.time())
    lock = threading.Lock()

    def locked_run(messages: list[dict[str, Any]], tools: list[dict[str, Any]], opts: dict[str, Any]) -> Any:
        with lock:
            return _run(agent, messages, tools, opts)

    async def chat_completions(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        try:
            messages, tools, opts = _validate(body)
        except BadRequest as exc:
            return _error(400, exc.message, param=exc.param)
        try:
            message, finish, usage = await run_in_threadpool(locked_run, messages, tools, opts)
        except Exception as exc:  # noqa: BLE001 - report as an OpenAI-style server error, keep serving
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}", err_type="server_error")
        out_msg: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            out_msg["tool_calls"] = message["tool_calls"]
        if message.get("parse_error"):
            out_msg["parse_error"] = message["parse_error"]  # non-standard; clients ignore unknown fields
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or name,
                "choices": [{"index": 0, "message": out_msg, "finish_reason": finish, "logprobs": None}],
                "usage": usage,
            }
        )

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "cowork-pipeline"}]}
        )

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        err_type = "invalid_request_error" if status < 500 else "server_error"
        return _error(status, f"{detail}: {request.method} {request.url.path}", err_type=err_type)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )


def serve(checkpoint: str | Path, host: str = "127.0.0.1", port: int = 8000, **agent_kwargs: Any) -> None:
    """Load ``checkpoint`` into an ``HFAgent`` and serve it (blocking)."""
    import uvicorn

    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(checkpoint, **agent_kwargs)
    uvicorn.run(make_app(agent), host=host, port=port, log_level="warning")


__all__ = ["make_app", "serve", "BadRequest"]
