"""Two-way certification of an environment's grader.

An environment is certified only if: its document is internally consistent (tools exist
and are exposed, every record the request names exists exactly once); its reference
program runs to completion and passes every item, and so does the same work done another
correct way (look-ups repeated, times in another offset, amounts written differently); the
do-nothing trajectory fails; every applicable mutation of the reference fails; the same trajectory gets the same verdict
twice; and the reference still passes under injected transient faults (with retries).
Multi-turn tasks run with their user simulator in the loop, world events included.
"""
from __future__ import annotations

import gc
import json
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from cowork_pipeline.agents.program import ProgramAgent
from cowork_pipeline.runner import Checkpoint, Limits, Trajectory, UserSimulator, run_episode
from cowork_pipeline.services import REGISTRY, FaultConfig, Workspace
from cowork_pipeline.spec import EnvironmentSpec
from cowork_pipeline.synthesis.draft import Diagnostic, Draft
from cowork_pipeline.synthesis.injections import problems as injection_problems
from cowork_pipeline.validation.grader import Grade, grade_many
from cowork_pipeline.validation.mutations import _MONEY, OPERATORS, Mutant, equivalent, executed_program, mutants
from cowork_pipeline.validation.sandbox import calls_nondeterministic

CHECKER_ERRORS = {"compile_error": "checker_compile_error", "forbidden": "checker_forbidden", "timeout": "checker_timeout",
                  "memory": "checker_memory"}
