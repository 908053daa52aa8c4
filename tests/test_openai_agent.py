"""An agent behind an OpenAI-compatible endpoint, against real HTTP servers on 127.0.0.1: our own server serving
the reference solution (the contract: scored exactly like the program it serves), and a scripted server that
answers with what real endpoints get wrong (errors, arguments that are not JSON, calls written into the text,
bodies with no message)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest

from _servers import running
from cowork_pipeline.agents.openai_agent import OpenAIAgent, request_messages
from cowork_pipeline.agents.program import ProgramAgent
from cowork_pipeline.capabilities import load_catalog
from cowork_pipeline.chat_client import TransportError
from cowork_pipeline.evaluation import evaluate
from cowork_pipeline.runner import run_episode, run_episodes
from cowork_pipeline.serving.server import make_app
from cowork_pipeline.synthesis.embedded import EmbeddedBackend

CATALOG = load_catalog()


def _env(cap: str, seed: int = 5):
    return EmbeddedBackend().draft(CATALOG[cap], seed).spec


@pytest.mark.parametrize("cap", ["invoice_reconcile", "ticket_triage_followup", "overdue_invoices_question"])
def test_an_endpoint_serving_the_reference_is_scored_like_the_reference(sb, cap):
    """Single-turn, multi-turn (a world event between turns) and a question: the reference served by `cowork serve`'s
    app and driven over HTTP passes every trial, with the same calls, faults and scores as the program run directly."""
    env = _env(cap)
    with running(make_app(ProgramAgent(env.reference), model_name="reference")) as base:
        agent = OpenAIAgent(base + "/v1", "reference", concurrency=4)
        remote = evaluate(agent, [(env, "heldout_env")], sb, trials=2, fault_rate=0.3, checkpoint_id="endpoint")
    direct = evaluate(ProgramAgent(env.reference), [(env, "heldout_env")], sb, trials=2, fault_rate=0.3)
    assert remote["passed"].all() and remote["agent"].unique().to_list() == ["endpoint:reference"]
    cols = ["trial", "passed", "score", "n_tool_calls", "faults_injected", "faults_recovered", "failed_items"]
    assert remote.select(cols).equals(direct.select(cols))
    assert agent.usage["requests"] == agent.usage["http_attempts"] > 0


# ---- the scripted endpoint ------------------------------------------------------------------------------
def _body(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


class Scripted:
    """Answers each request with ``respond(body, n)`` -> (status, JSON-able body); n counts requests so far."""

    def __init__(self, respond: Callable[[dict[str, Any], int], tuple[int, Any]]):
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with script.lock:
                    script.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                    n = len(script.requests)
                status, out = respond(body, n)
                raw = out if isinstance(out, bytes) else json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def agent(self, **kw: Any) -> OpenAIAgent:
        return OpenAIAgent(self.url, "m", backoff_s=0.01, timeout_s=5, **kw)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(respond: Callable[[dict[str, Any], int], tuple[int, Any]]) -> Scripted:
        made.append(Scripted(respond))
        return made[-1]

    yield make
    for s in made:
        s.server.shutdown()
        s.server.server_close()


def _first_call(env) -> tuple[str, dict[str, Any]]:
    step = env.reference[0].steps[0]
    return step.tool, step.args


def test_requests_carry_the_conversation_and_tools_in_the_api_shape(scripted):
    """The request: model, sampling, seed, the environment's tools, the key as a bearer token, and the messages
    with only the keys the API knows (a tool message's name and an unparseable output's parse_error stay ours)."""
    env = _env("invoice_reconcile")
    tool, args = _first_call(env)

    def respond(body, n):
        if n == 1:
            return 200, _body({"content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": tool, "arguments": json.dumps(args)}}]})
        return 200, _body({"content": "Done."})

    s = scripted(respond)
    traj = run_episode(env, s.agent(api_key="sk-test", temperature=0.2, max_tokens=64, seed=7))
    assert traj.termination == "completed" and [st["tool"] for st in traj.steps] == [tool] and traj.steps[0]["ok"]
    first, second = (r["body"] for r in s.requests)
    assert (first["model"], first["temperature"], first["max_tokens"], first["seed"], first["tool_choice"]) == ("m", 0.2, 64, 7, "auto")
    assert {t["function"]["name"] for t in first["tools"]} == set(env.tools) and s.requests[0]["auth"] == "Bearer sk-test"
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert set(second["messages"][3]) == {"role", "content", "tool_call_id"} and second["messages"][3]["tool_call_id"] == "c1"
    assert second["messages"][2]["tool_calls"][0]["function"] == {"name": tool, "arguments": json.dumps(args)}
    cleaned = request_messages([{"role": "assistant", "content": "<tool_call>{oops", "parse_error": "invalid JSON"},
                                {"role": "assistant", "content": None}])
    assert cleaned == [{"role": "assistant", "content": "<tool_call>{oops"}, {"role": "assistant", "content": ""}]


def test_transient_errors_are_retried_and_a_refusal_ends_only_its_own_episode(scripted):
    """A 503 is retried (the step succeeds); a 401 is not: that episode ends as agent_error with the server's
    message, and the other episode of the same batch goes on to complete."""
    ok_env, bad_env = _env("invoice_reconcile"), _env("share_doc_internal")

    def respond(body, n):
        task = body["messages"][1]["content"]
        if task == bad_env.turns[0].user:
            return 401, {"error": {"message": "invalid api key for this model", "type": "auth_error"}}
        if n == 1:
            return 503, {"error": {"message": "overloaded"}}
        return 200, _body({"content": "Nothing to do."})

    s = scripted(respond)
    agent = s.agent(concurrency=1)  # in order: the first request is the 503
    good, bad = run_episodes([(ok_env, None), (bad_env, None)], agent)
    assert good.termination == "completed" and good.replies == ["Nothing to do."]
    assert bad.termination == "agent_error" and "401" in bad.termination_detail and "invalid api key" in bad.termination_detail
    assert agent.usage["requests"] == 2 and agent.usage["http_attempts"] >= 3  # 503 + retry, and the 401 once


def test_what_a_model_gets_wrong_is_a_failed_step_not_a_crash(scripted):
    """Arguments that are not JSON: a failed step the model sees as a tool error; calls written into the text
    (a model served without a tool-call parser): read and run; a body with no message: agent_error."""
    env = _env("invoice_reconcile")
    tool, args = _first_call(env)
    text_call = "Looking it up.\n<tool_call>\n" + json.dumps({"name": tool, "arguments": args}) + "\n</tool_call>"

    def respond(body, n):
        if n == 1:
            return 200, _body({"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": tool, "arguments": "{query: oops"}}]})
        if n == 2:
            return 200, _body({"content": text_call})
        if n == 3:
            return 200, _body({"content": "Done."})
        return 200, {"id": "x", "choices": []}

    s = scripted(respond)
    traj = run_episode(env, s.agent())
    assert [(st["tool"], st["ok"]) for st in traj.steps] == [(tool, False), (tool, True)]
    assert "not valid JSON" in traj.steps[0]["error"]["message"]
    tool_msgs = [m for m in json.loads(json.dumps(traj.messages)) if m["role"] == "tool"]
    assert "invalid_arguments" in tool_msgs[0]["content"]  # the model is told, and may try again
    assert traj.steps[1]["call_id"] == "call_1"  # an id unique in the conversation (the first call was c1 = call 0)
    assert traj.termination == "completed" and traj.replies == ["Done."]
    empty = run_episode(env, s.agent())
    assert empty.termination == "agent_error" and "no choices" in empty.termination_detail


def test_a_response_cache_replays_an_evaluation_without_requests(scripted, tmp_path, sb):
    """With cache_dir, the same requests are answered from disk: a re-run scores the same and costs nothing."""
    env = _env("invoice_reconcile")
    s = scripted(lambda body, n: (200, _body({"content": "Done."})))
    first = evaluate(s.agent(cache_dir=tmp_path), [(env, "heldout_env")], sb, trials=1, fault_rate=0.0)
    sent = len(s.requests)
    again_agent = s.agent(cache_dir=tmp_path)
    again = evaluate(again_agent, [(env, "heldout_env")], sb, trials=1, fault_rate=0.0)
    assert len(s.requests) == sent and again_agent.usage["cached"] == again_agent.usage["requests"] == sent
    assert again.drop("messages_json").equals(first.drop("messages_json")) and not again["passed"].any()


def test_each_trial_of_a_sampled_evaluation_is_its_own_sample(scripted, tmp_path, sb):
    """Sampling, each trial sends its own seed (mixed from the agent's and the trial's), so the trials of an
    environment are not one sample repeated (by a server that honours seeds, or by the response cache on a re-run);
    the same evaluation sends the same seeds again. Greedy, every request keeps the agent's seed (and its cached
    answers), and its agent key is unchanged."""
    env = _env("invoice_reconcile")
    s = scripted(lambda body, n: (200, _body({"content": "Done."})))

    def first_seeds(agent: OpenAIAgent) -> list[int]:
        before = len(s.requests)
        evaluate(agent, [(env, "heldout_env")], sb, trials=2, fault_rate=0.3)  # two faulted trials and a clean one
        return sorted(r["body"]["seed"] for r in s.requests[before:])

    sampled = first_seeds(s.agent(temperature=0.7))
    assert len(sampled) == 3 and len(set(sampled)) == 3  # (each trial's one request: "Done." ends the episode)
    assert first_seeds(s.agent(temperature=0.7)) == sampled
    assert first_seeds(s.agent(temperature=0.7, seed=1)) != sampled
    assert first_seeds(s.agent()) == [0, 0, 0]
    assert "seed_per_episode" not in s.agent().describe()
    assert s.agent(temperature=0.7).describe()["seed_per_episode"] is True


def test_bad_settings_fail_at_construction():
    with pytest.raises(ValueError, match="http"):
        OpenAIAgent("ftp://example/v1", "m")
    with pytest.raises(ValueError, match="model"):
        OpenAIAgent("http://127.0.0.1:9/v1", "")
    with pytest.raises(ValueError, match="concurrency"):
        OpenAIAgent("http://127.0.0.1:9/v1", "m", concurrency=0)


def test_cowork_ui_hands_its_endpoints_to_the_code_location(tmp_path, capsys):
    """`cowork ui --endpoint URL --endpoint-model NAME [--teacher-endpoint URL --teacher-model NAME]`: the code
    location (another process) builds the benchmark's agents and the teacher from the same settings; flags that do
    not pair up are refused before anything starts."""
    from assets.cli import parse_args, ui_environment
    from resources import AgentsResource

    args = parse_args(["--home", str(tmp_path), "ui", "--endpoint", "http://127.0.0.1:9/v1", "--endpoint-model", "qwen3-8b",
                       "--endpoint", "http://127.0.0.1:10/v1", "--endpoint-model", "Qwen/Qwen3-32B", "--endpoint-name", "small",
                       "--endpoint-temperature", "0.7"])
    agents = AgentsResource.from_env(ui_environment(args))
    built = agents.build()
    assert [(ck, a.name, a.model, a.client.base_url, a.temperature) for ck, a in built] == [
        ("endpoint-small", "endpoint:small", "qwen3-8b", "http://127.0.0.1:9/v1", 0.7),
        ("endpoint-Qwen-Qwen3-32B", "endpoint:Qwen-Qwen3-32B", "Qwen/Qwen3-32B", "http://127.0.0.1:10/v1", 0.7)]
    assert agents.teacher is None and (agents.teacher_version(), agents.teacher_code_version()) == ("embedded", "1")
    teach = AgentsResource.from_env(ui_environment(parse_args(["--home", str(tmp_path), "ui", "--teacher-endpoint", "http://127.0.0.1:9/v1",
                                                                "--teacher-model", "big"])))
    assert teach.build_teacher().name == "endpoint:big" and teach.teacher_code_version() == "1+endpoint:big@http://127.0.0.1:9/v1"
    assert AgentsResource.from_env({}).endpoints == []  # none configured: the benchmark scores the students and the teacher
    with pytest.raises(SystemExit) as exc:
        parse_args(["ui", "--endpoint", "http://127.0.0.1:9/v1"])
    assert exc.value.code == 2 and "--endpoint-model" in capsys.readouterr().err
    for bad in ("hot", "-1", "2.5", "nan"):
        with pytest.raises(SystemExit):
            parse_args(["eval", "--endpoint", "http://127.0.0.1:9/v1", "--endpoint-model", "m", "--endpoint-temperature", bad])
        assert "a temperature is a number in [0, 2]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["run", "--teacher-endpoint", "http://127.0.0.1:9/v1"])
    assert "--teacher-model" in capsys.readouterr().err
    with pytest.raises(ValueError, match="COWORK_AGENTS"):
        AgentsResource.from_env({"COWORK_AGENTS": "{\"endpoints\": [{\"model\": \"m\"}]}"})


def test_the_api_shape_of_a_conversation_renders_as_the_conversation_itself():
    """What the agent sends keeps everything the chat template uses: for every step of teacher episodes (tool calls,
    results, faults, a second turn after a world event), the request's messages render to the same prompt text."""
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.services import FaultConfig, tools_for

    for cap in ("invoice_reconcile", "ticket_triage_followup"):
        env = _env(cap)
        traj = run_episode(env, ProgramAgent(env.reference), faults=FaultConfig(rate=0.3, seed=2))
        tools = tools_for(env.tools)
        for i, m in enumerate(traj.messages):
            if m["role"] == "assistant":
                assert render_conversation(request_messages(traj.messages[:i]), tools) == render_conversation(traj.messages[:i], tools)


