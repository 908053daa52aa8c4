"""Minimal OpenAI-compatible chat-completions server (starlette + uvicorn).

``POST /v1/chat/completions`` (with ``n``, ``stream``, ``stream_options.include_usage``, ``stop``, ``logprobs``
and ``top_logprobs``, vLLM's ``return_token_ids`` and ``return_tokens_as_token_ids``, ``tool_choice`` auto, none,
required or a named function, ``parallel_tool_calls`` false, and ``response_format`` text, json_object or
json_schema: a required or single call or a JSON answer for a model served with strict tool calls, whose grammar
makes the turn open with the call, end after it, or be one JSON value valid for the schema), ``POST
/v1/completions`` (token in, token out: prompts as token ids or text, continued as given, with ``n``, ``stop``,
the legacy ``logprobs``, ``return_token_ids`` and ``stream`` (the text as drawn), for an agent that
can ``complete`` raw prompts), vLLM's
``POST /tokenize`` (a text's or a conversation's ids, rendered as the chat endpoint renders it) and ``/detokenize``,
``GET /v1/models`` and ``GET /health``.
Settings that change what the model writes and are not implemented here (penalties, logit_bias, top_k, ...) are
400s unless neutral.
Any ``Agent`` can be served; agents exposing ``generate(conversations, temperature=, top_p=, max_new_tokens=,
seed=)`` (``HFAgent``) honour per-request sampling settings and report token usage, other agents are called
through ``act``. Requests arriving together with the same settings are generated as one batch (the agent's
batched, KV-cached decoding is where throughput comes from; concurrent clients such as `cowork eval` or an RL
framework's rollout workers feed it), each answer as it is alone: a sampled one is reproduced by its seed.
Streamed requests get each choice's text as its tokens are drawn (an agent whose ``generate`` takes a
``listener``; other agents' answers are streamed whole once given). Such an agent also stops generating where a
stop sequence cuts the answer, and for a client that has left its stream.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import itertools
import json
import re
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cowork_pipeline.agents.base import Agent

_ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_N = 32  # choices per request (``n``)
# Settings that change what the model writes and that this server does not implement: refused, not ignored (the
# client expects them honoured). Their neutral values pass, since SDKs send them; settings that change nothing the
# model writes (user, metadata, store, chat_template_kwargs, ...) are ignored.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}),
    "functions": (None, []), "function_call": (None, "none", "auto"), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "top_k": (None, -1, 0), "min_p": (None, 0), "repetition_penalty": (None, 1),
    "min_tokens": (None, 0), "ignore_eos": (None, False), "best_of": (None, 1), "use_beam_search": (None, False),
}


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


def _validate(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Return (messages, tools, generation options, how the answer is delivered: stream, usage chunk, stop
    sequences) or raise BadRequest."""
    messages, tools = _conversation(body)
    tools, opts = _tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if parallel is False and tools:
        opts["single_tool_call"] = True
    if (schema := _json_schema(body.get("response_format"))) is not None:
        if tools:
            raise BadRequest("a JSON response_format with tools is not supported: the answer is either calls or one JSON "
                             "value (send no tools, or tool_choice 'none')", "response_format")
        opts["json_schema"] = schema
    delivery = _sampling(body, opts)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise BadRequest("'logprobs' must be a boolean", "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise BadRequest("'top_logprobs' must be an integer in [0, 20]", "top_logprobs")
        if not logprobs:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if top:
            opts["top_logprobs"] = top
    return messages, tools, opts, delivery | {"logprobs": bool(logprobs)}


def _sampling(body: dict[str, Any], opts: dict[str, Any], max_tokens: int | None = None) -> dict[str, Any]:
    """The settings chat and text completions share: sampling and length into ``opts`` (``max_tokens``: the
    default where the request gives none); returned, how the answer is delivered (stream, usage chunk, stop
    sequences, n, vLLM's token-id flags). Settings that change what the model writes and are not implemented
    here are refused."""
    for key, neutral in _UNSUPPORTED.items():
        if key in body and body[key] not in neutral:
            raise BadRequest(f"'{key}' is not supported by this server (it would be ignored); leave it out", key)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and (not stream or not isinstance(stream_options, dict)):
        raise BadRequest("'stream_options' is an object, and only allowed when 'stream' is true", "stream_options")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(x, str) and x for x in stop)):
        raise BadRequest("'stop' must be a non-empty string or an array of up to 4 of them", "stop")
    n = body.get("n")
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise BadRequest(f"'n' must be an integer in [1, {MAX_N}]", "n")
    if (t := _number(body, "temperature", 0.0, 2.0)) is not None:
        opts["temperature"] = t
    if (p := _number(body, "top_p", 0.0, 1.0)) is not None:
        if p <= 0.0:
            raise BadRequest("'top_p' must be > 0", "top_p")
        opts["top_p"] = p
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", max_tokens))
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("'max_tokens' must be a positive integer", "max_tokens")
        opts["max_new_tokens"] = max_tokens
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest("'seed' must be an integer", "seed")
        opts["seed"] = seed
    flags = {}
    for key in ("return_token_ids", "return_tokens_as_token_ids"):  # (vLLM's, which RL frameworks read)
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise BadRequest(f"'{key}' must be a boolean", key)
        flags[key] = bool(body.get(key))
    return {"stream": bool(stream), "usage_chunk": bool((stream_options or {}).get("include_usage")), "stop": stop or [],
            "n": n, **flags}


def _validate_completion(body: dict[str, Any], tokenize: Callable[[str], list[int]]) -> tuple[list[list[int]], dict[str, Any], dict[str, Any]]:
    """A text completion request (``/v1/completions``): its prompts as token ids (a string, a list of token ids,
    or a list of either; strings tokenized by ``tokenize``), generation options and delivery (``logprobs``: how
    many likeliest tokens to give at each step, 0 to 20, or None for no logprobs); or BadRequest."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all(
            (isinstance(p, str) and p) or (isinstance(p, list) and p and all(_is_id(t) for t in p)) for p in prompt):
        raise BadRequest("'prompt' must be a non-empty string, a non-empty array of token ids, or an array of them",
                         "prompt")
    for key in ("echo", "suffix"):
        if body.get(key):
            raise BadRequest(f"'{key}' is not supported by this server; leave it out", key)
    opts: dict[str, Any] = {}
    delivery = _sampling(body, opts, max_tokens=16)  # (the legacy API's default length)
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 20):
        raise BadRequest("'logprobs' must be an integer in [0, 20]: how many likeliest tokens to give", "logprobs")
    if logprobs:
        opts["top_logprobs"] = logprobs
    return [tokenize(p) if isinstance(p, str) else list(p) for p in prompt], opts, delivery | {"logprobs": logprobs}


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object, or BadRequest."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _conversation(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A request's messages (OpenAI's "developer" role as our system) and tools, checked; or BadRequest."""
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
    return messages, tools


