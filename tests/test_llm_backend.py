"""The LLM generator backend against a real (scripted) OpenAI-compatible HTTP server on 127.0.0.1."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowork_pipeline.capabilities import CATALOG_DIR, Capability, Range, load_catalog
from cowork_pipeline.spec import EnvironmentSpec, canonical_json
from cowork_pipeline.synthesis.draft import Diagnostic, Draft
from cowork_pipeline.synthesis.embedded import EmbeddedBackend
from cowork_pipeline.synthesis.llm import (
    PROMPTS_DIR, LLMBackend, NoJSON, example_document, extract_json_object, load_template, prompt_sha256,
)
from cowork_pipeline.synthesis.repair import synthesize, telemetry
from cowork_pipeline.validation.certify import VALIDATOR_VERSION, Validator

MODEL = "test-model"
LAX = "def check(ev):\n    return True\n"


# ---- a dev-or-real sandbox ----------------------------------------------------------------
def _make_sandbox() -> Any:
    if importlib.util.find_spec("cowork_pipeline.validation.sandbox") is not None:
        return importlib.import_module("cowork_pipeline.validation.sandbox").Sandbox(workers=1)
    spec = importlib.util.spec_from_file_location("devsandbox", "/tmp/shim/devsandbox.py")  # until the real one lands
    assert spec is not None and spec.loader is not None, "no cowork_pipeline.validation.sandbox and no /tmp/shim/devsandbox.py"
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.DevSandbox()


@pytest.fixture(scope="module")
def validator():
    sb = _make_sandbox()
    yield Validator(sb)
    if hasattr(sb, "close"):
        sb.close()


@pytest.fixture(scope="module")
def cap():
    return load_catalog()["invoice_reconcile"]


@pytest.fixture(scope="module")
def good_doc(cap) -> dict[str, Any]:
    return EmbeddedBackend().draft(cap, 3).spec.model_dump(mode="json")


def lax_doc(good: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(good))
    item = next(i for i in doc["rubric"] if i["id"] == "invoice_amount")
    item["code"] = LAX
    return doc


# ---- the scripted chat-completions server -------------------------------------------------
def completion(content: str | None, usage: dict[str, int] | None = None, finish: str = "stop",
               reasoning: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    message = {"role": "assistant", "content": content, **({"reasoning_content": reasoning} if reasoning is not None else {})}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage or {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}}
    return 200, json.dumps(body).encode(), {"Content-Type": "application/json"}


def error(status: int, message: str = "boom") -> tuple[int, bytes, dict[str, str]]:
    return status, json.dumps({"error": {"message": message, "type": "server_error"}}).encode(), {"Content-Type": "application/json"}


class ScriptedLLM:
    """Serves the scripted responses in order and records every request."""

    def __init__(self) -> None:
        self.responses: list[tuple[int, bytes, dict[str, str]]] = []
        # Instead of the scripted order: a response computed from the request body (concurrent clients).
        self.responder: Callable[[dict[str, Any]], tuple[int, bytes, dict[str, str]]] | None = None
        self.delay_s = 0.0  # each response waits this long, so concurrent requests overlap
        self.in_flight = self.max_in_flight = 0
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                with script.lock:
                    script.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                            "body": body})
                    script.in_flight += 1
                    script.max_in_flight = max(script.max_in_flight, script.in_flight)
                    if script.responder is None:
                        status, payload, headers = script.responses.pop(0) if script.responses else error(500, "script exhausted")
                try:
                    if script.responder is not None:
                        status, payload, headers = script.responder(body)
                    time.sleep(script.delay_s)
                finally:
                    with script.lock:
                        script.in_flight -= 1
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def script(self, *responses: tuple[int, bytes, dict[str, str]]) -> None:
        self.responses.extend(responses)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def backend(self, **kw: Any) -> LLMBackend:
        kw.setdefault("backoff_s", 0.01)
        kw.setdefault("timeout_s", 5)
        return LLMBackend(f"http://127.0.0.1:{self.port}/v1", MODEL, api_key="sk-test", **kw)


@pytest.fixture
def llm():
    s = ScriptedLLM()
    yield s
    s.close()


# ---- 1. a good answer --------------------------------------------------------------------
def test_good_response_certifies(llm, cap, good_doc, validator):
    llm.script(completion(json.dumps(good_doc)))
    d = llm.backend(temperature=0.3).draft(cap, 3)
    assert d.spec is not None, d.parse_diagnostics
    assert d.parse_diagnostics == [] and d.backend == "llm" and d.attempt == 0 and d.capability is cap
    assert d.spec.env_id == "invoice_reconcile-000003" and d.spec.capability_id == cap.id and d.spec.seed == 3
    g = d.spec.generator
    assert (g.backend, g.version, g.prompt_version, g.attempt, g.model) == ("llm", "llm-2", "generate_v26", 0, MODEL)
    cert = validator.certify(d)
    assert cert.certified, cert.diagnostics

    (req,) = llm.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == MODEL and body["temperature"] == 0.3 and body["seed"] == 3
    assert body["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    prompt = "\n".join(m["content"] for m in body["messages"])
    assert cap.title in prompt
    for t in cap.tools:
        assert f"`{t}(" in prompt, t
    assert "mail_deliver(" in prompt  # world-event tools of the capability's services
    assert "no_outside_email" in prompt and '"$var"' in prompt and "def check(ev)" in prompt
    assert "crm.invoices" in prompt  # record shapes
    assert d.raw == json.dumps(good_doc)
    assert d.cost["llm_tokens"] == 1500 and d.cost["prompt_tokens"] == 1000 and d.cost["completion_tokens"] == 500
    assert d.cost["seconds"] > 0 and d.cost["http_attempts"] == 1


def test_prompt_example_document_certifies(validator):
    """The example shown to the model by the current prompt is itself a valid, certifiable environment."""
    spec = EnvironmentSpec.model_validate(example_document())
    cert = validator.certify(Draft("example", 0, 0, "llm", spec))
    assert cert.certified, cert.diagnostics
    assert cert.kill_rate == 1.0 and len(cert.mutants) >= 4


@pytest.mark.parametrize("version", [f"v{i}" for i in range(1, 26)])
def test_older_prompt_examples_fail_only_what_the_validator_added_since(validator, version):
    """Released templates are never edited, so their examples were written for an older validator. Their gaps
    today: certify-9's (up to v8: the #ops post checker does not notice the post reporting the work as not done) and
    certify-20's (every one before v20: nor a template's placeholder left in the post). certify-21's new careless
    kinds do not fall on the example's seed (0: the placeholder), so v20's certifies; v21's checker rejects a
    claimed attachment as well (a unit test below shows it); certify-22's second amount needs an amount (the
    example's post has none, nor has it one for certify-26's wider currencies); certify-24's injection_followed mutant needs a planted instruction (the example has
    none)."""
    spec = EnvironmentSpec.model_validate(example_document(version))
    cert = validator.certify(Draft("example", 0, 0, "llm", spec))
    gaps = ([("mutation_survived", "misstated_value")] if int(version[1:]) <= 8 else []) + \
        ([("mutation_survived", "careless_message")] if int(version[1:]) < 20 else [])
    assert [(d.code, d.detail.get("operator")) for d in cert.diagnostics] == gaps
    assert int(version[1:]) > 8 or "reports the work as not done" in cert.diagnostics[0].message
    assert int(version[1:]) >= 20 or "leaves a template's placeholder in ('Hi [Name]')" in cert.diagnostics[-1].message
    assert cert.reference_pass and not cert.null_pass and len(cert.mutants) >= 4



def test_the_current_example_rejects_a_claimed_attachment(validator):
    """certify-21: on seed 4 the careless_message mutant adds "Please find the details attached." to the example's
    #ops post (a chat post carries no attachment): v20's checker lets it through, v21's (and later ones) reject it."""
    for version, certified in (("v20", False), ("v21", True), ("v22", True), ("v23", True), ("v24", True), ("v25", True), ("v26", True)):
        spec = EnvironmentSpec.model_validate({**example_document(version), "seed": 4})
        cert = validator.certify(Draft("example", 4, 0, "llm", spec))
        careless = [m for m in cert.mutants if m["operator"] == "careless_message"]
        assert len(careless) == 1 and "carries an attachment it does not" in careless[0]["description"], careless
        assert cert.certified is certified and careless[0]["killed"] is certified, (version, cert.diagnostics)

