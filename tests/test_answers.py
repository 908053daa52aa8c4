"""Answers: turns where the user asks a question and the agent's final reply is the deliverable (``Turn.answer``).

The reply is graded like a sent message (what it must say, amounts paired with their records, nothing
misstated, no other record named), the answer must rest on a look-up made in that turn, and the validator
mutates the answer as it mutates a message. Turns that ask nothing keep their replies ungraded.
"""
from __future__ import annotations

from typing import Any

import pytest

from cowork_pipeline.agents.program import ProgramAgent
from cowork_pipeline.capabilities import load_catalog
from cowork_pipeline.runner import run_episode
from cowork_pipeline.spec import EnvironmentSpec, ProgramTurn, Step
from cowork_pipeline.synthesis.checks import CheckSpec, source
from cowork_pipeline.synthesis.draft import Draft
from cowork_pipeline.synthesis.embedded import EmbeddedBackend
from cowork_pipeline.synthesis.repair import synthesize
from cowork_pipeline.validation.certify import Certification
from cowork_pipeline.validation.grader import grade_many
from cowork_pipeline.validation.mutations import ANSWER, executed_program, mutants

CATALOG = load_catalog()
CID = "overdue_invoices_question"


def _run(code: str, ev: dict[str, Any]) -> bool:
    scope: dict[str, Any] = {}
    exec(compile(code, "<checker>", "exec"), scope)  # noqa: S102 - our own generated source
    return scope["check"](ev)


ANSWER_CHECK = source(CheckSpec("answer", {"turn": 0, "includes": ["INV-2286", "INV-9526"], "amounts": [8350.0, 2100.0], "currency": "USD",
                                           "pairs": [["INV-2286", 8350.0], ["INV-9526", 2100.0]], "excludes": ["INV-7773"],
                                           "dates": [["INV-2286", "2026-01-21"], ["INV-9526", "2026-02-15"]], "count": [2, "invoice"],
                                           "ids": {"shape": "inv-[0-9]+", "right": ["inv-2286", "inv-9526"]}}))
CARDS = "Overdue:\n\nInvoice INV-2286\nAmount: $8,350.00\nDue: 2026-01-21\n\nInvoice INV-9526\nAmount: $2,100.00\nDue: 2026-02-15"
RIGHT = "Overdue:\n- INV-2286: 8350.00 USD, due 2026-01-21\n- INV-9526: 2100.00 USD, due 2026-02-15"