def test_a_turn_cut_at_the_token_limit_is_marked_in_the_transcript():
    from cowork_pipeline.agents.openai_agent import response_message

    cut = response_message(_body({"content": "I will now upd"}, finish="length"))
    assert cut["content"] == "I will now upd" and cut["parse_error"].startswith("truncated")
    assert "parse_error" not in response_message(_body({"content": "Done."}))


def test_a_reasoning_model_s_thoughts_are_neither_its_reply_nor_its_calls(scripted, sb):
    """Qwen3 or DeepSeek-R1 behind an endpoint without a reasoning parser: every message starts with its thoughts
    (``<think>...</think>``, or only the closing tag when the chat template opened the block), and the thoughts may
    sketch a call. The calls after them are made, the thoughts' are not; the reply is what follows them (an answer
    with the markup left in would fail); the transcript keeps the thoughts, the requests never send them back; a
    parser's ``reasoning_content`` is kept the same way."""
    from cowork_pipeline.validation.grader import grade_many

    env = _env("invoice_reconcile")
    calls = [(st["tool"], st["args"]) for st in run_episode(env, ProgramAgent(env.reference)).steps]
    decoy = '<tool_call>{"name": "crm_delete_contact", "arguments": {"contact_id": "x"}}</tool_call>'

    def respond(body, n):
        thoughts = (f"<think>\nStep {n}. Maybe {decoy}? No.\n</think>\n\n" if n % 2 else f"Step {n}, as planned.\n</think>\n\n")
        if n <= len(calls):
            tool, args = calls[n - 1]
            call = json.dumps({"name": tool, "arguments": args})
            if n % 3:  # calls written into the text after the thoughts (hermes format), or as the API's tool_calls
                return 200, _body({"content": f"{thoughts}<tool_call>\n{call}\n</tool_call>"})
            return 200, _body({"content": thoughts, "tool_calls": [{"id": f"c{n}", "type": "function",
                                                                    "function": {"name": tool, "arguments": json.dumps(args)}}]})
        return 200, _body({"content": thoughts + env.reference[0].reply})

    s = scripted(respond)
    traj = run_episode(env, s.agent())
    assert [(st["tool"], st["args"]) for st in traj.steps] == calls and all(st["ok"] for st in traj.steps)
    assert traj.replies == [env.reference[0].reply]
    (grade,) = grade_many(sb, [(env, traj, None)])
    assert grade.passed, grade.failed_items()
    said = [m for m in traj.messages if m["role"] == "assistant"]
    assert all(m.get("reasoning", "").startswith("Step") for m in said) and not any("<think>" in (m["content"] or "") for m in said)
    assert not any("think>" in json.dumps(r["body"]["messages"]) or "reasoning" in json.dumps(r["body"]["messages"]) for r in s.requests)
    from cowork_pipeline.agents.openai_agent import response_message

    apart = response_message(_body({"content": "Done.", "reasoning_content": "Parsed apart."}))
    assert apart == {"role": "assistant", "content": "Done.", "reasoning": "Parsed apart."}
    unended = response_message(_body({"content": "<think>\nStill going"}, finish="length"))
    assert unended["content"] == "" and unended["reasoning"] == "Still going" and unended["parse_error"].startswith("truncated")