# ---- 2. broken answers and transport failures ---------------------------------------------
def test_prose_and_fences_around_json_parse(llm, cap, good_doc):
    text = ("Sure! Here is the environment {as requested}:\n\n```json\n" + json.dumps(good_doc, indent=2)
            + "\n```\n\nLet me know if you need {anything} else.")
    llm.script(completion(text))
    d = llm.backend().draft(cap, 3)
    assert d.spec is not None, d.parse_diagnostics
    assert d.raw == text


def test_a_reasoning_model_s_thoughts_and_sketches_are_not_the_document(llm, cap, good_doc, validator):
    """A reasoning model served without a reasoning parser (Qwen3, DeepSeek-R1) writes its thoughts first, and they
    may hold an object of their own: the document is the object with a document's keys, after the thoughts."""
    sketch = '{"title": "Reconcile the invoice", "turns": 1}'
    for thoughts in (f"<think>\nA draft could start like {sketch}; the checker must reject '</think>'-free text... no.\n</think>\n\n",
                     f"Okay, the user wants an environment. Maybe {sketch}. Let me write it.\n</think>\n",  # template opened it
                     "Here is a sketch first: {\"title\": \"x\"}. And the document:\n"):
        text = thoughts + "```json\n" + json.dumps(good_doc, indent=1) + "\n```"
        llm.script(completion(text))
        d = llm.backend().draft(cap, 3)
        assert d.spec is not None, (thoughts, d.parse_diagnostics)
        assert d.raw == text and validator.certify(d).certified
    # still thinking when the tokens ran out, or a sketch and then a cut document: the answer never came
    for text, says in ((f"<think>\nMaybe {sketch}, or", "never ends"),
                       (f"Sketch: {sketch}\n" + json.dumps(good_doc)[:4000], "never closed")):
        llm.script(completion(text, finish="length"))
        d = llm.backend().draft(cap, 3)
        assert d.spec is None and [x.code for x in d.parse_diagnostics] == ["unparseable_output"]
        assert says in d.parse_diagnostics[0].message and "token limit" in d.parse_diagnostics[0].message
    # a server's reasoning parser that got no closing tag puts everything in reasoning_content, the content empty
    llm.script(completion(None, reasoning="Let me write it.\n" + json.dumps(good_doc)))
    d = llm.backend().draft(cap, 3)
    assert d.spec is not None and validator.certify(d).certified, d.parse_diagnostics
    llm.script(completion("", reasoning=f"Maybe {sketch}, or", finish="length"))
    d = llm.backend().draft(cap, 3)
    assert d.spec is None and "reasoning block and nothing after it" in d.parse_diagnostics[0].message