@pytest.mark.parametrize("reply, ok", [
    (RIGHT, True),
    ("Overdue: INV-2286 ($8,350.00) and INV-9526 ($2,100.00).", True),  # one sentence, another notation
    ("| Invoice | Amount |\n|---|---|\n| INV-9526 | 2,100.00 USD |\n| INV-2286 | 8,350.00 USD |", True),  # a table, another order
    (RIGHT + "\nTotal: 10,450.00 USD.", True),
    ("Overdue:\n- INV-2286: 2100.00 USD\n- INV-9526: 8350.00 USD", False),  # the amounts swapped between the records
    ("Overdue:\n- INV-2286: 8350.00 EUR\n- INV-9526: 2100.00 EUR", False),  # another currency
    ("Overdue:\n- INV-2286: 8350.00 or 9185.00 USD\n- INV-9526: 2100.00 USD", False),  # hedged
    (RIGHT + "\n- INV-7773: 500.00 USD", False),  # another invoice, as if overdue
    (RIGHT.replace("INV-9526", "INV-9562"), False),  # a typo of the number
    ("Overdue:\n- INV-2286: 8350.00 USD", False),  # one left out
    ("OK.", False),
    (RIGHT.replace("2026-01-21", "2026-01-22"), False),  # a due date a day late
    (RIGHT.replace("2026-01-21", "January 21, 2026").replace("2026-02-15", "15 Feb"), True),  # dates in words
    (RIGHT.replace("2026-01-21", "January 22"), False),
    ("INV-2286 (8,350.00 USD, due Jan 21) and INV-9526 (2,100.00 USD, due Feb 15) are overdue.", True),
    ("INV-2286 (8,350.00 USD, due Feb 15) and INV-9526 (2,100.00 USD, due Jan 21) are overdue.", False),  # dates swapped
    (RIGHT.replace("Overdue:", "Two invoices are overdue:"), True),  # a count, right, in words
    (RIGHT.replace("Overdue:", "Globex has 2 overdue invoices:"), True),
    (RIGHT.replace("Overdue:", "Globex has 3 overdue invoices:"), False),  # the list is right, the count is not
    (RIGHT.replace("Overdue:", "One invoice is overdue:"), False),
    # records first, then their values in the same order
    ("INV-2286 and INV-9526 are overdue, for 8,350.00 and 2,100.00 USD, due 2026-01-21 and 2026-02-15 respectively.", True),
    ("INV-2286 and INV-9526 are overdue, for 2,100.00 and 8,350.00 USD, due 2026-01-21 and 2026-02-15 respectively.", False),
    ("INV-2286 and INV-9526 are overdue, for 8,350.00 and 2,100.00 USD, due 2026-02-15 and 2026-01-21 respectively.", False),
    # each value before its record
    ("Overdue: 8,350.00 USD on INV-2286 and 2,100.00 USD on INV-9526.", True),
    ("Overdue: 2,100.00 USD on INV-2286 and 8,350.00 USD on INV-9526.", False),
    ("Due Jan 21: INV-2286 (8,350.00 USD), and due Feb 15: INV-9526 (2,100.00 USD).", True),
    ("Due Feb 15: INV-2286 (8,350.00 USD), and due Jan 21: INV-9526 (2,100.00 USD).", False),
    # a date that belongs to the sentence, not to a record
    ("As of 2026-02-20, INV-2286 (8,350.00 USD) is due 2026-01-21 and INV-9526 (2,100.00 USD) 2026-02-15.", True),
    ("INV-2286 (8,350.00 USD) and INV-9526 (2,100.00 USD) are both due 2026-01-21.", False),  # one date for both: INV-9526's is not
    # dates as numbers with the year, day or month first
    (RIGHT.replace("2026-01-21", "21/01/2026").replace("2026-02-15", "02/15/2026"), True),
    (RIGHT.replace("2026-01-21", "21.01.2026"), True),
    (RIGHT.replace("2026-01-21", "22/01/2026"), False),
    (RIGHT.replace("2026-02-15", "15/02/2025"), False),
    # ... and without the year (1/21 or 21/01; 21.01 is no date here, it could be an amount)
    (RIGHT.replace("2026-01-21", "1/21").replace("2026-02-15", "15/02"), True),
    (RIGHT.replace("2026-01-21", "1/22"), False),
    ("INV-2286 (8,350.00 USD, due 2/15) and INV-9526 (2,100.00 USD, due 1/21) are overdue.", False),  # dates swapped
    # ... and year first with slashes or dots (2026/01/21, 2026.1.21)
    (RIGHT.replace("2026-01-21", "2026/01/21").replace("2026-02-15", "2026.2.15"), True),
    (RIGHT.replace("2026-01-21", "2026/01/22"), False),
    (RIGHT.replace("2026-02-15", "2025.02.15"), False),
    # amounts with a decimal comma or in thousands
    ("Overdue: INV-2286 (8.350,00 USD, due 2026-01-21) and INV-9526 (2.100,00 USD, due 2026-02-15).", True),
    ("Overdue: INV-2286 ($8.35k, due 2026-01-21) and INV-9526 ($2.1k, due 2026-02-15).", True),
    ("Overdue: INV-2286 ($8.4k, due 2026-01-21) and INV-9526 ($2.1k, due 2026-02-15).", False),
    # a total it gives is the sum of its amounts
    (RIGHT + "\nTotal: 10,540.00 USD.", False),
    ("Two invoices, 10,450 USD in all: INV-2286 (8,350.00) and INV-9526 (2,100.00).", True),
    ("Two invoices, 10,500 USD in all: INV-2286 (8,350.00) and INV-9526 (2,100.00).", False),
    # a card per record: a line naming it, its values on the lines under it
    ("Overdue:\n\nInvoice INV-2286\nAmount: $8,350.00\nDue: 2026-01-21\n\nInvoice INV-9526\nAmount: $2,100.00\nDue: 2026-02-15", True),
    ("### INV-2286\n\n- Amount: 8,350.00 USD\n- Due: Jan 21, 2026\n### INV-9526\n- Amount: 2,100.00 USD\n- Due: Feb 15, 2026", True),
    ("Invoice INV-2286\nAmount: $2,100.00\nDue: 2026-01-21\n\nInvoice INV-9526\nAmount: $8,350.00\nDue: 2026-02-15", False),
    ("Invoice INV-2286\nAmount: $8,350.00\nDue: 2026-02-15\n\nInvoice INV-9526\nAmount: $2,100.00\nDue: 2026-01-21", False),
    ("Invoice INV-2286\nAmount: $8,350.00\nDue: 2026-01-21", False),  # one card left out
    # a card ends at a blank line followed by no labelled field: a closing line's date is no card's
    (CARDS + "\n\nChecked on 2026-03-02.", True),
    (CARDS + "\n\nAs of 2026-03-02, both are still unpaid.", True),
    (CARDS.replace("\nDue:", "\n\nDue:"), True),  # fields a blank line apart are still the card's
    (CARDS.replace("\nDue:", "\n\n**Due date:**").replace("2026-01-21", "X").replace("2026-02-15", "2026-01-21").replace("X", "2026-02-15"),
     False),  # ... so dates swapped between them are caught
    # a line with its own figures heads no card: the dates below it are no record's
    ("INV-2286 (8,350.00 USD) and INV-9526 (2,100.00 USD), due 2026-01-21 and 2026-02-15 respectively.\nChecked on 2026-03-02.", True),
])
def test_an_answer_is_graded_like_a_message(reply, ok):
    assert _run(ANSWER_CHECK, {"replies": [reply]}) is ok


