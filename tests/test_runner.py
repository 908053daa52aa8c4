"""The episode runner: evidence channels, seeded faults, world events between turns, limits,
and agents that misbehave (none of which may crash the runner)."""
from __future__ import annotations

import copy
import json
from typing import Any, Sequence

import pytest

from cowork_pipeline.agents.base import assistant_message, tool_call
from cowork_pipeline.agents.program import ProgramAgent
from cowork_pipeline.runner import Limits, Trajectory, run_episode
from cowork_pipeline.services import FaultConfig, Workspace
from cowork_pipeline.services.workspace import FAULT_KINDS, META
from cowork_pipeline.spec import EnvironmentSpec, Event, GeneratorInfo, ProgramTurn, Step, Turn

ME = "alex@northwind.example"
BOB = "bob@globex.example"

WORLD: dict[str, dict[str, dict[str, Any]]] = {
    META: {"profile": {"name": "Alex Morgan", "email": ME, "timezone": "UTC"}},
    "crm.accounts": {"acc_1": {"id": "acc_1", "name": "Globex", "domain": "globex.example", "industry": "x", "owner": ME, "tier": "gold"}},
    "crm.invoices": {"inv_1": {"id": "inv_1", "account_id": "acc_1", "number": "INV-1001", "amount": 1200.0, "status": "open",
                               "due_date": "2026-03-30", "history": []}},
    "mail.messages": {"msg_old": {"id": "msg_old", "thread_id": "thr_old", "folder": "inbox", "from": BOB, "to": [ME], "cc": [],
                                  "subject": "Hello", "body": "Intro", "date": "2026-02-01T08:00:00Z", "read": True, "labels": [],
                                  "attachments": [], "in_reply_to": None}},
    "tasks.tasks": {
        "task_1": {"id": "task_1", "title": "Fix invoice", "assignee": ME, "due": None, "status": "todo", "priority": "high",
                   "notes": "", "related": "inv_1"},
        "task_2": {"id": "task_2", "title": "Obsolete", "assignee": ME, "due": None, "status": "todo", "priority": "low",
                   "notes": "", "related": None},
    },
    "chat.channels": {"ch_1": {"id": "ch_1", "name": "general", "private": False, "archived": False}},
    "chat.messages": {},
}
TOOLS = ["crm_search_invoices", "crm_update_invoice", "mail_search", "mail_reply", "tasks_list", "tasks_delete", "chat_read_channel"]
PAYMENT = Event(tool="mail_deliver", actor="customer",
                args={"id": "msg_in1", "sender": BOB, "to": [ME], "subject": "Payment confirmation", "body": "Paid 1100 today"})
CHAT = Event(tool="chat_deliver", args={"id": "cm_1", "channel_id": "ch_1", "author": "carol@northwind.example", "text": "FYI"})

REFERENCE = [
    ProgramTurn(steps=[
        Step(tool="crm_search_invoices", args={"number": "INV-1001"}, bind={"inv": "0.id"}),
        Step(tool="crm_update_invoice", args={"invoice_id": {"$var": "inv"}, "amount": 1100.0}),
        Step(tool="tasks_delete", args={"task_id": "task_2"}),
        Step(tool="mail_search", args={"query": "payment confirmation"}),  # nothing yet
    ], reply="Invoice corrected."),
    ProgramTurn(steps=[
        Step(tool="mail_search", args={"query": "payment confirmation"}, bind={"m": "0.id"}),
        Step(tool="mail_reply", args={"message_id": {"$var": "m"}, "body": "Thanks, received."}),
    ], reply="Replied to Bob."),
]


def make_env(turns: list[Turn] | None = None, reference: list[ProgramTurn] | None = None, tools: list[str] | None = None) -> EnvironmentSpec:
    return EnvironmentSpec(
        env_id="env_test", capability_id="cap", seed=1, title="t", multi_turn=True,
        generator=GeneratorInfo(backend="hand", version="0"), system_prompt="You are a helpful coworker.",
        world=copy.deepcopy(WORLD), tools=tools or TOOLS,
        turns=turns if turns is not None else [Turn(user="Fix invoice INV-1001 to 1100."), Turn(user="Answer Bob.", events=[PAYMENT])],
        rubric=[], reference=reference if reference is not None else REFERENCE,
    )


