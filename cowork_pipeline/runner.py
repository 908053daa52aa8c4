"""The episode runner: one agent, one environment, one trajectory with all its evidence.

Trustworthy benchmarks keep three evidence channels and so do we: the execution trace
(every message and tool call), an audit log per service (every call with arguments and
result, world events included) and state snapshots (initial, final and the structural
diff, plus the diff at the end of every turn for per-turn rewards).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Generator, Protocol, Sequence

from cowork_pipeline.agents.base import Agent, Message
from cowork_pipeline.services import FaultConfig, Workspace, diff_states, tools_for
from cowork_pipeline.spec import EnvironmentSpec

PROFILE_KEY = "profile"


@dataclass(frozen=True)
class Limits:
    max_steps_per_turn: int = 16  # assistant messages per user turn
    max_turns: int = 8
    max_tool_calls: int = 64  # per episode
    # A call repeated verbatim (same tool, same arguments) more than this many times in one turn, not counting
    # attempts that hit an injected fault, ends the episode as ``stuck``: a looping agent has stopped making
    # progress, and running it to the step limit only costs time (and repeats its writes). None: no limit.
    max_repeated_calls: int | None = 3


class UserSimulator(Protocol):
    def next_message(self, turn: int, env: EnvironmentSpec, ws: Workspace, messages: Sequence[Message]) -> str | None: ...


@dataclass(frozen=True)
class Checkpoint:
    """An episode as it stood when the agent was asked to act: enough to run the rest of it
    for an agent that would have acted identically so far (the validator's mutants share
    the reference's prefix). Lists are copies; the records in ``state`` are shared, as in
    every snapshot."""

    turn: int
    step: int  # agent messages already taken in this turn
    n_calls: int
    repeats: dict[str, int]
    messages: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    replies: list[str | None]
    turn_ends: list[int]
    turn_snaps: list[Any]
    initial: Any
    state: Any
    audit: list[dict[str, Any]]
    touched: dict[str, set[str]]  # ids written since ``initial`` (the workspace's journal)


class ScriptedUser:
    """Says the spec's user turns in order. A turn whose text is empty ends the conversation."""

    def next_message(self, turn: int, env: EnvironmentSpec, ws: Workspace, messages: Sequence[Message]) -> str | None:
        return env.turns[turn].user or None


@dataclass
class Trajectory:
    env_id: str
    agent: str
    fault_rate: float
    fault_seed: int
    messages: list[dict[str, Any]]
    steps: list[dict[str, Any]]  # one per tool call: turn, call_id, tool, args, ok, error, fault, seconds
    turns_completed: int
    termination: str  # completed | max_steps | max_turns | max_tool_calls | stuck | agent_error | event_failed
    termination_detail: str = ""
    faults: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    initial_state: dict[str, Any] = field(default_factory=dict)
    final_state: dict[str, Any] = field(default_factory=dict)
    diff: dict[str, Any] = field(default_factory=dict)
    turn_ends: list[int] = field(default_factory=list)  # audit length at the end of each turn
    turn_diffs: list[dict[str, Any]] = field(default_factory=list)  # diff(initial, state at end of turn i)
    replies: list[str | None] = field(default_factory=list)  # the agent's final message per turn
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def audit_by_service(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for e in self.audit:
            out.setdefault(e.get("service", "unknown"), []).append(e)
        return out

    def evidence(self, turn: int | None = None) -> dict[str, Any]:
        """What a checker sees. With ``turn``, the episode as it stood at the end of that turn."""
        if turn is None:
            return {"final": self.final_state, "diff": self.diff, "audit": self.audit, "replies": self.replies,
                    "turn_ends": self.turn_ends, "profile": self.initial_state.get("_meta", {}).get(PROFILE_KEY, {}),
                    "completed": self.termination == "completed"}
        end = self.turn_ends[turn] if turn < len(self.turn_ends) else len(self.audit)
        diff = self.turn_diffs[turn] if turn < len(self.turn_diffs) else self.diff
        return {"final": _apply(self.initial_state, diff), "diff": diff, "audit": self.audit[:end],
                "replies": self.replies[: turn + 1], "turn_ends": self.turn_ends[: turn + 1],
                "profile": self.initial_state.get("_meta", {}).get(PROFILE_KEY, {}), "completed": turn < self.turns_completed}


def _apply(initial: dict[str, Any], diff: dict[str, Any]) -> dict[str, Any]:
    out = dict(initial)  # collections the diff does not touch are shared, as in a snapshot
    for coll, d in diff.items():
        recs = out[coll] = dict(out.get(coll, {}))
        for k in d["removed"]:
            recs.pop(k, None)
        recs.update(d["added"])
        for k, fields in d["changed"].items():
            recs[k] = {**recs[k], **{f: new for f, (_old, new) in fields.items()}}
    return out


def build_workspace(env: EnvironmentSpec, faults: FaultConfig | None = None) -> Workspace:
    return Workspace(env.world, faults)


def run_episode(
    env: EnvironmentSpec,
    agent: Agent,
    *,
    faults: FaultConfig | None = None,
    limits: Limits = Limits(),
    user: UserSimulator | None = None,
    workspace: Workspace | None = None,
    checkpoints: list[Checkpoint] | None = None,
    resume: Checkpoint | None = None,
) -> Trajectory:
    """Run ``agent`` on ``env``. Never raises for agent or tool misbehaviour: the reason is recorded.
    ``checkpoints`` / ``resume``: see :func:`episode`."""
    name = getattr(agent, "name", type(agent).__name__)
    gen = episode(env, name, faults=faults, limits=limits, user=user, workspace=workspace, checkpoints=checkpoints, resume=resume)
    return _drive(gen, lambda req: agent.act(*req))


def run_episodes(
    cases: Sequence[tuple[EnvironmentSpec, FaultConfig | None]],
    agent: Agent,
    *,
    limits: Limits = Limits(),
    user: UserSimulator | None = None,
    seeds: Sequence[int] | None = None,
    lockstep: bool = False,
) -> list[Trajectory]:
    """Run many episodes together. An agent that decodes turns continuously (``turns()``, HFAgent's) gets each
    episode's next turn as soon as the episode is ready for it; otherwise episodes run in lockstep, so that a
    batching agent (``act_batch``) generates for all at once. ``seeds``: each episode's own, handed to an agent that
    samples each episode from its own seed (``per_episode_seeds``: ``act_batch(conversations, seeds=...)``; a
    continuous agent's sampled turns draw from streams seeded by it), so that trials of one environment are not
    one sample repeated. ``lockstep``: rounds even for an agent that can decode turns continuously (the baseline
    ``bench_episodes.py`` measures it against)."""
    name = getattr(agent, "name", type(agent).__name__)
    gens = [episode(env, name, faults=f, limits=limits, user=user) for env, f in cases]
    out: list[Trajectory | None] = [None] * len(gens)
    pending: dict[int, tuple[Any, Any]] = {}
    for i, g in enumerate(gens):
        try:
            pending[i] = next(g)
        except StopIteration as stop:
            out[i] = stop.value
    if not lockstep and callable(getattr(agent, "turns", None)):
        return _run_continuously(gens, out, pending, agent.turns(), seeds)
    batch_fn = getattr(agent, "act_batch", None)
    seeded = batch_fn is not None and seeds is not None and getattr(agent, "per_episode_seeds", False)
    while pending:
        idx = sorted(pending)
        reqs = [pending[i] for i in idx]
        try:
            if seeded:
                replies = batch_fn(reqs, seeds=[seeds[i] for i in idx])
            else:
                replies = batch_fn(reqs) if batch_fn else [agent.act(*r) for r in reqs]
            errors: list[Exception | None] = [None] * len(idx)
        except Exception as e:  # noqa: BLE001 - one failing batch fails its episodes, recorded
            replies, errors = [None] * len(idx), [e] * len(idx)
        for i, reply, err in zip(idx, replies, errors):
            if err is None and isinstance(reply, Exception):
                err = reply  # act_batch may fail one conversation and answer the others
            try:
                pending[i] = gens[i].throw(err) if err is not None else gens[i].send(reply)
            except StopIteration as stop:
                out[i] = stop.value
                del pending[i]
    return [t for t in out if t is not None]


def _run_continuously(gens: list[Any], out: list[Trajectory | None], pending: dict[int, tuple[Any, Any]], turns: Any,
                      seeds: Sequence[int] | None) -> list[Trajectory]:
    """``run_episodes`` for an agent that decodes turns continuously (``turns()``): an episode's next turn is
    submitted as soon as its reply came and its tools ran, and joins the batch while the others decode."""
    from cowork_pipeline.synthesis.embedded import sub_seed

    asked = dict.fromkeys(pending, 0)  # turns each episode has asked for (a sampled turn's seed: its episode's and this)

    def submit(i: int, request: tuple[Any, Any]) -> None:
        turns.submit(i, *request, None if seeds is None else sub_seed(seeds[i], asked[i]))
        asked[i] += 1

    for i in sorted(pending):
        submit(i, pending[i])
    while turns.busy:
        for i, reply in turns.step():
            try:
                request = gens[i].throw(reply) if isinstance(reply, Exception) else gens[i].send(reply)
            except StopIteration as stop:
                out[i] = stop.value
                continue
            submit(i, request)
    return [t for t in out if t is not None]


def _drive(gen: Any, act: Any) -> Trajectory:
    try:
        req = next(gen)
        while True:
            try:
                reply = act(req)
            except Exception as e:  # noqa: BLE001 - handed to the episode, which records it
                req = gen.throw(e)
                continue
            req = gen.send(reply)
    except StopIteration as stop:
        return stop.value


def episode(
    env: EnvironmentSpec,
    agent_name: str,
    *,
    faults: FaultConfig | None = None,
    limits: Limits = Limits(),
    user: UserSimulator | None = None,
    workspace: Workspace | None = None,
    checkpoints: list[Checkpoint] | None = None,
    resume: Checkpoint | None = None,
) -> Generator[tuple[list[dict[str, Any]], list[dict[str, Any]]], Any, Trajectory]:
    """One episode as a generator: yields ``(messages, tools)`` whenever the agent must act and
    receives the assistant message; returns the trajectory. Drivers batch many of these.

    ``checkpoints``: a list that receives a :class:`Checkpoint` before every agent act (fault-free
    episodes only). ``resume``: start from such a checkpoint of an episode of the same environment,
    limits and (stateless) user instead of from the beginning; the trajectory is the one a full run
    gives when the agent acts as that episode's agent did up to the checkpoint."""
    t_start = time.perf_counter()
    faults = faults or FaultConfig()
    if (checkpoints is not None or resume is not None) and faults.rate > 0.0:
        raise ValueError("checkpoints need a fault-free episode (the fault draws are not part of a checkpoint)")
    ws = workspace or build_workspace(env, faults)
    user = user or ScriptedUser()
    tools = tools_for(env.tools)
    exposed = frozenset(env.tools)
    termination, detail = "completed", ""
    if resume is None:
        initial = ws.snapshot()
        messages: list[dict[str, Any]] = [{"role": "system", "content": env.system_prompt}]
        steps: list[dict[str, Any]] = []
        turn_ends: list[int] = []
        turn_snaps: list[Any] = []
        replies: list[str | None] = []
        n_calls = 0
        first_turn = 0
    else:
        initial = resume.initial
        messages, steps, replies = list(resume.messages), list(resume.steps), list(resume.replies)
        turn_ends, turn_snaps = list(resume.turn_ends), list(resume.turn_snaps)
        n_calls = resume.n_calls
        first_turn = resume.turn
        ws.restore(resume.state, touched=resume.touched)
        ws.audit = list(resume.audit)
    turns_completed = first_turn

    for turn_idx in range(first_turn, len(env.turns)):
        turn = env.turns[turn_idx]
        reply: str | None = None
        if resume is not None and turn_idx == first_turn:
            # Mid-turn: this turn's world events and user message are already in the checkpoint.
            ws.turn = turn_idx
            repeats = dict(resume.repeats)  # canonical call -> times run without a fault in this turn
            first_step = resume.step
        else:
            if turn_idx >= limits.max_turns:
                termination, detail = "max_turns", f"turn limit {limits.max_turns} reached"
                break
            ws.turn = turn_idx
            failed = next((ev for ev in turn.events if not ws.call(ev.tool, ev.args, actor=ev.actor).ok), None)
            if failed is not None:
                termination, detail = "event_failed", f"world event {failed.tool} failed: {ws.audit[-1].get('error')}"
                break
            text = user.next_message(turn_idx, env, ws, messages)
            if text is None:
                break
            messages.append({"role": "user", "content": text})
            repeats = {}
            first_step = 0
        for step_idx in range(first_step, limits.max_steps_per_turn):
            if checkpoints is not None:
                checkpoints.append(Checkpoint(turn_idx, step_idx, n_calls, dict(repeats), messages[:], steps[:], replies[:],
                                              turn_ends[:], turn_snaps[:], initial, ws.snapshot(), ws.audit[:],
                                              {c: set(ids) for c, ids in ws.touched.items()}))
            try:
                msg = _normalize((yield messages, tools))
            except Exception as e:  # a remote endpoint or model failing must not kill the batch
                termination, detail = "agent_error", f"{type(e).__name__}: {e}"
                break
            messages.append(msg)
            calls = msg.get("tool_calls") or []
            if not calls:
                reply = msg.get("content") or ""
                break
            for call in calls:
                if n_calls >= limits.max_tool_calls:
                    termination, detail = "max_tool_calls", f"tool call limit {limits.max_tool_calls} reached"
                    break
                unpacked = _unpack(call)
                key = _call_key(unpacked)
                if limits.max_repeated_calls is not None and repeats.get(key, 0) >= limits.max_repeated_calls:
                    termination = "stuck"
                    detail = f"turn {turn_idx}: the same call was repeated more than {limits.max_repeated_calls} times: {key[:200]}"
                    break
                n_calls += 1
                step = _execute(ws, unpacked, messages, turn_idx, exposed)
                steps.append(step)
                if step["fault"] is None:
                    repeats[key] = repeats.get(key, 0) + 1
            if termination != "completed":
                break
        else:
            termination, detail = "max_steps", f"turn {turn_idx}: step limit {limits.max_steps_per_turn} reached"
        replies.append(reply)
        turn_ends.append(len(ws.audit))
        turn_snaps.append(ws.snapshot())
        if termination != "completed":
            break
        turns_completed += 1

    final = ws.snapshot()
    # Every record that differs from ``initial`` was written through the workspace since it was built
    # or restored (``touched``, carried over by a checkpoint), so the diffs look at those only.
    diff = diff_states(initial, final, ws.touched)
    # The state at the end of the last turn is usually the final one (records are shared, so the
    # comparison is mostly identity checks): its diff is then the same.
    last = len(turn_snaps) - 1
    turn_diffs = [diff if i == last and s == final else diff_states(initial, s, ws.touched) for i, s in enumerate(turn_snaps)]
    return Trajectory(
        env_id=env.env_id, agent=agent_name, fault_rate=faults.rate, fault_seed=faults.seed,
        messages=messages, steps=steps, turns_completed=turns_completed,
        termination=termination, termination_detail=detail, faults=list(ws.faults_injected), audit=ws.audit,
        initial_state=initial, final_state=final, diff=diff, turn_ends=turn_ends,
        turn_diffs=turn_diffs, replies=replies,
        seconds=time.perf_counter() - t_start,
    )


def _normalize(msg: Any) -> dict[str, Any]:
    if not isinstance(msg, dict):
        return {"role": "assistant", "content": str(msg), "parse_error": f"agent returned {type(msg).__name__}, not a message dict"}
    out = {"role": "assistant", "content": msg.get("content")}
    if msg.get("tool_calls"):
        out["tool_calls"] = list(msg["tool_calls"])
    if msg.get("parse_error"):
        out["parse_error"] = msg["parse_error"]
    if msg.get("reasoning"):  # (an endpoint model's thoughts before its reply: kept for the transcript, never graded)
        out["reasoning"] = msg["reasoning"]
    return out


def _execute(ws: Workspace, unpacked: tuple[str, str, Any, str | None], messages: list[dict[str, Any]], turn: int,
             exposed: frozenset[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    call_id, name, args, bad = unpacked
    if bad is None and name not in exposed:
        # A tool the task does not offer is as unknown to the agent as a made-up one.
        bad = f"unknown tool '{name}' (this task offers: {', '.join(sorted(exposed))})"
    if bad is not None:
        content = json.dumps({"error": {"type": "invalid_arguments", "message": bad}})
        step = {"turn": turn, "call_id": call_id, "tool": name, "args": args, "ok": False,
                "error": {"type": "invalid_arguments", "message": bad}, "fault": None}
    else:
        res = ws.call(name, args)
        content = res.content()
        step = {"turn": turn, "call_id": call_id, "tool": name, "args": args, "ok": res.ok, "error": res.error, "fault": res.fault}
    messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
    step["seconds"] = time.perf_counter() - t0
    return step


_KEY_JSON = json.JSONEncoder(sort_keys=True, default=str)  # built once (json.dumps(..., default=str) builds one per call)


def _call_key(unpacked: tuple[str, str, Any, str | None]) -> str:
    """The call as a canonical string (tool name and arguments, keys sorted), for repeat detection."""
    _id, name, args, _bad = unpacked
    try:
        return name + " " + _KEY_JSON.encode(args)
    except (TypeError, ValueError):
        return f"{name} {args!r}"


def _unpack(call: Any) -> tuple[str, str, Any, str | None]:
    """(id, name, args, error) from an OpenAI tool call; malformed calls become an error, not an exception."""
    if not isinstance(call, dict):
        return "call_invalid", "", None, "tool call is not an object"
    call_id = str(call.get("id") or "call_0")
    fn = call.get("function") or {}
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        return call_id, "", None, "tool call has no function name"
    raw = fn.get("arguments", "{}")
    if isinstance(raw, dict):
        return call_id, name, raw, None
    try:
        args = json.loads(raw or "{}")
    except (TypeError, ValueError) as e:
        return call_id, name, raw, f"arguments are not valid JSON: {e}"
    if not isinstance(args, dict):
        return call_id, name, args, "arguments must be a JSON object"
    return call_id, name, args, None