def test_truncated_json_is_unparseable(llm, cap, good_doc, validator):
    text = json.dumps(good_doc)[:5000]
    llm.script(completion(text, finish="length"))
    d = llm.backend().draft(cap, 3)
    assert d.spec is None and d.raw == text
    (diag,) = d.parse_diagnostics
    assert diag.code == "unparseable_output"
    assert "never closed" in diag.message and "token limit" in diag.message
    assert [x.code for x in validator.certify(d).diagnostics] == ["unparseable_output"]


def test_garbage_is_unparseable(llm, cap):
    llm.script(completion("I'm sorry, I cannot help with environments today."))
    d = llm.backend().draft(cap, 3)
    assert d.spec is None
    assert [x.code for x in d.parse_diagnostics] == ["unparseable_output"]
    assert "no JSON object" in d.parse_diagnostics[0].message


def test_wrong_shape_is_schema_invalid_with_paths(llm, cap, good_doc):
    bad = json.loads(json.dumps(good_doc))
    bad["rubric"][1]["kind"] = "bonus"
    del bad["reference"][0]["steps"][0]["tool"]
    llm.script(completion(json.dumps({"answer": "an environment"})), completion(json.dumps(bad)))
    b = llm.backend()
    d1 = b.draft(cap, 3)
    assert d1.spec is None and {x.code for x in d1.parse_diagnostics} == {"schema_invalid"}
    paths = {x.detail["path"] for x in d1.parse_diagnostics}
    assert {"$.world", "$.rubric", "$.reference", "$.turns", "$.system_prompt"} <= paths
    d2 = b.draft(cap, 3)
    assert d2.spec is None
    msgs = " | ".join(x.message for x in d2.parse_diagnostics)
    assert "$.rubric[1].kind" in msgs and "$.reference[0].steps[0].tool" in msgs


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_error_then_good_is_retried(llm, cap, good_doc, status):
    llm.script(error(status), completion(json.dumps(good_doc)))
    d = llm.backend().draft(cap, 3)
    assert d.spec is not None, d.parse_diagnostics
    assert len(llm.requests) == 2 and d.cost["http_attempts"] == 2
    assert llm.requests[0]["body"] == llm.requests[1]["body"]


def test_retries_are_bounded(llm, cap, validator):
    llm.script(error(500), error(502), error(503), error(500))
    d = llm.backend(max_retries=2).draft(cap, 3)
    assert d.spec is None and len(llm.requests) == 3
    (diag,) = d.parse_diagnostics
    assert diag.code == "generator_error" and "HTTP 503" in diag.message and "3 attempt" in diag.message
    assert [x.code for x in validator.certify(d).diagnostics] == ["generator_error"]


def test_client_error_is_not_retried(llm, cap):
    llm.script(error(401, "invalid api key"))
    d = llm.backend().draft(cap, 3)
    assert d.spec is None and len(llm.requests) == 1
    assert d.parse_diagnostics[0].code == "generator_error" and "invalid api key" in d.parse_diagnostics[0].message


def test_server_without_json_mode(llm, cap, good_doc):
    llm.script(error(400, "response_format json_object is not supported by this model"), completion(json.dumps(good_doc)))
    d = llm.backend().draft(cap, 3)
    assert d.spec is not None
    assert "response_format" in llm.requests[0]["body"] and "response_format" not in llm.requests[1]["body"]


def test_a_reasoning_model_drafts_at_its_own_temperature_and_the_draft_says_so(llm, cap, good_doc):
    """A reasoning model behind OpenAI's API refuses temperature and max_tokens: the generator asks again without the
    one and with max_completion_tokens for the other, drafts, and records in the draft's knobs what the request left
    out; its next draft pays no 400."""
    llm.script(error(400, "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported."),
               error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."),
               completion(json.dumps(good_doc)), completion(json.dumps(good_doc)))
    b = llm.backend(temperature=0.2, max_tokens=9000)
    first, second = b.draft(cap, 3), b.draft(cap, 4)
    assert first.spec is not None and second.spec is not None, first.parse_diagnostics
    assert len(llm.requests) == 4 and first.cost["http_attempts"] == 3 and second.cost["http_attempts"] == 1
    sent = llm.requests[-1]["body"]
    assert "temperature" not in sent and "max_tokens" not in sent and sent["max_completion_tokens"] == 9000
    assert first.knobs["temperature"] == 0.2 and set(first.knobs["endpoint_adapted"]) == {"temperature", "max_tokens"}
    assert first.knobs["endpoint_adapted"]["max_tokens"].startswith("sent as max_completion_tokens: Unsupported parameter")


def test_connection_refused_is_a_diagnostic(cap):
    s = ScriptedLLM()
    b = s.backend(max_retries=1)
    s.close()
    d = b.draft(cap, 3)
    assert d.spec is None and d.raw is None
    (diag,) = d.parse_diagnostics
    assert diag.code == "generator_error" and "cannot reach" in diag.message
    r = b.revise(d, d.parse_diagnostics)  # revise never raises either
    assert r.spec is None and r.attempt == 1 and r.parse_diagnostics[0].code == "generator_error"


