"""Composers whose deliverable is an answer: the user asks, the agent looks it up and replies; nothing changes."""
from __future__ import annotations

import random
from datetime import datetime, timedelta

from cowork_pipeline.services._util import matches
from cowork_pipeline.spec import Event, ProgramTurn, Step, Turn
from cowork_pipeline.synthesis.checks import CheckSpec, ItemPlan, id_shape
from cowork_pipeline.synthesis.composers._common import V, _at, dates_given, first, mention, other_names, position, twin_person
from cowork_pipeline.synthesis.embedded import Composition, Ctx, composer
from cowork_pipeline.synthesis.world import BASE

BRANCHES = ["Europe", "Labs", "Holdings", "Services"]


def _line(inv: dict) -> str:
    return f"- {inv['number']}: {inv['amount']:.2f} USD, due {inv['due_date']}"


@composer("overdue_invoices_question")
def overdue_invoices_question(ctx: Ctx) -> Composition:
    wb = ctx.world("Finance")
    acc = wb.add_account()
    due = ctx.piece("invoices")
    n = 2 + ctx.extra_steps
    overdue = []
    for days in sorted(due.sample(range(3, 45), n), reverse=True):  # oldest first, as the answer lists them
        inv = wb.add_invoice(acc, amount=wb.amount(400, 15000))
        inv["due_date"] = (BASE - timedelta(days=days)).strftime("%Y-%m-%d")
        overdue.append(inv)
    # what is not overdue: open but not yet due, and paid although its due date has passed
    wb.add_invoice(acc)
    paid = wb.add_invoice(acc, status="paid")
    paid["due_date"] = (BASE - timedelta(days=due.randint(3, 45))).strftime("%Y-%m-%d")
    if ctx.flaw("conflict"):  # the generator recorded every invoice as paid: there is nothing overdue to find
        for inv in overdue:
            inv["status"] = "paid"
    for i in range(ctx.near_duplicates):  # a sister company with overdue invoices of its own: the search finds both
        sister = wb.add_account(name=f"{acc['name']} {BRANCHES[i]}")
        late = wb.add_invoice(sister)
        late["due_date"] = (BASE - timedelta(days=due.randint(3, 45))).strftime("%Y-%m-%d")
    if ctx.flaw("collision"):  # a second account record with the very same name
        wb.add_account(name=acc["name"])
    settled = overdue[ctx.piece("payment").randrange(n)]
    left = [inv for inv in overdue if inv is not settled]
    ai = position(wb, "crm.accounts", acc["id"], lambda a: matches(acc["name"], a["name"], a["domain"]))
    user1 = f"Which invoices of {acc['name']} are overdue, and for how much each?"
    user2 = f"Finance just recorded a payment from {acc['name']}. Which of their invoices are still overdue? Just list those."
    t1 = ProgramTurn(steps=[
        Step(tool="crm_search_accounts", args={"query": acc["name"]}, bind={"a": f"{ai}.id"}),
        Step(tool="crm_search_invoices", args={"account_id": V("a"), "status": "open"}),
    ], reply=f"{acc['name']} has {n} overdue invoices:\n" + "\n".join(_line(inv) for inv in overdue))
    t2 = ProgramTurn(steps=[
        Step(tool="crm_search_invoices", args={"account_id": V("a"), "status": "open"}),
    ], reply=f"Still overdue for {acc['name']}:\n" + "\n".join(_line(inv) for inv in left))
    event = Event(tool="crm_update_invoice", actor="finance", args={"invoice_id": settled["id"], "status": "paid",
                                                                    "note": "Payment received by bank transfer"})
    numbers = [inv["number"] for inv in overdue]
    unpaid = ["paid", "settled", "cleared"]  # "INV-1 for 3800.00 USD has not been paid": that it is unpaid is the answer
    items = [
        ItemPlan("overdue_listed", f"The answer lists the overdue invoices {', '.join(numbers)} with their amounts, and no other invoice",
                 CheckSpec("answer", {"turn": 0, "includes": numbers, "amounts": [inv["amount"] for inv in overdue], "currency": "USD",
                                      "pairs": [[inv["number"], inv["amount"]] for inv in overdue],
                                      "dates": [[inv["number"], inv["due_date"]] for inv in overdue], "count": [n, "invoice"], "negations": unpaid,
                                      "excludes": other_names(wb.state, "crm.invoices", "number", *numbers), "ids": id_shape(*numbers)},
                           service="answer"), 2.0, turn=0, extra={"piece": "invoices"}),
        ItemPlan("looked_up", f"The agent looked up {acc['name']}'s invoices before answering",
                 CheckSpec("looked_up", {"turn": 0, "shows": [inv["id"] for inv in overdue]}, service="crm"), 1.0, turn=0,
                 extra={"piece": "invoices"}),
        ItemPlan("still_overdue", f"After the payment the answer lists {', '.join(i['number'] for i in left)} with their amounts, "
                                  f"not the paid {settled['number']}",
                 CheckSpec("answer", {"turn": 1, "includes": [i["number"] for i in left], "amounts": [i["amount"] for i in left], "currency": "USD",
                                      "pairs": [[i["number"], i["amount"]] for i in left],
                                      "dates": [[i["number"], i["due_date"]] for i in left], "count": [n - 1, "invoice"], "negations": unpaid,
                                      "excludes": other_names(wb.state, "crm.invoices", "number", *[i["number"] for i in left]),
                                      "ids": id_shape(*[i["number"] for i in left])},
                           service="answer"), 2.0, turn=1),
        ItemPlan("looked_again", "The agent looked the invoices up again after the payment",
                 CheckSpec("looked_up", {"turn": 1, "shows": [i["id"] for i in left]}, service="crm"), 1.0, turn=1),
    ]
    return Composition(
        title=f"Tell which invoices of {acc['name']} are overdue", world=wb,
        turns=[Turn(user=user1, answer=True), Turn(user=user2, events=[event], answer=True)],
        reference=[t1, t2], items=items, targets={}, new_in=[],  # (the payment is the world's change, not the agent's)
        mentions=[mention("crm.accounts", "name", acc["name"], "account")],
        facts={"account_id": acc["id"], "overdue": [inv["id"] for inv in overdue], "settled": settled["id"]},
    )