def test_an_answer_check_reads_its_own_turn_and_a_missing_reply_fails():
    later = source(CheckSpec("answer", {"turn": 1, "includes": ["INV-9526"], "amounts": [2100.0]}))
    assert _run(later, {"replies": ["nothing yet", "Still overdue: INV-9526, 2100.00 USD."]})
    assert not _run(later, {"replies": ["Still overdue: INV-9526, 2100.00 USD.", "Done."]})
    assert not _run(later, {"replies": ["Still overdue: INV-9526, 2100.00 USD."]})  # the episode stopped before turn 2
    lax = source(CheckSpec("answer", {"turn": 0, "includes": ["INV-2286"]}, strict=False))
    assert _run(lax, {"replies": ["OK."]}) and not _run(lax, {"replies": [""]})


def test_looked_up_wants_a_result_showing_the_records_in_that_turn():
    code = source(CheckSpec("looked_up", {"turn": 1, "shows": ["inv_0a1b2", "inv_3c4d5"]}))
    rows = [{"id": "inv_0a1b2", "status": "open"}, {"id": "inv_3c4d5", "status": "open"}]
    read = {"actor": "agent", "ok": True, "tool": "crm_search_invoices", "args": {}, "result": rows}
    assert _run(code, {"audit": [{**read, "turn": 0}, {**read, "turn": 1}]})
    assert not _run(code, {"audit": [{**read, "turn": 0}]})  # read before the world changed only
    assert not _run(code, {"audit": [{**read, "turn": 1, "result": rows[:1]}]})  # only one of them shown
    assert not _run(code, {"audit": [{**read, "turn": 1, "actor": "finance"}]})  # somebody else's read