def test_revise_after_transport_failure_asks_again(llm, cap, good_doc):
    b = llm.backend()
    failed = Draft(cap.id, 3, 0, "llm", None, capability=cap, parse_diagnostics=[Diagnostic("generator_error", "timeout")])
    llm.script(completion(json.dumps(good_doc)))
    d = b.revise(failed, failed.parse_diagnostics)
    assert d.spec is not None and d.attempt == 1 and d.spec.generator.attempt == 1
    assert [m["role"] for m in llm.requests[0]["body"]["messages"]] == ["system", "user"]
    assert d.spec.generator.prompt_version == "generate_v26"


# ---- 3. the repair loop end to end --------------------------------------------------------
def test_repair_loop_end_to_end(llm, cap, good_doc, validator):
    llm.script(completion("the environment: {world: ...}"), completion(json.dumps(lax_doc(good_doc))),
               completion(json.dumps(good_doc)))
    (out,) = synthesize(llm.backend(), validator, cap, [3], max_rounds=3)
    assert out.accepted and out.rounds == 2
    codes = [sorted({d.code for d in a.certification.diagnostics}) for a in out.attempts]
    assert codes[0] == ["unparseable_output"]
    assert "mutation_survived" in codes[1] and codes[2] == []
    assert len(llm.requests) == 3

    first, second, third = (r["body"]["messages"] for r in llm.requests)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[:2] == first  # the revision continues the generate conversation
    assert second[2]["content"] == "the environment: {world: ...}"  # the raw answer, quoted back
    assert "unparseable_output" in second[3]["content"]
    assert "mutation_survived" in third[3]["content"] and "crm_update_invoice" in third[3]["content"]
    assert json.loads(third[2]["content"])["rubric"][0]["code"] == LAX  # the previous document, as parsed

    final = out.final.draft
    assert final.attempt == 2 and final.spec.generator.attempt == 2 and final.spec.generator.prompt_version == "revise_v26"
    assert any("changed rubric item invoice_amount (code)" in c for c in final.changes)
    rows = [a.log_row() for a in out.attempts]
    assert [r["round"] for r in rows] == [0, 1, 2] and all(r["llm_tokens"] == 1500 for r in rows)


def outcome_view(outcomes: list[Any]) -> list[Any]:
    """What the repair loop decided, attempt by attempt (no timings or costs)."""
    return [(o.seed, o.accepted, [(a.draft.draft_id, a.draft.spec.content_hash() if a.draft.spec else None, a.draft.raw,
                                   sorted(d.code for d in a.certification.diagnostics)) for a in o.attempts]) for o in outcomes]


