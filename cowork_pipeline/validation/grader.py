"""Grading: run an environment's rubric checkers on trajectories, in the sandbox.

The validator, the RL reward and the benchmark all grade through this one function, so
the verdict that certified an environment is the verdict that scores an agent on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from cowork_pipeline.runner import Trajectory
from cowork_pipeline.spec import EnvironmentSpec

TRANSIENT_ERRORS = frozenset({"timeout", "crash"})  # sandbox outcomes that get a second attempt


@dataclass
class Grade:
    items: dict[str, bool]
    errors: dict[str, dict[str, str]] = field(default_factory=dict)  # item -> {code, message} when a checker failed to run
    completion: float = 0.0  # weighted share of completion items that hold
    safety: bool = True  # every safety item holds
    passed: bool = False  # every item holds

    def failed_items(self) -> list[str]:
        return sorted(k for k, v in self.items.items() if not v)


def _score(env: EnvironmentSpec, results: dict[str, bool], errors: dict[str, dict[str, str]], turn: int | None) -> Grade:
    items = [i for i in env.rubric if turn is None or i.turn is None or i.turn <= turn]
    comp = [i for i in items if i.kind == "completion"]
    total = sum(i.weight for i in comp) or 1.0
    completion = sum(i.weight for i in comp if results.get(i.id)) / total
    safety = all(results.get(i.id, False) for i in items if i.kind == "safety")
    sub = {i.id: results.get(i.id, False) for i in items}
    return Grade(sub, errors, completion, safety, all(sub.values()) and bool(sub))


def grade_many(sandbox: Any, cases: Sequence[tuple[EnvironmentSpec, Trajectory, int | None]]) -> list[Grade]:
    """Grade ``(env, trajectory, turn)`` cases in one sandbox batch (``turn``: grade the episode
    as it stood at the end of that turn, with only the items due by then)."""
    sources: dict[str, str] = {}
    calls: list[tuple[str, Any]] = []
    index: list[tuple[int, str]] = []
    # One evidence object per (trajectory, turn), shared by every case grading that trajectory (the
    # validator grades the reference twice): the sandbox then serializes it once, and still hands
    # every call its own copy.
    evidences: dict[tuple[int, int | None], dict[str, Any]] = {}
    rubrics: dict[int, list[tuple[str, str, int | None]]] = {}  # id(env) -> (source key, item id, item turn)
    for ci, (env, traj, turn) in enumerate(cases):
        items = rubrics.get(id(env))
        if items is None:  # the validator grades ~12 trajectories per environment
            prefix = f"{env.env_id}/{env.generator.attempt}/"
            items = rubrics[id(env)] = [(prefix + item.id, item.id, item.turn) for item in env.rubric]
            for (key, _id, _turn), item in zip(items, env.rubric):
                sources.setdefault(key, item.code)
        # An item that belongs to a turn must hold when that turn ends (later turns may change the
        # same records); other items are judged on the episode as of ``turn`` (the end by default).
        last = len(traj.turn_ends) - 1
        for key, item_id, item_turn in items:
            if turn is not None and item_turn is not None and item_turn > turn:
                continue
            at = item_turn if item_turn is not None and item_turn < last and (turn is None or item_turn < turn) else turn
            ev = evidences.get((id(traj), at))
            if ev is None:
                ev = evidences[(id(traj), at)] = traj.evidence(at)
            calls.append((key, ev))
            index.append((ci, item_id))
    results = sandbox.evaluate(sources, calls) if calls else []
    # A timeout or a dead worker can be the machine (a load spike past the wall-clock backstop), not the
    # checker: such calls get one more attempt, so a verdict does not depend on what else the machine did.
    # A checker that really hangs or crashes the worker fails the second attempt the same way.
    again = [i for i, r in enumerate(results) if not r.ok and r.error_code in TRANSIENT_ERRORS]
    if again:
        for i, r in zip(again, sandbox.evaluate(sources, [calls[i] for i in again])):
            results[i] = r
    per_case: list[tuple[dict[str, bool], dict[str, dict[str, str]]]] = [({}, {}) for _ in cases]
    for (ci, item_id), r in zip(index, results):
        ok_map, err_map = per_case[ci]
        if r.ok and isinstance(r.value, bool):
            ok_map[item_id] = r.value
        else:
            ok_map[item_id] = False
            if r.ok:
                err_map[item_id] = {"code": "bad_return", "message": f"check() returned {type(r.value).__name__}, not bool"}
            else:
                err_map[item_id] = {"code": r.error_code or "error", "message": r.error or ""}
    return [_score(env, per_case[ci][0], per_case[ci][1], turn) for ci, (env, _t, turn) in enumerate(cases)]
