"""Composers: invoice reconciliation, meeting scheduling, ticket triage + follow-up, quote follow-up."""
from __future__ import annotations

from datetime import datetime, timedelta

from cowork_pipeline.services._util import matches
from cowork_pipeline.spec import Event, ProgramTurn, Step, Turn
from cowork_pipeline.synthesis.checks import CheckSpec, ItemPlan, id_shape
from cowork_pipeline.synthesis.composers._common import V, dates_given, first, mention, other_names
from cowork_pipeline.synthesis.embedded import Composition, Ctx, composer
from cowork_pipeline.synthesis.world import BASE

@composer("invoice_reconcile")
def invoice_reconcile(ctx: Ctx) -> Composition:
    wb = ctx.world("Finance")
    me = wb.me
    acc = wb.add_account()
    cust = wb.add_contact(acc, title="Accounts Payable")
    number = f"INV-{ctx.piece('number').randrange(1000, 9999)}"
    old = wb.amount(1200, 30000)
    pct = ctx.piece("discount").choice([5, 8, 10, 12, 15])
    new = round(old * (100 - pct) / 100, 2)
    inv = wb.add_invoice(acc, number=number, amount=old)
    for _ in range(ctx.near_duplicates):  # same customer, another invoice: pick by number, not by account
        wb.add_invoice(acc, status="paid")
    if ctx.flaw("collision"):  # another account's invoice carries the same number
        wb.add_invoice(wb.add_account(), number=number)
    lookalike = None
    if ctx.near_duplicates or ctx.flaw("vague"):
        other = wb.add_account()
        lookalike = wb.add_contact(other, first=first(cust["name"]))
    vague = ctx.flaw("vague") and lookalike is not None
    msg = wb.add_message(cust["email"], [me["email"]], f"Invoice {number} correction",
                         f"Hi {first(me['name'])},\nas agreed on our call we get a {pct}% volume discount, so the amount for "
                         f"invoice {number} should be {new:.2f} USD instead of {old:.2f} USD. Could you correct it?\n"
                         f"Thanks,\n{cust['name']}\n{acc['name']}")
    who = first(cust["name"]) if vague else cust["name"]
    user = f"{who} emailed about a correction to one of their invoices. Update the invoice in the CRM and reply to confirm."
    reference = [ProgramTurn(steps=[
        Step(tool="mail_search", args={"query": who}, bind={"msg": "0.id"}),
        Step(tool="mail_read", args={"message_id": V("msg")}),
        Step(tool="crm_search_invoices", args={"number": number}, bind={"inv": "0.id"}),
        Step(tool="crm_update_invoice", args={"invoice_id": V("inv"), "amount": new, "note": f"{pct}% volume discount agreed with {cust['name']}"}),
        Step(tool="mail_reply", args={"message_id": V("msg"), "body": f"Hi {first(cust['name'])}, invoice {number} is now corrected to {new:.2f} USD. Best, {first(me['name'])}"}),
    ], reply=f"Invoice {number} is corrected to {new:.2f} USD and I confirmed it to {cust['name']}.")]
    items = [
        ItemPlan("invoice_amount", f"Invoice {number} amount is {new:.2f}", CheckSpec("field_equals", {"collection": "crm.invoices", "id": inv["id"], "fields": {"amount": new}, "figures": [f"{pct}%"], "people": [cust["name"]]}, service="crm"), 2.0),
        ItemPlan("confirmation_sent", f"A reply to {cust['email']} confirms invoice {number} at {new:.2f}", CheckSpec("mail_sent", {"to": [cust["email"]], "includes": [number], "amounts": [new], "currency": "USD", "in_reply_to": msg["id"],
                                                                                                                  "excludes": other_names(wb.state, "crm.invoices", "number", number), "ids": id_shape(number)}, service="mail")),
    ]
    return Composition(
        title=f"Reconcile invoice {number} for {acc['name']}", world=wb, turns=[Turn(user=user)], reference=reference, items=items,
        targets={"crm.invoices": [inv["id"]], "mail.messages": [msg["id"]]}, new_in=["mail.messages"], allowed_domains=[acc["domain"]],
        mentions=[mention("crm.contacts", "name", who, "customer", partial=vague), mention("crm.invoices", "number", number, "invoice")],
        facts={"invoice_id": inv["id"], "new_amount": new, "message_id": msg["id"], "customer": cust["email"]},
    )


