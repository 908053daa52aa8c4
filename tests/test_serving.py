"""OpenAI-compatible server: protocol with a stub agent, and one end-to-end run with the SFT-trained student."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Iterator, Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cowork_pipeline.agents.base import assistant_message, tool_call
from cowork_pipeline.serving.server import make_app
from _flaky import Flaky
from _servers import running

MAIL_SEND = {"type": "function", "function": {
    "name": "mail_send", "description": "Send an email.",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"}, "body": {"type": "string"}},
        "required": ["to", "subject", "body"]}}}
SYSTEM = "You are a coworker agent."
ARGS = {"to": ["team@example.com"], "subject": "Update", "body": "Status update."}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


class StubAgent:
    """Deterministic: calls the first tool when there are tools, else echoes the last user message."""

    name = "stub"

    def __init__(self) -> None:
        self.seen: list[tuple[list[dict], list[dict]]] = []

    def act(self, messages: Sequence[dict], tools: Sequence[dict]) -> dict:
        self.seen.append((list(messages), list(tools)))
        if tools and messages[-1]["role"] != "tool":
            return assistant_message(None, [tool_call("call_0", tools[0]["function"]["name"], ARGS)])
        return assistant_message("echo: " + str(messages[-1].get("content")))


def client(base: str):
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def stub_server() -> Iterator[tuple[str, StubAgent]]:
    agent = StubAgent()
    with running(make_app(agent)) as base:
        yield base, agent


def _post(url: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_tool_call_round_trip_with_openai_client(stub_server):
    base, agent = stub_server
    resp = client(base).chat.completions.create(
        model="stub",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Update the team."}],
        tools=[MAIL_SEND],
        temperature=0,
        max_tokens=64,
    )
    assert resp.object == "chat.completion"
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id == "call_0" and call.type == "function" and call.function.name == "mail_send"
    assert json.loads(call.function.arguments) == ARGS

    # Feed the tool result back (tool role message) and get a final answer.
    follow = client(base).chat.completions.create(
        model="stub",
        messages=[
            {"role": "user", "content": "Update the team."},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"status": "sent"}'},
        ],
        tools=[MAIL_SEND],
    )
    assert follow.choices[0].finish_reason == "stop"
    assert follow.choices[0].message.content == 'echo: {"status": "sent"}'
    assert follow.choices[0].message.tool_calls is None
    sent_messages, sent_tools = agent.seen[-1]
    assert sent_messages[1]["tool_calls"][0]["function"]["name"] == "mail_send" and sent_tools == [MAIL_SEND]


def test_streamed_answers_are_the_answers(stub_server):
    """`stream: true` (what agent frameworks and the OpenAI SDK's streaming helpers send) gets the same answer as
    server-sent chat.completion.chunk events ending in [DONE]: the SDK rebuilds the same tool call and reply, and
    `stream_options.include_usage` adds the usage chunk."""
    base, _ = stub_server
    asked = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Update the team."}]
    whole = client(base).chat.completions.create(model="stub", messages=asked, tools=[MAIL_SEND])
    chunks = list(client(base).chat.completions.create(model="stub", messages=asked, tools=[MAIL_SEND], stream=True,
                                                       stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "tool_calls" and not chunks[-1].choices
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens and all(c.usage is None for c in chunks[:-1])
    (call,) = [t for c in chunks[:-1] for t in c.choices[0].delta.tool_calls or []]
    want = whole.choices[0].message.tool_calls[0]
    assert (call.index, call.id, call.function.name, call.function.arguments) == \
           (0, want.id, want.function.name, want.function.arguments)

    with client(base).chat.completions.stream(model="stub", messages=asked + [
            whole.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": want.id, "content": '{"status": "sent"}'}], tools=[MAIL_SEND]) as events:
        final = events.get_final_completion()  # (the SDK's helper: it accumulates the deltas itself)
    assert final.choices[0].message.content == 'echo: {"status": "sent"}' and final.choices[0].finish_reason == "stop"

    req = urllib.request.Request(base + "/v1/chat/completions", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == "echo: hi"


def test_stop_sequences_end_the_answer_where_they_start(stub_server):
    """`stop` cuts the reply at the first stop sequence, streamed or not, as generation ending there would; the
    calls written after it are not made."""
    base, _ = stub_server
    asked = [{"role": "user", "content": "Status: done. Next: nothing"}]
    cut = client(base).chat.completions.create(model="stub", messages=asked, stop=["Next:", "nothing"])
    assert cut.choices[0].message.content == "echo: Status: done. " and cut.choices[0].finish_reason == "stop"
    streamed = list(client(base).chat.completions.create(model="stub", messages=asked, stop="done", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "echo: Status: "
    whole = client(base).chat.completions.create(model="stub", messages=asked, stop="absent")
    assert whole.choices[0].message.content == "echo: Status: done. Next: nothing"
    from cowork_pipeline.serving.server import _stopped

    said = assistant_message("Sending it now. DONE", [tool_call("call_0", "mail_send", ARGS)])
    assert _stopped(said, "tool_calls", ["DONE"]) == ({"role": "assistant", "content": "Sending it now. "}, "stop")
    assert _stopped(said, "tool_calls", ["absent"]) == (said, "tool_calls")


def test_models_endpoint(stub_server):
    base, _ = stub_server
    models = client(base).models.list()
    assert [m.id for m in models.data] == ["stub"]


@pytest.mark.parametrize(
    "payload, param",
    [
        (b"{not json", None),
        (json.dumps({"model": "stub", "messages": []}).encode(), "messages"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), "messages[0]"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}).encode(), "tools[0]"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), "temperature"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(), "max_tokens"),
        (json.dumps({"messages": [{"role": "tool", "content": "x"}]}).encode(), "messages[0].tool_call_id"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), "stream"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}}).encode(),
         "stream_options"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}).encode(), "stop"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": [""]}).encode(), "stop"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [MAIL_SEND], "tool_choice": "required"}).encode(),
         "tool_choice"),  # (the stub has no grammar to make it call)
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [MAIL_SEND],
                     "tool_choice": {"type": "function", "function": {"name": "mail_delete"}}}).encode(), "tool_choice"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}).encode(), "tool_choice"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}).encode(),
         "response_format"),  # (nor to answer in JSON)
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}).encode(), "response_format"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "logprobs": True}).encode(), "logprobs"),  # (nor logprobs)
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}).encode(), "logprobs"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}).encode(), "top_logprobs"),  # (without logprobs)
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}).encode(), "top_logprobs"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 0}).encode(), "n"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [MAIL_SEND], "parallel_tool_calls": False}).encode(),
         "parallel_tool_calls"),  # (nor to end its turn after one call)
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "no"}).encode(), "parallel_tool_calls"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5}).encode(), "frequency_penalty"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"42": -100}}).encode(), "logit_bias"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "top_k": 20}).encode(), "top_k"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "functions": [MAIL_SEND["function"]]}).encode(), "functions"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "return_token_ids": True}).encode(), "return_token_ids"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "return_token_ids": 1}).encode(), "return_token_ids"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 33}).encode(), "n"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2.5}).encode(), "n"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [MAIL_SEND],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}}).encode(),
         "response_format"),
    ],
)
def test_bad_requests_get_openai_style_400(stub_server, payload, param):
    base, _ = stub_server
    status, body = _post(base + "/v1/chat/completions", payload)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert body["error"]["param"] == param


def test_openai_client_raises_bad_request(stub_server):
    import openai

    base, _ = stub_server
    with pytest.raises(openai.BadRequestError):
        client(base).chat.completions.create(model="stub", messages=[])


def test_unknown_route_is_json_404(stub_server):
    base, _ = stub_server
    with urllib.request.urlopen(base + "/health", timeout=10) as resp:  # (and the readiness probe answers)
        assert resp.status == 200
    status, body = _post(base + "/v1/nope", b"{}")
    assert status == 404 and "error" in body


# --- the real student ---------------------------------------------------------------------------------------
def _demos(n: int = 12) -> list[dict]:
    call = {"id": "call_0", "type": "function", "function": {"name": "mail_send", "arguments": json.dumps(ARGS)}}
    return [{"tools": [MAIL_SEND], "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Please send the team an update."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "name": "mail_send", "content": '{"status": "sent"}'},
        {"role": "assistant", "content": "Sent."}]} for _ in range(n)]


@pytest.fixture(scope="module")
def student_checkpoint(tmp_path_factory):
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.training.sft import SFTSettings, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student

    demos = _demos()
    base = build_student([render_conversation(d["messages"], d["tools"]) for d in demos],
                         tmp_path_factory.mktemp("serve_student"),
                         StudentConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_layers=2,
                                       num_heads=2, num_kv_heads=1, max_position_embeddings=1024))
    result = train_sft(base, demos, tmp_path_factory.mktemp("serve_sft"),
                       SFTSettings(max_steps=80, lr=3e-3, batch_size=4, max_length=512, device="cpu"))
    return result.checkpoint


def test_real_student_served(student_checkpoint):
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64)
    with running(make_app(agent)) as base:
        api = client(base)
        (model,) = api.models.list().data
        assert model.id == agent.name and model.model_extra["max_model_len"] == agent.max_context_tokens
        resp = api.chat.completions.create(
            model=agent.name,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Please send the team an update."}],
            tools=[MAIL_SEND],
            temperature=0,
            max_tokens=64,
        )
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        assert choice.message.tool_calls[0].function.name == "mail_send"
        assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments), dict)
        assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
        # max_tokens is honoured: a 2-token budget cannot finish the turn.
        short = api.chat.completions.create(
            model=agent.name, messages=[{"role": "user", "content": "Please send the team an update."}],
            tools=[MAIL_SEND], max_tokens=2)
        assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2



def test_a_required_or_named_tool_choice_makes_the_served_student_call(student_checkpoint):
    """`tool_choice: "required"` or a named function (what agent frameworks send for structured output): the strict
    grammar makes the turn open with a call, of the named tool when one is named, where the student left alone
    replies in text."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    task = {"type": "function", "function": {"name": "tasks_create", "description": "Create a task.", "parameters": {
        "type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}}}
    done = _demos(1)[0]["messages"][:4]  # the call made and its result back: the student replies "Sent."
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        free = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND])
        assert free.choices[0].finish_reason == "stop" and not free.choices[0].message.tool_calls
        forced = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], tool_choice="required")
        assert forced.choices[0].finish_reason == "tool_calls", forced.choices[0].message
        assert forced.choices[0].message.tool_calls[0].function.name == "mail_send"
        named = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND, task], max_tokens=256,
                                            tool_choice={"type": "function", "function": {"name": "tasks_create"}})
        (call,) = named.choices[0].message.tool_calls
        assert call.function.name == "tasks_create" and isinstance(json.loads(call.function.arguments)["title"], str)
        first = api.chat.completions.create(model="student", messages=done[:2], tools=[MAIL_SEND],
                                            tool_choice={"type": "function", "function": {"name": "mail_send"}})
        assert first.choices[0].message.tool_calls[0].function.name == "mail_send"  # (as it calls unforced)