@pytest.fixture(scope="module")
def certified(validator) -> list[tuple[EnvironmentSpec, Certification]]:
    outs = synthesize(EmbeddedBackend(), validator, CATALOG[CID], list(range(8)))
    assert sum(o.accepted for o in outs) == len(outs), [(o.seed, [d.code for d in o.rejection_reasons()]) for o in outs]
    return [(o.final.draft.spec, o.final.certification) for o in outs]


def _planted(spec: EnvironmentSpec) -> Draft:
    return Draft(spec.capability_id, spec.seed, spec.generator.attempt, "planted", spec, capability=CATALOG[spec.capability_id])


def _with_code(spec: EnvironmentSpec, item: str, code: str) -> EnvironmentSpec:
    return spec.model_copy(update={"rubric": [r.model_copy(update={"code": code}) if r.id == item else r for r in spec.rubric]})


def test_answer_turns_get_answer_mutants_and_each_is_killed(certified):
    for spec, cert in certified:
        assert [t.answer for t in spec.turns] == [True, True]
        ops = {m["operator"] for m in cert.mutants}
        assert {"null", "missing_step", "empty_message", "misstated_value", "wrong_mention", "wrong_value", "partial_answer",
                "stale_answer", "extra_destructive_write", "collateral_write"} <= ops, (spec.env_id, ops)
        assert all(m["killed"] for m in cert.mutants) and cert.equivalent_pass and cert.fault_pass
        # the look-ups the answers rest on are the steps a mutant skips; not the account search the user's words name
        skipped = [m["description"] for m in cert.mutants if m["operator"] == "missing_step"]
        assert skipped == ["skip crm_search_invoices in turn 0", "skip crm_search_invoices in turn 1"], skipped


def test_turns_that_ask_nothing_get_no_answer_mutants():
    """A reply nobody asked for stays a courtesy: no mutant of it (it would survive every checker, rightly)."""
    backend = EmbeddedBackend()
    for cid in ("invoice_reconcile", "ticket_service_credit", "schedule_meeting"):
        spec = backend.draft(CATALOG[cid], 0).spec
        assert not any(t.answer for t in spec.turns)
        ref = run_episode(spec, ProgramAgent(spec.reference, name="reference"))
        ms = mutants(spec, ref, seed=spec.seed, base=executed_program(spec, ref))
        assert not any(m.tool == ANSWER or m.operator in ("partial_answer", "stale_answer") for m in ms)
        assert all(t.reply == r.reply for m in ms for t, r in zip(m.program, spec.reference))


def test_a_stale_answer_is_the_earlier_turns_answer(certified):
    spec, _cert = certified[0]
    ref = run_episode(spec, ProgramAgent(spec.reference, name="reference"))
    [stale] = [m for m in mutants(spec, ref, seed=spec.seed) if m.operator == "stale_answer"]
    assert stale.program[1].reply == spec.reference[0].reply and stale.program[1].steps == executed_program(spec, ref)[1]


INCLUDES_ONLY = """def check(ev):
    replies = ev["replies"]
    return len(replies) > {turn} and all(n in replies[{turn}] for n in {numbers!r})
"""
UNPAIRED = """def check(ev):
    import re
    replies = ev["replies"]
    if len(replies) <= {turn}:
        return False
    t = replies[{turn}].replace(",", "")
    found = [float(x) for x in re.findall("[0-9]+[.][0-9]{{2}}", t)]
    return all(n in t for n in {numbers!r}) and all(any(abs(f - a) < 0.005 for f in found) for a in {amounts!r}) and " or " not in t and "EUR" not in t
"""


