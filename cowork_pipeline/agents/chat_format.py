"""The one chat rendering shared by SFT data, rollouts and serving.

Layout (Qwen3-style ChatML, no ``<think>`` blocks)::

    <|im_start|>system
    {system prompt}

    # Tools
    <tools>
    mail_send(to: array[string], subject: string, body: string, cc?: array[string]) - Send an email.
    </tools>
    Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>
    <|im_start|>user
    ...<|im_end|>
    <|im_start|>assistant
    {% generation %}text<tool_call>{"name": "mail_send", "arguments": {...}}</tool_call><|im_end|>{% endgeneration %}
    <|im_start|>user
    <tool_response>
    {tool result}
    </tool_response><|im_end|>

How "one rendering" is guaranteed:

* Tool schemas are rendered by exactly one piece of code, the Jinja macro in ``TOOLS_MACRO``. It is embedded in
  ``CHAT_TEMPLATE`` (so ``tokenizer.apply_chat_template(messages, tools=...)`` - what TRL's SFTTrainer calls, and
  what any external server of the checkpoint would call - uses it) and :func:`render_tools` evaluates that same
  macro through transformers' own Jinja environment instead of re-implementing it in Python.
* Every checkpoint we train or build carries ``CHAT_TEMPLATE`` as its tokenizer template, and the rollout path
  (:func:`render_prompt`, used by ``HFAgent``) passes ``chat_template=CHAT_TEMPLATE`` explicitly, so even a
  checkpoint with a foreign template is prompted exactly as our SFT data was rendered.
* Tool-call arguments may be a JSON string (OpenAI shape) or a dict. The template prints dicts with
  ``tojson(sort_keys=True)`` and strings verbatim; :func:`normalize_messages` (applied by the SFT exporter and by
  the rollout path) rewrites argument strings into that same canonical form, so both shapes render identically.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

Message = dict[str, Any]
ToolSchema = dict[str, Any]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
TOOLS_OPEN = "<tools>"
TOOLS_CLOSE = "</tools>"

# Control tokens that structure a conversation; they are single special tokens in the student tokenizer.
CONTROL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)
# Markup tokens that the model writes/reads as text but that must stay single tokens (not "special", so that
# decoding with skip_special_tokens keeps them, as in Qwen's tokenizer).
MARKUP_TOKENS: tuple[str, ...] = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOLS_OPEN,
    TOOLS_CLOSE,
)
STOP_STRINGS: tuple[str, ...] = (IM_END, END_OF_TEXT)

# --- The single tool renderer -------------------------------------------------------------------------------
# One line per tool: ``name(req: type, opt?: type) - description``. Parameter descriptions are dropped on purpose:
# a tiny student has a short context, and names + types + enums carry most of the signal.
TOOLS_MACRO = r"""
{%- macro render_type(p) -%}
{%- if p is not mapping -%}any
{%- elif p.enum is defined and p.enum is iterable and p.enum is not string and p.enum | length > 0 -%}
{%- for v in p.enum -%}{{ v | tojson }}{{ '|' if not loop.last }}{%- endfor -%}
{%- elif p.anyOf is defined or p.oneOf is defined -%}
{%- set alts = p.anyOf if p.anyOf is defined else p.oneOf -%}
{%- for a in alts -%}{{ render_type(a) }}{{ '|' if not loop.last }}{%- endfor -%}
{%- elif p.type is defined and p.type is not string and p.type is iterable -%}
{%- for t in p.type -%}{{ render_type(dict(p, type=t)) }}{{ '|' if not loop.last }}{%- endfor -%}
{%- elif p.type == 'array' -%}array[{{ render_type(p['items']) if p['items'] is defined else 'any' }}]
{%- elif p.type == 'object' and p.properties is defined and p.properties is mapping and p.properties | length > 0 -%}
{{ '{' }}{{ render_params(p) }}{{ '}' }}
{%- elif p.type is defined and p.type is string -%}{{ p.type }}
{%- else -%}any
{%- endif -%}
{%- endmacro -%}
{%- macro render_params(schema) -%}
{%- set props = schema.properties if schema is mapping and schema.properties is defined and schema.properties is mapping else {} -%}
{%- set req = schema.required if schema is mapping and schema.required is defined and schema.required is iterable and schema.required is not string else [] -%}
{%- for name, p in props | items -%}
{{ name }}{{ '' if name in req else '?' }}: {{ render_type(p) }}{{ ', ' if not loop.last }}
{%- endfor -%}
{%- endmacro -%}
{%- macro render_tools(tools) -%}
{%- for tool in tools -%}
{%- set fn = tool.function if tool.function is defined and tool.function is mapping else tool -%}
{{ fn.name }}({{ render_params(fn.parameters if fn.parameters is defined else {}) }})
{%- if fn.description is defined and fn.description %} - {{ fn.description | replace('\r', ' ') | replace('\n', ' ') | trim }}{% endif %}
{{ '\n' if not loop.last }}
{%- endfor -%}
{%- endmacro -%}
"""

# --- The chat template ----------------------------------------------------------------------------------------
_CONVERSATION_TEMPLATE = r"""
{%- macro render_content(c) -%}
{%- if c is none -%}
{%- elif c is string -%}{{ c }}
{%- elif c is mapping -%}{{ c | tojson }}
{%- elif c is iterable -%}
{%- for part in c -%}{%- if part is mapping and part.text is defined -%}{{ part.text }}{%- elif part is string -%}{{ part }}{%- endif -%}{%- endfor -%}
{%- else -%}{{ c }}
{%- endif -%}
{%- endmacro -%}
{%- macro render_tool_call(tc) -%}
{%- set f = tc.function if tc.function is defined and tc.function is mapping else tc -%}
<tool_call>{"name": {{ f.name | tojson }}, "arguments": {% if f.arguments is string %}{{ f.arguments if f.arguments | trim else '{}' }}{% elif f.arguments is defined and f.arguments is not none %}{{ f.arguments | tojson(sort_keys=true) }}{% else %}{}{% endif %}}</tool_call>
{%- endmacro -%}
{%- if messages | length > 0 and messages[0].role == 'system' -%}
{%- set system_text = render_content(messages[0].content) -%}
{%- set body = messages[1:] -%}
{%- else -%}
{%- set system_text = '' -%}
{%- set body = messages -%}
{%- endif -%}
{%- if tools or system_text -%}
<|im_start|>system{{ '\n' }}{{ system_text }}
{%- if tools -%}
{{ '\n\n' if system_text }}# Tools{{ '\n' }}<tools>{{ '\n' }}{{ render_tools(tools) }}{{ '\n' }}</tools>{{ '\n' }}Call tools as <tool_call>{"name": ..., "arguments": {...}}</tool_call>
{%- endif -%}
<|im_end|>{{ '\n' }}
{%- endif -%}
{%- for message in body -%}
{%- if message.role == 'assistant' -%}
<|im_start|>assistant{{ '\n' }}
{%- generation -%}
{%- set text = render_content(message.content) -%}
{{ text }}
{%- if message.tool_calls is defined and message.tool_calls -%}
{%- for tc in message.tool_calls -%}
{{ '\n' if (text or not loop.first) }}{{ render_tool_call(tc) }}
{%- endfor -%}
{%- endif -%}
<|im_end|>
{%- endgeneration -%}
{{ '\n' }}
{%- elif message.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}<|im_start|>user{{ '\n' }}{%- endif -%}
<tool_response>{{ '\n' }}{{ render_content(message.content) }}{{ '\n' }}</tool_response>
{%- if loop.last or loop.nextitem.role != 'tool' -%}<|im_end|>{{ '\n' }}{%- else -%}{{ '\n' }}{%- endif -%}
{%- else -%}
<|im_start|>{{ message.role }}{{ '\n' }}{{ render_content(message.content) }}<|im_end|>{{ '\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant{{ '\n' }}
{%- endif -%}
"""

CHAT_TEMPLATE: str = (TOOLS_MACRO + _CONVERSATION_TEMPLATE).strip()

# A template holding only the tool macro: evaluated by render_tools so that Python and the chat template share
# one implementation.
_RENDER_TOOLS_TEMPLATE = TOOLS_MACRO.strip() + "{{- render_tools(tools) -}}"


def render_tools(tools: Sequence[ToolSchema] | None) -> str:
    """The compact tools block body (one line per tool), exactly as ``CHAT_TEMPLATE`` embeds it."""
    if not tools:
        return ""
    from transformers.utils.chat_template_utils import render_jinja_template  # lazy: parsing needs no transformers

    rendered, _ = render_jinja_template(conversations=[[]], tools=list(tools), chat_template=_RENDER_TOOLS_TEMPLATE)
    return rendered[0]


def canonical_arguments(arguments: Any) -> str:
    """Canonical JSON text of tool-call arguments: what the template prints for a dict (``tojson(sort_keys=True)``).

    A string that is not valid JSON is returned unchanged so that nothing is silently lost."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        if not arguments.strip():
            return "{}"
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return arguments
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Copy of ``messages`` with tool-call arguments as canonical JSON strings (OpenAI shape).

    Applied on both the SFT path and the rollout path so that string and dict arguments render identically."""
    out: list[Message] = []
    for message in messages:
        msg = dict(message)
        calls = msg.get("tool_calls")
        if calls:
            new_calls = []
            for call in calls:
                call = dict(call)
                fn = dict(call.get("function") or {})
                fn["arguments"] = canonical_arguments(fn.get("arguments"))
                call["function"] = fn
                new_calls.append(call)
            msg["tool_calls"] = new_calls
        out.append(msg)
    return out


def render_conversation(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSchema] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render without a tokenizer (e.g. to build a tokenizer-training corpus), in transformers' own Jinja
    environment, so the text equals ``tokenizer.apply_chat_template(..., tokenize=False)``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[_drop_none(normalize_messages(messages))],
        tools=list(tools) if tools else None,
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSchema] | None,
    add_generation_prompt: bool = True,
) -> str:
    """The rollout-time prompt text. Always uses ``CHAT_TEMPLATE`` (not whatever the tokenizer carries)."""
    return tokenizer.apply_chat_template(
        normalize_messages(messages),
        tools=list(tools) if tools else None,
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def _drop_none(messages: list[Message]) -> list[Message]:
    # Same normalisation transformers applies in apply_chat_template (Arrow fills absent keys with None).
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


# --- Parsing model output -----------------------------------------------------------------------------------
_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def _error(raw: str, why: str) -> Message:
    return {"role": "assistant", "content": raw, "parse_error": why}


def parse_assistant_output(text: str, *, truncated: bool = False, id_offset: int = 0) -> Message:
    """Turn generated text into an assistant message; never raises.

    ``text`` is the decoded completion (control tokens kept). Output stops at the first ``<|im_end|>`` /
    ``<|endoftext|>``. Tool calls get deterministic ids ``call_<id_offset + i>`` (the agent passes the number of
    earlier calls in the conversation so ids stay unique within it). ``truncated=True`` means generation hit its
    token limit before the end-of-turn token; that is reported as a ``parse_error`` because the turn is incomplete.
    On any problem the message is ``{"role": "assistant", "content": <raw text>, "parse_error": <reason>}``.
    """
    try:
        return _parse(text, truncated=truncated, id_offset=id_offset)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises"; any surprise becomes a failed step
        raw = text if isinstance(text, str) else repr(text)
        return _error(raw, f"internal parser error: {type(exc).__name__}: {exc}")


def _parse(text: str, *, truncated: bool, id_offset: int) -> Message:
    if not isinstance(text, str):
        return _error(repr(text), f"expected str output, got {type(text).__name__}")
    body = text
    for stop in STOP_STRINGS:
        cut = body.find(stop)
        if cut != -1:
            body = body[:cut]
    raw = body
    if truncated:
        return _error(raw, "truncated: generation hit the token limit before <|im_end|>")

    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    pos = 0
    for i, match in enumerate(_TOOL_CALL_RE.finditer(body)):
        pieces.append(body[pos : match.start()])
        pos = match.end()
        payload = match.group(1).strip()
        try:
            obj = json.loads(payload)
        except (json.JSONDecodeError, RecursionError) as exc:
            return _error(raw, f"tool call {i}: invalid JSON ({exc})")
        if not isinstance(obj, dict):
            return _error(raw, f"tool call {i}: expected a JSON object, got {type(obj).__name__}")
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return _error(raw, f'tool call {i}: missing or non-string "name"')
        unknown = set(obj) - {"name", "arguments"}
        if unknown:
            return _error(raw, f"tool call {i}: unexpected keys {sorted(unknown)}")
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode arguments
            try:
                args = json.loads(args) if args.strip() else {}
            except (json.JSONDecodeError, RecursionError) as exc:
                return _error(raw, f"tool call {i}: arguments string is not JSON ({exc})")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return _error(raw, f'tool call {i}: "arguments" must be an object, got {type(args).__name__}')
        calls.append(
            {
                "id": f"call_{id_offset + len(calls)}",
                "type": "function",
                "function": {"name": name.strip(), "arguments": json.dumps(args, ensure_ascii=False, sort_keys=True)},
            }
        )
    pieces.append(body[pos:])
    rest = "".join(pieces)
    if TOOL_CALL_OPEN in rest:
        return _error(raw, "unterminated <tool_call> block (truncated or malformed output)")
    if TOOL_CALL_CLOSE in rest:
        return _error(raw, "</tool_call> without a matching <tool_call>")
    content = rest.strip()
    msg: Message = {"role": "assistant", "content": content if (content or not calls) else None}
    if calls:
        msg["tool_calls"] = calls
    return msg