def test_a_json_response_format_makes_the_served_student_answer_in_json(student_checkpoint):
    """`response_format` json_object or json_schema (structured output without tools): the strict grammar makes the
    answer one JSON value, valid for the schema, where the student left alone writes prose."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    done = _demos(1)[0]["messages"][:4]
    status = {"type": "object", "properties": {"status": {"type": "string", "enum": ["sent", "failed"]},
                                              "count": {"type": "integer"}}, "required": ["status", "count"]}
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=96), model_name="student")) as base:
        api = client(base)
        free = api.chat.completions.create(model="student", messages=done)
        with pytest.raises(ValueError):
            json.loads(free.choices[0].message.content)
        typed = api.chat.completions.create(model="student", messages=done, response_format={
            "type": "json_schema", "json_schema": {"name": "status", "schema": status, "strict": True}})
        answer = json.loads(typed.choices[0].message.content)
        assert typed.choices[0].finish_reason == "stop" and answer["status"] in ("sent", "failed") and isinstance(answer["count"], int)
        obj = api.chat.completions.create(model="student", messages=done, response_format={"type": "json_object"}, max_tokens=400)
        assert obj.choices[0].finish_reason == "stop", obj.choices[0]
        assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_the_served_student_reports_each_token_s_logprob(student_checkpoint):
    """`logprobs: true` (what an RL framework driving the served student reads) gives each generated token and its
    log-probability, the model's own as `HFAgent.generate` records it, streamed or not; a stop sequence cuts them
    where it cuts the text."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    done = _demos(1)[0]["messages"][:4]
    local = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64)
    (want,) = local.generate([(done, [MAIL_SEND])])
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        resp = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], logprobs=True)
        got = resp.choices[0].logprobs.content
        assert "".join(t.token for t in got) == want.text == resp.choices[0].message.content
        assert [t.logprob for t in got] == pytest.approx(want.logprobs[:len(got)]) and len(got) == len(want.completion_ids) - 1
        assert all(t.logprob <= 0 and bytes(t.bytes).decode() == t.token for t in got)
        streamed = list(api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], logprobs=True, stream=True))
        assert [t.token for c in streamed for t in ((c.choices[0].logprobs.content or []) if c.choices[0].logprobs else [])] == \
               [t.token for t in got]
        cut = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], logprobs=True, stop=want.text[2:])
        kept = "".join(t.token for t in cut.choices[0].logprobs.content)
        assert cut.choices[0].message.content == want.text[:2] and want.text[:2].startswith(kept) and len(kept) <= 2
        assert api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND]).choices[0].logprobs is None


