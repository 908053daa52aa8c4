"""Strict tool calls for local checkpoints: decoding constrained to the offered tools' JSON schemas.

What hosted APIs call "strict" function calling (and vLLM/SGLang "structured outputs"), for ``HFAgent``. Every
``<tool_call>`` a model opens must be ``{"name": <an offered tool>, "arguments": <an object valid for that tool's
parameters schema>}`` closed by ``</tool_call>``: known argument names only, required ones present, enum values
from the enum, numbers where numbers go. Text outside tool calls (the final reply) is free. What the model still
decides is everything that matters for the task: whether to call, which tool, which values.

The grammar engine is xgrammar (the one vLLM and SGLang use): it compiles a grammar per tool set once and masks
the next-token logits in microseconds per row.

Arguments are rendered with sorted keys (``chat_format``: ``tojson(sort_keys=True)``), so the schema given to the
grammar lists properties in sorted order; ``additionalProperties`` is false unless the tool says otherwise.
Whitespace inside a call is capped at one character in a row (canonical calls have single spaces after ``:`` and
``,``): with JSON's unlimited whitespace, a model that wanted a token the grammar forbids (say ``","`` after the
last allowed argument) put its remaining mass on spaces and padded the call until the token budget ran out.
xgrammar applies the cap inside string values too, so a value cannot contain two spaces in a row.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from cowork_pipeline.agents.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

ToolSchema = dict[str, Any]


def strict_schema(schema: Any) -> Any:
    """``schema`` with every object's declared properties in sorted order and no undeclared ones (an object
    schema that declares no properties stays free-form)."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) if k not in ("properties", "enum", "const", "default", "examples") else v
           for k, v in schema.items()}
    props = schema.get("properties")
    if isinstance(props, dict):
        out["properties"] = {k: strict_schema(props[k]) for k in sorted(props)}
        out.setdefault("additionalProperties", False)
    return out


def tool_call_format(tools: Sequence[ToolSchema], required: bool = False, single: bool = False) -> dict[str, Any]:
    """The xgrammar structural tag: free text, and tool calls that must match one offered tool's schema; with
    ``required`` (an API's ``tool_choice: "required"``, or a named tool offered alone) the turn opens with a call;
    with ``single`` (``parallel_tool_calls: false``) it ends after its first call."""
    tags = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        tags.append({
            "type": "tag",
            # Exactly how CHAT_TEMPLATE renders a call: {"name": <tojson>, "arguments": <canonical JSON>}.
            "begin": f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": strict_schema(params), "max_whitespace_cnt": 1},
            "end": f"}}{TOOL_CALL_CLOSE}",
        })
    # Free text may not hold a stray closing tag (the parser would reject the turn as malformed).
    return {"type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": [TOOL_CALL_OPEN], "tags": tags, "excludes": [TOOL_CALL_CLOSE],
                       "at_least_one": bool(required and tags), "stop_after_first": bool(single)}}


class ToolCallConstraint:
    """Compiled tool-call grammars for one tokenizer (cached per tool set) and matchers for them."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._grammars: dict[str, Any] = {}

    def matcher(self, tools: Sequence[ToolSchema] | None, required: bool = False,
                json_schema: dict[str, Any] | None = None, single: bool = False) -> Any | None:
        """A fresh matcher for one assistant turn (``required``: one that opens with a call; ``single``: one that
        ends after its first call; ``json_schema``: a turn that is one JSON value valid for it, an API's
        ``response_format``, no calls); None when neither tools nor a schema are given (nothing to constrain)."""
        if not tools and json_schema is None:
            return None
        key = json.dumps([list(tools or []), required, json_schema, single], sort_keys=True, default=str)
        grammar = self._grammars.get(key)
        if grammar is None:
            grammar = self._grammars[key] = (
                self.compiler.compile_json_schema(json.dumps(json_schema), any_whitespace=False) if json_schema is not None
                else self.compiler.compile_structural_tag(json.dumps(tool_call_format(tools or [], required, single))))
        return self._xgr.GrammarMatcher(grammar)

    def bitmask(self, rows: int) -> Any:
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits: Any, matchers: Sequence[Any | None], bitmask: Any) -> None:
        """Mask ``logits`` (rows x vocab) in place: row i may only continue what ``matchers[i]`` accepts."""
        idx = []
        for i, m in enumerate(matchers):
            if m is not None and not m.is_terminated():
                m.fill_next_token_bitmask(bitmask, i)
                idx.append(i)
        if idx:
            self._xgr.apply_token_bitmask_inplace(logits, bitmask[: logits.shape[0]].to(logits.device), indices=idx)
