"""Strict tool calls: decoding constrained to the offered tools' schemas (agents/constrained.py)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from cowork_pipeline.agents.chat_format import render_conversation
from cowork_pipeline.agents.constrained import strict_schema, tool_call_format
from cowork_pipeline.services import tools_for
from cowork_pipeline.training.student import StudentConfig, build_student

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py

TOOLS = tools_for(["mail_search", "mail_send", "crm_update_invoice", "helpdesk_update_ticket", "chat_list_channels"])


def test_strict_schema_sorts_properties_and_forbids_undeclared_ones():
    schema = {"type": "object", "properties": {"to": {"type": "array", "items": {"type": "object", "properties": {
        "b": {"type": "string"}, "a": {"type": "string"}}}}, "body": {"type": "string"}, "meta": {"type": "object"}},
        "required": ["to"]}
    s = strict_schema(schema)
    assert list(s["properties"]) == ["body", "meta", "to"] and s["additionalProperties"] is False
    assert list(s["properties"]["to"]["items"]["properties"]) == ["a", "b"]
    assert "additionalProperties" not in s["properties"]["meta"]  # free-form objects stay free-form
    assert s["required"] == ["to"] and schema["properties"]["to"]["items"]["properties"].keys() == {"b", "a"}


def test_grammar_begins_each_call_exactly_as_the_chat_template_renders_it():
    fmt = tool_call_format(TOOLS)["format"]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function", "function": {
        "name": "mail_search", "arguments": json.dumps({"query": "Clara"})}}]}
    text = render_conversation([{"role": "user", "content": "hi"}, call])
    begins = [t["begin"] for t in fmt["tags"]]
    assert any(b in text for b in begins) and len(begins) == len(TOOLS)
    assert all(t["end"] + "<|im_end|>" in text for t in fmt["tags"][:1])


@pytest.fixture(scope="module")
def random_student(tmp_path_factory):
    # An untrained student writes garbage: whatever it writes inside a tool call must still be a valid call.
    corpus = [render_conversation([{"role": "user", "content": "find the invoice INV-1 of Clara and email her"}], TOOLS)] * 4
    cfg = StudentConfig(vocab_size=600, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2, num_kv_heads=1,
                        max_position_embeddings=2048, min_frequency=1, pointer_dim=16)
    return build_student(corpus, tmp_path_factory.mktemp("student"), cfg)


def test_grammar_accepts_canonical_calls_and_no_whitespace_runs(random_student):
    from cowork_pipeline.agents.constrained import ToolCallConstraint
    from cowork_pipeline.training.student import load_checkpoint

    _model, tok = load_checkpoint(random_student)
    constraint = ToolCallConstraint(tok, len(tok), [tok.convert_tokens_to_ids("<|im_end|>")])
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function", "function": {
        "name": "mail_send", "arguments": json.dumps({"to": ["clara@acme.example"], "subject": "Invoice", "body": "Hi Clara, see below."})}}]}
    text = render_conversation([call])
    canonical = text[text.index("<tool_call>"): text.index("</tool_call>") + len("</tool_call>")]

    def accepts(s: str) -> bool:
        return constraint.matcher(TOOLS).accept_string(s)

    assert accepts(canonical)
    # A model that wanted a forbidden token could otherwise pad with spaces until its token budget ran out.
    assert not accepts('<tool_call>{"name": "crm_update_invoice", "arguments": {"invoice_id": "inv_1"  ')
    assert not accepts('<tool_call>{"name": "mail_search", "arguments": {"query": "Clara"}  \n  ')
    assert accepts('<tool_call>{"name": "mail_search", "arguments": {"query": "Clara" }}</tool_call>')
    # Free text around calls is free, except for a stray closing tag (a malformed turn for the parser).
    assert accepts("Done, the email is sent.") and not accepts("Done.</tool_call>")


def test_every_sampled_tool_call_is_valid_for_its_schema(random_student):
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(random_student, device="cpu", max_new_tokens=96, strict_tools=True)
    # Tilt the random model towards opening tool calls and closing what it opens, so that calls get finished
    # within the token budget; which tokens are *allowed* is still the grammar's business alone.
    tok = agent.tokenizer
    favoured = [tok.convert_tokens_to_ids("<tool_call>"), *tok('"}', add_special_tokens=False)["input_ids"]]

    def tilt(_module, _inputs, logits):
        logits[..., favoured] += 6.0
        return logits

    agent.model.lm_head.register_forward_hook(tilt)
    prompt = [{"role": "user", "content": "find the invoice of Clara and email her"}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    # A random model finishes a turn within the budget only now and then: sample (fixed seeds) until a few
    # finished calls have been checked; every sample on the way must be valid or merely cut off.
    calls = 0
    for seed in range(30):
        if calls >= 3:
            break
        for sample in agent.sample_with_logprobs([(prompt, TOOLS)] * 4, temperature=1.5, seed=seed):
            for call in sample.message.get("tool_calls") or []:
                calls += 1
                assert call["function"]["name"] in schemas
                jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
            err = sample.message.get("parse_error", "")
            assert not err or err.startswith("truncated"), err  # never malformed, at worst cut off by the budget
    assert calls > 0