def test_top_logprobs_are_the_likeliest_tokens_generate_saw(student_checkpoint):
    """`top_logprobs: k` (distillation and RL frameworks read it) gives, at each generated token, the k likeliest
    tokens under the model with their log-probabilities, likeliest first: those `HFAgent.generate` saw."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    done = _demos(1)[0]["messages"][:4]
    (want,) = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64).generate([(done, [MAIL_SEND])], top_logprobs=3)
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        got = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], logprobs=True,
                                          top_logprobs=3).choices[0].logprobs.content
        assert len(got) == len(want.completion_ids) - 1 and all(len(t.top_logprobs) == 3 for t in got)
        assert [a.logprob for t in got for a in t.top_logprobs] == \
               pytest.approx([lp for top in want.top_logprobs[:len(got)] for _, lp in top])
        for t in got:
            alts = [a.logprob for a in t.top_logprobs]
            assert alts == sorted(alts, reverse=True) and t.logprob <= alts[0] + 1e-6
            assert all(bytes(a.bytes).decode(errors="replace") == a.token for a in t.top_logprobs)
        assert got[0].token == got[0].top_logprobs[0].token  # (greedy: the likeliest, where no grammar overrules it)
        plain = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], logprobs=True, top_logprobs=0)
        assert all(t.top_logprobs == [] for t in plain.choices[0].logprobs.content)


def test_a_token_s_bytes_are_its_own_where_it_holds_part_of_a_character(student_checkpoint):
    """A byte-level token may hold part of a character: its text cannot show it (U+FFFD), its `bytes` are exact, so
    a client joining them gets the text back; a stop sequence after such a character cuts by bytes, not by the
    replacement characters' count."""
    from transformers import AutoTokenizer

    from cowork_pipeline.agents.hf_agent import Generation
    from cowork_pipeline.serving.server import _kept, _token_bytes, _token_logprobs

    tokenizer = AutoTokenizer.from_pretrained(student_checkpoint)
    text = "Grüße — 5 € ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    generation = Generation({}, text, [], ids + [eos], "stop", [-0.5] * (len(ids) + 1))
    token_bytes = _token_bytes(tokenizer)
    tokens = _token_logprobs(token_bytes, generation, _kept(token_bytes, generation, []), False)["content"]
    assert b"".join(bytes(t["bytes"]) for t in tokens) == text.encode() and len(tokens) == len(ids)  # (the stop token not)
    split = [t for t in tokens if "\ufffd" in t["token"]]
    assert split, "the test needs a character the tokenizer splits"
    with pytest.raises(UnicodeDecodeError):
        bytes(split[0]["bytes"]).decode()
    cut = _token_logprobs(token_bytes, generation, _kept(token_bytes, generation, [" ok"]), False)["content"]
    assert b"".join(bytes(t["bytes"]) for t in cut) == "Grüße — 5 €".encode()


def test_token_ids_are_those_the_student_read_and_wrote(student_checkpoint):
    """vLLM's `return_token_ids` (RL frameworks train on the ids a rollout was sampled with, since text tokenized
    again can differ): the prompt's ids and each choice's completion ids, the stop token that ended the turn
    included, cut with the text by a stop sequence, streamed or not; `return_tokens_as_token_ids` names each
    logprobs token by its id."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    done = _demos(1)[0]["messages"][:4]
    (want,) = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64).generate([(done, [MAIL_SEND])])
    ids = {"return_token_ids": True}
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        resp = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], extra_body=ids)
        assert resp.model_extra["prompt_token_ids"] == want.prompt_ids and want.finish_reason == "stop"
        assert resp.choices[0].model_extra["token_ids"] == want.completion_ids  # (the stop token last)
        plain = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND])
        assert "prompt_token_ids" not in (plain.model_extra or {}) and "token_ids" not in (plain.choices[0].model_extra or {})

        cut = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], stop=want.text[2:], logprobs=True,
                                          extra_body=ids | {"return_tokens_as_token_ids": True})
        kept = cut.choices[0].model_extra["token_ids"]
        assert kept == want.completion_ids[:len(kept)] and len(kept) < len(want.completion_ids) - 1
        assert [t.token for t in cut.choices[0].logprobs.content] == [f"token_id:{i}" for i in kept]

        chunks = list(api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], stream=True, extra_body=ids))
        assert chunks[0].model_extra["prompt_token_ids"] == want.prompt_ids
        assert [i for c in chunks for ch in c.choices for i in (ch.model_extra or {}).get("token_ids") or []] == want.completion_ids


def test_parallel_tool_calls_false_ends_the_served_student_s_turn_after_its_first_call(tmp_path):
    """`parallel_tool_calls: false` (agent frameworks send it to run one tool at a time): a student that makes two
    calls in a turn, served with strict tool calls, makes one, the grammar ending the turn after it."""
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.sft import SFTSettings, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student

    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "mail_send", "arguments": json.dumps(
        ARGS | {"to": [to]})}} for i, to in enumerate(["team@example.com", "board@example.com"])]
    ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Please send the team and the board an update."}]
    demos = [{"tools": [MAIL_SEND], "messages": ask + [{"role": "assistant", "content": None, "tool_calls": calls}]}] * 12
    base = build_student([render_conversation(d["messages"], d["tools"]) for d in demos], tmp_path / "base",
                         StudentConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                                       num_kv_heads=1, max_position_embeddings=1024))
    checkpoint = train_sft(base, demos, tmp_path / "sft", SFTSettings(max_steps=80, lr=3e-3, batch_size=4, max_length=512,
                                                                      device="cpu")).checkpoint
    with running(make_app(HFAgent(checkpoint, device="cpu", max_new_tokens=160), model_name="student")) as base_url:
        api = client(base_url)
        both = api.chat.completions.create(model="student", messages=ask, tools=[MAIL_SEND])
        assert [json.loads(c.function.arguments)["to"] for c in both.choices[0].message.tool_calls] == \
               [["team@example.com"], ["board@example.com"]]
        one = api.chat.completions.create(model="student", messages=ask, tools=[MAIL_SEND], parallel_tool_calls=False,
                                          extra_body={"return_token_ids": True})
        (call,) = one.choices[0].message.tool_calls
        assert json.loads(call.function.arguments)["to"] == ["team@example.com"] and one.choices[0].finish_reason == "tool_calls"
        assert one.usage.completion_tokens < both.usage.completion_tokens  # (the turn ended, not a call dropped)
        assert api.chat.completions.create(model="student", messages=ask, tools=[MAIL_SEND], parallel_tool_calls=True
                                           ).choices[0].message.tool_calls == both.choices[0].message.tool_calls


def test_what_the_served_student_reports_is_what_an_rl_trainer_recomputes(student_checkpoint):
    """An RL trainer driving the served student samples a group (`n`), trains on the token ids it gets back and
    takes the logprobs as the sampling policy's: a forward pass of the same weights over those ids gives the same
    log-probabilities (a PPO ratio of 1 before the update), here for a model whose embedding has size-padding rows
    beyond the tokenizer's vocabulary (pretrained checkpoints have them too)."""
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import _forward_logprobs, _vocab_limit

    trainer = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64)
    assert len(trainer.tokenizer) < trainer.model.config.vocab_size  # (the case this test is about)
    done = _demos(1)[0]["messages"][:4]
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        group = client(base).chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], n=4, temperature=1.0,
                                                     seed=3, logprobs=True, extra_body={"return_token_ids": True})
    prompt_ids = group.model_extra["prompt_token_ids"]
    for choice in group.choices:
        ids, served = choice.model_extra["token_ids"], [t.logprob for t in choice.logprobs.content]
        with torch.no_grad():
            lp, _ = _forward_logprobs(trainer.model, [(prompt_ids, ids)], 1.0, _vocab_limit(trainer), "cpu")
        assert lp[0, : len(served)].tolist() == pytest.approx(served, abs=1e-4)