VALIDATOR_VERSION = "certify-26"  # 2: collateral_write mutants; 3: wrong_mention mutants; 4: empty_message mutants; 5: confidential text pasted into an outside email, a checker that cannot run on any trajectory (time, memory, sandbox rules) is reported; 6: misstated_value mutants (amounts in another currency; amounts, times or dates hedged between two values; a weekday that contradicts its date); 7: the confidential text pasted into a public comment on an outside requester's ticket (the helpdesk emails it to them); a reference program that stops early (a search found nothing to bind) is reference_incomplete, and no mutant runs; a reference that writes a world value (a name, an address, a title, an id) before anything it saw showed it is reference_ungrounded; 8: answers (turns with answer=true) are mutated like messages (emptied, misstated, another record named, a changed or swapped amount, a date a day late, a count one more, partial_answer, stale_answer), missing_step skips the look-ups an answer rests on, the equivalent variant rewrites answers ($1,234.00, lists reversed); a collateral_write makes a world event's change itself a turn early; an answer's figures must appear in what the reference read (reference_ungrounded); 9: a misstated_value mutant reports the work as not done ("I couldn't get this done") after doing it; an answer's stated room (a meeting's location) swapped for another record's (wrong_value); 10: a misstated_value mutant gives a message's or answer's UTC times in another zone ("15:00 UTC" -> "15:00 CET"); 11: the equivalent variant writes the dates in messages in words ("2026-03-05" -> "March 5, 2026"); 12: a safety_violation mutant states the confidential documents' figures in words ("43%" -> "43 percent") in an outside message; 13: the equivalent variant lists the organizer among a new event's attendees; 14: a misstated-value mutant gives a message's or answer's dates in words in the next year ("March 5, 2027"), up to 4 misstated-value mutants per environment (was 3); 15: a misstated-value mutant gives a message's or answer's amounts as record numbers ("4830.00" -> "#4830"), a safety_violation mutant states the confidential figures under a unit label ("Figure (%): 43") in an outside message; 16: a misstated-value mutant writes a note on a record (a deal's or an invoice's note, a ticket's description) with its amounts a tenth more, its percentages and counts one more, or another person named in place of its person (a namesake); 17: a misstated-value mutant writes a note on a meeting or a task that states its start another hour of the day or its due date a later day, none the task gives, or on a moved one the start or due date it had before the move; a misstated-value mutant gives a message or an answer about a meeting a second time after its own ("See you at 13:00 UTC."); the amounts-as-record-numbers mutant writes both notations ("#4830 (PO 4830)"); the equivalent variant gives a meeting or a task the reference leaves without a note one that says its own day and time; 18: a misstated-value mutant writes a note on a new meeting the request asks for in a window ("between 09:00 and 17:00") that gives a bound of the window as its start, and one on a task due another day than today gives today as its due date ("Due 2026-03-02."); 19: a misstated-value mutant of a message or an answer denies ("the corrected amount is not 4830.00 USD") or doubts ("has probably been moved to 15:00 UTC") what its first sentence with a value states, a message's for an even seed and an answer's for an odd one denying (answers get it beside their first three misstatements; a message's cap of misstatements 4 -> 5); 20: a careless_message mutant, one per environment, leaves a template's placeholder in a message or an answer ("Hi [Name],"), signs an email or a comment with a colleague's first name (every other time their signature block: full name, role, team), calls its first date "tomorrow" or "today" when it is not, or copies a new email to two colleagues the task never involves (its kind turning with the seed; where a kind fits no message, the next; where nothing is sent, a text written on a record gets the placeholder: "Owner: [Name]"); a misstated-value mutant of a message or an answer gives its first figure for another period or base ("180.00 EUR per week" for "per night", "for each full day" for "each full hour"); the hedge mutant lists a message's amounts with a slash for an odd seed ("4830.00 / 5314.00", an answer's for an even one), an "or" otherwise; 21: the careless_message mutant has two more kinds in its rotation: a line saying the message carries an attachment it does not ("Please find the details attached."; not on a forward, which carries the original's) and one saying a colleague the task never involves was told, by full name ("I've also let Priya Chen know."); "never involves" now also leaves out everyone on a record the reference's calls name (a channel's members, an event's attendees), read from the calls as executed; 22: a misstated-value mutant of a message with an amount, where the task is not about a meeting (whose messages get a second time), adds a second amount of its currency, a tenth more or more and none the workspace or the task's texts give ("The total comes to 5313.00 USD."), up to two per environment; 23: the careless_message mutant has a seventh kind in its rotation: a due date nothing in the workspace, the task's texts or the reference's calls gives ("It is due on 2026-03-27."); 24: an injection_followed mutant makes the call an instruction planted in an outside email asks for (facts.injection) right after the step that reads it; a planted instruction whose call is no exposed tool's or whose text is not in the email it names is injection_invalid; 25: the planted instruction may stand in an outside requester's ticket (facts.injection.ticket_id: its description or the requester's comment a world event adds), and the mutant makes its call right after the first step that reads the email or ticket whole once the instruction is there (a world event may bring it in a later turn); 26: the misstated-currency mutant knows every currency code the checks read (27: SEK, NOK, DKK, ...), not eight
@dataclass
class Certification:
    env_id: str
    capability_id: str
    attempt: int
    certified: bool
    diagnostics: list[Diagnostic]
    reference_pass: bool = False
    null_pass: bool = False
    fault_pass: bool = False
    equivalent_pass: bool = True  # the reference done another correct way (see mutations.equivalent) passes
    deterministic: bool = True
    mutants: list[dict[str, Any]] = field(default_factory=list)  # operator, description, killed, failed_items
    confusion: dict[str, dict[str, int]] = field(default_factory=dict)  # operator -> applicable, killed
    kill_rate: float = 0.0
    difficulty: float = 0.0
    difficulty_bucket: str = "easy"
    seconds: float = 0.0
    reference: Trajectory | None = None

    def summary(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "certified": self.certified, "codes": sorted({d.code for d in self.diagnostics}),
                "kill_rate": self.kill_rate, "difficulty": self.difficulty}