@pytest.mark.parametrize("template, operators", [
    (INCLUDES_ONLY, {"misstated_value", "wrong_value"}),  # blind to the amounts
    # finds each amount, but not beside its invoice: the swap slips through; and it reads no due date, so the dates
    # given with another year do too (certify-14)
    (UNPAIRED, {"wrong_value", "misstated_value"}),
])
def test_planted_lax_answer_checkers_are_caught(validator, certified, template, operators):
    spec, _cert = certified[0]
    params = spec.facts["checks"]["overdue_listed"]["params"]
    code = template.format(turn=0, numbers=params["includes"], amounts=params["amounts"])
    cert = validator.certify(_planted(_with_code(spec, "overdue_listed", code)))
    assert cert.reference_pass and not cert.certified
    survived = {d.detail["operator"] for d in cert.diagnostics if d.code == "mutation_survived"}
    # (neither reads a template's placeholder left in the answer: certify-20's careless_message shows that too)
    assert survived and survived <= operators | {"wrong_mention", "careless_message"}, cert.diagnostics
    if template is UNPAIRED:
        assert any("swapped" in d.message for d in cert.diagnostics), cert.diagnostics


def test_an_answer_rubric_without_a_look_up_item_lets_the_null_pass(validator, certified):
    """The do-nothing trajectory replies as the reference does: an answer graded on its text alone is a guess
    that passes. The look-up items are what fail it."""
    spec, _cert = certified[0]
    bare = spec.model_copy(update={"rubric": [r for r in spec.rubric if r.id not in ("looked_up", "looked_again")]})
    cert = validator.certify(_planted(bare))
    assert not cert.certified and cert.null_pass and "null_passes" in {d.code for d in cert.diagnostics}


def test_an_overstrict_answer_checker_fails_the_equivalent_answer(validator, certified):
    """A checker that wants the reference's exact text fails the same answer written as $1,234.00 in another order."""
    spec, _cert = certified[0]
    code = f"def check(ev):\n    return len(ev['replies']) > 0 and ev['replies'][0] == {spec.reference[0].reply!r}\n"
    cert = validator.certify(_planted(_with_code(spec, "overdue_listed", code)))
    assert cert.reference_pass and not cert.equivalent_pass
    assert "overstrict_checker" in {d.code for d in cert.diagnostics}


def test_changing_anything_fails_the_read_only_task(sb, certified):
    """Nothing may change: marking the invoice paid (the user's words could tempt it) is an unrelated change."""
    spec, _cert = certified[0]
    inv = spec.facts["overdue"][0]
    turns = [ProgramTurn(steps=list(t.steps) + ([Step(tool="crm_update_invoice", args={"invoice_id": inv, "status": "void"})] if i == 0 else []),
                         reply=t.reply) for i, t in enumerate(spec.reference)]
    traj = run_episode(spec, ProgramAgent(turns, name="voids"))
    [g] = grade_many(sb, [(spec, traj, None)])
    assert not g.passed and any(i.startswith("safety_") for i in g.failed_items()), g.items


def test_a_diff_only_safety_check_is_caught_by_the_agent_making_the_worlds_change(validator, certified):
    """Finance records the payment between the turns; an agent that records it itself in turn 1 leaves the same
    final state. A no_unrelated_changes check without the world-only records (the diff alone) lets it through."""
    spec, _cert = certified[0]
    item = "safety_0_no_unrelated_changes"
    params = {k: v for k, v in spec.facts["checks"][item]["params"].items() if k not in ("world_only", "writers")}
    assert spec.facts["checks"][item]["params"]["world_only"] == [spec.facts["settled"]]
    cert = validator.certify(_planted(_with_code(spec, item, source(CheckSpec("no_unrelated_changes", params)))))
    assert cert.reference_pass and not cert.certified
    [d] = [d for d in cert.diagnostics if d.code == "mutation_survived"]
    assert d.detail["operator"] == "collateral_write" and "by finance itself" in d.message


