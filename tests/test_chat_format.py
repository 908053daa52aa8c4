"""The shared chat rendering: template, tools block, generation mask, and output parsing."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowork_pipeline.agents.base import tool_call
from cowork_pipeline.agents.chat_format import (
    CHAT_TEMPLATE,
    IM_END,
    normalize_messages,
    parse_assistant_output,
    render_conversation,
    render_tools,
)

MAIL_SEND = {
    "type": "function",
    "function": {
        "name": "mail_send",
        "description": "Send an email.",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "array", "items": {"type": "string"}, "description": "Recipients."},
                "subject": {"type": "string"},
                "body": {"type": "string"},
                "cc": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["to", "subject", "body"],
        },
    },
}
CRM_UPDATE = {
    "type": "function",
    "function": {
        "name": "crm_update_record",
        "description": "Update a CRM record.\nFields are merged.",
        "parameters": {
            "type": "object",
            "properties": {
                "record_id": {"type": "string"},
                "stage": {"type": "string", "enum": ["lead", "won"]},
                "fields": {"type": "object", "properties": {"owner": {"type": ["string", "null"]}}},
                "amount": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            },
            "required": ["record_id"],
        },
    },
}
TASKS_LIST = {"type": "function", "function": {"name": "tasks_list", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [MAIL_SEND, CRM_UPDATE, TASKS_LIST]

CONVERSATION = [
    {"role": "system", "content": "You are a coworker agent."},
    {"role": "user", "content": "Email bob about the launch, then list my tasks."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("call_0", "mail_send", {"to": ["bob@example.com"], "subject": "Launch", "body": "It is today."})],
    },
    {"role": "tool", "tool_call_id": "call_0", "name": "mail_send", "content": '{"status": "sent"}'},
    {
        "role": "assistant",
        "content": "Sent. Now the tasks.",
        "tool_calls": [tool_call("call_1", "tasks_list", {}), tool_call("call_2", "crm_update_record", {"record_id": "r1"})],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "tasks_list", "content": "[]"},
    {"role": "tool", "tool_call_id": "call_2", "name": "crm_update_record", "content": '{"ok": true}'},
    {"role": "assistant", "content": "Done: email sent, you have no tasks."},
]


@pytest.fixture(scope="module")
def tokenizer():
    from cowork_pipeline.training.student import markup_corpus, train_tokenizer

    corpus = [render_conversation(CONVERSATION, TOOLS)] * 5 + markup_corpus()
    return train_tokenizer(corpus, vocab_size=400)


def test_render_tools_is_compact_one_line_per_tool():
    text = render_tools(TOOLS)
    lines = text.split("\n")
    assert lines == [
        "mail_send(to: array[string], subject: string, body: string, cc?: array[string]) - Send an email.",
        'crm_update_record(record_id: string, stage?: "lead"|"won", fields?: {owner?: string|null}, '
        "amount?: number|null) - Update a CRM record. Fields are merged.",
        "tasks_list()",
    ]
    assert render_tools([]) == "" and render_tools(None) == ""


def test_template_embeds_the_same_tools_block():
    rendered = render_conversation(CONVERSATION, TOOLS)
    assert f"<tools>\n{render_tools(TOOLS)}\n</tools>" in rendered
    assert rendered.startswith("<|im_start|>system\nYou are a coworker agent.\n\n# Tools\n<tools>\n")
    assert "<think>" not in rendered
    # No system message: the tools still get a system block of their own.
    assert render_conversation(CONVERSATION[1:2], TOOLS).startswith("<|im_start|>system\n# Tools\n<tools>\n")
    # No tools and no system message: no system block at all.
    assert render_conversation(CONVERSATION[1:2]) == "<|im_start|>user\n" + CONVERSATION[1]["content"] + "<|im_end|>\n"


def test_rendered_layout():
    rendered = render_conversation(CONVERSATION, TOOLS)
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "mail_send", "arguments": {"body": "It is today.", '
        '"subject": "Launch", "to": ["bob@example.com"]}}</tool_call><|im_end|>\n'
    ) in rendered
    # Consecutive tool results share one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\n[]\n</tool_response>\n<tool_response>\n"
        '{"ok": true}\n</tool_response><|im_end|>\n'
    ) in rendered
    assert "Sent. Now the tasks.\n<tool_call>" in rendered
    assert rendered.endswith("<|im_start|>assistant\nDone: email sent, you have no tasks.<|im_end|>\n")


def test_string_and_dict_arguments_render_identically():
    args = {"to": ["zoë@example.com"], "subject": "Hi", "body": "x"}
    as_dict = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": None,
                "tool_calls": [{"id": "a", "type": "function", "function": {"name": "mail_send", "arguments": args}}]}]
    as_str = json.loads(json.dumps(as_dict))
    # Non-canonical JSON text: other key order, no spaces, ASCII escapes.
    as_str[1]["tool_calls"][0]["function"]["arguments"] = json.dumps(args, separators=(",", ":"))
    assert render_conversation(as_dict, TOOLS) == render_conversation(as_str, TOOLS)
    # The template alone (no normalisation) already agrees for canonical strings, e.g. what the SFT export stores.
    from transformers.utils.chat_template_utils import render_jinja_template

    raw = render_jinja_template([normalize_messages(as_str)], tools=TOOLS, chat_template=CHAT_TEMPLATE)[0][0]
    raw_dict = render_jinja_template([as_dict], tools=TOOLS, chat_template=CHAT_TEMPLATE)[0][0]
    assert raw == raw_dict


def _assistant_bodies(rendered: str) -> list[str]:
    return re.findall(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", rendered, flags=re.DOTALL)


def test_round_trip_through_template_and_parser():
    rendered = render_conversation(CONVERSATION, TOOLS)
    bodies = _assistant_bodies(rendered)
    originals = [m for m in normalize_messages(CONVERSATION) if m["role"] == "assistant"]
    assert len(bodies) == len(originals)
    n_calls = 0
    for body, original in zip(bodies, originals):
        parsed = parse_assistant_output(body, id_offset=n_calls)
        assert "parse_error" not in parsed
        assert (parsed["content"] or None) == (original["content"] or None)
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.get("tool_calls", [])]
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in original.get("tool_calls", [])]
        assert got == want
        n_calls += len(got)


def test_tokenizer_paths_render_the_same_text(tokenizer):
    from cowork_pipeline.agents.chat_format import render_prompt

    via_tokenizer = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, chat_template=CHAT_TEMPLATE, tokenize=False)
    assert via_tokenizer == render_conversation(CONVERSATION, TOOLS)
    # render_prompt ignores whatever template the tokenizer carries: rollouts always use CHAT_TEMPLATE.
    tokenizer.chat_template = "{{ 'foreign template' }}"
    try:
        assert render_prompt(tokenizer, CONVERSATION[:2], TOOLS) == render_conversation(
            CONVERSATION[:2], TOOLS, add_generation_prompt=True)
    finally:
        tokenizer.chat_template = CHAT_TEMPLATE


def test_generation_prompt_is_a_prefix_of_the_training_text(tokenizer):
    for k, message in enumerate(CONVERSATION):
        if message["role"] != "assistant":
            continue
        prompt = render_conversation(CONVERSATION[:k], TOOLS, add_generation_prompt=True)
        full = render_conversation(CONVERSATION[: k + 1], TOOLS)
        assert full.startswith(prompt) and prompt.endswith("<|im_start|>assistant\n")
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        assert full_ids[: len(prompt_ids)] == prompt_ids  # token-level too: no merge across the boundary


def test_generation_mask_covers_exactly_the_assistant_turns(tokenizer):
    out = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, chat_template=CHAT_TEMPLATE, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    spans, cur = [], []
    for token, m in zip(ids, mask):
        if m:
            cur.append(token)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    decoded = [tokenizer.decode(s, skip_special_tokens=False) for s in spans]
    assert decoded == _assistant_bodies(render_conversation(CONVERSATION, TOOLS))
    assert all(d.endswith(IM_END) for d in decoded)  # the stop token is trained


def test_trl_accepts_the_template(tokenizer):
    from trl.chat_template_utils import has_generation_markers, is_chat_template_stop_token_trained

    tokenizer.chat_template = CHAT_TEMPLATE
    assert has_generation_markers(CHAT_TEMPLATE)
    assert is_chat_template_stop_token_trained(tokenizer)


# --- parse_assistant_output ---------------------------------------------------------------------------------
def test_parse_single_tool_call():
    msg = parse_assistant_output('<tool_call>{"name": "mail_send", "arguments": {"to": ["a@b.c"]}}</tool_call><|im_end|>')
    assert msg == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_0", "type": "function",
                        "function": {"name": "mail_send", "arguments": '{"to": ["a@b.c"]}'}}],
    }


def test_parse_multiple_calls_with_content_and_id_offset():
    text = ('Let me do both.\n<tool_call>{"name": "a_x", "arguments": {}}</tool_call>\n'
            '<tool_call> {"name": "b_y", "arguments": "{\\"k\\": 1}"} </tool_call>')
    msg = parse_assistant_output(text, id_offset=3)
    assert msg["content"] == "Let me do both."
    assert [c["id"] for c in msg["tool_calls"]] == ["call_3", "call_4"]
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["a_x", "b_y"]
    assert json.loads(msg["tool_calls"][1]["function"]["arguments"]) == {"k": 1}


def test_parse_plain_text():
    assert parse_assistant_output("All done.<|im_end|>garbage after stop") == {"role": "assistant", "content": "All done."}


@pytest.mark.parametrize(
    "text, reason",
    [
        ('<tool_call>{"name": "mail_send", "arguments": {"to": </tool_call>', "invalid JSON"),
        ('<tool_call>{"name": "mail_send", "arguments": {"to": ["a"]}}', "unterminated"),
        ('<tool_call>["mail_send"]</tool_call>', "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "name"),
        ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "x", "args": {}}</tool_call>', "unexpected keys"),
        ('hello </tool_call>', "without a matching"),
        ("\x00\x01<tool_call><tool_call>}}{{", "unterminated"),
    ],
)
def test_parse_malformed_outputs_become_parse_errors(text, reason):
    msg = parse_assistant_output(text)
    assert msg["role"] == "assistant" and "tool_calls" not in msg
    assert reason in msg["parse_error"]
    assert msg["content"] == text  # raw text kept for the trajectory log


def test_parse_truncated_generation():
    msg = parse_assistant_output('Sure, <tool_call>{"name": "mail_send"', truncated=True)
    assert msg["parse_error"].startswith("truncated")
    msg = parse_assistant_output("An answer that was cut", truncated=True)
    assert "parse_error" in msg


def test_parse_non_string_input_does_not_raise():
    assert "parse_error" in parse_assistant_output(None)  # type: ignore[arg-type]


_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=8))
_json_values = st.recursive(_json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)
_markup = st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", "<|im_end|>", '"', "\n"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=12), _markup), max_size=20).map("".join), st.booleans())
def test_parse_never_raises(text, truncated):
    msg = parse_assistant_output(text, truncated=truncated)
    assert msg["role"] == "assistant"
    if "parse_error" in msg:
        assert isinstance(msg["parse_error"], str) and "tool_calls" not in msg
    for call in msg.get("tool_calls", []):
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.from_regex(r"[a-z]{1,6}_[a-z]{1,8}", fullmatch=True), st.dictionaries(st.text(max_size=6), _json_values, max_size=4)),
        min_size=0,
        max_size=3,
    ),
    st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=20)),
)
def test_template_parser_round_trip_property(calls, content):
    message = {"role": "assistant", "content": content,
               "tool_calls": [tool_call(f"c{i}", n, a) for i, (n, a) in enumerate(calls)] or None}
    body = _assistant_bodies(render_conversation([{"role": "user", "content": "hi"}, message]))[0]
    parsed = parse_assistant_output(body)
    assert "parse_error" not in parsed
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.get("tool_calls", [])] == calls
    assert (parsed["content"] or "") == (content or "").strip()