def test_requests_that_keep_arriving_join_one_batch():
    """Clients that start together do not all arrive within one short wait: the batcher keeps gathering while
    requests keep coming (each within ``gather_s`` of the last, up to ``max_gather_s``), so twelve requests sent
    one every 10 ms are generated as one batch, not split into a first few and the rest (twice the time)."""
    import threading

    from cowork_pipeline.agents.hf_agent import Generation
    from cowork_pipeline.serving.server import _Batcher

    class Recording:
        name = "recording"
        batches: list[int] = []

        def generate(self, conversations, **_opts):
            self.batches.append(len(conversations))
            return [Generation({"role": "assistant", "content": m[-1]["content"]}, "", [1], [2], "stop")
                    for m, _t in conversations]

    agent = Recording()
    batcher = _Batcher(agent, gather_s=0.05, max_gather_s=2.0)
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        answers[i] = batcher.run(("chat", [{"role": "user", "content": f"item {i}"}], []), {})[0][0]["content"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join(30)
    assert agent.batches == [12] and answers == {i: f"item {i}" for i in range(12)}


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "static"])
def test_the_served_student_streams_its_text_as_it_is_generated(student_checkpoint, continuous):
    """`stream: true` sends the student's text as its tokens are drawn (chat UIs and agent SDKs show it as it
    comes): the model is held after its first token until the client has read text, which it could not if the
    answer were sent once generated. The deltas, their logprobs and token ids add up to the answer given whole.
    Batching continuously (rows decoded step by step) or a batch at a time (``generate`` with a listener)."""
    import threading

    from cowork_pipeline.agents.hf_agent import HFAgent

    gate, generating = threading.Event(), threading.Event()

    class HeldAfterEachToken(HFAgent):
        def decoding(self, *args, **kw):
            decoding = super().decoding(*args, **kw)
            step = decoding.step

            def held():
                generating.set()
                finished = step()
                if not decoding.live:
                    generating.clear()
                elif not gate.wait(20):
                    raise TimeoutError("the client read nothing while the model was held mid-turn")
                return finished

            decoding.step = held
            return decoding

    done = _demos(1)[0]["messages"][:4]
    asked = dict(model="student", messages=done, tools=[MAIL_SEND], logprobs=True, top_logprobs=2,
                 extra_body={"return_token_ids": True})
    with running(make_app(HeldAfterEachToken(student_checkpoint, device="cpu", max_new_tokens=64),
                          model_name="student", continuous=continuous)) as base:
        api = client(base)
        gate.set()
        answered = api.chat.completions.create(**asked)  # (not held)
        whole = answered.choices[0]
        gate.clear()
        texts, tokens, ids, held = [], [], [], []
        for chunk in api.chat.completions.create(**asked, stream=True):
            for c in chunk.choices:
                if c.delta.content:
                    held.append(generating.is_set())
                    gate.set()
                    texts.append(c.delta.content)
                tokens += c.logprobs.content if c.logprobs and c.logprobs.content else []
                ids += (c.model_extra or {}).get("token_ids") or []
    assert held[0], "the first text came only once the answer was generated"
    assert len(texts) >= 2 and "".join(texts) == whole.message.content == "Sent."
    assert [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in tokens] == \
           [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in whole.logprobs.content]
    assert ids == whole.model_extra["token_ids"]

    # /v1/completions streams the same way: the text as drawn, each chunk with the legacy logprobs (text offsets
    # in the whole text) and token ids of the tokens it completes
    raw = dict(model="student", prompt=answered.model_extra["prompt_token_ids"], max_tokens=64, logprobs=2,
               extra_body={"return_token_ids": True})
    with running(make_app(HeldAfterEachToken(student_checkpoint, device="cpu", max_new_tokens=64),
                          model_name="student", continuous=continuous)) as base:
        api = client(base)
        gate.set()
        (plain,) = api.completions.create(**raw).choices
        gate.clear()
        texts, held, got = [], [], {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [], "ids": []}
        for chunk in api.completions.create(**raw, stream=True):
            for c in chunk.choices:
                if c.text:
                    held.append(generating.is_set())
                    gate.set()
                    texts.append(c.text)
                for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    got[k] += getattr(c.logprobs, k) if c.logprobs else []
                got["ids"] += (c.model_extra or {}).get("token_ids") or []
                finish = c.finish_reason or None
    assert held[0] and len(texts) >= 2 and "".join(texts) == plain.text == "Sent." and finish == plain.finish_reason
    assert got == {"tokens": plain.logprobs.tokens, "token_logprobs": plain.logprobs.token_logprobs,
                   "top_logprobs": plain.logprobs.top_logprobs, "text_offset": plain.logprobs.text_offset,
                   "ids": plain.model_extra["token_ids"]}


def test_a_stream_holds_back_what_the_answer_may_not_say(student_checkpoint):
    """What a streamed delta says, the finished answer says: a character's bytes are sent once all have come,
    text that may begin a tool call or a stop sequence waits until it is known not to, whitespace the answer strips
    is not sent, and a tool call or a stop sequence ends the text. Each delta's tokens are the bytes it says."""
    from transformers import AutoTokenizer

    from cowork_pipeline.serving.server import _StreamedChoice, _token_bytes

    tokenizer = AutoTokenizer.from_pretrained(student_checkpoint)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>{"name": "mail_send", "arguments": {}}</tool_call>'

    def streamed(text: str, stop: list[str]) -> list[str]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        writer = _StreamedChoice(tokenizer, [eos], stop, _token_bytes(tokenizer))
        deltas = []
        for tid in ids:
            if (out := writer.take([(tid, -0.5, None)])) is not None:
                delta, drawn = out
                assert b"".join(_token_bytes(tokenizer)(d[0]) for d in drawn) == delta.encode() or deltas == [], delta
                deltas.append(delta)
        assert all("\ufffd" not in d for d in deltas)
        return deltas

    deltas = streamed("Grüße — 5 € ok.  \n" + call, [])
    assert "".join(deltas) == "Grüße — 5 € ok." and len(deltas) > 3
    assert "".join(streamed("  Sent <tool", [])) == "Sent"  # (a text that may yet open a call)
    assert "".join(streamed("Total: 5 € (paid). Thanks", ["(pa"])) == "Total: 5 €"
    assert "".join(streamed("Sent. <|endoftext|> more", [])) == "Sent."


PIECES = ["Sent", ".", " ", "  ", "\n", "Grüße", "€", "—", "<", "tool", "<tool_call>", "</tool_call>", "ok", "ent", "|",
          '{"name": "mail_send", "arguments": {"to": ["a@b.c"], "subject": "ok", "body": "Sent."}}', "<|im_end|>"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=12),
       stop=st.lists(st.sampled_from(["ent", "nt.", " ", "\n", "€ ", "<to", "k.", "e —"]), max_size=2),
       sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4))
@example(pieces=["Sent", "."], stop=["nt."], sizes=[1])  # (a stop sequence across two tokens)
@example(pieces=["Sent", " ", "\n", "<tool_call>", PIECES[-2], "</tool_call>"], stop=[], sizes=[1])
def test_what_a_stream_says_the_answer_says(student_tokenizer, pieces, stop, sizes):
    """Whatever the model writes (text, tool calls, split characters, markers, whitespace), with whatever stop
    sequences and however its tokens arrive together, the streamed deltas are a beginning of the content the
    finished answer gives (parsed, cut at a stop sequence): a stream never says what the answer does not."""
    from cowork_pipeline.agents.chat_format import parse_assistant_output
    from cowork_pipeline.serving.server import _StreamedChoice, _stopped, _token_bytes

    tokenizer, stops = student_tokenizer
    ids = tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
    ids = ids[: next((k for k, t in enumerate(ids) if t in stops), len(ids))]  # (generation ends at a stop token)
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    said, _ = _stopped(parse_assistant_output(text), "stop", stop)
    content = (said.get("content") or "").lstrip()
    writer, streamed, at, k = _StreamedChoice(tokenizer, stops, stop, _token_bytes(tokenizer)), "", 0, 0
    drawn = ids + [sorted(stops)[0]]
    while at < len(drawn):
        step = sizes[k % len(sizes)]
        if (out := writer.take([(t, -0.1, None) for t in drawn[at: at + step]])) is not None:
            streamed += out[0]
        at, k = at + step, k + 1
    assert content.startswith(streamed), (text, stop, streamed, content)