_TOOL_CHOICES = "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}"


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The tools the turn may call and the generation option ``tool_choice`` asks for: none offers none; required,
    or a named function (offered alone), asks for a turn that opens with a call."""
    if choice in (None, "auto"):
        return tools, {}
    if choice == "none":
        return [], {}
    if isinstance(choice, dict):
        fn = choice.get("function")
        named = fn.get("name") if choice.get("type") == "function" and isinstance(fn, dict) else None
        if not isinstance(named, str):
            raise BadRequest(_TOOL_CHOICES, "tool_choice")
        tools = [t for t in tools if t["function"]["name"] == named]
        if not tools:
            raise BadRequest(f"tool_choice names {named!r}, which is not among the tools offered", "tool_choice")
    elif choice != "required":
        raise BadRequest(_TOOL_CHOICES, "tool_choice")
    elif not tools:
        raise BadRequest("tool_choice 'required' needs tools", "tool_choice")
    return tools, {"require_tool_call": True}


def _json_schema(response_format: Any) -> dict[str, Any] | None:
    """The schema the answer must be valid for (json_object: any object), None for text."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if response_format is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema", {}) if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise BadRequest("response_format must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
                         "'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
    return schema


def _answer(message: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int,
            generation: Any = None) -> tuple[dict[str, Any], str, dict[str, int], Any]:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if message.get("tool_calls"):
        finish = "tool_calls"
    elif finish not in ("stop", "length"):
        finish = "length" if finish == "context_overflow" else "stop"
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return message, finish, usage, generation


def _stop_at(text: Any, stop: list[str]) -> int | None:
    """Where the first stop sequence in ``text`` starts (None: none there)."""
    return min((i for i in (text.find(x) for x in stop) if i >= 0), default=None) if isinstance(text, str) else None


def _stopped(message: dict[str, Any], finish: str, stop: list[str]) -> tuple[dict[str, Any], str]:
    """``message`` as if generation had ended at the first stop sequence in its text: the text before it, finish
    "stop", and no tool calls (they come after the text, so the model would not have written them)."""
    cut = _stop_at(message.get("content"), stop)
    if cut is None:
        return message, finish
    kept = {k: v for k, v in message.items() if k not in ("tool_calls", "parse_error")}
    return kept | {"content": message["content"][:cut]}, "stop"


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte in a token's string."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(extra)}


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a SentencePiece byte-fallback token


def _token_bytes(tokenizer: Any) -> Callable[[int], bytes]:
    """The bytes each token id stands for. A byte-level BPE token (GPT-2, Qwen, our student) or a byte-fallback
    one may hold part of a character, which its decoded text cannot show (U+FFFD): the API's ``bytes`` are there
    for a client to put such characters back together."""
    byte_level = type(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)).__name__ == "ByteLevel"
    alphabet = _byte_level_alphabet() if byte_level else {}
    added = set(getattr(tokenizer, "added_tokens_decoder", None) or ())  # (their strings are their text)

    def of(tid: int) -> bytes:
        piece = tokenizer.convert_ids_to_tokens(tid) if tid not in added else None
        if isinstance(piece, str) and piece:
            if byte_level and all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
            if (m := _BYTE_FALLBACK.fullmatch(piece)) is not None:
                return bytes([int(m.group(1), 16)])
            if not byte_level and "\u2581" in piece:  # SentencePiece's word-boundary mark is a space
                return piece.replace("\u2581", " ").encode()
        return tokenizer.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False).encode()

    return functools.lru_cache(maxsize=None)(of)  # (a token's bytes never change; the vocabulary bounds it)


def _kept(token_bytes: Callable[[int], bytes], generation: Any, stop: list[str]) -> int:
    """How many completion tokens the answer's text holds: those wholly before where a stop sequence cut the text
    (counted in bytes: a token may hold part of a character), or all but the stop token where none did."""
    text = generation.text
    cut = _stop_at(text, stop)
    limit, at = len((text if cut is None else text[:cut]).encode()), 0
    for k, tid in enumerate(generation.completion_ids):
        at += len(token_bytes(tid))
        if at > limit:
            return k
    return len(generation.completion_ids)


def _token_logprobs(token_bytes: Callable[[int], bytes], generation: Any, kept: int, as_ids: bool) -> dict[str, Any]:
    """The ``kept`` tokens' log-probabilities under the model (the text of a tool call too), in the API's
    ``logprobs.content`` shape, with the k likeliest tokens at each step where the request asked for
    ``top_logprobs``; ``as_ids`` names each token ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``)."""
    tops = generation.top_logprobs or [[]] * len(generation.completion_ids)
    return {"content": [_logprob_entry(token_bytes, tid, lp, top, as_ids)
                        for tid, lp, top in zip(generation.completion_ids[:kept], generation.logprobs, tops)]}


def _token_name(token_bytes: Callable[[int], bytes], tid: int, as_ids: bool) -> str:
    """How a logprobs entry names a token: its text (U+FFFD for part of a character), or ``token_id:<id>`` (vLLM's
    ``return_tokens_as_token_ids``)."""
    return f"token_id:{tid}" if as_ids else token_bytes(tid).decode(errors="replace")


def _logprob_entry(token_bytes: Callable[[int], bytes], tid: int, lp: float, top: list[tuple[int, float]] | None,
                   as_ids: bool) -> dict[str, Any]:
    """One token's entry in ``logprobs.content``: its text (or ``token_id:<id>``), log-probability and exact bytes,
    with the k likeliest tokens where they were recorded."""
    def entry(t: int, v: float) -> dict[str, Any]:
        return {"token": _token_name(token_bytes, t, as_ids), "logprob": v, "bytes": list(token_bytes(t))}

    return entry(tid, lp) | {"top_logprobs": [entry(t, v) for t, v in top or []]}


def _chunks(head: dict[str, Any], choices: list[dict[str, Any]], usage: dict[str, int], usage_chunk: bool,
            prompt_token_ids: list[int] | None = None):
    """The choices as chat.completion.chunk events (server-sent events, then ``[DONE]``), one choice after the
    other, each by its index: the role (the first chunk with the prompt's token ids where asked for), the text with
    its logprobs and token ids, each tool call whole (index, id, name and arguments in one delta), the finish
    reason; with ``stream_options.include_usage`` a last chunk with the usage and no choices (earlier chunks carry
    usage null)."""
    for c in choices:
        first = {"prompt_token_ids": prompt_token_ids} if prompt_token_ids is not None and c is choices[0] else None
        yield _event(head, c["index"], {"role": "assistant", "content": ""}, usage_chunk, top=first)
        yield from _rest_of_choice(head, c, usage_chunk, "", 0)
    yield from _end(head, usage, usage_chunk)


def _event(head: dict[str, Any], index: int, delta: dict[str, Any], usage_chunk: bool, finish_reason: str | None = None,
           lps: dict[str, Any] | None = None, ids: dict[str, Any] | None = None, top: dict[str, Any] | None = None) -> str:
    """One chat.completion.chunk event for one choice (earlier chunks carry usage null where a usage chunk comes)."""
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": lps} | (ids or {})
    extra = {"usage": None} if usage_chunk else {}
    return f"data: {json.dumps({**head, **(top or {}), 'choices': [choice], **extra}, ensure_ascii=False)}\n\n"