# City, currency, and the range its limit is drawn from (in steps of 5) in each world. A limit fixed per city
# made every draft of this capability pose one of eight tasks with one of eight answers (9 distinct tasks in 64
# seeds), so a student could answer from memory without reading the policy. (Currencies the validator's
# misstated-currency mutant knows.)
CITIES = [("Amsterdam", "EUR", 160, 240), ("Berlin", "EUR", 150, 220), ("Boston", "USD", 240, 340),
          ("Chicago", "USD", 220, 320), ("Dublin", "EUR", 170, 250), ("Edinburgh", "GBP", 140, 210),
          ("Geneva", "CHF", 230, 330), ("London", "GBP", 170, 250), ("Madrid", "EUR", 130, 200),
          ("Melbourne", "AUD", 200, 290), ("New York", "USD", 260, 380), ("Paris", "EUR", 190, 280),
          ("Singapore", "SGD", 250, 360), ("Sydney", "AUD", 230, 330), ("Toronto", "CAD", 200, 300),
          ("Zurich", "CHF", 220, 310)]


# Every (city, limit) the traveller may ask about, in one fixed shuffled order: seed k asks the k-th, so no two of
# the first len(_ASKED) seeds ask the same question for the same answer (drawn at random, 64 seeds repeated 4 to 5
# of their questions with the same limit: one task in two environments). First the limits in steps of 5 (306),
# then the others (1,160 more: seed 306 on had asked seed 0's question again); a world whose question is one of
# those lists every city at any figure, so the asked city's is not the one line that is no multiple of 5.
_ROUND = [(city, cur, limit) for city, cur, low, high in CITIES for limit in range(low, high + 1, 5)]
_OTHER = [(city, cur, limit) for city, cur, low, high in CITIES for limit in range(low, high + 1) if limit % 5 != low % 5]
random.Random("travel_policy_question").shuffle(_ROUND)
random.Random("travel_policy_question:other").shuffle(_OTHER)
_ASKED = _ROUND + _OTHER


def _draw_limits(pick: random.Random, n: int, asked: int) -> list[tuple[str, str, int]]:
    """``n`` cities with this world's limits, the traveller's first (the ``asked``-th of :data:`_ASKED`); no two of
    one currency share a limit, so the policy's line for the asked city is the only one that gives its answer."""
    first = _ASKED[asked % len(_ASKED)]
    step = 5 if asked % len(_ASKED) < len(_ROUND) else 1
    cities = pick.sample([c for c in CITIES if c[0] != first[0]], n - 1)
    while True:
        rows = [first] + [(city, cur, pick.randrange(low, high + 1, step)) for city, cur, low, high in cities]
        if len({(cur, amount) for _, cur, amount in rows}) == n:
            return rows


# A limit per night given for another period misinforms by a factor of 7 or 30 ("180.00 EUR per week"); "per day" is how
# some people say per night, and a limit without its period is what the user asked for.
OTHER_PERIODS = ["per week", "a week", "weekly", "per month", "a month", "monthly", "per year", "a year", "per stay", "per trip"]


def _limits(rows: list[tuple[str, str, int]], delta: int) -> str:
    return "\n".join(f"- {city}: {amount + delta} {cur}" for city, cur, amount in rows)