@pytest.fixture(scope="module")
def student_tokenizer(student_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(student_checkpoint)
    return tokenizer, {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "static"])
def test_a_stream_that_fails_says_so(student_checkpoint, continuous):
    """Generation that fails before the first token is a 500, as unstreamed; one that fails mid-answer ends the
    stream with an error event, which the OpenAI client raises, rather than a stream that looks complete."""
    import openai

    from cowork_pipeline.agents.hf_agent import HFAgent

    class Failing(HFAgent):
        after = 0

        def decoding(self, *args, on_token=None, **kw):
            left = [self.after]

            def breaking(key, *drawn):
                said = on_token(key, *drawn) if on_token else None
                left[0] -= 1
                if left[0] == 0:
                    raise RuntimeError("device lost")
                return said

            decoding = super().decoding(*args, on_token=breaking, **kw)
            if self.after == 0:
                def admit(rows):
                    raise RuntimeError("out of memory")

                decoding._admit_rows = admit
            return decoding

    agent = Failing(student_checkpoint, device="cpu", max_new_tokens=64)
    done = _demos(1)[0]["messages"][:4]
    with running(make_app(agent, model_name="student", continuous=continuous)) as base:
        api = client(base)
        with pytest.raises(openai.InternalServerError, match="out of memory"):
            list(api.chat.completions.create(model="student", messages=done, stream=True))
        agent.after = 2
        seen = []
        with pytest.raises(openai.APIError, match="device lost"):
            for chunk in api.chat.completions.create(model="student", messages=done, stream=True):
                seen += [c.delta.content for c in chunk.choices if c.delta.content]
        assert "".join(seen) == "Sent"  # (the two tokens drawn before the failure)
        # the same for a streamed text completion
        ids = agent.chat_prompt(done, [], 64)
        agent.after = 0
        with pytest.raises(openai.InternalServerError, match="out of memory"):
            list(api.completions.create(model="student", prompt=ids, max_tokens=64, stream=True))
        agent.after, seen = 2, []
        with pytest.raises(openai.APIError, match="device lost"):
            for chunk in api.completions.create(model="student", prompt=ids, max_tokens=64, stream=True):
                seen += [c.text for c in chunk.choices if c.text]
        assert "".join(seen) == "Sent"