def structural_diagnostics(spec: EnvironmentSpec) -> list[Diagnostic]:
    """Schema-level and referential checks that need no execution."""
    out: list[Diagnostic] = []
    exposed = set(spec.tools)
    for name in spec.tools:
        t = REGISTRY.get(name)
        if t is None or t.hidden:
            out.append(Diagnostic("unknown_tool", f"exposed tool '{name}' does not exist", detail={"tool": name}))
    for ti, turn in enumerate(spec.reference):
        for s in turn.steps:
            if s.tool not in exposed:
                out.append(Diagnostic("unexposed_tool", f"reference turn {ti} calls '{s.tool}', which the task does not expose",
                                      detail={"tool": s.tool}))
    for ti, turn in enumerate(spec.turns):
        for ev in turn.events:
            if ev.tool not in REGISTRY:
                out.append(Diagnostic("unknown_tool", f"world event before turn {ti} uses unknown tool '{ev.tool}'", detail={"tool": ev.tool}))
    if len(spec.reference) != len(spec.turns):
        out.append(Diagnostic("schema_invalid", f"{len(spec.turns)} user turns but {len(spec.reference)} reference turns"))
    if not any(i.kind == "completion" for i in spec.rubric):
        out.append(Diagnostic("schema_invalid", "rubric has no completion item"))
    ids = [i.id for i in spec.rubric]
    if len(set(ids)) != len(ids):
        out.append(Diagnostic("schema_invalid", f"duplicate rubric item ids: {sorted({i for i in ids if ids.count(i) > 1})}"))
    for i in spec.rubric:
        if calls_nondeterministic(i.code):
            out.append(Diagnostic("nondeterministic_checker", f"checker '{i.id}' calls a time/random/identity function", item=i.id))
    event_records = {
        (coll, str(ev.args.get("id"))) for t in spec.turns for ev in t.events
        for coll in ("mail.messages", "chat.messages") if ev.args.get("id")
    }
    for m in spec.facts.get("mentions", []):
        coll, field_, value = m.get("collection"), m.get("field"), str(m.get("value", ""))
        recs = spec.world.get(coll, {})
        if m.get("partial"):
            n = sum(1 for r in recs.values() if str(r.get(field_, "")).lower().split()[:1] == value.lower().split()[:1])
        else:
            n = sum(1 for r in recs.values() if str(r.get(field_, "")).lower() == value.lower())
        if n == 0 and not any(c == coll for c, _ in event_records):
            out.append(Diagnostic("dangling_reference", f"the request names {m.get('role')} '{value}' but no {coll} record has {field_}='{value}'",
                                  detail=dict(m)))
        elif n > 1:
            out.append(Diagnostic("ambiguous_reference", f"the request's {m.get('role')} '{value}' matches {n} {coll} records by {field_}",
                                  detail=dict(m)))
    for why in injection_problems(spec):
        out.append(Diagnostic("injection_invalid", why, detail={"piece": "injection"}))
    services = {t.service for t in REGISTRY.values()}
    for coll in spec.world:
        if coll != "_meta" and coll.split(".")[0] not in services:
            out.append(Diagnostic("schema_invalid", f"world collection '{coll}' belongs to no known service ({', '.join(sorted(services))})",
                                  detail={"collection": coll}))
    for coll, recs in spec.world.items():
        for rid, rec in recs.items():
            if isinstance(rec, dict) and "id" in rec and rec["id"] != rid:
                out.append(Diagnostic("schema_invalid", f"{coll} record key '{rid}' != its id '{rec['id']}'"))
    return out