def test_calls_written_as_bare_json_are_calls_and_other_json_is_a_reply(scripted, sb):
    """Llama 3 or Mistral behind an endpoint without a tool-call parser write their calls as the whole text:
    ``{"name": ..., "parameters": {...}}`` (after ``<|python_tag|>`` too), ``[TOOL_CALLS][{"name": ..., "arguments":
    {...}}]``, in a json fence, the arguments as a JSON string, or in the API's own shape, which a model imitates.
    Each is the call (the trial passes its grading); JSON that is not a call of an offered tool stays the reply."""
    from cowork_pipeline.agents.openai_agent import bare_calls, response_message
    from cowork_pipeline.validation.grader import grade_many

    env = _env("invoice_reconcile")
    calls = [(st["tool"], st["args"]) for st in run_episode(env, ProgramAgent(env.reference)).steps]
    ways = [lambda t, a: json.dumps({"name": t, "parameters": a}),
            lambda t, a: "[TOOL_CALLS]" + json.dumps([{"name": t, "arguments": a}]),
            lambda t, a: "```json\n" + json.dumps({"name": t, "arguments": json.dumps(a)}) + "\n```",
            lambda t, a: "<|python_tag|>" + json.dumps({"name": t, "parameters": a}),
            lambda t, a: json.dumps({"type": "function", "function": {"name": t, "arguments": json.dumps(a)}}),
            lambda t, a: json.dumps({"tool_calls": [{"id": "x", "type": "function", "function": {"name": t, "arguments": a}}]})]

    def respond(body, n):
        if n <= len(calls):
            return 200, _body({"content": ways[n % len(ways)](*calls[n - 1])})
        return 200, _body({"content": env.reference[0].reply})

    s = scripted(respond)
    traj = run_episode(env, s.agent())
    assert [(st["tool"], st["args"]) for st in traj.steps] == calls and all(st["ok"] for st in traj.steps)
    (grade,) = grade_many(sb, [(env, traj, None)])
    assert grade.passed, grade.failed_items()
    sent = s.requests[1]["body"]["messages"][2]
    assert sent["tool_calls"][0]["id"] == "call_0" and not sent.get("content")  # (sent back in the API's shape)

    offered = frozenset({"mail_search", "crm_update_invoice"})
    two = [{"name": "mail_search", "parameters": {"query": "x"}}, {"name": "crm_update_invoice", "arguments": {"invoice_id": "i"}}]
    for both in (json.dumps(two), "; ".join(map(json.dumps, two)), "\n".join(map(json.dumps, two))):
        assert [c["name"] for c in bare_calls(both, offered)] == ["mail_search", "crm_update_invoice"], both
    for reply in ('{"answer": "15200.00 USD"}', '{"name": "delete_everything", "parameters": {}}',
                  json.dumps(two[0]) + " and then the invoice", '{"tool_calls": [], "content": "Done."}',
                  '{"function": {"name": "mail_search", "arguments": {}}, "why": "to find it"}',
                  '{"name": "mail_search", "parameters": {"query": "x"}, "note": "and then?"}', '{"name": "mail_search"}',
                  'Searching: {"name": "mail_search", "parameters": {"query": "x"}}', "[1, 2]", "The total is 15200.00 USD."):
        assert bare_calls(reply, offered) is None, reply
        assert response_message(_body({"content": reply}), tool_names=offered) == {"role": "assistant", "content": reply}
    cut = response_message(_body({"content": json.dumps(two[0])}, finish="length"), tool_names=offered)
    assert "tool_calls" not in cut and cut["parse_error"].startswith("truncated")