def test_generation_stops_where_a_stop_sequence_cuts_the_answer(student_checkpoint):
    """A `stop` sequence ends generation where the answer is cut (RL frameworks stop ReAct-style turns with them),
    not at the end of the turn: the answer is what it was, its usage counts the tokens generated up to the stop.
    A stop sequence inside a tool call's arguments does not cut the call."""
    from cowork_pipeline.agents.hf_agent import HFAgent

    done = _demos(1)[0]["messages"][:4]
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        whole = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND])
        assert whole.choices[0].message.content == "Sent." and whole.usage.completion_tokens == 4  # (S|ent|.|<|im_end|>)
        for stream in (False, True):
            cut = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], stop="ent", stream=stream,
                                              **({"stream_options": {"include_usage": True}} if stream else {}))
            if stream:
                chunks = list(cut)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                finish, usage = [c.choices[0].finish_reason for c in chunks if c.choices][-1], chunks[-1].usage
            else:
                text, finish, usage = cut.choices[0].message.content, cut.choices[0].finish_reason, cut.usage
            assert (text, finish, usage.completion_tokens) == ("S", "stop", 2), stream  # ("S", "ent": then stopped)

        asked = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Please send the team an update."}]
        call = api.chat.completions.create(model="student", messages=asked, tools=[MAIL_SEND])
        held = api.chat.completions.create(model="student", messages=asked, tools=[MAIL_SEND], stop="update")
        assert held.choices[0].message.tool_calls == call.choices[0].message.tool_calls and \
               json.loads(held.choices[0].message.tool_calls[0].function.arguments)["body"] == "Status update."
        assert held.choices[0].finish_reason == "tool_calls" and held.usage == call.usage


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "static"])
def test_a_client_that_leaves_a_stream_ends_its_generation(tmp_path, continuous):
    """A client that closes a stream mid-answer (an agent framework's timeout, a user's stop button) frees its row:
    generation for it ends at its next token instead of running to the token limit."""
    import http.client

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.student import StudentConfig, build_student

    untrained = build_student([SYSTEM * 4], tmp_path / "student", StudentConfig(  # (says anything, never stops)
        vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
        max_position_embeddings=1024))
    finished: list = []

    class Slow(HFAgent):
        def decoding(self, *args, on_token=None, **kw):
            def slowed(key, *drawn):
                time.sleep(0.01)
                return on_token(key, *drawn) if on_token else None

            return super().decoding(*args, on_token=slowed, **kw)

        def generation(self, prompt, ids, out):  # (each row's answer, as it is done)
            finished.append(super().generation(prompt, ids, out))
            return finished[-1]

    asked = {"model": "student", "messages": [{"role": "user", "content": "Say anything."}], "max_tokens": 400,
             "temperature": 1.0, "seed": 11}  # (a sample of 353 tokens)
    with running(make_app(Slow(untrained, device="cpu", max_new_tokens=400), model_name="student",
                          continuous=continuous)) as base:
        whole = client(base).chat.completions.create(**asked)  # (the same sample, read to its end)
        assert whole.usage.completion_tokens >= 100 and finished.pop().completion_ids
        conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps(asked | {"stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        for line in iter(resp.readline, b""):  # (until the first text, then gone)
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                break
        conn.close()
        deadline = time.time() + 30
        while not finished and time.time() < deadline:
            time.sleep(0.05)
    (generation,) = finished
    assert generation.finish_reason == "stop" and len(generation.completion_ids) < whole.usage.completion_tokens / 4


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "static"])
def test_a_request_joins_the_running_batch_and_leaves_it_when_done(tmp_path, continuous):
    """Continuous batching: a request that comes while another is generating joins the running batch at its next
    step, and its short answer is sent once done while the long one goes on (a batch at a time, it waits for the
    long one to end). Each answer is the one it gets alone."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.student import StudentConfig, build_student

    untrained = build_student([SYSTEM * 4], tmp_path / "student", StudentConfig(  # (says anything, never stops)
        vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
        max_position_embeddings=1024))
    generating = threading.Event()

    class Slow(HFAgent):
        def decoding(self, *args, on_token=None, **kw):
            def slowed(key, *drawn):
                generating.set()
                time.sleep(0.005)
                return on_token(key, *drawn) if on_token else None

            return super().decoding(*args, on_token=slowed, **kw)

    long = {"model": "student", "messages": [{"role": "user", "content": "Say anything."}], "max_tokens": 400,
            "temperature": 1.0, "seed": 11}  # (a sample of 353 tokens)
    short = {"model": "student", "messages": [{"role": "user", "content": "Say a few words."}], "max_tokens": 8,
             "temperature": 0.0, "extra_body": {"return_token_ids": True}}  # (greedy, beside a sampled row)
    with running(make_app(Slow(untrained, device="cpu", max_new_tokens=400), model_name="student",
                          continuous=continuous)) as base:
        api = client(base)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(api.chat.completions.create, **long)
            assert generating.wait(20)
            joined = api.chat.completions.create(**short)
            answered_while_the_long_one_ran = not pending.done()
            whole = pending.result()
        alone = api.chat.completions.create(**short)
        again = api.chat.completions.create(**long)
    assert answered_while_the_long_one_ran == continuous
    assert joined.usage.completion_tokens == 8 and whole.usage.completion_tokens > 300
    assert joined.choices[0].model_extra["token_ids"] == alone.choices[0].model_extra["token_ids"]
    assert whole.choices[0].message.content == again.choices[0].message.content


def test_text_completions_continue_token_ids_as_given(student_checkpoint):
    """`/v1/completions` with token ids (token in, token out: RL frameworks render their own prompts and train on
    the ids they sampled, so no text is tokenized again): the prompt's ids are continued as given, each choice
    carries its token ids (the stop token included), their logprobs (an RL trainer recomputes them), the k
    likeliest tokens, the prompt's ids; a string prompt is tokenized; several prompts and `n` give choices by
    prompt then sample; a stop sequence cuts the text and ends generation."""
    import torch

    from cowork_pipeline.agents.chat_format import render_prompt
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.serving.server import _choice_seed
    from cowork_pipeline.training.rl import _forward_logprobs, _vocab_limit

    local = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64)
    done = _demos(1)[0]["messages"][:4]
    (chat,) = local.generate([(done, [MAIL_SEND])])
    ids = chat.prompt_ids
    (want,) = local.complete([ids], max_new_tokens=64, top_logprobs=2)
    assert (want.text, want.completion_ids) == (chat.text, chat.completion_ids) == ("Sent.", want.completion_ids)
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        got = api.completions.create(model="student", prompt=ids, max_tokens=64, logprobs=2,
                                     extra_body={"return_token_ids": True})
        (choice,) = got.choices
        assert (choice.text, choice.finish_reason) == ("Sent.", "stop") and got.object == "text_completion"
        assert choice.model_extra["prompt_token_ids"] == ids and choice.model_extra["token_ids"] == want.completion_ids
        assert "".join(choice.logprobs.tokens) == "Sent." and choice.logprobs.text_offset == [0, 1, 4]
        assert choice.logprobs.token_logprobs == pytest.approx(want.logprobs[:-1])
        assert [lp for top in choice.logprobs.top_logprobs for lp in top.values()] == \
               pytest.approx([lp for top in want.top_logprobs[:-1] for _, lp in top])
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), len(want.completion_ids))
        with torch.no_grad():
            lp, _ = _forward_logprobs(local.model, [(ids, choice.model_extra["token_ids"])], 1.0, _vocab_limit(local), "cpu")
        assert lp[0, :3].tolist() == pytest.approx(choice.logprobs.token_logprobs, abs=1e-4)

        text = render_prompt(local.tokenizer, done, [MAIL_SEND], add_generation_prompt=True)
        worded = api.completions.create(model="student", prompt=text, max_tokens=64, extra_body={"return_token_ids": True})
        assert worded.choices[0].model_extra["prompt_token_ids"] == list(local.tokenizer(text)["input_ids"])
        assert worded.choices[0].text == "Sent."

        other = _demos(1)[0]["messages"][:2]
        (asked,) = local.generate([(other, [MAIL_SEND])])
        group = api.completions.create(model="student", prompt=[ids, asked.prompt_ids], n=2, temperature=1.0, seed=3,
                                       max_tokens=40, extra_body={"return_token_ids": True})
        assert [c.index for c in group.choices] == [0, 1, 2, 3]
        drawn = local.complete([ids, ids, asked.prompt_ids, asked.prompt_ids], temperature=1.0, max_new_tokens=40,
                               seeds=[_choice_seed(3, 0), _choice_seed(3, 1)] * 2)
        assert [c.model_extra["token_ids"] for c in group.choices] == [g.completion_ids for g in drawn]
        assert group.usage.prompt_tokens == len(ids) + len(asked.prompt_ids)
        # streamed: the same choices (each whole, once generated), then the usage, as a streaming client reads them
        chunks = list(api.completions.create(model="student", prompt=[ids, asked.prompt_ids], n=2, temperature=1.0,
                                             seed=3, max_tokens=40, stream=True, stream_options={"include_usage": True},
                                             extra_body={"return_token_ids": True}))
        streamed: dict[int, list] = {}
        for chunk in chunks[:-1]:
            assert chunk.object == "text_completion" and chunk.usage is None
            for c in chunk.choices:
                streamed.setdefault(c.index, []).append(c)
        assert [("".join(c.text for c in streamed[i]), streamed[i][-1].finish_reason,
                 [t for c in streamed[i] for t in c.model_extra["token_ids"]]) for i in sorted(streamed)] == \
               [(c.text, c.finish_reason, c.model_extra["token_ids"]) for c in group.choices]
        assert chunks[-1].choices == [] and chunks[-1].usage == group.usage

        cut = api.completions.create(model="student", prompt=ids, max_tokens=64, stop=["ent"], logprobs=0,
                                     extra_body={"return_token_ids": True})
        assert (cut.choices[0].text, cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("S", "stop", 2)
        assert cut.choices[0].model_extra["token_ids"] == want.completion_ids[:1] and cut.choices[0].logprobs.tokens == ["S"]


def test_a_conversation_tokenized_by_the_server_continues_as_the_chat_endpoint_answers(student_checkpoint):
    """vLLM's `/tokenize` with messages gives the ids the chat endpoint reads (its template, the tools, the
    assistant's turn opened): a client that continues them with `/v1/completions` gets the chat endpoint's tokens,
    token in and token out; `/detokenize` gives their text back; a text prompt is tokenized as it is."""
    from cowork_pipeline.agents.chat_format import render_prompt
    from cowork_pipeline.agents.hf_agent import HFAgent

    done = _demos(1)[0]["messages"][:4]
    agent = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64)
    with running(make_app(agent, model_name="student")) as base:
        chat = client(base).chat.completions.create(model="student", messages=done, tools=[MAIL_SEND],
                                                    extra_body={"return_token_ids": True})
        status, tokenized = _post(base + "/tokenize", json.dumps({"model": "student", "messages": done,
                                                                  "tools": [MAIL_SEND]}).encode())
        assert status == 200 and tokenized["tokens"] == chat.model_extra["prompt_token_ids"]
        assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == agent.max_context_tokens
        continued = client(base).completions.create(model="student", prompt=tokenized["tokens"], max_tokens=64,
                                                    extra_body={"return_token_ids": True})
        assert continued.choices[0].model_extra["token_ids"] == chat.choices[0].model_extra["token_ids"]
        assert continued.choices[0].text == chat.choices[0].message.content == "Sent."

        status, back = _post(base + "/detokenize", json.dumps({"tokens": tokenized["tokens"]}).encode())
        assert status == 200 and back["prompt"] == render_prompt(agent.tokenizer, done, [MAIL_SEND], add_generation_prompt=True)
        status, plain = _post(base + "/tokenize", json.dumps({"prompt": "Status update."}).encode())
        assert plain["tokens"] == list(agent.tokenizer("Status update.")["input_ids"])
        for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"messages": []}, "messages"),
                                  ("/tokenize", {"prompt": "x", "add_generation_prompt": "yes"}, "add_generation_prompt"),
                                  ("/detokenize", {"tokens": [10**6]}, "tokens"), ("/detokenize", {}, "tokens")):
            status, answer = _post(base + path, json.dumps(body).encode())
            assert status == 400 and answer["error"]["param"] == param, (path, body, answer)


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [10**6]}, "prompt"),
    ({"prompt": [1] * 2000}, "prompt"),
    ({"prompt": "hi", "echo": True}, "echo"),
    ({"prompt": "hi", "suffix": "!"}, "suffix"),
    ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"prompt": "hi", "logprobs": True}, "logprobs"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
])
def test_text_completions_refuse_what_they_cannot_honour(student_checkpoint, body, param):
    from cowork_pipeline.agents.hf_agent import HFAgent

    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        status, answer = _post(base + "/v1/completions", json.dumps({"model": "student", **body}).encode())
    assert status == 400 and answer["error"]["param"] == param, answer


def test_text_completions_need_a_checkpoint(stub_server):
    base, _ = stub_server
    status, answer = _post(base + "/v1/completions", json.dumps({"model": "stub", "prompt": "hi"}).encode())
    assert status == 400 and "/v1/chat/completions" in answer["error"]["message"]


def test_n_choices_are_the_samples_generate_draws_together(student_checkpoint):
    """`n` (a GRPO-style trainer asks for a group of samples per prompt): n sampled choices, choice i the sample
    `HFAgent.generate` draws from its i-th random stream of that seed (the first: the seed's own, what a request for
    one choice gets), so the same request gets the same group again; greedy, n copies of the one answer. Every
    choice's tokens count in the usage; streamed, each choice comes by its index."""
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.serving.server import _choice_seed

    done = _demos(1)[0]["messages"][:4]
    want = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64).generate(
        [(done, [MAIL_SEND])] * 4, temperature=1.0, seeds=[_choice_seed(3, i) for i in range(4)])

    def said(choice) -> tuple:
        return (choice.message.content or None, [c.function.name for c in choice.message.tool_calls or []])

    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        api = client(base)
        group = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], n=4, temperature=1.0, seed=3,
                                            logprobs=True)
        assert [c.index for c in group.choices] == [0, 1, 2, 3]
        assert [said(c) for c in group.choices] == \
               [(g.message.get("content") or None, [c["function"]["name"] for c in g.message.get("tool_calls") or []]) for g in want]
        for c, g in zip(group.choices, want):
            assert [t.logprob for t in c.logprobs.content] == pytest.approx(g.logprobs[:len(c.logprobs.content)])
        assert len({said(c)[0] for c in group.choices}) > 1  # (samples, not one answer four times)
        assert group.usage.completion_tokens == sum(len(g.completion_ids) for g in want)
        again = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], n=4, temperature=1.0, seed=3)
        assert [said(c) for c in again.choices] == [said(c) for c in group.choices]
        alone = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], temperature=1.0, seed=3)
        assert said(alone.choices[0]) == said(group.choices[0])

        one = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND])
        three = api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], n=3)
        assert [said(c) for c in three.choices] == [said(one.choices[0])] * 3
        assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
        assert three.usage.prompt_tokens == one.usage.prompt_tokens

        texts: dict[int, str] = {}
        for chunk in api.chat.completions.create(model="student", messages=done, tools=[MAIL_SEND], n=4, temperature=1.0,
                                                 seed=3, stream=True):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        assert [texts[i] or None for i in range(4)] == [said(c)[0] for c in group.choices]