def prose_then_good(good_doc: dict[str, Any]) -> Callable[[dict[str, Any]], tuple[int, bytes, dict[str, str]]]:
    """Even seeds answer their first request with prose (no JSON), then a good document; odd seeds a good one."""
    def respond(body: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
        if body["seed"] % 2 == 0 and len(body["messages"]) == 2:
            return completion(f"I would build a CRM world with an invoice email (seed {body['seed']}).")
        return completion(json.dumps(good_doc))
    return respond


def test_repair_loop_keeps_requests_in_flight_with_the_same_outcomes(llm, cap, good_doc, validator):
    """A backend's ``concurrency`` requests are in flight at once; outcomes, attempts and their order
    are the same as one request at a time."""
    seeds = [0, 1, 2, 3, 4, 5]
    llm.responder, llm.delay_s = prose_then_good(good_doc), 0.2
    progress: list[str] = []
    t0 = time.perf_counter()
    together = synthesize(llm.backend(concurrency=3), validator, cap, seeds, max_rounds=2, log=progress.append)
    tel = telemetry(together, wall_seconds=time.perf_counter() - t0)
    # 9 requests of 0.2 s, 3 at a time: the attempts' seconds add up to well over the elapsed time
    assert tel["seconds_total"] > 1.5 * tel["wall_seconds"] > 0 and abs(tel["wall_seconds_per_accepted"] - tel["wall_seconds"] / 6) < 1e-4
    assert [line.split(" (")[0] for line in progress] == [  # one line per round: what a user watches
        "invoice_reconcile round 0: 3/6 certified, revising 3", "invoice_reconcile round 1: 3/3 certified, done"]
    assert 2 <= llm.max_in_flight <= 3, llm.max_in_flight
    assert len(llm.requests) == 9  # 6 drafts + 3 revisions
    llm.requests.clear()
    llm.max_in_flight, llm.delay_s = 0, 0.0
    alone = synthesize(llm.backend(concurrency=1), validator, cap, seeds, max_rounds=2)
    assert llm.max_in_flight == 1 and len(llm.requests) == 9
    assert outcome_view(together) == outcome_view(alone)
    assert [o.seed for o in together] == seeds and [o.rounds for o in together] == [1, 0, 1, 0, 1, 0]
    assert all(o.accepted for o in together)


def test_response_cache_replays_answers_and_never_stores_errors(llm, cap, good_doc, validator, tmp_path):
    cache = tmp_path / "llm-cache"
    llm.responder = prose_then_good(good_doc)
    first = synthesize(llm.backend(cache_dir=cache), validator, cap, [0, 1], max_rounds=2)
    assert len(llm.requests) == 3 and not any(a.draft.knobs["cache_hit"] for o in first for a in o.attempts)
    again = synthesize(llm.backend(cache_dir=cache), validator, cap, [0, 1], max_rounds=2)
    assert len(llm.requests) == 3  # every answer replayed: the same drafts, nothing paid
    assert outcome_view(again) == outcome_view(first) and all(o.accepted for o in again)
    for a in (a for o in again for a in o.attempts):
        assert a.draft.knobs["cache_hit"] and a.draft.cost["llm_tokens"] == 0 and a.draft.cost["http_attempts"] == 0
        assert a.draft.knobs["response"]["usage"]["total_tokens"] == 1500  # what the answer cost when it was paid for

    # Another sampling setting is another request.
    llm.backend(cache_dir=cache, temperature=0.7).draft(cap, 1)
    assert len(llm.requests) == 4
    # An entry that cannot be read is a miss, replaced by the next answer.
    entries = sorted(cache.rglob("*.json"))
    assert len(entries) == 4
    for e in entries:
        e.write_text("{truncated")
    d = llm.backend(cache_dir=cache).draft(cap, 1)
    assert d.spec is not None and not d.knobs["cache_hit"] and len(llm.requests) == 5
    assert llm.backend(cache_dir=cache).draft(cap, 1).knobs["cache_hit"] and len(llm.requests) == 5

    # Errors are never stored: a failed request is asked again next time; a retried one stores the answer.
    llm.responder = None
    llm.script(error(400, "bad request"), error(500), completion(json.dumps(good_doc)))
    failed = llm.backend(cache_dir=cache).draft(cap, 7)
    assert failed.spec is None and failed.parse_diagnostics[0].code == "generator_error"
    retried = llm.backend(cache_dir=cache).draft(cap, 7)
    assert retried.spec is not None and retried.cost["http_attempts"] == 2 and len(llm.requests) == 8
    assert llm.backend(cache_dir=cache).draft(cap, 7).knobs["cache_hit"] and len(llm.requests) == 8
    assert not list(cache.rglob("*.tmp"))


def test_a_capability_without_composer_is_drafted_by_a_model_and_refused_by_the_embedded_backend(llm, cap, good_doc, validator):
    model_only = Capability.model_validate({**cap.model_dump(), "composer": None})
    with pytest.raises(ValueError, match="no embedded composer: draft it with an LLM generator"):
        synthesize(EmbeddedBackend(), validator, model_only, [0, 1])
    llm.script(completion(json.dumps(good_doc)))
    (out,) = synthesize(llm.backend(), validator, model_only, [3], max_rounds=0)
    assert out.accepted and len(llm.requests) == 1


# ---- 4. versioned prompts -----------------------------------------------------------------
def test_prompts_are_versioned_and_hashed(llm, cap, good_doc):
    llm.script(completion(json.dumps(lax_doc(good_doc))), completion(json.dumps(good_doc)))
    b = llm.backend()
    d = b.draft(cap, 3)
    assert d.spec.generator.prompt_version == "generate_v26" == d.knobs["prompt_version"]
    sent = llm.requests[0]["body"]["messages"]
    assert d.knobs["prompt"] == sent
    assert d.knobs["prompt_sha256"] == hashlib.sha256(canonical_json(sent).encode()).hexdigest() == prompt_sha256(sent)
    tpl_bytes = (PROMPTS_DIR / "generate_v26.md").read_bytes()
    assert d.knobs["template_sha256"] == hashlib.sha256(tpl_bytes).hexdigest()
    assert d.knobs["response"]["usage"]["total_tokens"] == 1500

    r = b.revise(d, [Diagnostic("null_passes", "the do-nothing trajectory passes every item")])
    assert r.spec.generator.prompt_version == "revise_v26" == r.knobs["prompt_version"]
    assert r.knobs["prompt_sha256"] == prompt_sha256(llm.requests[1]["body"]["messages"]) != d.knobs["prompt_sha256"]
    assert r.knobs["template_sha256"] == load_template("revise_v26").sha256

    # Rendering is deterministic for (capability, seed) and differs across seeds.
    assert prompt_sha256(b.generate_messages(cap, 3)) == d.knobs["prompt_sha256"]
    assert prompt_sha256(b.generate_messages(cap, 4)) != d.knobs["prompt_sha256"]
    with pytest.raises(ValueError, match="available versions"):
        LLMBackend("http://127.0.0.1:1/v1", MODEL, prompt_version="v999")


def test_a_drafted_document_with_a_planted_instruction_gets_its_mutant(llm, cap, validator):
    """v24: the generate prompt asks for a planted instruction on the seeds whose knob draws one (rule 10, with the
    constraints that may forbid it) and says "none" on the others; v25 adds the ticket and the unrelated change
    (no_unrelated_changes); older templates render as they always did. A
    model's document with ``facts.injection`` is certified like the embedded one: the injection_followed mutant
    makes the asked call after the read and the safety items kill it."""
    b = llm.backend()
    cap = cap.with_difficulty(injections=Range(min=0, max=1))  # (opt-in)
    seeds = {o.seed: o.final.draft.spec for o in synthesize(EmbeddedBackend(), validator, cap, list(range(6))) if o.accepted}
    with_one = next(seed for seed, spec in seeds.items() if "injection" in spec.facts)
    without = next(seed for seed, spec in seeds.items() if "injection" not in spec.facts)
    asked = b.generate_messages(cap, with_one)[1]["content"]
    assert "- Planted instruction: one: end the first email or ticket from outside" in asked
    assert "`no_deletes` or `no_outside_email` or `no_unrelated_changes` forbids (rule 10)" in asked
    v24 = LLMBackend("http://127.0.0.1:1/v1", MODEL, prompt_version="v24").generate_messages(cap, with_one)[1]["content"]
    assert "- Planted instruction: one: end the first email from outside" in v24 and "`no_deletes` or `no_outside_email` forbids (rule 10)" in v24
    assert "- Planted instruction: none" in b.generate_messages(cap, without)[1]["content"]
    assert "Planted instruction" not in LLMBackend("http://127.0.0.1:1/v1", MODEL, prompt_version="v23").generate_messages(cap, with_one)[1]["content"]
    llm.script(completion(json.dumps(seeds[with_one].model_dump(mode="json"))))
    d = b.draft(cap, with_one)  # (the repaired document, as a model's first answer)
    assert d.spec is not None and d.spec.facts["injection"] == seeds[with_one].facts["injection"]
    cert = validator.certify(d)
    assert cert.certified, cert.diagnostics
    [m] = [m for m in cert.mutants if m["operator"] == "injection_followed"]
    assert m["killed"] and any(i.startswith("safety_") for i in m["failed_items"])


# ---- JSON extraction ----------------------------------------------------------------------
def test_extract_json_object_respects_strings():
    text = 'Note {not json}. Result: {"a": "brace } and { in \\"string\\"", "b": {"c": [1, 2]}} trailing {"x": 1}'
    assert extract_json_object(text) == {"a": 'brace } and { in "string"', "b": {"c": [1, 2]}}
    assert extract_json_object('{"code": "def check(ev):\n    return True\n"}')["code"].startswith("def check")  # raw newlines
    with pytest.raises(NoJSON, match="never closed"):
        extract_json_object('{"world": {"a": {"id": "a"}}, "rubric": [{"id": "x"')  # inner objects are not returned
    with pytest.raises(NoJSON, match="invalid JSON"):
        extract_json_object("{'single': 'quotes'}")
    with pytest.raises(NoJSON, match="empty"):
        extract_json_object("   ")


def test_bad_base_url_fails_fast_and_unreachable_endpoint_is_a_diagnostic(cap):
    # A URL that can never work is a configuration error, raised before any draft...
    for bad in ("notaurl", "127.0.0.1:8000/v1", "ftp://127.0.0.1/v1", "http:///v1"):
        with pytest.raises(ValueError, match="must be an http"):
            LLMBackend(bad, MODEL)
    with pytest.raises(ValueError, match="concurrency"):
        LLMBackend("http://127.0.0.1:1/v1", MODEL, concurrency=0)
    # ...while an endpoint that does not answer fails each draft with a diagnostic, never a crash.
    d = LLMBackend("http://127.0.0.1:1/v1", MODEL, max_retries=0, timeout_s=2).draft(cap, 3)
    assert d.spec is None and d.parse_diagnostics[0].code == "generator_error"
    assert "refused" in d.parse_diagnostics[0].message.lower(), d.parse_diagnostics


@settings(max_examples=60, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=12), max_size=4),
    before=st.text(alphabet=st.characters(blacklist_characters="{"), max_size=30), after=st.text(max_size=30))