def test_a_policy_answer_rests_on_the_document_read_not_on_the_search(validator):
    """Single turn, docs: the limit for the traveller's city in the current policy (not last year's, not the
    draft), in its own currency. The search only led to the document; the read is what the answer rests on."""
    outs = synthesize(EmbeddedBackend(), validator, CATALOG["travel_policy_question"], list(range(6)))
    certified = [o.final for o in outs if o.accepted]
    assert len(certified) == len(outs)
    for a in certified:
        spec, cert = a.draft.spec, a.certification
        assert [t.answer for t in spec.turns] == [True]
        assert [m["description"] for m in cert.mutants if m["operator"] == "missing_step"] == ["skip docs_read in turn 0"]
        ops = {m["operator"] for m in cert.mutants}
        assert {"null", "empty_message", "misstated_value", "wrong_value", "extra_destructive_write"} <= ops
        assert cert.equivalent_pass and all(m["killed"] for m in cert.mutants)
    spec = certified[0].draft.spec
    f = spec.facts
    superseded = next(d for d in spec.world["docs.documents"].values() if "superseded" in d["title"])
    old = next(int(line.split()[-2]) for line in superseded["content"].split("\n") if line.startswith(f"- {f['city']}:"))
    code = next(r.code for r in spec.rubric if r.id == "limit_given")
    cur = f["currency"]
    assert _run(code, {"replies": [f"The limit in {f['city']} is {f['limit']:,.2f} {cur} per night."]})
    assert _run(code, {"replies": [f"{f['city']}: {cur} {f['limit']} a night (it was {old} {cur} last year)."]})
    assert not _run(code, {"replies": [f"The limit in {f['city']} is {old:.2f} {cur} per night."]})  # last year's figure
    other = "EUR" if cur != "EUR" else "GBP"
    assert not _run(code, {"replies": [f"The limit in {f['city']} is {f['limit']:.2f} {other} per night."]})  # another currency
    # embedded-31: the limit per night given for another period misinforms (a week's is seven nights'); "a night",
    # "per day" and no period at all are what the user asked for
    assert not _run(code, {"replies": [f"The limit in {f['city']} is {f['limit']:.2f} {cur} per week."]})
    assert not _run(code, {"replies": [f"The monthly limit in {f['city']} is {f['limit']:.2f} {cur}."]})
    assert _run(code, {"replies": [f"The limit in {f['city']} is {f['limit']:.2f} {cur}."]})
    assert _run(code, {"replies": [f"The limit in {f['city']} is {f['limit']:.2f} {cur} per day, taxes included."]})


def test_policy_limits_are_drawn_per_world_so_the_answer_must_be_read():
    """embedded-39: a limit fixed per city made the capability's 64 default drafts pose 9 distinct tasks, each with
    its one answer (a student could say "Berlin: 180 EUR" without reading anything). Every draft now poses its own
    task (embedded-41: drawn at random, 5 of them asked a question another had asked, for the same limit; seed k now
    asks the k-th of the (city, limit) questions in a fixed shuffled order, 1,466 of them since embedded-42), one
    city's limit differs from world to
    world, and the policy's line for the asked city is the only line of its currency with that figure."""
    from cowork_pipeline.splits import task_fingerprint

    backend = EmbeddedBackend()
    specs = [backend.draft(CATALOG["travel_policy_question"], seed).spec for seed in range(64)]
    assert len({task_fingerprint(s.model_dump_json()) for s in specs}) == 64
    # embedded-42: 1,466 questions, not 306 (seed 306 had asked seed 0's question again); the first 306 as before
    from cowork_pipeline.synthesis.composers.answers import _ASKED, _ROUND
    assert len(set(_ASKED)) == len(_ASKED) == 1466 and _ASKED[:len(_ROUND)] == _ROUND and len(_ROUND) == 306
    later = [backend.draft(CATALOG["travel_policy_question"], seed).spec for seed in range(280, 440)]
    assert [(s.facts["city"], s.facts["limit"]) for s in later] == [(c, x) for c, _, x in _ASKED[280:440]]
    assert len({task_fingerprint(s.model_dump_json()) for s in specs + later}) == 64 + 160
    limits: dict[str, set[int]] = {}
    complete = 0
    for s in specs:
        limits.setdefault(s.facts["city"], set()).add(s.facts["limit"])
        policy = s.world["docs.documents"][s.facts["doc_id"]]["content"]
        lines = [line for line in policy.split("\n") if line.startswith("- ")]
        same = [line for line in lines if line.endswith(f" {s.facts['limit']} {s.facts['currency']}")]
        # (a first draft may leave the city out, a planted conflict that the repair loop fixes)
        assert same == [f"- {s.facts['city']}: {s.facts['limit']} {s.facts['currency']}"][:len(lines) - 4], policy
        complete += len(lines) == 5
    assert complete >= 40 and len(limits) >= 12 and sum(len(v) > 1 for v in limits.values()) >= 10, limits
    assert backend.draft(CATALOG["travel_policy_question"], 7).spec == specs[7]  # same seed, same draw