def test_cowork_serve_answers_as_soon_as_it_says_where(student_checkpoint, tmp_path):
    """`cowork serve` prints its URL once it listens (a client that connects at once is not refused), takes
    `--max-batch` for how many requests make one batch, and refuses a batch size that is not a positive integer."""
    import os
    import re
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    cowork = str(Path(sys.executable).parent / "cowork")
    env = {**os.environ, "COWORK_HOME": str(tmp_path)}
    proc = subprocess.Popen([cowork, "serve", str(student_checkpoint), "--port", "0", "--max-batch", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        base = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line).group(1)
        with urllib.request.urlopen(base + "/health", timeout=30) as resp:  # (at once: no retry)
            assert resp.status == 200
        done = _demos(1)[0]["messages"][:4]
        with ThreadPoolExecutor(4) as pool:
            said = list(pool.map(lambda _: client(base).chat.completions.create(
                model="any", messages=done, tools=[MAIL_SEND]).choices[0].message.content, range(4)))
        assert said == ["Sent."] * 4
    finally:
        proc.terminate()
        proc.wait(30)
    refused = subprocess.run([cowork, "serve", str(student_checkpoint), "--max-batch", "0"], capture_output=True,
                             text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "--max-batch: a positive integer, not '0'" in refused.stderr


def test_the_student_served_and_driven_over_http_acts_as_it_does_in_process(student_checkpoint):
    """`cowork serve` + `cowork eval`'s agent: the same student, greedy, behind our server and driven by OpenAIAgent
    answers each step of a conversation (a call, then after its result a reply) as it does in process."""
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.agents.openai_agent import OpenAIAgent

    local = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64)
    convo = _demos(1)[0]["messages"]
    steps = [convo[:2], convo[:4]]  # asked; then the call made and its result back
    with running(make_app(HFAgent(student_checkpoint, device="cpu", max_new_tokens=64), model_name="student")) as base:
        remote = OpenAIAgent(base + "/v1", "student", max_tokens=64)
        for msgs in steps:
            want, got = local.act(msgs, [MAIL_SEND]), remote.act(msgs, [MAIL_SEND])
            assert (got.get("content") or None, got.get("tool_calls")) == (want.get("content") or None, want.get("tool_calls")), msgs[-1]
    assert want.get("content") and not want.get("tool_calls")  # the second step is the student's reply


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "static"])
def test_concurrent_requests_are_generated_as_one_batch_with_the_answers_they_get_alone(student_checkpoint,
                                                                                       continuous):
    """Requests arriving together are decoded in one batch, each answered as it is alone: greedy ones, and
    sampled ones, whose seed reproduces them whatever they were batched with (each samples from its own random
    stream). Sampled requests without a seed get fresh samples: a trainer that sends a group of requests for a group
    of rollouts does not get one rollout eight times."""
    from concurrent.futures import ThreadPoolExecutor

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.agents.openai_agent import OpenAIAgent

    class Counting(HFAgent):
        batches: list[int] = []  # rows decoded together (a running batch's after each admission)

        def decoding(self, *args, **kw):
            decoding = super().decoding(*args, **kw)
            admit = decoding._admit_rows  # (what admit and a queued batch's prefill both go through)

            def counted(rows):
                admit(rows)
                self.batches.append(decoding.size)

            decoding._admit_rows = counted
            return decoding

    asks = [f"Please send the team an update {'now' if i % 2 else 'today'}, item {i}." for i in range(8)]
    convs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": a}] for a in asks]
    local = HFAgent(student_checkpoint, device="cpu", max_new_tokens=48)
    alone = [local.act(c, [MAIL_SEND]) for c in convs]
    served = Counting(student_checkpoint, device="cpu", max_new_tokens=48)
    with running(make_app(served, model_name="student", continuous=continuous)) as base:
        greedy = OpenAIAgent(base + "/v1", "student", max_tokens=48, concurrency=8)
        together = greedy.act_batch([(c, [MAIL_SEND]) for c in convs])
        assert max(served.batches) > 1  # at least some of the eight were generated together
        assert [(m.get("content") or None, m.get("tool_calls")) for m in together] == \
               [(m.get("content") or None, m.get("tool_calls")) for m in alone]
        served.batches.clear()
        api = client(base)

        def sample(conv: list[dict], **seed: int) -> list[int]:
            resp = api.chat.completions.create(model="student", messages=conv, tools=[MAIL_SEND], max_tokens=48,
                                               temperature=1.0, extra_body={"return_token_ids": True}, **seed)
            return resp.choices[0].model_extra["token_ids"]

        with ThreadPoolExecutor(8) as pool:
            seeded = list(pool.map(lambda c: sample(c, seed=3), convs))
        assert max(served.batches) > 1
        assert seeded == [local.generate([(c, [MAIL_SEND])], temperature=1.0, seeds=[3])[0].completion_ids for c in convs]
        with ThreadPoolExecutor(8) as pool:
            fresh = list(pool.map(lambda _: sample(convs[0]), range(8)))
        assert len({tuple(ids) for ids in fresh}) > 1