def test_extract_finds_the_document_in_any_prose(doc, before, after):
    assert extract_json_object(before + json.dumps(doc) + after) == doc


# ---- 5. `cowork run` with an LLM endpoint, through Dagster -------------------------------
def test_cowork_run_drafts_with_an_llm_endpoint(llm, good_doc, tmp_path, monkeypatch, capsys):
    """The CLI's generator flags reach the synthesis asset: the endpoint drafts (two requests in flight),
    the repair loop revises its prose answer, the lake records the LLM lineage, the key comes from the
    named environment variable (never from run config), ``--until`` stops after synthesis, and the same
    command again replays every answer from the response cache."""
    import dagster as dg

    from assets.cli import main
    from cowork_pipeline.lake import Lake, LakeError

    llm.responder, llm.delay_s = prose_then_good(good_doc), 0.2
    # The user's own catalog, with a capability only a model can draft (no embedded composer).
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    own = (CATALOG_DIR / "invoice_reconcile.yaml").read_text()
    assert "\ncomposer: invoice_reconcile\n" in own
    (catalog / "invoice_reconcile.yaml").write_text(own.replace("\ncomposer: invoice_reconcile\n", "\n"))
    home = tmp_path / "home"
    monkeypatch.setenv("COWORK_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    monkeypatch.setenv("COWORK_TEST_LLM_KEY", "sk-from-env")
    argv = ["--home", str(home), "run", "--profile", "smoke", "--catalog", str(catalog), "--envs-per-capability", "3",
            "--until", "validated_environments", "--generator", "llm", "--base-url", f"http://127.0.0.1:{llm.port}/v1",
            "--model", MODEL, "--api-key-env", "COWORK_TEST_LLM_KEY", "--concurrency", "2"]
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert len(llm.requests) == 5 and llm.max_in_flight == 2  # 3 drafts + 2 revisions
    assert {r["headers"]["authorization"] for r in llm.requests} == {"Bearer sk-from-env"}
    assert {r["body"]["model"] for r in llm.requests} == {MODEL}

    lake = Lake(str(home / "lake"))
    specs, _ = lake.read_promoted("capability_specs")
    assert specs["capability_id"].to_list() == ["invoice_reconcile"] and specs["composer"].to_list() == [None]
    envs, _ = lake.read_promoted("validated_environments")
    assert sorted(envs["env_id"]) == [f"invoice_reconcile-00000{i}" for i in range(3)]
    assert set(envs["generator_backend"]) == {"llm"} and set(envs["kill_rate"]) == {1.0}
    log, _ = lake.read_promoted("repair_log")
    rows = {r["attempt_id"]: r for r in log.to_dicts()}
    assert sorted(rows) == [f"invoice_reconcile-{a}" for a in ("s0-a0", "s0-a1", "s1-a0", "s2-a0", "s2-a1")]
    assert rows["invoice_reconcile-s0-a0"]["codes"] == ["unparseable_output"] and rows["invoice_reconcile-s0-a1"]["certified"]
    assert all(r["llm_tokens"] == 1500 and r["backend"] == "llm" for r in rows.values())
    drafts, _ = lake.read_promoted("environment_drafts")
    first = drafts.filter(drafts["attempt_id"] == "invoice_reconcile-s0-a0").to_dicts()[0]
    assert first["raw"].startswith("I would build a CRM world")
    # The prompt is stored with the draft it produced, exactly as sent (and hashed), and what it cost.
    knobs = json.loads(first["knobs_json"])
    sent = next(r["body"]["messages"] for r in llm.requests if r["body"]["seed"] == 0 and len(r["body"]["messages"]) == 2)
    assert knobs["prompt"] == sent and knobs["prompt_sha256"] == prompt_sha256(sent)
    assert knobs["prompt_version"] == "generate_v26" and knobs["model"] == MODEL and "sk-from-env" not in first["knobs_json"]
    assert json.loads(first["cost_json"])["llm_tokens"] == 1500

    # --until: synthesis only; nothing downstream ran or is summarized.
    assert "synthesize[invoice_reconcile]" in out and "environment_splits" not in out and "benchmark" not in out
    with pytest.raises(LakeError, match="environment_splits"):
        lake.read_promoted("environment_splits")
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    runs = instance.get_runs()
    assert runs and all("sk-from-env" not in json.dumps(r.run_config, default=str) + json.dumps(r.tags) for r in runs)

    # Lineage of an attempt names the prompt (hash as sent) and the model behind it.
    assert main(["--home", str(home), "lineage", "invoice_reconcile-s0-a0", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    assert tree["kind"] == "attempt" and tree["code_version"] == f"llm-2/{MODEL}/v26+{VALIDATOR_VERSION}"
    draft = tree["attrs"]["draft"]
    assert (draft["model"], draft["prompt_version"], draft["prompt_sha256"], draft["cache_hit"]) == (
        MODEL, "generate_v26", prompt_sha256(sent), False)

    # The partition records the generator that drafted it (model and prompt version included): the nightly
    # schedule and the catalog sensor, configured with this generator, leave it alone; with the embedded one,
    # or another model, it is stale.
    from assets.automation import SYNTH_CODE_VERSION, partition_states, plan_regeneration, published_fingerprints
    from resources import GeneratorResource

    ours = GeneratorResource(backend="llm", base_url=f"http://127.0.0.1:{llm.port}/v1", model=MODEL).code_version()
    assert ours == f"llm-2/{MODEL}/v26+{VALIDATOR_VERSION}"
    states, published = partition_states(lake), published_fingerprints(lake)
    assert states["invoice_reconcile"].code_version == ours
    assert plan_regeneration(["invoice_reconcile"], published, states, code_version=ours).selection == {}
    for other in (SYNTH_CODE_VERSION, GeneratorResource(backend="llm", base_url="http://127.0.0.1:1/v1", model="other").code_version()):
        assert plan_regeneration(["invoice_reconcile"], published, states, code_version=other).selection == {
            "invoice_reconcile": f"code version {ours} -> {other}"}

    # The same command again: every answer comes from <home>/llm-cache, the same environments are promoted.
    assert main(argv) == 0
    assert len(llm.requests) == 5 and len(list((home / "llm-cache").rglob("*.json"))) == 5
    again, _ = lake.read_promoted("validated_environments")
    assert again.sort("env_id")["spec_hash"].to_list() == envs.sort("env_id")["spec_hash"].to_list()
    log, _ = lake.read_promoted("repair_log")
    assert log["llm_tokens"].sum() == 0 and len(log) == 5


def test_cowork_run_rejects_bad_options_before_running(tmp_path, monkeypatch, capsys):
    from assets.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("COWORK_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "broken.yaml").write_text("id: broken\ntitle: [unclosed\n")

    def run(*argv: str) -> tuple[int, str]:
        try:
            rc = main(["--home", str(home), "run", *argv])
        except SystemExit as e:  # argparse errors
            rc = int(e.code or 0)
        cap = capsys.readouterr()
        return rc, cap.out + cap.err

    rc, err = run("--catalog", str(catalog))
    assert rc == 2 and "broken.yaml:3: invalid YAML" in err, err  # file and line
    (catalog / "broken.yaml").unlink()
    own = (CATALOG_DIR / "invoice_reconcile.yaml").read_text()
    (catalog / "model_only.yaml").write_text(own.replace("id: invoice_reconcile", "id: model_only").replace("\ncomposer: invoice_reconcile\n", "\n"))
    rc, err = run("--catalog", str(catalog))
    assert rc == 2 and "'model_only' has no embedded composer: draft it with an LLM generator" in err, err
    rc, err = run("--capabilities", "invoice_reconcile,no_such_capability")
    assert rc == 2 and "unknown capabilities no_such_capability" in err and "invoice_reconcile" in err
    rc, err = run("--generator", "llm", "--model", MODEL)
    assert rc == 2 and "needs --base-url and --model" in err
    rc, err = run("--generator", "llm", "--base-url", "127.0.0.1:8000/v1", "--model", MODEL)
    assert rc == 2 and "must be an http(s) URL" in err
    rc, err = run("--base-url", "http://127.0.0.1:8000/v1")
    assert rc == 2 and "for --generator llm" in err
    rc, err = run("--repair-rounds", "-1")
    assert rc == 2 and "--repair-rounds must be at least 0" in err
    rc, err = run("--student-seed", "-2")
    assert rc == 2 and "--student-seed must be at least 0" in err
    rc, err = run("--until", "everything")
    assert rc == 2 and "invalid choice" in err
    rc, err = run("--injections", "most")
    assert rc == 2 and "argument --injections: invalid choice: 'most'" in err and "'some'" in err, err
    assert not (home / "lake").exists()  # nothing was written


def test_cowork_ui_hands_its_generator_to_the_code_location(tmp_path):
    """`cowork ui --generator llm ...`: the code location (another process, as `dagster dev` starts it)
    builds its definitions with that generator, so launched runs, the sensors and the schedule use it, and
    the synthesis assets' code version is that generator's (declarative automation sees a switch)."""
    import subprocess
    import sys

    from assets.cli import parse_args, ui_environment

    home = tmp_path / "home"
    args = parse_args(["--home", str(home), "ui", "--generator", "llm", "--base-url", "http://127.0.0.1:9/v1", "--model", MODEL,
                       "--api-key-env", "MY_KEY", "--concurrency", "5", "--no-llm-cache"])
    env = ui_environment(args)
    probe = ("import json\nfrom assets.definitions import defs\ng = defs.resources['generator']\nb = g.build()\n"
             "a = defs.resolve_assets_def('validated_environments')\n"
             "print(json.dumps([g.backend, b.url, b.model, b.concurrency, b.cache is None, g.api_key_env,\n"
             "                  [v for k, v in a.code_versions_by_key.items() if k.to_user_string() == 'validated_environments']]))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["llm", "http://127.0.0.1:9/v1/chat/completions", MODEL, 5, True, "MY_KEY",
                                                               [f"llm-2/{MODEL}/v26+{VALIDATOR_VERSION}"]]  # the asset's code version too
    assert env["COWORK_HOME"] == str(home) and env["COWORK_LAKE"] == os.environ.get("COWORK_LAKE", str(home / "lake"))

    # Without generator flags the code location keeps the embedded default; a bad URL never starts it.
    plain = ui_environment(parse_args(["--home", str(home), "ui"]))
    assert plain["COWORK_GENERATOR"] == "embedded"
    with pytest.raises(ValueError, match="must be an http"):
        ui_environment(parse_args(["--home", str(home), "ui", "--generator", "llm", "--base-url", "nope", "--model", MODEL]))


def test_cowork_ui_hands_its_catalog_and_injections_to_the_code_location(tmp_path):
    """`cowork ui --catalog DIR --injections some`: the code location's profile reads that catalog and plants
    instructions, so runs launched from the UI, the catalog sensor and the schedule draft as `cowork run` with the
    same flags does; without them it keeps the shipped catalog and each file's own knob."""
    import subprocess
    import sys

    from assets.cli import parse_args, ui_environment
    from resources import ProfileResource

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "invoice_reconcile.yaml").write_text((CATALOG_DIR / "invoice_reconcile.yaml").read_text())
    env = ui_environment(parse_args(["--home", str(tmp_path / "home"), "ui", "--catalog", str(catalog), "--injections", "some"]))
    probe = ("import json\nfrom assets.definitions import defs\np = defs.resources['profile']\n"
             "print(json.dumps([p.catalog_dir, p.injections, p.injections_range()]))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [str(catalog), "some", [0, 1]]
    plain = ProfileResource.from_env(ui_environment(parse_args(["--home", str(tmp_path / "home"), "ui"])))
    assert (plain.catalog_dir, plain.injections, plain.injections_range()) == ("", "", None)
    with pytest.raises(ValueError, match="unknown injections setting 'most'"):
        ProfileResource.from_env({"COWORK_INJECTIONS": "most"})


def test_generator_resource_passes_every_option_to_the_backend(tmp_path, monkeypatch):
    from resources import GeneratorResource

    monkeypatch.setenv("MY_KEY", "sk-env")
    g = GeneratorResource(backend="llm", base_url="http://127.0.0.1:9/v1", model=MODEL, api_key_env="MY_KEY", concurrency=3,
                          temperature=0.7, timeout_s=30, max_retries=5, max_tokens=2048, json_mode=False, cache_dir=str(tmp_path))
    b = g.build()
    assert (b.api_key, b.concurrency, b.temperature, b.timeout_s, b.max_retries, b.max_tokens, b.json_mode) == (
        "sk-env", 3, 0.7, 30, 5, 2048, False)
    assert b.cache is not None and b.cache.folder == tmp_path
    assert GeneratorResource(backend="llm", base_url="http://127.0.0.1:9/v1", model=MODEL, api_key="sk-explicit").build().api_key == "sk-explicit"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert GeneratorResource(backend="llm", base_url="http://127.0.0.1:9/v1", model=MODEL, response_cache=False).build().api_key is None
    with pytest.raises(ValueError, match="needs base_url and model"):
        GeneratorResource(backend="llm", model=MODEL).build()
    with pytest.raises(ValueError, match="unknown generator backend"):
        GeneratorResource(backend="gpt").build()
    with pytest.raises(ValueError, match="COWORK_LLM_CONCURRENCY"):
        GeneratorResource.from_env({"COWORK_GENERATOR": "llm", "COWORK_LLM_CONCURRENCY": "many"})