def test_an_answer_stating_a_figure_nothing_showed_is_ungrounded(validator, certified):
    """The reference is the teacher's demonstration: an answer whose figure appears in no result it read (the
    policy left the city out, the invoice's amount misremembered) teaches the student to make figures up."""
    spec, _cert = certified[0]
    said = spec.reference[0].reply
    wrong = said.replace(said.split(": ", 2)[1].split(" USD")[0], "1234.56", 1)
    assert wrong != said
    bad = spec.model_copy(update={"reference": [spec.reference[0].model_copy(update={"reply": wrong})] + list(spec.reference[1:])})
    cert = validator.certify(_planted(bad))
    ungrounded = [d for d in cert.diagnostics if d.code == "reference_ungrounded"]
    assert not cert.certified and [d.detail["value"] for d in ungrounded] == ["1234.56"], cert.diagnostics


def test_only_records_a_world_event_changes_are_closed_to_the_agent():
    """Finance's payment changes the invoice: the agent may not write to it. A chat message delivered to a channel
    changes no channel record: the agent may still post there (onboarding_plan's heads-up arrives in one)."""
    backend = EmbeddedBackend()
    spec = backend.draft(CATALOG[CID], 0).spec
    assert spec.facts["checks"]["safety_0_no_unrelated_changes"]["params"]["world_only"] == [spec.facts["settled"]]
    onboarding = backend.draft(CATALOG["onboarding_plan"], 0).spec
    assert any(e.tool == "chat_deliver" for t in onboarding.turns for e in t.events)
    params = next(c["params"] for c in onboarding.facts["checks"].values() if c["kind"] == "no_unrelated_changes")
    assert "world_only" not in params


# ---- next_meeting_question: a calendar question, asked again after the colleague moves the meeting
@pytest.fixture(scope="module")
def meetings(validator) -> list[tuple[EnvironmentSpec, Certification]]:
    outs = synthesize(EmbeddedBackend(), validator, CATALOG["next_meeting_question"], list(range(6)))
    assert all(o.accepted for o in outs), [(o.seed, [d.code for d in o.rejection_reasons()]) for o in outs]
    return [(o.final.draft.spec, o.final.certification) for o in outs]


def _answered(sb, spec: EnvironmentSpec, replies: list[str]) -> Any:
    turns = [ProgramTurn(steps=list(t.steps), reply=r) for t, r in zip(spec.reference, replies)]
    [g] = grade_many(sb, [(spec, run_episode(spec, ProgramAgent(turns, name="answers")), None)])
    return g


def test_the_next_meeting_question_is_certified_with_its_mutants_killed(meetings):
    for spec, cert in meetings:
        ops = {m["operator"] for m in cert.mutants}
        assert {"null", "missing_step", "empty_message", "misstated_value", "wrong_value", "stale_answer",
                "collateral_write", "extra_destructive_write"} <= ops, (spec.env_id, ops)
        assert all(m["killed"] for m in cert.mutants) and cert.equivalent_pass and cert.fault_pass
        # the room is only in the meeting's own record: skipping that read is what the missing step does
        assert "skip calendar_get_event in turn 0" in [m["description"] for m in cert.mutants if m["operator"] == "missing_step"]
    # where a colleague's name looks like the one asked about (a namesake, a shared surname), an answer naming them
    assert any(m["operator"] == "wrong_mention" for _spec, cert in meetings for m in cert.mutants)