def _busy(wb, email: str, day: datetime, hours: list[int], title: str = "Busy") -> None:
    for h in hours:
        wb.add_event(title, day.replace(hour=h), 60, [email], organizer=email)


@composer("schedule_meeting")
def schedule_meeting(ctx: Ctx) -> Composition:
    wb = ctx.world("Engineering")
    me = wb.me
    n_att = 2 + min(ctx.extra_steps, 2)
    people = [wb.add_person() for _ in range(n_att)]
    day = (BASE + timedelta(days=1 + ctx.piece("day").randrange(3))).replace(hour=0, minute=0)
    hours = list(range(9, 17))
    slot_rng = ctx.piece("slot")
    free_hour = slot_rng.choice(hours[1:-1])
    # Everyone is busy at every other hour of the working day except the chosen one (and one decoy hour
    # where all but one attendee are free), so exactly one slot works.
    decoy = slot_rng.choice([h for h in hours if h != free_hour])
    for i, p in enumerate([me] + people):
        blocked = [h for h in hours if h not in (free_hour, decoy)]
        if i == 1:
            blocked.append(decoy)
        _busy(wb, p["email"], day, sorted(blocked))
    if ctx.flaw("conflict"):  # the sampled "free" hour is not free for the last attendee
        _busy(wb, people[-1]["email"], day, [free_hour], title="Dentist")
    topic = ctx.piece("topic").choice(["Q2 roadmap review", "Incident retro", "Hiring sync", "Budget check-in", "Launch go/no-go"])
    start = day.replace(hour=free_hour)
    names = ", ".join(p["name"] for p in people)
    emails = [p["email"] for p in people]
    user = (f"Find a one-hour slot on {day:%A %Y-%m-%d} (between 09:00 and 17:00 UTC) when {names} and I are all free, "
            f"and invite them to a meeting titled '{topic}'.")
    steps = [Step(tool="directory_search", args={"query": p["name"]}, bind={f"p{i}": "0.email"}) for i, p in enumerate(people)]
    steps.append(Step(tool="calendar_free_busy", args={"people": [V(f"p{i}") for i in range(len(people))] + [me["email"]],
                                                           "start": f"{day:%Y-%m-%d}T09:00:00Z", "end": f"{day:%Y-%m-%d}T17:00:00Z"}))
    steps.append(Step(tool="calendar_create_event", args={"title": topic, "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                              "end": (start + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                              "attendees": [V(f"p{i}") for i in range(len(people))], "timezone": "UTC"}))
    reference = [ProgramTurn(steps=steps, reply=f"Booked '{topic}' on {day:%Y-%m-%d} at {free_hour:02d}:00 UTC with {names}.")]
    items = [
        ItemPlan("meeting_booked", f"'{topic}' starts {start:%Y-%m-%d %H:%M} UTC for 60 minutes with {names}",
                 CheckSpec("event_at", {"start_utc": start.isoformat(), "minutes": 60, "attendees": emails, "title": topic,
                                        "when_allowed": dates_given(user, f"{BASE:%Y-%m-%d}", own=(start.isoformat(),),
                                                             ends=((start + timedelta(hours=1)).isoformat(),))},
                           service="calendar"), 2.0,
                 extra={"piece": "slot"}),
        ItemPlan("everyone_free", "Nobody invited is double-booked at that time",
                 CheckSpec("attendees_free", {"attendees": emails + [me["email"]]}, service="calendar"), 1.0, extra={"piece": "slot"}),
    ]
    return Composition(
        title=f"Schedule '{topic}'", world=wb, turns=[Turn(user=user)], reference=reference, items=items,
        targets={}, new_in=["calendar.events"], mentions=[mention("directory.people", "name", p["name"], f"attendee{i}") for i, p in enumerate(people)],
        facts={"start_utc": start.isoformat(), "attendees": emails},
    )


@composer("ticket_triage_followup")
def ticket_triage_followup(ctx: Ctx) -> Composition:
    wb = ctx.world("Support")
    acc = wb.add_account()
    cust = wb.add_contact(acc)
    oncall = wb.add_person(team="Support")
    others = [wb.add_person(team="Support") for _ in range(1 + ctx.near_duplicates)]
    # (subject, the customer's update, the word of the update an acknowledgement must repeat: a word that says what
    # is new, never a stop word such as 'it' or 'the', which any polite comment contains)
    problem = ctx.piece("problem").choice([("CSV export fails", "XLSX exports fail too", "XLSX"),
                                           ("Login loops back to the start page", "it also happens on mobile", "mobile"),
                                           ("Invoices PDF is blank", "the March invoices are affected as well", "March"),
                                           ("Webhook deliveries delayed", "delays are now over an hour", "hour")])
    subject, update, key = problem
    tkt = wb.add_ticket(subject, cust["email"], f"Since yesterday: {subject.lower()}. Please help.")
    for o in others:  # look-alike tickets from other customers
        wb.add_ticket(subject, wb.add_contact(wb.add_account())["email"], f"We see something similar: {subject.lower()}.", assignee=o["email"])
    support = wb.add_channel("support", [oncall["email"]] + [o["email"] for o in others] + [wb.me["email"]])
    wb.add_chat(support, others[0]["email"], f"Reminder: on-call this week is {oncall['name']}.")
    wb.add_chat(support, others[0]["email"], f"Last week's on-call was {others[-1]['name']}.")
    comment_id_text = f"Update from {first(cust['name'])}: {update}."
    user1 = (f"Triage the ticket {cust['name']} opened about '{subject}': set its priority to high and assign it to this week's "
             f"on-call engineer (see the support channel).")
    user2 = (f"{first(cust['name'])} added an update on that ticket. Acknowledge it with a public comment that says what you noted, "
             f"and set the ticket to pending.")
    ci = [r["id"] for r in sorted(wb.state["crm.contacts"].values(), key=lambda r: r["id"]) if matches(cust["name"], r["name"], r["email"], r["title"])].index(cust["id"])
    t1 = ProgramTurn(steps=[
        Step(tool="crm_search_contacts", args={"query": cust["name"]}, bind={"c": f"{ci}.email"}),  # the user names them; tickets know emails
        Step(tool="helpdesk_search_tickets", args={"requester": V("c")}, bind={"t": "0.id"}),
        Step(tool="chat_search", args={"query": "on-call this week"}),
        Step(tool="directory_search", args={"query": oncall["name"]}, bind={"oc": "0.email"}),
        Step(tool="helpdesk_update_ticket", args={"ticket_id": V("t"), "priority": "high", "assignee": V("oc")}),
    ], reply=f"The ticket is now high priority and assigned to {oncall['name']}.")
    t2 = ProgramTurn(steps=[
        Step(tool="helpdesk_get_ticket", args={"ticket_id": V("t")}),
        Step(tool="helpdesk_add_comment", args={"ticket_id": V("t"), "public": True,
                                                "body": f"Thanks {first(cust['name'])}, noted that {update}. {first(oncall['name'])} is on it."}),
        Step(tool="helpdesk_update_ticket", args={"ticket_id": V("t"), "status": "pending"}),
    ], reply="I acknowledged the update publicly and set the ticket to pending.")
    event = Event(tool="helpdesk_requester_comment", args={"ticket_id": tkt["id"], "author": cust["email"], "body": comment_id_text}, actor="customer")
    items = [
        ItemPlan("triaged", f"Ticket is high priority and assigned to {oncall['email']}, still {tkt['status']}",
                 CheckSpec("field_equals", {"collection": "helpdesk.tickets", "id": tkt["id"], "fields": {"priority": "high", "assignee": oncall["email"],
                                                                                                   "status": tkt["status"]}}, service="helpdesk"), 2.0, turn=0),
        ItemPlan("acknowledged", f"A public comment acknowledges the update ('{key}')",
                 CheckSpec("comment_added", {"ticket_id": tkt["id"], "public": True, "includes": [key],  # not naming last week's on-call
                                             "excludes": [o["name"] for o in others if o["name"] != oncall["name"]]}, service="helpdesk"), 1.0, turn=1),
        # judged on the whole record: the follow-up must not undo the triage
        ItemPlan("pending", "Ticket status is pending, still high priority with the on-call engineer",
                 CheckSpec("field_equals", {"collection": "helpdesk.tickets", "id": tkt["id"],
                                            "fields": {"status": "pending", "priority": "high", "assignee": oncall["email"]}}, service="helpdesk"), 1.0, turn=1),
        ItemPlan("after_update", "The acknowledgement came after the customer's update",
                 CheckSpec("after_event", {"actor": "customer", "tool": "helpdesk_add_comment", "args": {"public": True}}, service="helpdesk"), 1.0, turn=1),
    ]
    return Composition(
        title=f"Triage '{subject}' and follow up", world=wb, turns=[Turn(user=user1), Turn(user=user2, events=[event])],
        reference=[t1, t2], items=items, targets={"helpdesk.tickets": [tkt["id"]]}, new_in=[],
        mentions=[mention("crm.contacts", "name", cust["name"], "customer"), mention("helpdesk.tickets", "requester", cust["email"], "ticket")],
        facts={"ticket_id": tkt["id"], "oncall": oncall["email"]},
    )


@composer("quote_followup")
def quote_followup(ctx: Ctx) -> Composition:
    wb = ctx.world("Sales")
    me = wb.me
    acc = wb.add_account()
    buyer = wb.add_contact(acc, title="Procurement Lead")
    deal = wb.add_deal(acc, stage="proposal")
    for _ in range(ctx.near_duplicates):
        wb.add_deal(acc, stage="lost")
    amount = deal["amount"]
    reply_id = wb.id("msg")
    # The buyer's answer: the user's "if they accepted" must be read, so some buyers decline or haggle
    # (an agent that marks every quoted deal won fails those).
    answer = ctx.piece("answer").choice(["accept", "accept", "decline", "counter"])
    counter = round(amount * 0.85 / 100) * 100
    answer_body = {
        "accept": f"we accept the quote of {amount:.2f} USD. Please go ahead.",
        "decline": "thank you for the quote, but we have decided not to go ahead this quarter.",
        "counter": f"{amount:.2f} USD is above our budget. We could sign at {counter:.2f} USD; could you do that?",
    }[answer]
    user1 = (f"Send {buyer['name']} at {acc['name']} our quote for the '{deal['name']}' deal: email them the amount from the CRM "
             f"and ask them to confirm.")
    user2 = (f"{first(buyer['name'])} answered. If they accepted, mark the deal as won and thank them in a reply; "
             f"if not, leave the deal as it is and tell me what they said.")
    t1 = ProgramTurn(steps=[
        Step(tool="crm_search_contacts", args={"query": buyer["name"]}, bind={"b": "0.email", "acc": "0.account_id"}),
        Step(tool="crm_search_deals", args={"account_id": V("acc"), "stage": "proposal"}, bind={"d": "0.id"}),
        Step(tool="mail_send", args={"to": [V("b")], "subject": f"Quote: {deal['name']}",
                                     "body": f"Hi {first(buyer['name'])}, our quote for {deal['name']} is {amount:.2f} USD. Could you confirm? Best, {first(me['name'])}"}),
    ], reply=f"Sent the quote of {amount:.2f} USD to {buyer['name']}.")
    read = [Step(tool="mail_search", args={"sender": buyer["email"]}, bind={"r": "0.id"}), Step(tool="mail_read", args={"message_id": V("r")})]
    if answer == "accept":
        t2 = ProgramTurn(steps=read + [
            Step(tool="crm_update_deal", args={"deal_id": V("d"), "stage": "won", "note": f"Accepted by {buyer['name']} by email"}),
            Step(tool="mail_reply", args={"message_id": V("r"), "body": f"Thank you {first(buyer['name'])}, we are glad to have {acc['name']} on board!"}),
        ], reply="The deal is marked won and I thanked them.")
    else:
        t2 = ProgramTurn(steps=read, reply=(f"{first(buyer['name'])} declined for this quarter" if answer == "decline" else
                                            f"{first(buyer['name'])} did not accept {amount:.2f} USD; they offered {counter:.2f} USD")
                         + f", so I left '{deal['name']}' as it is.")
    event = Event(tool="mail_deliver", actor="customer", args={
        "id": reply_id, "sender": buyer["email"], "to": [me["email"]], "subject": f"Re: Quote: {deal['name']}",
        "body": f"Hi {first(me['name'])}, {answer_body}\n{buyer['name']}"})
    # the buyer must not read another customer's or another deal's name (a leak and a wrong quote)
    wrong = other_names(wb.state, "crm.accounts", "name", acc["name"], deal["name"]) + other_names(wb.state, "crm.deals", "name", deal["name"])
    items = [
        ItemPlan("quote_sent", f"Quote email to {buyer['email']} states {amount:.2f}",
                 CheckSpec("mail_sent", {"to": [buyer["email"]], "includes": [], "amounts": [amount], "currency": deal["currency"], "excludes": wrong}, service="mail"), 2.0, turn=0),
    ]
    if answer == "accept":
        items += [
            ItemPlan("deal_won", "Deal stage is won", CheckSpec("field_equals", {"collection": "crm.deals", "id": deal["id"], "fields": {"stage": "won"},
                                                                            "people": [buyer["name"]]}, service="crm"), 2.0, turn=1),
            ItemPlan("thanked", "A reply thanks the buyer in the acceptance thread",
                     CheckSpec("mail_sent", {"to": [buyer["email"]], "includes": ["thank"], "in_reply_to": reply_id, "excludes": wrong}, service="mail"), 1.0, turn=1),
            ItemPlan("won_after_acceptance", "The deal was marked won only after the acceptance arrived",
                     CheckSpec("after_event", {"actor": "customer", "tool": "crm_update_deal", "args": {"stage": "won"}}, service="crm"), 1.0, turn=1),
        ]
    else:  # not accepted: the deal stays where it was, at the quoted amount (not won, not re-priced to the counter-offer)
        items.append(ItemPlan("deal_left_open", f"The buyer did not accept: the deal is still at {deal['stage']}, {amount:.2f}",
                              CheckSpec("field_equals", {"collection": "crm.deals", "id": deal["id"], "fields": {"stage": deal["stage"], "amount": amount}},
                                        service="crm"), 2.0, turn=1))
    return Composition(
        title=f"Quote and close '{deal['name']}'", world=wb, turns=[Turn(user=user1), Turn(user=user2, events=[event])],
        reference=[t1, t2], items=items, targets={"crm.deals": [deal["id"]], "mail.messages": [reply_id]}, new_in=["mail.messages"],
        allowed_domains=[acc["domain"]], mentions=[mention("crm.contacts", "name", buyer["name"], "buyer"), mention("crm.deals", "name", deal["name"], "deal")],
        facts={"deal_id": deal["id"], "amount": amount, "answer": answer, **({"counter": float(counter)} if answer == "counter" else {})},
    )