def test_a_reasoning_model_s_refused_settings_are_left_out_or_renamed_once_and_recorded(scripted, sb):
    """OpenAI's reasoning models refuse a temperature but their own, top_p, and max_tokens ("Use
    'max_completion_tokens' instead"), one 400 at a time. Each refused setting is left out (or renamed) and the
    request sent again; the client remembers, so later steps pay no 400, and says what it changed. The trial is
    scored as any other (it passes its grading); a 400 for anything else still ends the episode."""
    from cowork_pipeline.validation.grader import grade_many

    env = _env("invoice_reconcile")
    calls = [(st["tool"], st["args"]) for st in run_episode(env, ProgramAgent(env.reference)).steps]
    refusals = {"temperature": "Unsupported value: 'temperature' does not support 0.0 with this model. Only the default (1) value is supported.",
                "top_p": "Unsupported parameter: 'top_p' is not supported with this model.",
                "max_tokens": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."}
    answered: list[dict[str, Any]] = []

    def respond(body, n):
        for field, message in refusals.items():
            if field in body:
                return 400, {"error": {"message": message, "type": "invalid_request_error", "param": field, "code": None}}
        answered.append(body)
        if len(answered) <= len(calls):
            tool, args = calls[len(answered) - 1]
            return 200, _body({"content": None, "tool_calls": [{"id": f"c{n}", "type": "function",
                                                                "function": {"name": tool, "arguments": json.dumps(args)}}]})
        return 200, _body({"content": env.reference[0].reply})

    s = scripted(respond)
    agent = s.agent(top_p=0.9, max_tokens=2048)
    traj = run_episode(env, agent)
    (grade,) = grade_many(sb, [(env, traj, None)])
    assert grade.passed, grade.failed_items()
    assert len(s.requests) == len(answered) + 3  # the three refusals, once
    assert all(b["max_completion_tokens"] == 2048 and b["seed"] == 0 and not set(refusals) & set(b) for b in answered)
    assert {f: how.split(":")[0] for f, how in agent.client.adapted.items()} == \
           {"max_tokens": "sent as max_completion_tokens", "temperature": "left out", "top_p": "left out"}
    assert "Only the default (1) value is supported" in agent.client.adapted["temperature"]

    other = scripted(lambda body, n: (400, {"error": {"message": "'messages' must not be empty", "param": "messages"}}))
    with pytest.raises(TransportError, match="not retried"):
        other.agent(max_tokens=64).act([{"role": "user", "content": "hi"}], [])
    assert len(other.requests) == 1