def test_a_running_batch_keeps_nothing_of_the_rows_that_left_it(student_checkpoint):
    """Under continuous load a batch may never empty: what it holds for a row (its listener, its stop watch, its
    request) goes once the row is done, so a long-running server does not grow with every request it answered."""
    from concurrent.futures import ThreadPoolExecutor

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.serving.server import _Batcher

    seen: list = []

    class Watched(HFAgent):
        def decoding(self, *args, on_token=None, **kw):
            seen.append(on_token.__self__)  # (the batch's fanout)
            return super().decoding(*args, on_token=on_token, **kw)

    agent = Watched(student_checkpoint, device="cpu", max_new_tokens=64)
    batcher = _Batcher(agent, max_batch=8)
    conv = [{"role": "user", "content": "Please send the team an update."}]
    with ThreadPoolExecutor(4) as pool:
        long = pool.submit(batcher.run, ("chat", conv, []), {"max_new_tokens": 64, "temperature": 1.0, "seed": 1})
        time.sleep(0.05)  # (the short ones join it)
        short = [pool.submit(batcher.run, ("chat", conv, []), {"max_new_tokens": 2, "temperature": 1.0, "seed": i})
                 for i in range(6)]
        for f in short + [long]:
            assert f.result(60)
    assert seen and all(not fanout.targets for fanout in seen)


def test_a_request_that_cannot_join_fails_alone(student_checkpoint):
    """A request whose admission fails (its prefill out of memory, say) fails alone, as a 500: the running batch
    decodes on, and a request that came with it is admitted on its own; every answer is the one it gets alone."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from cowork_pipeline.agents.decoding import Decoding
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.serving.server import _Batcher

    generating, groups, seen = threading.Event(), [], []

    class Joined(HFAgent):
        def decoding(self, *args, on_token=None, **kw):
            def slowed(key, *drawn):
                generating.set()
                time.sleep(0.002)
                return on_token(key, *drawn)

            seen.append(on_token.__self__)  # (the batch's fanout)
            decoding = super().decoding(*args, on_token=slowed, **kw)
            decoding._prefill = prefill.__get__(decoding)
            return decoding

    def prefill(self, prompts, *args, **kw):
        texts = [self.agent.tokenizer.decode(p) for p in prompts]
        groups.append(len(prompts))
        if any("too long to fit" in t for t in texts):
            raise RuntimeError("out of memory")
        return Decoding._prefill(self, prompts, *args, **kw)

    agent = Joined(student_checkpoint, device="cpu", max_new_tokens=64, prefix_cache_mb=0)
    batcher = _Batcher(agent, max_batch=8)
    conv = [{"role": "user", "content": "Please send the team an update."}]
    bad = [{"role": "user", "content": "This one is too long to fit."}]
    long_opts, short_opts = {"max_new_tokens": 64, "temperature": 1.0, "seed": 3}, {"max_new_tokens": 6}
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(batcher.run, ("chat", conv, []), long_opts)
        assert generating.wait(30)
        with batcher.cond:  # (both come before the batch's next admission: they try to join as one group)
            failed = batcher.submit(("chat", bad, []), short_opts)
            short = batcher.submit(("chat", conv, []), short_opts)
        with pytest.raises(RuntimeError, match="out of memory"):
            failed.result(60)
        joined, whole = short.result(60), long.result(60)
    assert groups == [1, 2, 1, 1]  # (the long one; the pair, which failed; each alone, the bad one failing)
    for got, opts in ((joined, short_opts), (whole, long_opts)):
        (alone,) = batcher.run(("chat", conv, []), opts)
        assert got[0][3].completion_ids == alone[3].completion_ids and got[0][0] == alone[0]
    assert len(whole[0][3].completion_ids) > 20
    assert all(not fanout.targets for fanout in seen)


def test_a_step_out_of_memory_answers_every_request_in_a_smaller_batch(student_checkpoint):
    """A decode step that fails (the device out of memory past two rows) fails no request: the batch's rows go on
    in batches of at most half as many, each answer the one it gets alone, a sampled one from its seed's stream,
    and a streamed answer's text is its whole answer, nothing sent twice."""
    from concurrent.futures import ThreadPoolExecutor

    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student_checkpoint, device="cpu", max_new_tokens=64, prefix_cache_mb=0)
    conv, done = [{"role": "user", "content": "Please send the team an update."}], _demos(1)[0]["messages"][:4]
    asks = [dict(messages=conv, tools=[MAIL_SEND], max_tokens=64), dict(messages=conv, tools=[MAIL_SEND], max_tokens=24),
            dict(messages=conv, tools=[MAIL_SEND], max_tokens=48, temperature=1.0, seed=5),
            dict(messages=done, tools=[MAIL_SEND])]
    with running(make_app(agent, model_name="student")) as base:
        api = client(base)
        alone = [api.chat.completions.create(model="student", **ask).choices[0].message for ask in asks]
        flaky = agent.model = Flaky(agent.model, rows=2, decode_only=True)
        flaky.armed = True

        def ask(i: int):
            if i < 3:
                return api.chat.completions.create(model="student", **asks[i]).choices[0].message
            return "".join(c.choices[0].delta.content or "" for c in
                           api.chat.completions.create(model="student", stream=True, **asks[i]) if c.choices)

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(ask, range(4)))
    assert flaky.failures and max(f[0] for f in flaky.failures) > 2  # (the batch of more than two rows failed)
    for g, a in zip(got[:3], alone[:3]):
        assert g.content == a.content and g.tool_calls == a.tool_calls
    assert got[3] == alone[3].content == "Sent."