@composer("travel_policy_question")
def travel_policy_question(ctx: Ctx) -> Composition:
    wb = ctx.world("People")
    folder = wb.add_folder("Policies")
    pick = ctx.piece("city")
    # (a re-sampled city asks another question: one a seed far from this one asks)
    rows = _draw_limits(pick, 5, ctx.seed + 101 * ctx.knobs.get("resample", {}).get("city", 0))
    city, cur, amount = rows[0]
    rows = sorted(rows)  # the document lists its cities alphabetically
    bump = pick.choice([10, 20, 30])
    title = "Travel policy 2026"
    doc = wb.add_doc(folder, title, "Applies from 2026-01-01. Book through the travel desk.\nHotel limit per night, taxes included:\n"
                     + _limits(rows, 0) + "\nAbove the limit, your manager approves before booking.")
    # last year's policy, and next year's draft: the same cities at other limits (a search for the policy finds all three)
    wb.add_doc(folder, "Travel policy 2025 (superseded)", "Superseded by the 2026 policy.\nHotel limit per night:\n" + _limits(rows, -bump))
    for _ in range(ctx.near_duplicates):
        wb.add_doc(folder, "Travel policy 2027 draft", "Draft, not in force.\nHotel limit per night:\n" + _limits(rows, bump))
    if ctx.flaw("collision"):  # a second document with the very same title
        wb.add_doc(wb.add_folder("Archive"), title, "Old copy.\nHotel limit per night:\n" + _limits(rows, -bump))
    if ctx.flaw("conflict"):  # the generator left the traveller's city out of the policy
        doc["content"] = doc["content"].replace(f"- {city}: {amount} {cur}\n", "")
    di = position(wb, "docs.documents", doc["id"], lambda r: matches("travel policy", r["title"], r["content"]))
    user = f"I'm travelling to {city} next month. What is the hotel limit per night under our current travel policy?"
    ref = [ProgramTurn(steps=[
        Step(tool="docs_search", args={"query": "travel policy"}, bind={"d": f"{di}.id"}),
        Step(tool="docs_read", args={"doc_id": V("d")}),
    ], reply=f"Under the {title}, the hotel limit in {city} is {amount:.2f} {cur} per night, taxes included; above it your "
             f"manager approves before booking.")]
    items = [
        ItemPlan("limit_given", f"The answer gives the {city} limit of the current policy: {amount} {cur} per night",
                 CheckSpec("answer", {"turn": 0, "includes": [], "amounts": [amount], "currency": cur,
                                      "excludes": OTHER_PERIODS}, service="answer"), 2.0, turn=0,  # the limit is per night
                 extra={"piece": "city"}),
        ItemPlan("policy_read", f"The agent read the current policy ({title}) before answering",
                 CheckSpec("looked_up", {"turn": 0, "shows": [doc["id"], f"- {city}: {amount} {cur}"]}, service="docs"), 1.0, turn=0,
                 extra={"piece": "city"}),
    ]
    return Composition(
        title=f"Tell the hotel limit for {city}", world=wb, turns=[Turn(user=user, answer=True)], reference=ref, items=items,
        targets={}, new_in=[], mentions=[mention("docs.documents", "title", title, "policy")],
        facts={"doc_id": doc["id"], "city": city, "limit": amount, "currency": cur},
    )


ROOMS = ["Fjord", "Atlas", "Summit", "Harbor", "Orchard", "Beacon", "Lagoon", "Granite"]


def _slot(day: datetime, hour: int) -> str:
    return f"{day:%A %Y-%m-%d} at {hour:02d}:00 UTC"


