"""One HTTP client for OpenAI-compatible ``/chat/completions`` endpoints (the LLM generator, endpoint agents).

Standard library only. Bounded retries with exponential backoff and jitter on connection errors, timeouts,
429 and 5xx (``Retry-After`` honoured); other statuses fail at once with the server's own error message. A
field the caller marks optional (``response_format``: a server without JSON mode; a sampling setting a reasoning
model refuses) is dropped and the request sent again, free, when a 400 names it, and ``max_tokens`` is sent as
``max_completion_tokens`` when a 400 asks for that; the client remembers both for its later requests and says so
in :attr:`ChatClient.adapted`. Loopback endpoints bypass any HTTP(S)_PROXY of the environment. With a
:class:`ResponseCache`, a request answered before is answered from disk.
"""
from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from cowork_pipeline.spec import canonical_json

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
# A setting an endpoint refuses under one name and takes under another (OpenAI's reasoning models: "Use
# 'max_completion_tokens' instead"): sent again under the new name when a 400 names the old one
RENAMED = {"max_tokens": "max_completion_tokens"}


class TransportError(RuntimeError):
    """The endpoint gave no usable answer (after ``attempts`` requests)."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ResponseCache:
    """Chat-completion answers on disk, keyed by the request (endpoint URL and the whole body: model,
    messages, sampling settings, seed). A re-run with the same requests replays the answers instead of
    paying for them again. Only usable answers are stored (never an error); an entry that cannot be read
    is a miss and is replaced by the next answer."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @staticmethod
    def key(url: str, payload: dict[str, Any]) -> str:
        return hashlib.sha256(canonical_json({"url": url, "request": payload}).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            body = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return body if isinstance(body, dict) and "choices" in body else None

    def put(self, key: str, body: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(body), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a reader sees the old entry or the whole new one


class ChatClient:
    """POSTs chat-completion requests to ``{base_url}/chat/completions``. Holds no per-request state, so
    threads may share one client."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 120, max_retries: int = 2,
                 backoff_s: float = 1.0, max_backoff_s: float = 20.0, cache_dir: str | Path | None = None):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # Fail here, not once per request after every retry.
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.cache = ResponseCache(cache_dir) if cache_dir else None
        handlers = [urllib.request.ProxyHandler({})] if is_loopback(self.url) else []
        self._opener = urllib.request.build_opener(*handlers)
        # what this endpoint refused, learnt from its 400s: field -> (the name it is sent under, None: left out; the
        # endpoint's words); later requests are sent so at once instead of paying for the same 400 each time
        self._adapted: dict[str, tuple[str | None, str]] = {}

    @property
    def adapted(self) -> dict[str, str]:
        """What requests to this endpoint left out or renamed, and the endpoint's words for why (for the record:
        an answer sampled at the model's own temperature is not one at the temperature asked for)."""
        return {f: (f"sent as {to}" if to else "left out") + f": {why}" for f, (to, why) in sorted(self._adapted.items())}

    def post(self, payload: dict[str, Any], *, optional: Sequence[str] = ()) -> tuple[dict[str, Any], int]:
        """The answer to ``payload`` and the number of requests it took (0: from the response cache).
        Raises :class:`TransportError`."""
        if self.cache is None:
            return self.send(payload, optional=optional)
        key = self.cache.key(self.url, payload)  # before send, which may drop optional fields
        hit = self.cache.get(key)
        if hit is not None:
            return hit, 0
        body, attempts = self.send(payload, optional=optional)
        try:
            self.cache.put(key, body)
        except OSError:  # a cache that cannot be written costs a later re-run, never this answer
            pass
        return body, attempts

    def send(self, payload: dict[str, Any], *, optional: Sequence[str] = ()) -> tuple[dict[str, Any], int]:
        payload = dict(payload)
        for f, (to, _why) in list(self._adapted.items()):
            if f in payload:
                value = payload.pop(f)
                if to:
                    payload[to] = value
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempts, retry = 0, 0
        dropped: set[str] = set()
        last = ""
        while True:
            attempts += 1
            delay: float | None = None
            req = urllib.request.Request(self.url, data=json.dumps(payload).encode(), headers=headers, method="POST")
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
                try:
                    body = json.loads(raw)
                    if not isinstance(body, dict):
                        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
                    if "choices" not in body:
                        raise ValueError(f"no 'choices' in the response (keys: {sorted(body)[:8]})")
                    return body, attempts
                except ValueError as e:
                    last = f"HTTP {resp.status} with an unusable body: {e}: {raw[:200]!r}"
            except urllib.error.HTTPError as e:
                text = read_error(e)
                last = f"HTTP {e.code} from {self.url}: {text}"
                named = {f: None for f in optional if f in payload and f not in dropped and _names(text, f)}
                named |= {f: to for f, to in RENAMED.items() if f in payload and f not in dropped and _names(text, f) and _names(text, to)}
                if e.code == 400 and named:
                    for f, to in named.items():  # a server without this feature or setting: ask again without it (free)
                        value = payload.pop(f)
                        if to:
                            payload[to] = value
                        dropped.add(f)
                        self._adapted[f] = (to, text[:200])
                    continue
                if e.code not in RETRY_STATUS:
                    raise TransportError(f"{last} (not retried)", attempts) from None
                delay = retry_after(e)
            except (urllib.error.URLError, http.client.HTTPException, socket.timeout, TimeoutError, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                last = f"cannot reach {self.url}: {type(reason).__name__}: {reason}"
            if retry >= self.max_retries:
                raise TransportError(f"{last} (gave up after {attempts} attempt(s))", attempts)
            wait = min(self.max_backoff_s, self.backoff_s * (2 ** retry))
            wait = min(self.max_backoff_s, delay) if delay is not None else wait * (0.5 + random.random() / 2)
            retry += 1
            time.sleep(max(0.0, wait))


def _names(text: str, field: str) -> bool:
    # whether an error message names a request field (as a word: 'max_tokens' is not in 'max_completion_tokens')
    return re.search(rf"(?<![\w.]){re.escape(field)}(?![\w])", text) is not None


_REASONING_OPEN = re.compile(r"\s*<(think|thinking|reasoning)>")


def message_text(msg: dict[str, Any]) -> tuple[str | None, str | None]:
    """(content, reasoning) of a response's message: the content as text (content parts joined, anything else as
    JSON; None when absent) and what a server's reasoning parser put apart (``reasoning_content``, or
    ``reasoning``), None when nothing."""
    content = msg.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    elif content is not None and not isinstance(content, str):
        content = json.dumps(content)
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    return content, reasoning if isinstance(reasoning, str) and reasoning.strip() else None


def split_reasoning(text: str) -> tuple[str, str | None]:
    """(the answer, the reasoning before it) in a completion's content. A reasoning model served without a
    reasoning parser (Qwen3, DeepSeek-R1, QwQ) writes its thoughts first, ``<think>...</think>``, or only the closing
    tag when the chat template opened the block in the prompt; a block opened and never closed is all reasoning (the
    answer never came: ``("", reasoning)``). Without a block: ``(text, None)``."""
    opened = _REASONING_OPEN.match(text)
    if opened is not None:
        close = f"</{opened.group(1)}>"
        end = text.find(close, opened.end())
        if end < 0:
            return "", text[opened.end():].strip()
        return text[end + len(close):].lstrip(), text[opened.end():end].strip()
    end = text.find("</think>")
    if end >= 0 and "<think>" not in text[:end]:
        return text[end + len("</think>"):].lstrip(), text[:end].strip()
    return text, None


def read_error(e: urllib.error.HTTPError) -> str:
    try:
        raw = e.read().decode("utf-8", "replace")
    except Exception:  # noqa: BLE001
        raw = ""
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
    except (ValueError, AttributeError):
        pass
    return " ".join(raw.split())[:500] or str(e.reason)


def retry_after(e: urllib.error.HTTPError) -> float | None:
    value = e.headers.get("Retry-After") if e.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


__all__ = ["ChatClient", "ResponseCache", "RETRY_STATUS", "TransportError", "is_loopback", "message_text", "read_error",
           "retry_after", "split_reasoning"]