def _rest_of_choice(head: dict[str, Any], c: dict[str, Any], usage_chunk: bool, sent: str, tokens_sent: int):
    """What is left to stream of the answer ``c`` once ``sent`` of its text and the logprobs and ids of its first
    ``tokens_sent`` tokens have gone out: the rest of the text with the rest of the tokens, each tool call whole
    (index, id, name and arguments in one delta), the finish reason."""
    message = c["message"]
    content = message.get("content") or ""
    rest = content[len(sent):] if content.startswith(sent) else ""
    lps = {"content": c["logprobs"]["content"][tokens_sent:]} if c["logprobs"] is not None else None
    ids = {"token_ids": c["token_ids"][tokens_sent:]} if "token_ids" in c else None
    if rest or (lps and lps["content"]) or (ids and ids["token_ids"]) or (not sent and not tokens_sent and (lps or ids)):
        yield _event(head, c["index"], {"content": rest}, usage_chunk, lps=lps, ids=ids)
    for i, call in enumerate(message.get("tool_calls") or []):
        yield _event(head, c["index"], {"tool_calls": [{"index": i, **call}]}, usage_chunk)
    yield _event(head, c["index"], {}, usage_chunk, c["finish_reason"])


def _end(head: dict[str, Any], usage: dict[str, int], usage_chunk: bool):
    if usage_chunk:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