@composer("next_meeting_question")
def next_meeting_question(ctx: Ctx) -> Composition:
    wb = ctx.world("Engineering")
    me = wb.me
    peer = wb.add_person()
    slot = ctx.piece("slot")
    day = (BASE + timedelta(days=1 + slot.randrange(3))).replace(hour=0, minute=0)
    h = slot.randrange(9, 17)
    rooms = ctx.piece("rooms").sample(ROOMS, 3)
    title = f"1:1 {first(me['name'])} / {first(peer['name'])}"
    one = wb.add_event(title, day.replace(hour=h), 30, [peer["email"]])
    one["location"] = rooms[0]
    # the same 1:1 last week (past) and next week (not the next one), and a team meeting with them before it
    for weeks in (-1, 1):
        wb.add_event(title, day.replace(hour=h) + timedelta(days=7 * weeks), 30, [peer["email"]])["location"] = rooms[0]
    series = [f"{day + timedelta(days=7 * weeks):%Y-%m-%d}" for weeks in (-1, 1)]  # (an answer may say when the others are: the series' own days)
    team = wb.add_event("Team sync", BASE.replace(hour=11 + slot.randrange(4)), 45, [peer["email"], wb.add_person()["email"]])
    team["location"] = rooms[1]
    for _ in range(ctx.near_duplicates):  # a namesake colleague with a 1:1 of the same title, sooner
        twin = wb.add_person(first=first(peer["name"]))
        wb.add_event(title, BASE.replace(hour=14) + timedelta(days=1), 30, [twin["email"]])["location"] = rooms[1]
    if ctx.flaw("collision"):  # a second colleague with the very same name
        twin_person(wb, peer, peer["team"])
    if ctx.flaw("conflict"):  # the generator left the 1:1 cancelled: the next one is a week later
        one["status"] = "cancelled"
    moved = ctx.piece("move")
    day2 = day + timedelta(days=moved.randrange(2))
    h2 = moved.choice([x for x in range(9, 17) if (day2, x) != (day, h)])
    new, dur = day2.replace(hour=h2), timedelta(minutes=30)
    pi = position(wb, "directory.people", peer["id"], lambda r: matches(peer["name"], r["name"], r["email"], r["team"], r["role"]))
    ei = position(wb, "calendar.events", one["id"],
                  lambda r: r["status"] != "cancelled" and datetime.fromisoformat(r["end"]) > BASE
                  and (peer["email"] in r["attendees"] or r["organizer"] == peer["email"]),
                  key=lambda r: (datetime.fromisoformat(r["start"]), r["id"]))
    user1 = f"When is my next 1:1 with {peer['name']}, and in which room? Times in UTC, please."
    user2 = f"{first(peer['name'])} says they moved our 1:1. When and where is it now?"
    t1 = ProgramTurn(steps=[
        Step(tool="directory_search", args={"query": peer["name"]}, bind={"p": f"{pi}.email"}),
        Step(tool="calendar_list_events", args={"start": _at(BASE), "attendee": V("p")}, bind={"e": f"{ei}.id"}),
        Step(tool="calendar_get_event", args={"event_id": V("e")}),
    ], reply=f"Your next 1:1 with {peer['name']} is on {_slot(day, h)}, in {rooms[0]}.")
    t2 = ProgramTurn(steps=[
        Step(tool="calendar_get_event", args={"event_id": V("e")}),
    ], reply=f"It is now on {_slot(day2, h2)}, in {rooms[2]}.")
    event = Event(tool="calendar_update_event", actor="colleague", args={
        "event_id": one["id"], "start": new.isoformat(), "end": (new + dur).isoformat(), "location": rooms[2]})
    others = [n for n in other_names(wb.state, "directory.people", "name", peer["name"]) if n != me["name"]]  # no one else's 1:1
    items = [
        ItemPlan("next_given", f"The answer gives the next 1:1: {_slot(day, h)}, in {rooms[0]}",
                 CheckSpec("answer", {"turn": 0, "includes": [rooms[0]], "when": {"date": f"{day:%Y-%m-%d}", "time": f"{h:02d}:00"},
                                      "excludes": others, "when_allowed": dates_given(user1, f"{BASE:%Y-%m-%d}", own=(one["start"], *series), ends=(one["end"],))},
                           service="answer"), 2.0, turn=0, extra={"piece": "slot"}),
        ItemPlan("looked_up", "The agent read the 1:1's record (its room) before answering",
                 CheckSpec("looked_up", {"turn": 0, "shows": [one["id"], rooms[0]]}, service="calendar"), 1.0, turn=0,
                 extra={"piece": "slot"}),
        ItemPlan("moved_given", f"After the move the answer gives {_slot(day2, h2)}, in {rooms[2]}",
                 CheckSpec("answer", {"turn": 1, "includes": [rooms[2]], "when": {"date": f"{day2:%Y-%m-%d}", "time": f"{h2:02d}:00"},
                                      "excludes": others, "when_allowed": dates_given(user2, f"{BASE:%Y-%m-%d}", own=(new.isoformat(), *series),
                                                                                      ends=((new + dur).isoformat(),), was=(one["start"], one["end"]))},
                           service="answer"), 2.0, turn=1),
        ItemPlan("looked_again", "The agent read the 1:1 again after it moved",
                 CheckSpec("looked_up", {"turn": 1, "shows": [one["id"], rooms[2]]}, service="calendar"), 1.0, turn=1),
    ]
    return Composition(
        title=f"Tell when the next 1:1 with {peer['name']} is", world=wb,
        turns=[Turn(user=user1, answer=True), Turn(user=user2, events=[event], answer=True)],
        reference=[t1, t2], items=items, targets={}, new_in=[],  # (the move is the colleague's change, not the agent's)
        mentions=[mention("directory.people", "name", peer["name"], "colleague")],
        facts={"event_id": one["id"], "colleague": peer["email"], "room": rooms[0], "moved_room": rooms[2]},
    )