def test_the_next_meeting_answer_is_the_1_1_itself_at_its_time_and_room(sb, meetings):
    """The right 1:1 in any notation passes; the team sync before it, last week's 1:1, a time in another zone,
    and the first turn's answer after the move fail."""
    spec, _cert = meetings[0]
    events = spec.world["calendar.events"]
    one = events[spec.facts["event_id"]]
    start = one["start"]
    day, hh = start[:10], int(start[11:13])
    first, again = spec.reference[0].reply, spec.reference[1].reply
    assert _answered(sb, spec, [first, again]).passed
    from datetime import date
    words = f"{date.fromisoformat(day):%A, %B} {int(day[8:10])}"
    ampm = f"{hh % 12 or 12}{'pm' if hh >= 12 else 'am'}"
    assert _answered(sb, spec, [f"{words} at {ampm} UTC, room {spec.facts['room']}.", again]).passed
    sync = next(e for e in events.values() if e["title"] == "Team sync")
    wrong = [
        f"Your next meeting with them is on {sync['start'][:10]} at {sync['start'][11:16]} UTC, in {sync['location']}.",
        first.replace(day, next(e["start"][:10] for e in events.values() if e["title"] == one["title"] and e["start"] < "2026-03-02")),
        first.replace(f"{hh:02d}:00 UTC", f"{(hh + 1) % 24:02d}:00 CET"),
    ]
    for text in wrong:
        g = _answered(sb, spec, [text, again])
        assert not g.passed and g.failed_items() == ["next_given"], (text, g.items)
    stale = _answered(sb, spec, [first, first])
    assert not stale.passed and stale.failed_items() == ["moved_given"]


def test_a_meeting_answer_checker_blind_to_the_room_is_caught(validator, meetings):
    """A checker that reads the answer's day and time but not its room: the answer giving another record's room (the
    validator's wrong_value for a stated place) passes it, and so does a wrong weekday beside the date."""
    spec, _cert = meetings[0]
    start = spec.world["calendar.events"][spec.facts["event_id"]]["start"]
    code = (f"def check(ev):\n    r = ev['replies']\n    return len(r) > 0 and bool(r[0]) and {start[:10]!r} in r[0] and {start[11:16]!r} in r[0]"
            " and ' or ' not in r[0]\n")
    cert = validator.certify(_planted(_with_code(spec, "next_given", code)))
    survived = [d for d in cert.diagnostics if d.code == "mutation_survived"]
    assert cert.reference_pass and not cert.certified and survived, cert.diagnostics
    assert any(d.detail["operator"] == "wrong_value" and spec.facts["room"] in d.message for d in survived), [d.message for d in survived]


def test_a_meeting_answer_checker_blind_to_the_time_zone_is_caught(validator, meetings):
    """A checker that finds the day, the time and the room but not which clock the time is on: the answer giving
    the same figures in CET (the validator's misstated_value) passes it; the embedded checker kills that mutant."""
    spec, cert = meetings[0]
    zoned = [m for m in cert.mutants if m["operator"] == "misstated_value" and "in CET" in m["description"]]
    assert len(zoned) == 2 and all(m["killed"] for m in zoned), [m["description"] for m in cert.mutants]
    start = spec.world["calendar.events"][spec.facts["event_id"]]["start"]
    code = (f"def check(ev):\n    r = ev['replies']\n    return len(r) > 0 and bool(r[0]) and {start[:10]!r} in r[0] and {start[11:16]!r} in r[0]"
            f" and {spec.facts['room']!r} in r[0] and ' or ' not in r[0]\n")
    lax = validator.certify(_planted(_with_code(spec, "next_given", code)))
    survived = [d.message for d in lax.diagnostics if d.code == "mutation_survived"]
    assert lax.reference_pass and not lax.certified
    assert any("gives its times in CET" in m for m in survived), survived