class _StreamedChoice:
    """One choice's text as its tokens are drawn: each delta is text the finished answer will hold, so the deltas
    add up to the answer's content. Held back until it is known: a character whose bytes have not all come, text
    that may begin a tool call, a stop sequence or an end-of-turn marker, and whitespace the answer may strip. Once
    a tool call or a stop sequence begins, the rest comes with the finished answer (a tool call whole, as its
    arguments must be complete to be checked). Each delta carries the logprobs and ids of the tokens it completes."""

    def __init__(self, tokenizer: Any, stop_ids: Any, stop: list[str], token_bytes: Callable[[int], bytes],
                 answer: bool = True) -> None:
        from cowork_pipeline.agents.chat_format import STOP_STRINGS, TOOL_CALL_OPEN

        self.tokenizer, self.stop_ids, self.token_bytes = tokenizer, set(stop_ids), token_bytes
        # (a text completion's text is the raw continuation: only its stop sequences are held back, nothing stripped)
        self.answer = answer
        self.markers = (TOOL_CALL_OPEN, *STOP_STRINGS, *stop) if answer else tuple(stop)
        self.ids: list[int] = []  # the text's tokens (an end-of-turn token is not text)
        self.drawn: list[tuple[int, float, list[tuple[int, float]] | None]] = []
        self.ends: list[int] = []  # each drawn text token's last byte in the text
        self.prefix = self.read = 0  # incremental decoding: tokens decoded for context, and up to where text is out
        self.text = self.before = ""  # the text so far; the last tokens' own decoding, which new text extends
        self.longest = max((len(m) for m in self.markers), default=0)
        self.sent = ""  # the content streamed so far
        self.tokens_sent = 0
        self.closed = False

    def _decoded(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def take(self, drawn: list[tuple[int, float, list[tuple[int, float]] | None]]) -> tuple[str, list[tuple]] | None:
        """The delta these newly drawn tokens (id, logprob, top) complete, with the tokens it covers (None: nothing
        to send yet)."""
        self.drawn += drawn
        if self.closed:
            return None
        for tid, _lp, _top in drawn:
            if tid not in self.stop_ids:
                self.ids.append(tid)
                self.ends.append((self.ends[-1] if self.ends else 0) + len(self.token_bytes(tid)))
        # The new tokens are decoded with the last ones before them as context, not the whole text again (a
        # word-boundary tokenizer spells a token differently at the start of a text).
        now = self._decoded(self.ids[self.prefix:])
        if now.endswith("\ufffd") or len(now) <= len(self.before):
            return None  # (a character whose bytes have not all come)
        grown = len(self.text)
        self.text += now[len(self.before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.before = self._decoded(self.ids[self.prefix:self.read])
        text = self.text
        since = max(grown - self.longest, 0)  # (a marker not in the text before would end in what is new)
        cut = min((i for i in (text.find(m, since) for m in self.markers) if i >= 0), default=None)
        if cut is None:
            held = max((k for m in self.markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
            end = len(text) - held
        else:
            end, self.closed = cut, True
        shown = text[:end].rstrip() if self.answer else text[:end]
        start = len(shown) - len(shown.lstrip()) if self.answer else 0
        content = shown[start:]
        if len(content) <= len(self.sent) or not content.startswith(self.sent):
            return None
        delta, self.sent = content[len(self.sent):], content
        covered = len(text[:start + len(content)].encode())
        k = self.tokens_sent
        while k < len(self.ends) and self.ends[k] <= covered:
            k += 1
        tokens, self.tokens_sent = self.drawn[self.tokens_sent:k], k
        return delta, tokens


def _completion_choice(index: int, generation: Any, delivery: dict[str, Any],
                       token_bytes: Callable[[int], bytes]) -> dict[str, Any]:
    """One text completion choice: the text cut at the first stop sequence, the legacy API's ``logprobs``
    (tokens, their logprobs, the k likeliest at each step, each token's offset in the text) and vLLM's token ids
    (the prompt's and the completion's, the stop token that ended it included unless a stop sequence cut it)."""
    text, finish = generation.text, generation.finish_reason
    cut = _stop_at(text, delivery["stop"])
    if cut is not None:
        text, finish = text[:cut], "stop"
    kept = _kept(token_bytes, generation, delivery["stop"] if cut is not None else [])
    out: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
    if delivery["logprobs"] is not None:
        def named(tid: int) -> str:
            return _token_name(token_bytes, tid, delivery["return_tokens_as_token_ids"])

        tokens = [named(t) for t in generation.completion_ids[:kept]]
        offsets = [0, *itertools.accumulate(len(t) for t in tokens)][: len(tokens)]
        tops = [{named(t): v for t, v in top} for top in generation.top_logprobs[:kept]] \
            if delivery["logprobs"] else None
        out["logprobs"] = {"tokens": tokens, "token_logprobs": generation.logprobs[:kept], "top_logprobs": tops,
                           "text_offset": offsets}
    if delivery["return_token_ids"]:
        out["prompt_token_ids"] = list(generation.prompt_ids)
        out["token_ids"] = list(generation.completion_ids[:kept] if cut is not None else generation.completion_ids)
    return out


def _usage(answers: list[Any]) -> dict[str, int]:
    """The prompt is read once, whatever n; every choice's tokens count."""
    usage = dict(answers[0][2], completion_tokens=sum(a[2]["completion_tokens"] for a in answers))
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def _choice_seed(seed: int, index: int) -> int:
    """The random stream of choice ``index`` of a request sampled with ``seed``: choice 0 samples from the seed's own
    (as a request for one choice does), later ones from streams mixed from it."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest(), "big") >> 1


def _takes(fn: Any, parameter: str) -> bool:
    try:
        return callable(fn) and parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # (a callable whose signature Python cannot read)
        return False


class _StopWatch:
    """Ends a row's turn once its text says a stop sequence where the answer would be cut there (:func:`_stopped`:
    in the text before any tool call, past its leading whitespace), so that generation stops with it instead of
    running on to the end of the turn for text that is cut away. Matched on bytes (a stop sequence's UTF-8 bytes
    are found exactly where its characters are), nothing decoded."""

    def __init__(self, stop: list[str], token_bytes: Callable[[int], bytes], answer: bool = True) -> None:
        from cowork_pipeline.agents.chat_format import TOOL_CALL_OPEN

        self.stops, self.token_bytes = [x.encode() for x in stop], token_bytes
        self.call = TOOL_CALL_OPEN.encode() if answer else None  # (a raw completion is cut anywhere, as it is)
        self.text = bytearray()
        self.watching = True

    def said(self, token_id: int) -> bool:
        if not self.watching:
            return False
        self.text += self.token_bytes(token_id)
        if self.call is None:
            return any(x in self.text for x in self.stops)
        text = bytes(self.text).lstrip()
        if (call := text.find(self.call)) >= 0:
            self.watching, text = False, text[:call]  # (a tool call's text is not cut: its call would be lost)
        return any(x in text for x in self.stops)


class _Fanout:
    """``generate``'s listener for a batch: each row's prompt and tokens go to its request's listener, by the
    choices the row is for (a greedy row is all n choices of its request); a row ends where its request's stop
    sequence is said, or where its listener says so (its client gone)."""

    def __init__(self, targets: list[tuple[Any, list[int], _StopWatch | None]] | dict[int, tuple]) -> None:
        self.targets = targets  # by row (a running batch's: by row key, each gone once its row is done)

    def prompt(self, index: int, prompt_ids: list[int]) -> None:
        listener, choices, _watch = self.targets[index]
        if listener is not None:
            listener.prompt(choices, prompt_ids)

    def token(self, index: int, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> bool:
        listener, choices, watch = self.targets[index]
        gone = listener is not None and bool(listener.token(choices, token_id, logprob, top))
        return (watch is not None and watch.said(token_id)) or gone


class _Relay:
    """A streamed request's listener: hands what the generating thread sees to the request's event loop. The loop
    is woken once for whatever has come since it last took it (a decode step brings a token for every row), not
    once per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.items, self.ready = loop, deque(), asyncio.Event()
        self.lock, self.waking = threading.Lock(), False
        self.gone = False  # (the client left: its rows end at their next token)

    def put(self, *item: Any) -> None:  # (from the generating thread)
        self.items.append(item)
        with self.lock:
            if self.waking:
                return
            self.waking = True
        self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self.ready.set()

    async def taken(self) -> list[tuple]:
        """Everything that has come since the last call (waits for something)."""
        while True:
            await self.ready.wait()
            with self.lock:  # (what comes from now on wakes the loop again; what came before is taken below)
                self.waking = False
                self.ready.clear()
            out = []
            while self.items:
                out.append(self.items.popleft())
            if out:
                return out

    def prompt(self, choices: list[int], prompt_ids: list[int]) -> None:
        self.put("prompt", choices, prompt_ids)

    def token(self, choices: list[int], token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> bool:
        self.put("token", choices, token_id, logprob, top)
        return self.gone


def _by_choice(taken: list[tuple]) -> tuple[dict[int, list[tuple]], list[tuple]]:
    """What a relay brought: each choice's tokens drawn (token id, logprob, top), and the ``done`` items that came
    after a request's last token (their fields)."""
    drawn: dict[int, list[tuple]] = {}
    done: list[tuple] = []
    for item in taken:
        if item[0] == "done":
            done.append(item[1:])
        elif item[0] == "token":
            for c in item[1]:
                drawn.setdefault(c, []).append(item[2:])
    return drawn, done


class _Tagged:
    """The listener of one prompt of a text completion request: its choices by their index in the request (choices
    come by prompt, then sample), into the request's relay."""

    def __init__(self, relay: _Relay, first: int) -> None:
        self.relay, self.first = relay, first

    def prompt(self, choices: list[int], prompt_ids: list[int]) -> None:
        self.relay.put("prompt", [self.first + c for c in choices], prompt_ids)

    def token(self, choices: list[int], token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> bool:
        self.relay.put("token", [self.first + c for c in choices], token_id, logprob, top)
        return self.relay.gone


class _Request:
    """A request being generated row by row: its future gets its n answers once every row is done."""

    def __init__(self, prompt: tuple, n: int, sampled: bool, fut: Future) -> None:
        self.prompt, self.n, self.sampled, self.fut = prompt, n, sampled, fut
        self.rows = n if sampled else 1  # (a greedy answer is every choice's)
        self.generations: list[Any] = [None] * self.rows
        self.left = self.rows

    def done(self, choice: int, generation: Any) -> None:
        self.generations[choice] = generation
        self.left -= 1
        if self.left == 0 and not self.fut.done():
            gens = self.generations if self.sampled else self.generations * self.n
            self.fut.set_result([_answer(g.message, g.finish_reason, len(g.prompt_ids), len(g.completion_ids), g)
                                 for g in gens])

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)


class _Batcher:
    """Concurrent requests are generated together, so that clients share the agent's batched, KV-cached decoding.
    Continuously (an agent with ``decoding``, HFAgent's): requests join the running batch between decode steps,
    whatever their prompts, tools, token limits or sampling settings, and each leaves it with its answer once
    done. Otherwise a batch (requests with the same options) is one ``generate`` call, run to its end before the
    next starts. Either way a group of requests that arrive together starts as one batch. What a request gets
    does not depend on what it is batched with: greedy decoding draws nothing, and each sampled choice draws from
    its own random stream, seeded by the request's seed and the choice's index, so a seed reproduces its answer
    whatever else is in the batch. A sampled request without a seed gets a fresh one, as OpenAI's and vLLM's servers draw afresh: clients
    that send a group of requests to sample a group of rollouts get different samples."""

    def __init__(self, agent: Agent, max_batch: int = 32, gather_s: float = 0.005, max_gather_s: float = 0.05,
                 continuous: bool = True, join_every: int = 4):
        self.agent, self.max_batch, self.gather_s, self.max_gather_s = agent, max_batch, gather_s, max_gather_s
        self.join_every = max(1, join_every)
        # Continuous batching (an agent whose decoding rows can join, HFAgent's): requests join the running batch
        # between decode steps and leave it when done. Otherwise a batch runs to its end before the next starts.
        self.continuous = continuous and callable(getattr(agent, "decoding", None))
        self.cond = threading.Condition()
        self.queue: list[tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], int, Any, Future]] = []
        self.streams = _takes(getattr(agent, "generate", None), "listener")
        self._token_bytes: Callable[[int], bytes] | None = None
        self.greedy = float(getattr(agent, "temperature", 0.0) or 0.0) <= 0.0  # the agent's default for requests without one
        threading.Thread(target=self._loop, daemon=True, name="cowork-serve-batcher").start()

    def token_bytes(self) -> Callable[[int], bytes]:
        """The agent's tokens' bytes (its tokenizer's alphabet and added tokens take ms to read: once)."""
        if self._token_bytes is None:
            self._token_bytes = _token_bytes(self.agent.tokenizer)
        return self._token_bytes

    def run(self, prompt: tuple, opts: dict[str, Any], n: int = 1, stop: list[str] | None = None) -> list[Any]:
        """The request's ``n`` answers: one greedy answer n times (n copies would be the same), or n samples.
        ``prompt`` is ``("chat", messages, tools)``, or ``("text", token_ids)`` for an agent that can ``complete``
        raw prompts."""
        return self.submit(prompt, opts, n, stop=stop).result()

    def submit(self, prompt: tuple, opts: dict[str, Any], n: int = 1, listener: Any = None,
               stop: list[str] | None = None) -> Future:
        """:meth:`run`'s answers, to come; ``listener`` (where the agent can stream, :attr:`streams`) sees the
        request's prompt ids and tokens as they are generated, by the choices they are for: ``prompt(choices,
        ids)`` and ``token(choices, token_id, logprob, top)``, which ends them by returning True. Where the agent
        can be listened to, generation stops at a ``stop`` sequence the answer is cut at."""
        fut: Future = Future()
        with self.cond:
            self.queue.append((prompt, opts, n, (listener, stop or []), fut))
            self.cond.notify()
        return fut

    def _sampled(self, opts: dict[str, Any]) -> bool:
        t = opts.get("temperature")
        return not self.greedy if t is None else t > 0.0

    @staticmethod
    def _key(opts: dict[str, Any]) -> str:
        """Requests batch together whatever their seeds (each choice has its own random stream)."""
        return json.dumps({k: v for k, v in opts.items() if k != "seed"}, sort_keys=True)

    def _gather(self) -> None:
        """Let requests sent at the same moment join this batch: wait while they keep coming (a group of clients
        that start together does not all arrive within one short wait, and a batch split in two takes twice as
        long), until a wait brings none, the batch is full, or ``max_gather_s`` has passed."""
        waited = 0.0
        with self.cond:
            seen = len(self.queue)
        while waited < self.max_gather_s:
            time.sleep(self.gather_s)
            waited += self.gather_s
            with self.cond:
                now = len(self.queue)
            if now == seen or now >= self.max_batch:
                return
            seen = now

    def _loop_continuously(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
            self._gather()
            fanout = _Fanout({})
            waiting: dict[int, tuple[_Request, int]] = {}  # row key (its fanout target) -> (request, choice)
            requests: list[_Request] = []
            keys = itertools.count()
            try:
                decoding = self.agent.decoding(on_token=fanout.token)  # type: ignore[attr-defined]
                steps = 0
                while True:
                    # Newcomers join every few steps, not at each: each join is a prefill and a copy of the batch's
                    # cache, and those that come within a few steps share them (bench_serving's staggered agents:
                    # 688 tok/s joining every 4th step, 633 at every step, one run each).
                    if decoding.can_join() and (steps % self.join_every == 0 or not decoding.live):
                        self._admit(decoding, fanout, waiting, requests, keys)
                    if not decoding.live:
                        break
                    steps += 1
                    for row_key, ids, out in decoding.step():
                        # (what a finished row held goes with it: a batch that never empties keeps no history)
                        del fanout.targets[row_key]
                        request, choice = waiting.pop(row_key)
                        if isinstance(out, Exception):  # (it failed alone, after a failed step: a 500 for it)
                            request.fail(out)
                            continue
                        request.done(choice, self.agent.generation(request.prompt, ids, out))  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - each request in the batch gets the error as a 500
                if not requests:  # (it failed before admitting any: the request it was started for fails)
                    with self.cond:
                        *_rest, fut = self.queue.pop(0)
                    requests.append(_Request((), 1, False, fut))
                for request in requests:
                    request.fail(exc)

    def _admit(self, decoding: Any, fanout: _Fanout, waiting: dict[int, tuple[_Request, int]],
               requests: list[_Request], keys: Any) -> None:
        """Let the requests at the head of the queue join ``decoding``, in order, while there is room."""
        import torch

        from cowork_pipeline.agents.decoding import Prompt

        with self.cond:
            room, taken = decoding.room(self.max_batch), []
            for queued in self.queue:
                rows = queued[2] if self._sampled(queued[1]) else 1
                if rows > room and (taken or decoding.live):
                    break
                taken.append(queued)
                room -= rows
            del self.queue[: len(taken)]
        requests[:] = [r for r in requests if not r.fut.done()]  # (those in the batch: a failure fails them)
        groups: list[tuple[_Request, list[Prompt]]] = []
        for prompt, opts, n, (listener, stop), fut in taken:
            request = _Request(prompt, n, self._sampled(opts), fut)
            requests.append(request)
            try:
                ids = self._prompt_ids(prompt, opts)
                if not isinstance(ids, list):  # (a conversation that does not fit: its turn failed, nothing generated)
                    for choice in range(request.rows):
                        request.done(choice, ids)
                    continue
                rows = self._rows(prompt, opts, n, listener, stop)
                # (its tools' grammar, or its JSON schema, is its own: one that cannot be compiled fails it alone)
                matchers = [self.agent.matcher(prompt[2], opts.get("require_tool_call", False),  # type: ignore[attr-defined]
                                               opts.get("json_schema"), opts.get("single_tool_call", False))
                            if prompt[0] == "chat" else None for _ in rows]
            except Exception as exc:  # noqa: BLE001 - this request's own failure (its prompt): a 500 for it alone
                request.fail(exc)
                continue
            entries = []
            for choice, ((target, seed), matcher) in enumerate(zip(rows, matchers)):
                row_key = next(keys)
                fanout.targets[row_key] = target
                waiting[row_key] = (request, choice)
                fanout.prompt(row_key, ids)
                gen = torch.Generator(device=self.agent.device).manual_seed(seed) \
                    if request.sampled else None  # type: ignore[attr-defined]
                entries.append(Prompt(row_key, ids, matcher, gen, opts.get("max_new_tokens"), opts.get("temperature"),
                                      opts.get("top_p"), opts.get("top_logprobs", 0)))
            groups.append((request, entries))
        self._join(decoding, groups, fanout, waiting)

    def _join(self, decoding: Any, groups: list[tuple[_Request, list[Any]]], fanout: _Fanout,
              waiting: dict[int, tuple[_Request, int]]) -> None:
        """Admit the requests' rows into ``decoding`` together. Where that fails (a prefill out of memory, say), the
        running batch is as it was (``Decoding.admit``) and each request is admitted alone, so that only a request
        that cannot be admitted fails, and the batch decodes on without it."""
        if not groups:
            return
        try:
            decoding.admit([entry for _request, entries in groups for entry in entries])
            return
        except Exception as exc:  # noqa: BLE001 - the request gets the error as a 500; the others go on
            if len(groups) == 1:
                request, entries = groups[0]
                for entry in entries:
                    del fanout.targets[entry.key], waiting[entry.key]
                request.fail(exc)
                return
        for group in groups:
            self._join(decoding, [group], fanout, waiting)

    def _prompt_ids(self, prompt: tuple, opts: dict[str, Any]) -> Any:
        """A request's prompt ids, or for a conversation that does not fit the turn that failed."""
        max_new = opts.get("max_new_tokens")
        if prompt[0] == "chat":
            return self.agent.chat_prompt(prompt[1], prompt[2], max_new or self.agent.max_new_tokens)  # type: ignore[attr-defined]
        ids = [int(t) for t in prompt[1]]
        if (why := self.agent.prompt_problem(ids, max_new)) is not None:  # type: ignore[attr-defined]
            raise ValueError(f"prompt 0: {why}")
        return ids

    def _loop(self) -> None:
        if self.continuous:
            return self._loop_continuously()
        generate = getattr(self.agent, "generate", None)
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                first = self.queue[0]
            if callable(generate):
                self._gather()
            with self.cond:
                if callable(generate):
                    kind, key = first[0][0], self._key(first[1])
                    batch = [r for r in self.queue if r[0][0] == kind and self._key(r[1]) == key][: self.max_batch]
                else:
                    batch = [first]
                self.queue = [r for r in self.queue if not any(r is b for b in batch)]
            try:
                if not callable(generate):  # a plain agent (one request per batch): its act, no token usage
                    (_kind, m, t), _o, n, _l, fut = batch[0]
                    fut.set_result([_answer(self.agent.act(m, t), "stop", 0, 0) for _ in range(n)])
                    continue
                sampled = self._sampled(first[1])
                rows: list[Any] = []  # (messages, tools) to generate for, or token ids to continue
                seeds: list[int] = []
                targets: list[tuple[Any, list[int], _StopWatch | None]] = []
                requests: list[tuple[_Request, int]] = []  # (request, choice) of each row
                for prompt, o, n, (listener, stop), fut in batch:
                    request = _Request(prompt, n, sampled, fut)
                    for choice, (target, seed) in enumerate(self._rows(prompt, o, n, listener, stop)):
                        rows.append(prompt[1:] if kind == "chat" else prompt[1])
                        seeds.append(seed)
                        targets.append(target)
                        requests.append((request, choice))
                opts = {k: v for k, v in first[1].items() if k != "seed"}
                if any(listener is not None or watch is not None for listener, _c, watch in targets):
                    opts["listener"] = _Fanout(targets)
                call = generate if kind == "chat" else self.agent.complete  # type: ignore[attr-defined]
                gens = call(rows, **opts, seeds=seeds) if sampled else call(rows, **opts)
                for (request, choice), generation in zip(requests, gens):
                    request.done(choice, generation)
            except Exception as exc:  # noqa: BLE001 - each waiting request gets the error as a 500
                for *_rest, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)

    def _rows(self, prompt: tuple, opts: dict[str, Any], n: int, listener: Any,
              stop: list[str]) -> list[tuple[tuple[Any, list[int], _StopWatch | None], int]]:
        """A request's rows (a sampled request's n choices, or the one answer of a greedy one, every choice's):
        per row, what its tokens go to (the request's listener, the choices the row is, what watches for the
        request's stop sequences) and the seed of its random stream."""
        sampled = self._sampled(opts)
        seed = opts["seed"] if "seed" in opts else secrets.randbits(63)
        return [((listener, choices, _StopWatch(stop, self.token_bytes(), answer=prompt[0] == "chat")
                  if stop and self.streams else None), _choice_seed(seed, i))
                for i, choices in enumerate([[c] for c in range(n)] if sampled else [list(range(n))])]


def make_app(agent: Agent, model_name: str | None = None, max_batch: int = 32, stream_interval_s: float = 0.05,
             continuous: bool = True) -> Starlette:
    """ASGI app serving ``agent``; ``model_name`` defaults to ``agent.name``. Concurrent requests are generated
    together, up to ``max_batch`` at once (see :class:`_Batcher`): joining the running batch between decode
    steps (``continuous``, where the agent can), or as a batch that runs to its end before the next starts. A
    streamed answer's text goes out as it is drawn, what comes within ``stream_interval_s`` in one event (the
    first as soon as it comes)."""
    name = model_name or getattr(agent, "name", "agent")
    created = int(time.time())
    batcher = _Batcher(agent, max_batch=max_batch, continuous=continuous)


    async def chat_completions(request: Request) -> JSONResponse:
        try:
            body = await _body(request)
            messages, tools, opts, delivery = _validate(body)
            if getattr(agent, "constraint", None) is None:
                # (only a grammar can make the model call, or answer in JSON; anything else breaks the client's contract)
                for key, param in (("require_tool_call", "tool_choice"), ("json_schema", "response_format"),
                                   ("single_tool_call", "parallel_tool_calls")):
                    if key in opts:
                        raise BadRequest(f"this {param} needs a model served with strict tool calls; {name} is not", param)
            if not callable(getattr(agent, "generate", None)):
                if delivery["logprobs"]:
                    raise BadRequest(f"{name} does not report token log-probabilities", "logprobs")
                if delivery["return_token_ids"]:
                    raise BadRequest(f"{name} does not report token ids", "return_token_ids")
        except BadRequest as exc:
            return _error(400, exc.message, param=exc.param)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.get("model") or name}
        if delivery["stream"] and batcher.streams:
            return await _streamed(head, messages, tools, opts, delivery)
        try:
            answers = await run_in_threadpool(batcher.run, ("chat", messages, tools), opts, delivery["n"], delivery["stop"])
        except Exception as exc:  # noqa: BLE001 - report as an OpenAI-style server error, keep serving
            return _failed(exc)
        token_bytes = batcher.token_bytes() if answers[0][3] is not None else None
        choices = [_choice(i, *answer, delivery, token_bytes) for i, answer in enumerate(answers)]
        prompt_ids = {"prompt_token_ids": list(answers[0][3].prompt_ids)} \
            if delivery["return_token_ids"] and answers[0][3] is not None else {}
        if delivery["stream"]:  # (an agent that cannot stream: its answers whole, as the events a client reads)
            events = _chunks({**head, "object": "chat.completion.chunk"}, choices, _usage(answers), delivery["usage_chunk"],
                             prompt_ids.get("prompt_token_ids"))
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return JSONResponse({**head, "object": "chat.completion", "choices": choices, "usage": _usage(answers), **prompt_ids})

    def _failed(exc: BaseException) -> JSONResponse:
        return _error(500, f"generation failed: {type(exc).__name__}: {exc}", err_type="server_error")

    async def _streamed(head: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                        opts: dict[str, Any], delivery: dict[str, Any]) -> Any:
        """The answer streamed as it is generated: each choice's text as its tokens are drawn (see
        :class:`_StreamedChoice`), its tool calls and finish reason when it is done. A request that fails before
        its first token is a 500; one that fails later ends its stream with an error event."""
        relay = _Relay(asyncio.get_running_loop())
        fut = batcher.submit(("chat", messages, tools), opts, delivery["n"], relay, delivery["stop"])
        fut.add_done_callback(lambda f: relay.put("done", f))
        taken = await relay.taken()
        while all(item[0] == "prompt" for item in taken):  # (a failure in the prefill, before any token, is a 500)
            taken += await relay.taken()
        first = taken[0]
        if (came := next(item for item in taken if item[0] != "prompt"))[0] == "done" and came[1].exception() is not None:
            return _failed(came[1].exception())
        head = {**head, "object": "chat.completion.chunk"}
        usage_chunk, token_bytes = delivery["usage_chunk"], batcher.token_bytes()
        writers = [_StreamedChoice(agent.tokenizer, getattr(agent, "stop_ids", ()), delivery["stop"], token_bytes)
                   for _ in range(delivery["n"])]

        def tokens(drawn: list[tuple], as_ids: bool) -> dict[str, Any]:
            return {"content": [_logprob_entry(token_bytes, *d, as_ids) for d in drawn]}

        async def stream():
            try:
                async for events in answer():
                    yield events
            finally:  # (done, or the client gone: a row still generating for it ends at its next token)
                relay.gone = True

        async def answer():
            nonlocal taken
            if first[0] == "prompt":
                prompt_ids = first[2]
            else:  # (answered before any prompt was encoded: a context overflow)
                prompt_ids = list(first[1].result()[0][3].prompt_ids)
            top = {"prompt_token_ids": list(prompt_ids)} if delivery["return_token_ids"] else None
            yield "".join(_event(head, c, {"role": "assistant", "content": ""}, usage_chunk, top=top if c == 0 else None)
                          for c in range(delivery["n"]))
            done = None
            while done is None:
                out = []
                drawn, ended = _by_choice(taken)
                if ended:
                    done = ended[-1][0]
                for c, new in sorted(drawn.items()):
                    if (said := writers[c].take(new)) is not None:
                        delta, covered = said
                        lps = tokens(covered, delivery["return_tokens_as_token_ids"]) if delivery["logprobs"] else None
                        ids = {"token_ids": [d[0] for d in covered]} if delivery["return_token_ids"] else None
                        out.append(_event(head, c, {"content": delta}, usage_chunk, lps=lps, ids=ids))
                if out:
                    yield "".join(out)  # (one write for what came together)
                if done is None:
                    if out:
                        # What comes within stream_interval_s is sent together: per-token events cost the
                        # generating thread throughput (they share its interpreter); a reader sees no difference.
                        # Streams wake on a shared tick, so the loop takes the interpreter once per tick for all.
                        now = asyncio.get_running_loop().time()
                        await asyncio.sleep(stream_interval_s - now % stream_interval_s)
                    taken = await relay.taken()
            if (exc := done.exception()) is not None:
                err = {"message": f"generation failed: {type(exc).__name__}: {exc}", "type": "server_error",
                       "param": None, "code": None}
                yield f"data: {json.dumps({'error': err})}\n\n"
                return
            answers = done.result()
            for i, answer in enumerate(answers):
                yield "".join(_rest_of_choice(head, _choice(i, *answer, delivery, token_bytes), usage_chunk,
                                              writers[i].sent, writers[i].tokens_sent))
            yield "".join(_end(head, _usage(answers), usage_chunk))

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _streamed_completions(head: dict[str, Any], prompts: list[list[int]], opts: dict[str, Any],
                                    delivery: dict[str, Any]) -> Any:
        """Text completions streamed as they are generated: each choice's text as its tokens are drawn (only what
        may begin a stop sequence, or a character whose bytes have not all come, waits), with the legacy
        logprobs and vLLM's token ids of the tokens it completes, then its finish reason (and the prompt's ids);
        choices by prompt then sample, as unstreamed. A request that fails before its first token is a 500; one
        that fails later ends its stream with an error event."""
        relay, n = _Relay(asyncio.get_running_loop()), delivery["n"]
        for p, ids in enumerate(prompts):
            fut = batcher.submit(("text", ids), opts, n, _Tagged(relay, p * n), delivery["stop"])
            fut.add_done_callback(lambda f, p=p: relay.put("done", p, f))
        taken = await relay.taken()
        while all(item[0] == "prompt" for item in taken):
            taken += await relay.taken()
        if (came := next(item for item in taken if item[0] != "prompt"))[0] == "done" and came[2].exception() is not None:
            return _failed(came[2].exception())
        token_bytes, as_ids = batcher.token_bytes(), delivery["return_tokens_as_token_ids"]
        writers = [_StreamedChoice(agent.tokenizer, getattr(agent, "stop_ids", ()), delivery["stop"], token_bytes,
                                   answer=False) for _ in range(len(prompts) * n)]
        offsets = [0] * len(writers)  # each choice's text offset of its next token (the legacy logprobs')
        extra = {"usage": None} if delivery["usage_chunk"] else {}

        def event(choice: dict[str, Any]) -> str:
            return f"data: {json.dumps({**head, 'choices': [choice], **extra}, ensure_ascii=False)}\n\n"

        def logprobs(i: int, drawn: list[tuple]) -> dict[str, Any] | None:
            if delivery["logprobs"] is None:
                return None
            tokens = [_token_name(token_bytes, d[0], as_ids) for d in drawn]
            starts = list(itertools.accumulate((len(t) for t in tokens), initial=offsets[i]))
            offsets[i] = starts[-1]
            tops = [{_token_name(token_bytes, t, as_ids): v for t, v in d[2] or []} for d in drawn] \
                if delivery["logprobs"] else None
            return {"tokens": tokens, "token_logprobs": [d[1] for d in drawn], "top_logprobs": tops,
                    "text_offset": starts[:-1]}

        async def stream():
            try:
                async for events in answer():
                    yield events
            finally:  # (done, or the client gone: its rows end at their next token)
                relay.gone = True

        async def answer():
            nonlocal taken
            left = len(prompts)
            usage = {"prompt_tokens": sum(len(ids) for ids in prompts), "completion_tokens": 0}
            while True:
                out: list[str] = []
                drawn, done = _by_choice(taken)
                for i, new in sorted(drawn.items()):
                    if (said := writers[i].take(new)) is not None:
                        delta, covered = said
                        ids = {"token_ids": [d[0] for d in covered]} if delivery["return_token_ids"] else {}
                        out.append(event({"index": i, "text": delta, "logprobs": logprobs(i, covered),
                                          "finish_reason": None} | ids))
                for p, fut in done:  # (a prompt's choices end: the rest of each, from the answer given whole)
                    if (exc := fut.exception()) is not None:
                        err = {"message": f"generation failed: {type(exc).__name__}: {exc}", "type": "server_error",
                               "param": None, "code": None}
                        yield "".join(out) + f"data: {json.dumps({'error': err})}\n\n"
                        return
                    for j, ans in enumerate(fut.result()):
                        i, w = p * n + j, writers[p * n + j]
                        whole = _completion_choice(i, ans[3], delivery, token_bytes)
                        last: dict[str, Any] = {
                            "index": i, "text": whole["text"][len(w.sent):] if whole["text"].startswith(w.sent) else "",
                            "logprobs": None, "finish_reason": whole["finish_reason"]}
                        if whole["logprobs"] is not None:
                            last["logprobs"] = {k: v[w.tokens_sent:] if isinstance(v, list) else v
                                                for k, v in whole["logprobs"].items()}
                        if delivery["return_token_ids"]:
                            last |= {"token_ids": whole["token_ids"][w.tokens_sent:],
                                     "prompt_token_ids": whole["prompt_token_ids"]}
                        out.append(event(last))
                        usage["completion_tokens"] += ans[2]["completion_tokens"]
                    left -= 1
                if out:
                    yield "".join(out)
                if not left:
                    break
                if out:  # (what comes within stream_interval_s goes together, as the chat stream's)
                    now = asyncio.get_running_loop().time()
                    await asyncio.sleep(stream_interval_s - now % stream_interval_s)
                taken = await relay.taken()
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            yield "".join(_end(head, usage, delivery["usage_chunk"]))

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def _choice(index: int, message: dict[str, Any], finish: str, _usage: dict[str, int], generation: Any,
                delivery: dict[str, Any], token_bytes: Callable[[int], bytes] | None) -> dict[str, Any]:
        said, finish = _stopped(message, finish, delivery["stop"])
        out: dict[str, Any] = {"index": index, "finish_reason": finish, "logprobs": None}
        if generation is not None and token_bytes is not None and (delivery["logprobs"] or delivery["return_token_ids"]):
            cut = said is not message
            kept = _kept(token_bytes, generation, delivery["stop"] if cut else [])
            if delivery["logprobs"]:
                out["logprobs"] = _token_logprobs(token_bytes, generation, kept, delivery["return_tokens_as_token_ids"])
            if delivery["return_token_ids"]:  # (the stop token too, where it ended the turn: a trainer learns it)
                out["token_ids"] = list(generation.completion_ids[:kept] if cut else generation.completion_ids)
        content = said.get("content")
        # (an answer that parsed is stripped; one that did not is its raw text, whose leading whitespace a stream
        # cannot know to send until the end: dropped, so that streamed or not, the text is the same)
        out_msg: dict[str, Any] = {"role": "assistant", "content": content.lstrip() if isinstance(content, str) else content}
        if said.get("tool_calls"):
            out_msg["tool_calls"] = said["tool_calls"]
        if said.get("parse_error"):
            out_msg["parse_error"] = said["parse_error"]  # non-standard; clients ignore unknown fields
        return {"message": out_msg} | out

    async def completions(request: Request) -> JSONResponse:
        """Text completions (``/v1/completions``): token in, token out, for RL frameworks that render their own
        prompts and train on the ids they sampled (vLLM's way): each prompt's ids continued as given."""
        try:
            body = await _body(request)
            if not callable(getattr(agent, "complete", None)):
                raise BadRequest(f"{name} cannot continue raw prompts: /v1/completions needs a checkpoint served with "
                                 "`cowork serve` (use /v1/chat/completions)")
            prompts, opts, delivery = _validate_completion(
                body, lambda text: list(agent.tokenizer(text)["input_ids"]))  # type: ignore[attr-defined]
            if delivery["stream"] and not batcher.streams:
                raise BadRequest(f"{name} cannot stream its tokens; leave 'stream' out", "stream")
            problem = getattr(agent, "prompt_problem", lambda _ids, _max_new: None)
            for i, ids in enumerate(prompts):
                if (why := problem(ids, opts.get("max_new_tokens"))) is not None:
                    raise BadRequest(f"prompt {i}: {why}", "prompt")
        except BadRequest as exc:
            return _error(400, exc.message, param=exc.param)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": body.get("model") or name}
        if delivery["stream"]:
            return await _streamed_completions(head, prompts, opts, delivery)
        futures = [batcher.submit(("text", ids), opts, delivery["n"], stop=delivery["stop"]) for ids in prompts]
        try:
            answers = [await asyncio.wrap_future(f) for f in futures]
        except Exception as exc:  # noqa: BLE001 - report as an OpenAI-style server error, keep serving
            return _failed(exc)
        token_bytes = batcher.token_bytes()
        choices = [_completion_choice(p * delivery["n"] + j, answer[3], delivery, token_bytes)
                   for p, request_answers in enumerate(answers) for j, answer in enumerate(request_answers)]
        completion = sum(a[2]["completion_tokens"] for request_answers in answers for a in request_answers)
        usage = {"prompt_tokens": sum(len(ids) for ids in prompts), "completion_tokens": completion}
        usage["total_tokens"] = usage["prompt_tokens"] + completion
        return JSONResponse({**head, "choices": choices, "usage": usage})

    async def tokenize(request: Request) -> JSONResponse:
        """vLLM's ``/tokenize``: a text's ids, or a conversation's as the chat endpoint renders it (with its tools
        and, unless ``add_generation_prompt`` is false, the assistant's turn opened; whole, where the chat endpoint
        would drop old turns that do not fit the context), so that a client can continue it token by token with
        ``/v1/completions``."""
        from cowork_pipeline.agents.chat_format import render_prompt

        try:
            body = await _body(request)
            tokenizer = getattr(agent, "tokenizer", None)
            if tokenizer is None:
                raise BadRequest(f"{name} has no tokenizer to use")
            flags = {k: body.get(k, default) for k, default in (("add_generation_prompt", True), ("add_special_tokens", None))}
            for key, value in flags.items():
                if value is not None and not isinstance(value, bool):
                    raise BadRequest(f"'{key}' must be a boolean", key)
            if "messages" in body:
                messages, tools = _conversation(body)
                text = render_prompt(tokenizer, messages, tools, add_generation_prompt=flags["add_generation_prompt"])
                special = bool(flags["add_special_tokens"])  # (the template writes its own; as the chat endpoint)
            elif isinstance(body.get("prompt"), str):
                text, special = body["prompt"], flags["add_special_tokens"] is not False
            else:
                raise BadRequest("give 'prompt' (a string) or 'messages' (with 'tools' if any)", "prompt")
        except BadRequest as exc:
            return _error(400, exc.message, param=exc.param)
        ids = list(tokenizer(text, add_special_tokens=special)["input_ids"])
        return JSONResponse({"count": len(ids), "max_model_len": getattr(agent, "max_context_tokens", None),
                             "tokens": ids, "token_strs": None})

    async def detokenize(request: Request) -> JSONResponse:
        """vLLM's ``/detokenize``: the text of token ids (special tokens kept, as the completions' text)."""
        try:
            body = await _body(request)
            tokenizer = getattr(agent, "tokenizer", None)
            if tokenizer is None:
                raise BadRequest(f"{name} has no tokenizer to use")
            ids = body.get("tokens")
            size = len(tokenizer)
            if not isinstance(ids, list) or not all(_is_id(t) and 0 <= t < size for t in ids):
                raise BadRequest(f"'tokens' must be an array of token ids (0 to {size - 1})", "tokens")
        except BadRequest as exc:
            return _error(400, exc.message, param=exc.param)
        text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return JSONResponse({"prompt": text})

    async def health(request: Request) -> Response:
        return Response(status_code=200)  # (vLLM's readiness probe: served once the model is loaded)

    async def models(request: Request) -> JSONResponse:
        model = {"id": name, "object": "model", "created": created, "owned_by": "cowork-pipeline"}
        if (context := getattr(agent, "max_context_tokens", None)) is not None:
            model["max_model_len"] = context  # (vLLM's: how long a prompt and its answer may be together)
        return JSONResponse({"object": "list", "data": [model]})

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        err_type = "invalid_request_error" if status < 500 else "server_error"
        return _error(status, f"{detail}: {request.method} {request.url.path}", err_type=err_type)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )


def serve(checkpoint: str | Path, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          announce: Callable[[str], None] | None = None, max_batch: int = 32, continuous: bool = True,
          **agent_kwargs: Any) -> None:
    """Load ``checkpoint`` into an ``HFAgent`` and serve it as ``model_name`` (blocking). ``port`` 0 takes a free
    one; ``announce`` gets the base URL once the port is bound and the model loaded. Up to ``max_batch`` requests
    are generated together (the agent's own batch size is raised to match: with a smaller one, the rows past it
    would wait for the first ones to finish), joining the running batch between decode steps (``continuous``) or
    a batch at a time."""
    import socket

    import uvicorn

    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(checkpoint, **{"batch_size": max_batch, **agent_kwargs})
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))  # (an address in use fails here, before anything is announced)
    sock.listen(2048)  # (clients that connect once it is announced wait in the backlog, not refused, until it runs)
    server = uvicorn.Server(uvicorn.Config(make_app(agent, model_name, max_batch=max_batch, continuous=continuous), log_level="warning"))
    if announce is not None:
        shown = f"[{host}]" if ":" in host else host
        announce(f"http://{shown}:{sock.getsockname()[1]}/v1")
    server.run(sockets=[sock])


__all__ = ["make_app", "serve", "BadRequest"]