def serializable(t: Trajectory) -> dict[str, Any]:
    d = t.to_dict()
    text = json.dumps(d)  # must not raise
    assert json.loads(text)["termination"] == t.termination
    return d


class Scripted:
    """Returns the given responses in order (anything at all), then a final text reply."""

    name = "scripted"

    def __init__(self, responses: Sequence[Any]):
        self.responses = list(responses)
        self.seen: list[list[dict[str, Any]]] = []

    def act(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> Any:
        self.seen.append(list(messages))
        if self.responses:
            r = self.responses.pop(0)
            if isinstance(r, BaseException):
                raise r
            return r
        return assistant_message("done")


class Looping:
    """Always calls a tool (``per_message`` calls per assistant message) and never answers."""

    name = "looping"

    def __init__(self, per_message: int = 1):
        self.per_message = per_message
        self.n = 0

    def act(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        calls = []
        for _ in range(self.per_message):
            calls.append(tool_call(f"c{self.n}", "tasks_list", {}))
            self.n += 1
        return assistant_message(None, calls)


# =======================================================================================
# Evidence channels
# =======================================================================================
@pytest.fixture(scope="module")
def traj() -> Trajectory:
    return run_episode(make_env(), ProgramAgent(REFERENCE))


def test_trace_messages_and_steps(traj: Trajectory) -> None:
    assert traj.termination == "completed" and traj.termination_detail == "" and traj.turns_completed == 2
    msgs = traj.messages
    assert msgs[0] == {"role": "system", "content": "You are a helpful coworker."}
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["Fix invoice INV-1001 to 1100.", "Answer Bob."]
    # every tool call is answered by a tool message with its id and name, in order
    pending: list[tuple[str, str]] = []
    for m in msgs[1:]:
        if m["role"] == "assistant":
            assert not pending
            pending = [(c["id"], c["function"]["name"]) for c in m.get("tool_calls") or []]
        elif m["role"] == "tool":
            assert (m["tool_call_id"], m["name"]) == pending.pop(0)
            json.loads(m["content"])
    assert [s["tool"] for s in traj.steps] == [s.tool for pt in REFERENCE for s in pt.steps]
    assert [s["turn"] for s in traj.steps] == [0, 0, 0, 0, 1, 1]
    for s in traj.steps:
        assert set(s) == {"turn", "call_id", "tool", "args", "ok", "error", "fault", "seconds"}
        assert s["ok"] and s["error"] is None and s["fault"] is None and s["seconds"] >= 0
    assert traj.steps[1]["args"] == {"invoice_id": "inv_1", "amount": 1100.0}  # bound from the observed search result
    assert traj.replies == ["Invoice corrected.", "Replied to Bob."]
    assert traj.agent == "program" and traj.env_id == "env_test" and traj.seconds > 0


def test_audit_per_service_includes_world_events(traj: Trajectory) -> None:
    assert len(traj.audit) == len(traj.steps) + 1
    assert [e["seq"] for e in traj.audit] == list(range(len(traj.audit)))
    by = traj.audit_by_service()
    assert set(by) == {"crm", "mail", "tasks"}
    assert [e["tool"] for e in by["crm"]] == ["crm_search_invoices", "crm_update_invoice"]
    event = next(e for e in traj.audit if e["tool"] == "mail_deliver")
    assert (event["actor"], event["turn"], event["service"], event["ok"]) == ("customer", 1, "mail", True)
    assert event["args"]["subject"] == "Payment confirmation"
    assert all(e["actor"] == "agent" for e in traj.audit if e is not event)
    update = by["crm"][1]
    assert update["args"] == {"invoice_id": "inv_1", "amount": 1100.0} and update["result"]["amount"] == 1100.0
    assert traj.turn_ends == [4, 7]


def test_snapshots_and_structural_diff(traj: Trajectory) -> None:
    assert "msg_in1" not in traj.initial_state["mail.messages"] and "task_2" in traj.initial_state["tasks.tasks"]
    assert traj.initial_state["crm.invoices"]["inv_1"]["amount"] == 1200.0
    assert "msg_in1" in traj.final_state["mail.messages"] and "task_2" not in traj.final_state["tasks.tasks"]
    d = traj.diff
    assert set(d) == {"crm.invoices", "mail.messages", "tasks.tasks"}
    assert d["crm.invoices"]["changed"]["inv_1"]["amount"] == [1200.0, 1100.0]
    hist_old, hist_new = d["crm.invoices"]["changed"]["inv_1"]["history"]
    assert hist_old == [] and (hist_new[0]["old"], hist_new[0]["new"]) == (1200.0, 1100.0)
    assert list(d["tasks.tasks"]["removed"]) == ["task_2"] and d["tasks.tasks"]["added"] == {}
    added = d["mail.messages"]["added"]
    assert set(added) == {"msg_in1", "msg_0001"}
    reply = added["msg_0001"]
    assert (reply["in_reply_to"], reply["to"], reply["folder"]) == ("msg_in1", [BOB], "sent")
    assert d["mail.messages"]["removed"] == {} and d["mail.messages"]["changed"] == {}
    # the initial snapshot is the spec's world, untouched by the episode
    assert {c: r for c, r in traj.initial_state.items() if c != META} == {c: r for c, r in WORLD.items() if c != META}


def test_evidence_per_turn(traj: Trajectory) -> None:
    ev0, ev1, ev = traj.evidence(0), traj.evidence(1), traj.evidence()
    assert set(ev) == {"final", "diff", "audit", "replies", "turn_ends", "profile", "completed"}
    assert set(ev0) == set(ev)
    assert ev["completed"] and ev0["completed"] and ev1["completed"]
    assert ev0["profile"]["email"] == ME
    # the payment mail arrives before turn 1: not part of turn 0's evidence
    assert "mail_deliver" not in [e["tool"] for e in ev0["audit"]] and len(ev0["audit"]) == 4
    assert "mail.messages" not in ev0["diff"] and "msg_in1" not in ev0["final"]["mail.messages"]
    assert ev0["final"]["crm.invoices"]["inv_1"]["amount"] == 1100.0 and "task_2" not in ev0["final"]["tasks.tasks"]
    assert ev0["replies"] == ["Invoice corrected."] and ev0["turn_ends"] == [4]
    assert "msg_in1" in ev1["final"]["mail.messages"] and len(ev1["audit"]) == 7
    # the state rebuilt from the last turn's diff is the final state
    assert {c: r for c, r in ev1["final"].items() if c != META} == {c: r for c, r in traj.final_state.items() if c != META}
    json.dumps(ev0)
    json.dumps(ev1)


def test_trajectory_is_json_serializable(traj: Trajectory) -> None:
    d = serializable(traj)
    assert d["steps"][0]["tool"] == "crm_search_invoices" and d["diff"] == json.loads(json.dumps(traj.diff))


# =======================================================================================
# World events between turns
# =======================================================================================
def test_world_event_is_visible_in_turn_two_only(traj: Trajectory) -> None:
    tool_msgs = [m for m in traj.messages if m["role"] == "tool" and m["name"] == "mail_search"]
    assert len(tool_msgs) == 2
    assert json.loads(tool_msgs[0]["content"]) == []  # turn 0: not delivered yet
    seen = json.loads(tool_msgs[1]["content"])
    assert [m["id"] for m in seen] == ["msg_in1"] and seen[0]["read"] is False


def test_events_of_several_services_and_their_order() -> None:
    env = make_env(turns=[Turn(user="a"), Turn(user="b", events=[CHAT, PAYMENT])],
                   reference=[ProgramTurn(reply="ok"), ProgramTurn(steps=[Step(tool="chat_read_channel", args={"channel_id": "ch_1"})])])
    t = run_episode(env, ProgramAgent(env.reference))
    assert t.termination == "completed"
    assert [(e["tool"], e["actor"], e["turn"]) for e in t.audit] == [
        ("chat_deliver", "world", 1), ("mail_deliver", "customer", 1), ("chat_read_channel", "agent", 1)]
    assert json.loads(t.messages[-2]["content"])[0]["text"] == "FYI"
    assert t.evidence(0)["diff"] == {} and set(t.evidence(1)["diff"]) == {"chat.messages", "mail.messages"}


@pytest.mark.parametrize("event", [
    Event(tool="chat_deliver", args={"id": "cm_1", "channel_id": "ch_nope", "author": "x@y.example", "text": "t"}),
    Event(tool="mail_deliver", args=PAYMENT.args, actor="agent"),  # hidden tools are refused to the agent actor
    Event(tool="no_such_event", args={}),
])
def test_failing_world_event_ends_the_episode(event: Event) -> None:
    env = make_env(turns=[Turn(user="a"), Turn(user="b", events=[event]), Turn(user="c")],
                   reference=[ProgramTurn(reply="one"), ProgramTurn(reply="two"), ProgramTurn(reply="three")])
    t = run_episode(env, ProgramAgent(env.reference))
    assert t.termination == "event_failed" and event.tool in t.termination_detail
    assert t.turns_completed == 1 and t.replies == ["one"]
    assert t.evidence(0)["completed"] and not t.evidence()["completed"]
    serializable(t)


# =======================================================================================
# Seeded transient faults
# =======================================================================================
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("tasks_list", {}), ("crm_search_invoices", {"number": "INV-1001"}), ("mail_search", {"query": "hello"}),
    ("tasks_complete", {"task_id": "task_1"}), ("crm_update_invoice", {"invoice_id": "inv_1", "note": "checked"}),
    ("mail_read", {"message_id": "msg_old"}), ("tasks_list", {"status": "bogus"}), ("chat_read_channel", {"channel_id": "ch_1"}),
] * 12


def run_calls(faults: FaultConfig, actor: str = "agent") -> Workspace:
    ws = Workspace(WORLD, faults)
    for name, args in CALLS:
        ws.call(name, args, actor)
    return ws


def test_same_seed_same_faults_different_seed_different() -> None:
    a = run_calls(FaultConfig(rate=0.3, seed=7)).faults_injected
    b = run_calls(FaultConfig(rate=0.3, seed=7)).faults_injected
    c = run_calls(FaultConfig(rate=0.3, seed=8)).faults_injected
    assert a == b and len(a) > 5
    assert a != c
    assert {f["kind"] for f in a} <= set(FAULT_KINDS) and len({f["kind"] for f in a}) > 1
    assert run_calls(FaultConfig(rate=0.0, seed=7)).faults_injected == []
    assert run_calls(FaultConfig()).faults_injected == []


def test_fault_sequence_depends_only_on_seed_and_call_index() -> None:
    """Different (valid or invalid) arguments draw the same faults at the same positions."""
    ws1, ws2 = Workspace(WORLD, FaultConfig(rate=0.4, seed=3)), Workspace(WORLD, FaultConfig(rate=0.4, seed=3))
    for i in range(60):
        ws1.call("tasks_list", {})
        ws2.call("mail_search", {"limit": -1} if i % 2 else {"query": "x"})
    assert [f["seq"] for f in ws1.faults_injected] == [f["seq"] for f in ws2.faults_injected]
    assert [f["kind"] for f in ws1.faults_injected] == [f["kind"] for f in ws2.faults_injected]


def test_faulted_calls_change_nothing() -> None:
    ws = Workspace(WORLD, FaultConfig(rate=0.5, seed=11))
    n_faults = 0
    for name, args in CALLS:
        before, clock = ws.state(), ws.now()
        res = ws.call(name, args)
        if res.fault is not None:
            n_faults += 1
            assert ws.state() == before and ws.now() == clock
            assert not res.ok and res.error["type"] == res.fault and "retry" in res.error["message"]
            entry = ws.audit[-1]
            assert entry["fault"] == res.fault and entry["ok"] is False and "result" not in entry
            assert json.loads(res.content()) == {"error": res.error}
    assert n_faults > 10
    assert n_faults == len(ws.faults_injected)


@pytest.mark.parametrize("max_consecutive", [0, 1, 2, 3])
def test_max_consecutive_respected(max_consecutive: int) -> None:
    ws = Workspace(WORLD, FaultConfig(rate=0.95, seed=5, max_consecutive=max_consecutive))
    longest = run = 0
    for _ in range(300):
        res = ws.call("tasks_list", {})
        run = run + 1 if res.fault else 0
        longest = max(longest, run)
    assert longest == max_consecutive  # reached (rate 0.95) but never exceeded


def test_fault_kinds_and_config_validation() -> None:
    ws = run_calls(FaultConfig(rate=0.5, seed=1, kinds=("timeout",)))
    assert ws.faults_injected and {f["kind"] for f in ws.faults_injected} == {"timeout"}
    for bad in (dict(rate=1.0), dict(rate=-0.1), dict(kinds=("boom",)), dict(kinds=())):
        with pytest.raises(ValueError):
            FaultConfig(**bad)  # type: ignore[arg-type]


def test_world_events_are_never_faulted() -> None:
    assert run_calls(FaultConfig(rate=0.9, seed=2), actor="world").faults_injected == []


def test_restore_resets_the_fault_sequence() -> None:
    ws = Workspace(WORLD, FaultConfig(rate=0.3, seed=4))
    snap = ws.snapshot()
    for name, args in CALLS:
        ws.call(name, args)
    first = list(ws.faults_injected)
    ws.restore(snap)
    for name, args in CALLS:
        ws.call(name, args)
    assert ws.faults_injected == first
    ws.restore(snap, faults=FaultConfig(rate=0.3, seed=99))
    for name, args in CALLS:
        ws.call(name, args)
    assert ws.faults_injected != first


def test_program_agent_completes_under_faults() -> None:
    clean = run_episode(make_env(), ProgramAgent(REFERENCE))
    agent = ProgramAgent(REFERENCE)  # one instance serves every episode
    total_faults = 0
    for seed in range(20):
        t = run_episode(make_env(), agent, faults=FaultConfig(rate=0.3, seed=seed))
        assert t.termination == "completed", (seed, t.termination_detail)
        assert t.diff == clean.diff, seed  # faulted calls change nothing, retries converge to the same world
        assert t.replies == clean.replies
        assert (t.fault_rate, t.fault_seed) == (0.3, seed)
        assert len(t.steps) == len(clean.steps) + len(t.faults)
        assert all(s["fault"] in FAULT_KINDS for s in t.steps if not s["ok"])
        total_faults += len(t.faults)
        serializable(t)
    assert total_faults > 20


def test_same_seed_same_episode() -> None:
    a = run_episode(make_env(), ProgramAgent(REFERENCE), faults=FaultConfig(rate=0.3, seed=3))
    b = run_episode(make_env(), ProgramAgent(REFERENCE), faults=FaultConfig(rate=0.3, seed=3))
    assert a.faults == b.faults and a.messages == b.messages and a.audit == b.audit and a.faults


# =======================================================================================
# Limits
# =======================================================================================
def test_step_limit() -> None:
    t = run_episode(make_env(), Looping(), limits=Limits(max_steps_per_turn=5, max_repeated_calls=None))
    assert t.termination == "max_steps" and "step limit 5" in t.termination_detail
    assert len(t.steps) == 5 and t.replies == [None] and t.turn_ends == [5]
    assert t.turns_completed == 0 and not t.evidence(0)["completed"] and not t.evidence()["completed"]
    assert [m["role"] for m in t.messages].count("assistant") == 5
    serializable(t)


def test_tool_call_limit() -> None:
    t = run_episode(make_env(), Looping(per_message=3), limits=Limits(max_tool_calls=7, max_repeated_calls=None))
    assert t.termination == "max_tool_calls" and "tool call limit 7" in t.termination_detail
    assert len(t.steps) == 7 and len(t.audit) == 7 and t.turns_completed == 0
    serializable(t)


def test_repeated_call_ends_episode_as_stuck() -> None:
    t = run_episode(make_env(), Looping())  # default limits: 3 identical calls per turn
    assert t.termination == "stuck" and "repeated more than 3 times" in t.termination_detail
    assert "tasks_list {}" in t.termination_detail
    assert len(t.steps) == 3 and len(t.audit) == 3 and t.turns_completed == 0 and t.replies == [None]
    serializable(t)


def test_repeat_count_is_per_call_and_per_turn_and_skips_faults() -> None:
    class Varying(Looping):
        def act(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
            self.n += 1
            if self.n > 8:
                return assistant_message("done")
            # Two different calls alternating: each with its own arguments, made 4 times apiece.
            return assistant_message(None, [tool_call(f"c{self.n}", "tasks_list", {"status": "todo" if self.n % 2 else "done"})])

    t = run_episode(make_env(), Varying(), limits=Limits(max_repeated_calls=4))
    assert t.termination == "completed" and len(t.steps) == 8
    t = run_episode(make_env(), Varying(), limits=Limits(max_repeated_calls=3))
    assert t.termination == "stuck" and len(t.steps) == 6  # the 4th "todo" call (7th call) is not run

    # Faulted attempts are retries, not repeats: a high fault rate lets the same call run more than 3 times.
    t = run_episode(make_env(), Looping(), faults=FaultConfig(rate=0.5, seed=1))
    assert t.termination == "stuck"
    assert len(t.steps) == 3 + len(t.faults) and t.faults


def test_turn_limit() -> None:
    env = make_env(turns=[Turn(user="a"), Turn(user="b"), Turn(user="c")],
                   reference=[ProgramTurn(reply="one"), ProgramTurn(reply="two"), ProgramTurn(reply="three")])
    t = run_episode(env, ProgramAgent(env.reference), limits=Limits(max_turns=2))
    assert t.termination == "max_turns" and "turn limit 2" in t.termination_detail
    assert t.replies == ["one", "two"] and t.turns_completed == 2
    assert t.evidence(1)["completed"] and not t.evidence()["completed"]
    serializable(t)


def test_limit_in_second_turn_keeps_first_turn_evidence() -> None:
    class FirstThenLoop(Looping):
        def act(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
            if sum(m["role"] == "user" for m in messages) == 1:
                return assistant_message("first turn done")
            return super().act(messages, tools)

    t = run_episode(make_env(), FirstThenLoop(), limits=Limits(max_steps_per_turn=3, max_repeated_calls=None))
    assert t.termination == "max_steps" and "turn 1" in t.termination_detail
    assert t.turns_completed == 1 and t.replies == ["first turn done", None]
    assert t.evidence(0)["completed"] and not t.evidence(1)["completed"]
    assert t.evidence(0)["audit"] == [] and len(t.evidence(1)["audit"]) == 4  # the event + 3 calls


def test_user_ends_conversation_early() -> None:
    env = make_env(turns=[Turn(user="a"), Turn(user=""), Turn(user="c")],
                   reference=[ProgramTurn(reply="one"), ProgramTurn(reply="two"), ProgramTurn(reply="three")])
    t = run_episode(env, ProgramAgent(env.reference))
    assert t.termination == "completed" and t.turns_completed == 1 and t.replies == ["one"]


# =======================================================================================
# Agents that misbehave
# =======================================================================================
def _call(name: Any = "tasks_list", arguments: Any = "{}", call_id: Any = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("response", ["plain text instead of a message", None, 42, ["a", "list"], {"no": "role"}],
                         ids=["str", "none", "int", "list", "dict-without-content"])
def test_non_message_responses_are_recorded_not_raised(response: Any) -> None:
    t = run_episode(make_env(), Scripted([response]))
    assert t.termination == "completed"
    first = t.messages[2]
    assert first["role"] == "assistant"
    if not isinstance(response, dict):
        assert "parse_error" in first and first["content"] == str(response)
    serializable(t)


@pytest.mark.parametrize("bad_call,expect", [
    (_call(arguments="{not json"), "not valid JSON"),
    (_call(arguments="[1, 2]"), "must be a JSON object"),
    (_call(arguments="null"), "must be a JSON object"),
    (_call(arguments=""), None),  # empty arguments mean {}
    (_call(arguments=7), "not valid JSON"),
    (_call(name=None), "no function name"),
    (_call(name=""), "no function name"),
    ({"id": "c1", "type": "function", "function": "tasks_list"}, "no function name"),
    ({"id": "c1", "type": "function"}, "no function name"),
    ("tasks_list()", "not an object"),
    (_call(name="no_such_tool"), "unknown tool"),
    (_call(name="mail_deliver", arguments=json.dumps(PAYMENT.args)), "unknown tool"),  # hidden from agents
    (_call(arguments='{"status": "blocked"}'), "must be one of"),
    (_call(arguments={"status": "todo"}), None),  # already-parsed arguments are accepted
    (_call(call_id=None), None),
])
def test_malformed_tool_calls_become_tool_errors(bad_call: Any, expect: str | None) -> None:
    agent = Scripted([assistant_message(None, [bad_call])])
    t = run_episode(make_env(), agent)
    assert t.termination == "completed" and len(t.steps) == 1
    step, tool_msg = t.steps[0], t.messages[3]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == step["call_id"]
    payload = json.loads(tool_msg["content"])
    if expect is None:
        assert step["ok"] and isinstance(payload, list)
    else:
        assert not step["ok"] and expect in step["error"]["message"] and payload["error"] == step["error"]
    assert agent.seen[1][-1] == tool_msg  # the agent gets to see the error and carry on
    serializable(t)


def test_tool_not_offered_by_the_task_is_refused() -> None:
    """docs_read exists, but this task does not expose it: refused before reaching the workspace."""
    t = run_episode(make_env(), Scripted([assistant_message(None, [_call(name="docs_read", arguments='{"doc_id": "d"}')])]))
    assert t.termination == "completed" and not t.steps[0]["ok"] and "unknown tool" in t.steps[0]["error"]["message"]
    assert [e["tool"] for e in t.audit] == ["mail_deliver"]  # only the world event of turn 1 reached the workspace


@pytest.mark.parametrize("tool_calls", ["abc", {"a": 1}, [None, 3], 5], ids=["str", "dict", "junk-items", "int"])
def test_tool_calls_of_the_wrong_shape(tool_calls: Any) -> None:
    t = run_episode(make_env(), Scripted([{"role": "assistant", "content": None, "tool_calls": tool_calls}]))
    assert t.termination in {"completed", "agent_error"}
    assert all(not s["ok"] for s in t.steps)
    serializable(t)


def test_exception_in_act_is_recorded() -> None:
    agent = Scripted([assistant_message(None, [tool_call("c1", "tasks_list", {})]), RuntimeError("endpoint down")])
    t = run_episode(make_env(), agent)
    assert t.termination == "agent_error" and t.termination_detail == "RuntimeError: endpoint down"
    assert len(t.steps) == 1 and t.steps[0]["ok"] and t.turns_completed == 0
    assert t.replies == [None] and t.turn_ends == [1]
    serializable(t)


def test_program_agent_reports_unbound_variable() -> None:
    program = [ProgramTurn(steps=[Step(tool="crm_search_invoices", args={"number": "INV-9999"}, bind={"inv": "0.id"}),
                                  Step(tool="crm_update_invoice", args={"invoice_id": {"$var": "inv"}, "amount": 1.0})])]
    env = make_env(turns=[Turn(user="fix it")], reference=program)
    t = run_episode(env, ProgramAgent(program))
    assert t.termination == "completed" and len(t.steps) == 1
    assert "unbound variable 'inv'" in t.replies[0]


# ---------------------------------------------------------------------------------
# Checkpoints: a mutant resumes from the reference's state at the step it changes
# ---------------------------------------------------------------------------------


def _comparable(t: Trajectory) -> dict[str, Any]:
    d = t.to_dict()
    d.pop("seconds")
    d.pop("agent")
    for s in d["steps"]:
        s.pop("seconds")
    return d


def test_resumed_mutants_equal_full_runs() -> None:
    """Every mutant of drafts of every capability (multi-turn ones included): resumed from the
    reference's checkpoint, the trajectory is the one a run from the start gives."""
    from cowork_pipeline.capabilities import load_catalog
    from cowork_pipeline.synthesis.embedded import EmbeddedBackend
    from cowork_pipeline.validation.certify import _divergence
    from cowork_pipeline.validation.mutations import executed_program, mutants

    backend = EmbeddedBackend()
    resumed = 0
    for cap in sorted(load_catalog().values(), key=lambda c: c.id):
        for seed in (3, 4):
            spec = backend.draft(cap, seed).spec
            assert spec is not None
            cps: list[Any] = []
            ref = run_episode(spec, ProgramAgent(spec.reference, name="reference"), checkpoints=cps)
            if ref.termination != "completed" or not all(s["ok"] for s in ref.steps):
                continue
            # one checkpoint per act: every call, then the turn's reply
            assert len(cps) == sum(len(t) + 1 for t in executed_program(spec, ref)) == len(ref.steps) + len(ref.replies)
            at = {(c.turn, c.step): c for c in cps}
            base = executed_program(spec, ref)
            for m in mutants(spec, ref, seed=spec.seed):
                cp = at.get(_divergence(base, m, ref.replies))
                full = run_episode(spec, ProgramAgent(m.program, name="m"))
                part = run_episode(spec, ProgramAgent(m.program, name="m"), resume=cp)
                assert _comparable(part) == _comparable(full), (cap.id, seed, m.operator, m.description)
                resumed += cp is not None and cp.step + cp.turn > 0
    assert resumed > 100


def test_a_mutant_diverges_where_its_reply_differs_from_the_reference_s() -> None:
    """Same calls, another reply (the reference's turn ended with an apology, the mutant's program says it
    is done): the mutant resumes at that turn's reply act, not after it with the reference's reply."""
    from cowork_pipeline.validation.certify import _divergence
    from cowork_pipeline.validation.mutations import Mutant

    base = [[Step(tool="mail_search", args={"query": "x"})], [Step(tool="mail_read", args={"message_id": "m1"})]]
    m = Mutant("missing_step", "d", [ProgramTurn(steps=list(base[0]), reply="Done."), ProgramTurn(steps=[], reply="Done.")])
    assert _divergence(base, m) == (1, 0) == _divergence(base, m, ["Done.", "Done."])
    same = Mutant("extra_write", "d", [ProgramTurn(steps=list(base[0]), reply="Done."), ProgramTurn(steps=list(base[1]) + [Step(tool="mail_delete", args={"message_id": "m1"})], reply="Done.")])
    assert _divergence(base, same, ["I could not complete the request: unbound variable 't'", "Done."]) == (0, 1)
    assert _divergence(base, same, ["Done.", "Done."]) == (1, 1)


def test_checkpoints_refuse_faulted_episodes() -> None:
    with pytest.raises(ValueError, match="fault-free"):
        run_episode(make_env(), ProgramAgent(REFERENCE), faults=FaultConfig(rate=0.5, seed=1), checkpoints=[])