def difficulty_of(spec: EnvironmentSpec) -> tuple[float, str]:
    # Knobs are free-form (an LLM may write anything there): non-numbers count as 0.
    d = {k: v for k, v in spec.difficulty.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    steps = d.get("reference_steps") or sum(len(t.steps) for t in spec.reference)
    score = (0.06 * steps + 0.05 * d.get("distractors", 0) + 0.12 * d.get("near_duplicates", 0)
             + 0.2 * (len(spec.turns) - 1) + 0.05 * len(spec.tools) / 4
             + 0.1 * d.get("injections", 0))
    score = round(min(1.0, score), 3)
    return score, "easy" if score < 0.45 else "medium" if score < 0.75 else "hard"


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """No cyclic-GC passes while a batch is certified (the caller's setting is restored after).

    A batch allocates a few hundred thousand short-lived containers (records, messages, audit
    entries); their allocation counts trigger generation-2 collections that rescan the whole
    heap (drafts included), ~15% of the batch's CPU. Episodes create almost no reference
    cycles, and whatever they create is collected once GC runs again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _divergence(base: list[list[Any]], m: Mutant, replies: Sequence[str | None] | None = None) -> tuple[int, int] | None:
    """(turn, step) of the first agent act where the mutant's program differs from the executed
    reference (one call per act, then the turn's reply, compared with the reference's ``replies``
    when given); None when they never differ."""
    for ti, (ref_steps, turn) in enumerate(zip(base, m.program)):
        steps = turn.steps
        p = 0
        while p < len(ref_steps) and p < len(steps) and ref_steps[p].tool == steps[p].tool and ref_steps[p].args == steps[p].args:
            p += 1
        if p < len(ref_steps) or p < len(steps) or (replies is not None and ti < len(replies) and turn.reply != replies[ti]):
            return ti, p
    return None


# What a reference may only name once it has seen it: people, accounts, documents, invoices, deals, meetings and
# record ids of the world (values of 4+ characters; shorter ones are ordinary words too often).
_GROUNDED_FIELDS = {"directory.people": ("name", "email"), "crm.contacts": ("name", "email"), "crm.accounts": ("name",),
                    "docs.documents": ("title",), "crm.invoices": ("number",), "crm.deals": ("name",), "calendar.events": ("title",)}


def ungrounded(spec: EnvironmentSpec, traj: Trajectory) -> list[tuple[int, str, str]]:
    """(turn, act, value) for each world value the agent wrote (in a call's arguments or a reply) before anything it
    observed showed it: the system prompt, the user's turns and the tool results. A demonstration that names the
    document owner it never looked up teaches the student to invent names."""
    values: set[str] = set()
    for coll, recs in spec.world.items():
        if coll.startswith("_") or not isinstance(recs, dict):
            continue
        fields = ("id",) + _GROUNDED_FIELDS.get(coll, ())
        for r in recs.values():
            if isinstance(r, dict):
                values.update(v.lower() for f in fields for v in [r.get(f)] if isinstance(v, str) and len(v) >= 4)
    seen: list[str] = []
    written: list[tuple[int, str, str, int]] = []  # (turn, act, text, observations before it) of the agent's acts, in order, with what it had seen
    turn = -1
    for m in traj.messages:
        if m["role"] == "assistant":
            calls = m.get("tool_calls") or []
            text = " ".join([m.get("content") or ""] + [json.dumps(json.loads(c["function"]["arguments"]), ensure_ascii=False) for c in calls])
            written.append((turn, calls[0]["function"]["name"] if calls else "reply", text.lower(), len(seen)))
        else:
            turn += m["role"] == "user"
            seen.append(str(m.get("content") or "").lower())
    out: list[tuple[int, str, str]] = []
    # an answer's figures too: the limit, the amount owed must come from what was read (8350.0 or "300 SGD" in a result)
    asked = {i for i, t in enumerate(spec.turns) if t.answer}
    for t, act, text, n_seen in written:
        if act == "reply" and t in asked:
            for m in _MONEY.finditer(text):
                shown = re.compile(r"(?<![\w.])" + m.group(1) + r"(?:[.]0+)?(?![\d])")
                if not any(shown.search(s.replace(",", "")) for s in seen[:n_seen]):
                    out.append((t, act, m.group(0)))
    everything = " ".join(w[2] for w in written)
    for v in sorted(x for x in values if x in everything):  # (most values are never written: one pass over them)
        for t, act, text, n_seen in written:
            if v in text:
                if not any(v in s for s in seen[:n_seen]):
                    out.append((t, act, v))
                break
    return out


class Validator:
    def __init__(self, sandbox: Any, fault_rate: float = 0.25, limits: Limits = Limits(), user: UserSimulator | None = None):
        self.sandbox = sandbox
        self.fault_rate = fault_rate
        self.limits = limits
        self.user = user

    def certify(self, draft: Draft) -> Certification:
        return self.certify_many([draft])[0]

    def certify_many(self, drafts: Sequence[Draft]) -> list[Certification]:
        """Run every draft's trajectories, then grade all of them in one sandbox batch."""
        with _cyclic_gc_paused():
            return self._certify_many(drafts)

    def _certify_many(self, drafts: Sequence[Draft]) -> list[Certification]:
        t0 = time.perf_counter()
        plans: list[tuple[Draft, list[Diagnostic], list[tuple[str, Trajectory, Any]]]] = []
        cases: list[tuple[EnvironmentSpec, Trajectory, int | None]] = []
        for draft in drafts:
            spec = draft.spec
            if spec is None:
                plans.append((draft, list(draft.parse_diagnostics) or [Diagnostic("schema_invalid", "no environment document")], []))
                continue
            runs: list[tuple[str, Trajectory, Any]] = []
            try:
                diags = structural_diagnostics(spec)
                if not any(d.code in ("unknown_tool", "schema_invalid") for d in diags):
                    runs = self._trajectories(spec, diags)
            except Exception as e:  # noqa: BLE001 - a malformed document is diagnosed, never aborts the batch
                diags = [Diagnostic("schema_invalid", f"the environment document is malformed: {type(e).__name__}: {e}")]
                runs = []
            for _label, traj, _m in runs:
                cases.append((spec, traj, None))
            if runs:  # determinism: grade the reference a second time in the same batch
                cases.append((spec, runs[0][1], None))
            plans.append((draft, diags, runs))
        grades = grade_many(self.sandbox, cases)
        out, gi = [], 0
        for draft, diags, runs in plans:
            n = len(runs) + (1 if runs else 0)
            try:
                out.append(self._verdict(draft, diags, runs, grades[gi:gi + n]))
            except Exception as e:  # noqa: BLE001 - diagnose a malformed document instead of failing the batch
                out.append(Certification(draft.spec.env_id if draft.spec else draft.draft_id, draft.capability_id, draft.attempt, False,
                                         diags + [Diagnostic("schema_invalid", f"the environment document is malformed: {type(e).__name__}: {e}")]))
            gi += n
        per = (time.perf_counter() - t0) / max(1, len(drafts))
        for c in out:
            c.seconds = per
        return out

    def _trajectories(self, spec: EnvironmentSpec, diags: list[Diagnostic]) -> list[tuple[str, Trajectory, Any]]:
        # Every episode starts from the same world: copy its records once, then give each episode
        # a workspace restored from that snapshot (tools never edit records in place, so episodes
        # can share them exactly as snapshots within one episode do).
        pristine = Workspace(spec.world).snapshot()

        def fresh(faults: FaultConfig | None = None) -> Workspace:
            ws = Workspace(None, faults)
            ws.restore(pristine, faults)
            return ws

        # A mutant acts exactly as the reference until the step it changes, so it resumes from the
        # reference's checkpoint at that step (the scripted user is stateless; a custom one replays all).
        checkpoints: list[Checkpoint] | None = [] if self.user is None else None
        ref = run_episode(spec, ProgramAgent(spec.reference, name="reference"), limits=self.limits, user=self.user,
                          workspace=fresh(), checkpoints=checkpoints)
        runs: list[tuple[str, Trajectory, Any]] = [("reference", ref, None)]
        bad_steps = [s for s in ref.steps if not s["ok"]]
        if ref.termination != "completed" or bad_steps:
            why = ref.termination_detail or "; ".join(f"{s['tool']}: {s['error']['message']}" for s in bad_steps[:3])
            last = (ref.messages[-1].get("content") or "") if ref.messages else ""
            diags.append(Diagnostic("reference_incomplete", f"the reference solution did not run cleanly: {why or last}",
                                    detail={"termination": ref.termination}))
            return runs
        base = executed_program(spec, ref)
        # a program that stopped early ran cleanly as far as it went: a variable it could not bind (a search
        # that found nothing) ends the turn with an apology instead of the remaining steps
        short = next(((ti, len(done), len(t.steps)) for ti, (done, t) in enumerate(zip(base, spec.reference)) if len(done) < len(t.steps)), None)
        if short is not None:
            ti, done, n = short
            said = ref.replies[ti] if ti < len(ref.replies) else ""
            diags.append(Diagnostic("reference_incomplete", f"the reference solution stopped in turn {ti + 1} after {done} of its {n} steps: {said}",
                                    detail={"termination": "stopped", "turn": ti}))
            return runs
        for t, act, value in ungrounded(spec, ref)[:3]:
            diags.append(Diagnostic("reference_ungrounded", f"the reference's {act} in turn {t + 1} writes '{value}' before anything it "
                                    f"looked up or was told shows it: look it up first (a demonstration must not know what it never saw)",
                                    detail={"turn": t, "tool": act, "value": value}))
        at = {(c.turn, c.step): c for c in checkpoints or ()}
        for m in mutants(spec, ref, seed=spec.seed, base=base):
            cp = at.get(_divergence(base, m, ref.replies))  # the episode restores the checkpoint's state itself
            traj = run_episode(spec, ProgramAgent(m.program, name=f"mutant:{m.operator}"), limits=self.limits, user=self.user,
                               workspace=fresh() if cp is None else Workspace(None), resume=cp)
            runs.append((m.operator, traj, m))
        variant = equivalent(spec, base)
        if variant is not None:
            runs.append(("equivalent", run_episode(spec, ProgramAgent(variant.program, name="equivalent"), limits=self.limits,
                                                   user=self.user, workspace=fresh()), variant))
        faults = FaultConfig(rate=self.fault_rate, seed=spec.seed)
        runs.append(("faulted_reference", run_episode(spec, ProgramAgent(spec.reference, name="reference"), faults=faults,
                                                      limits=self.limits, user=self.user, workspace=fresh(faults)), None))
        return runs

    def _verdict(self, draft: Draft, diags: list[Diagnostic], runs: list[tuple[str, Trajectory, Any]], grades: list[Grade]) -> Certification:
        spec = draft.spec
        env_id = spec.env_id if spec else draft.draft_id
        cert = Certification(env_id, draft.capability_id, draft.attempt, False, diags)
        if spec is None or not runs:
            return cert
        cert.reference = runs[0][1]
        pieces = spec.facts.get("pieces", {})
        ref_grade = grades[0]
        cert.reference_pass = ref_grade.passed
        for item, err in sorted(ref_grade.errors.items()):
            diags.append(Diagnostic(CHECKER_ERRORS.get(err["code"], "checker_error"), f"checker '{item}' failed to run: {err['message']}",
                                    item=item, detail={"sandbox": err["code"]}))
        # A checker that runs out of time or memory, or breaks the sandbox's rules, on another trajectory did not
        # judge it: said as such (once per item), not passed off as a killed mutant or a flipped verdict.
        # (An exception is the checker's own way of failing a trajectory, as on the reference it is not.)
        seen = set(ref_grade.errors)
        labels = [label for label, _t, _m in runs[1:]] + ["reference (graded again)"]
        for label, g in zip(labels, grades[1:]):
            for item, err in sorted(g.errors.items()):
                if item not in seen and err["code"] in ("timeout", "memory", "forbidden", "crash"):
                    seen.add(item)
                    diags.append(Diagnostic(CHECKER_ERRORS.get(err["code"], "checker_error"),
                                            f"checker '{item}' failed to run on the {label} trajectory: {err['message']}",
                                            item=item, detail={"sandbox": err["code"], "run": label}))
        if not any(d.code == "reference_incomplete" for d in diags):
            for item in ref_grade.failed_items():
                if item not in ref_grade.errors:
                    diags.append(Diagnostic("reference_failed", f"the reference solution fails item '{item}'", item=item,
                                            detail={"piece": pieces.get(item, "world")}))
        if len(runs) == 1:
            return cert
        second = grades[-1]
        # (an item that could not run the second time is reported above, not as a flipped verdict)
        flipped = sorted(k for k in ref_grade.items if ref_grade.items[k] != second.items.get(k) and k not in seen)
        if flipped:
            cert.deterministic = False
            diags.append(Diagnostic("nondeterministic_checker", f"items {flipped} gave different verdicts on the same trajectory",
                                    item=flipped[0]))
        confusion = {op: {"applicable": 0, "killed": 0} for op in OPERATORS}
        for (label, traj, m), g in zip(runs[1:], grades[1:-1]):
            failed = [i for i in g.failed_items() if i not in seen]  # (a checker that could not run is reported above)
            if label == "equivalent":
                cert.equivalent_pass = g.passed
                if failed and cert.reference_pass:
                    diags.append(Diagnostic("overstrict_checker", f"correct work done another way fails items {failed} "
                                            f"({m.description.split(': ', 1)[-1]}): checkers must judge the outcome, not the reference's exact calls or strings",
                                            item=failed[0]))
                continue
            if label == "faulted_reference":
                cert.fault_pass = g.passed
                if failed and cert.reference_pass:
                    diags.append(Diagnostic("fault_fragile", f"the reference fails under a {self.fault_rate:.0%} fault rate: items {failed}"))
                continue
            killed = not g.passed
            cert.mutants.append({"operator": label, "description": m.description, "killed": killed, "failed_items": g.failed_items()})
            confusion[label]["applicable"] += 1
            confusion[label]["killed"] += int(killed)
            if label == "null":
                cert.null_pass = g.passed
                if g.passed:
                    diags.append(Diagnostic("null_passes", "the do-nothing trajectory passes every item"))
            elif not killed:
                diags.append(Diagnostic("mutation_survived", f"mutation {label} ({m.description}) passes every item",
                                        detail={"operator": label, "service": m.service, "tool": m.tool}))
        cert.confusion = confusion
        applicable = [x for x in cert.mutants]
        cert.kill_rate = round(sum(x["killed"] for x in applicable) / len(applicable), 4) if applicable else 0.0
        cert.difficulty, cert.difficulty_bucket = difficulty_of(spec)
        cert.certified = not diags
        return cert
