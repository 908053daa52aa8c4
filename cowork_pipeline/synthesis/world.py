"""A seeded builder of coherent worlds: people, companies and records that refer to one another."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

COMPANY = "Northwind"
DOMAIN = "northwind.example"
FIRST = ["Dana", "Priya", "Marcus", "Elena", "Tomás", "Aiko", "Jonas", "Fatima", "Oliver", "Mei", "Samir", "Grace",
         "Lukas", "Nadia", "Ravi", "Sofia", "Kwame", "Ingrid", "Mateo", "Hana", "Victor", "Zoe", "Arjun", "Clara"]
LAST = ["Kim", "Patel", "Okafor", "Rossi", "García", "Tanaka", "Berg", "Haddad", "Smith", "Chen", "Nasser", "Lee",
        "Weber", "Ivanova", "Rao", "Costa", "Mensah", "Larsen", "Silva", "Sato", "Dubois", "Novak", "Mehta", "Fischer"]
COMPANIES = ["Globex", "Initech", "Umbrella Foods", "Stark Metals", "Wayne Logistics", "Acme Retail", "Hooli Cloud",
             "Vandelay Imports", "Soylent Labs", "Cyberdyne Health", "Tyrell Design", "Oscorp Energy", "Wonka Candy",
             "Gringotts Finance", "Pied Piper Media", "Monarch Travel"]
TEAMS = ["Sales", "Finance", "Support", "Engineering", "People", "Marketing"]
ROLES = {"Sales": "Account Executive", "Finance": "Billing Specialist", "Support": "Support Engineer",
         "Engineering": "Engineer", "People": "HR Partner", "Marketing": "Marketing Manager"}
TIMEZONES = ["Europe/Berlin", "America/New_York", "Europe/London", "Asia/Tokyo", "America/Los_Angeles", "UTC"]
BASE = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)  # the workspace clock's origin (a Monday)


def slug(name: str) -> str:
    table = str.maketrans("áéíóúñçäöü", "aeiouncaou")
    return "".join(c for c in name.lower().translate(table) if c.isalnum() or c in " -").replace(" ", "-").replace("--", "-")


class WorldBuilder:
    """Each ``add_*`` returns the record it stored; ids are random hex so they never collide
    with the sequential ids tools mint at run time (``msg_0001``)."""

    def __init__(self, rng: random.Random, profile_team: str = "Sales", distinct: bool = False):
        self.rng = rng
        # a revision that fixed a name collision: records drawn with a generated name never repeat one
        self.distinct = distinct
        self.state: dict[str, dict[str, dict[str, Any]]] = {}
        self._names: set[str] = set()
        self._ids: set[str] = set()
        self.me = self.add_person(team=profile_team)
        self.state["_meta"] = {
            "profile": {"name": self.me["name"], "email": self.me["email"], "timezone": self.me["timezone"]},
            "clock": {"minutes": 0},
        }

    # ---- primitives -----------------------------------------------------------------
    def id(self, prefix: str) -> str:
        while True:
            rid = f"{prefix}_{self.rng.randrange(16 ** 5):05x}"
            if rid not in self._ids:
                self._ids.add(rid)
                return rid

    def put(self, collection: str, rec: dict[str, Any]) -> dict[str, Any]:
        self.state.setdefault(collection, {})[rec["id"]] = rec
        return rec

    def name(self, first: str | None = None, last: str | None = None) -> tuple[str, str]:
        for _ in range(500):
            f, l = first or self.rng.choice(FIRST), last or self.rng.choice(LAST)
            if f"{f} {l}" not in self._names:
                self._names.add(f"{f} {l}")
                return f, l
        raise RuntimeError("name pool exhausted")

    def past(self, days_max: int = 10) -> str:
        dt = BASE - timedelta(days=self.rng.randint(1, days_max), minutes=self.rng.randrange(0, 600, 5))
        return dt.strftime("%Y-%m-%dT%H:%M:%SZ")

    def amount(self, lo: int = 800, hi: int = 20000) -> float:
        return float(self.rng.randrange(lo, hi, 50))

    # ---- records --------------------------------------------------------------------
    def add_person(self, team: str | None = None, first: str | None = None, last: str | None = None) -> dict[str, Any]:
        f, l = self.name(first, last)
        team = team or self.rng.choice(TEAMS)
        return self.put("directory.people", {
            "id": self.id("usr"), "name": f"{f} {l}", "email": f"{slug(f)}.{slug(l)}@{DOMAIN}", "team": team,
            "role": ROLES[team], "timezone": self.rng.choice(TIMEZONES)})

    def add_account(self, name: str | None = None) -> dict[str, Any]:
        used = {a["name"] for a in self.state.get("crm.accounts", {}).values()}
        name = name or self.rng.choice([c for c in COMPANIES if c not in used])
        return self.put("crm.accounts", {
            "id": self.id("acc"), "name": name, "domain": f"{slug(name).split('-')[0]}.example",
            "industry": self.rng.choice(["retail", "manufacturing", "health", "finance", "media", "logistics"]),
            "owner": self.me["email"], "tier": self.rng.choice(["bronze", "silver", "gold"])})

    def add_contact(self, account: dict[str, Any], first: str | None = None, last: str | None = None,
                    title: str | None = None) -> dict[str, Any]:
        f, l = self.name(first, last)
        return self.put("crm.contacts", {
            "id": self.id("con"), "account_id": account["id"], "name": f"{f} {l}",
            "email": f"{slug(f)}.{slug(l)}@{account['domain']}",
            "title": title or self.rng.choice(["CFO", "Procurement Lead", "Operations Manager", "CTO", "Office Manager"]),
            "phone": f"+1-555-{self.rng.randrange(1000, 9999)}", "history": []})

    def add_invoice(self, account: dict[str, Any], number: str | None = None, amount: float | None = None,
                    status: str = "open") -> dict[str, Any]:
        return self.put("crm.invoices", {
            "id": self.id("inv"), "account_id": account["id"], "number": number or f"INV-{self.rng.randrange(1000, 9999)}",
            "amount": amount if amount is not None else self.amount(), "status": status,
            "due_date": (BASE + timedelta(days=self.rng.randint(5, 40))).strftime("%Y-%m-%d"), "history": []})

    def add_deal(self, account: dict[str, Any], name: str | None = None, stage: str = "proposal",
                 amount: float | None = None) -> dict[str, Any]:
        return self.put("crm.deals", {
            "id": self.id("deal"), "account_id": account["id"],
            "name": name or f"{account['name']} {self.rng.choice(self._unused(account['name'], 'crm.deals', ['renewal', 'expansion', 'pilot', 'rollout']))}",
            "stage": stage, "amount": amount if amount is not None else self.amount(5000, 90000), "currency": "USD",
            "close_date": (BASE + timedelta(days=self.rng.randint(10, 60))).strftime("%Y-%m-%d"),
            "owner": self.me["email"], "history": []})

    def _unused(self, prefix: str, collection: str, suffixes: list[str]) -> list[str]:
        """``suffixes``, or with ``distinct`` those that name no record of ``collection`` yet (all when none is left)."""
        if not self.distinct:
            return suffixes
        taken = {r.get("name") for r in self.state.get(collection, {}).values()}
        return [x for x in suffixes if f"{prefix} {x}" not in taken] or suffixes

    def add_message(self, sender: str, to: list[str], subject: str, body: str, folder: str = "inbox",
                    thread_id: str | None = None, read: bool = False, date: str | None = None,
                    attachments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        mid = self.id("msg")
        return self.put("mail.messages", {
            "id": mid, "thread_id": thread_id or f"thr_{mid[4:]}", "folder": folder, "from": sender, "to": to, "cc": [],
            "subject": subject, "body": body, "date": date or self.past(), "read": read, "labels": [],
            "attachments": attachments or [], "in_reply_to": None})

    def add_event(self, title: str, start: datetime, minutes: int, attendees: list[str], tz: str = "UTC",
                  organizer: str | None = None) -> dict[str, Any]:
        return self.put("calendar.events", {
            "id": self.id("evt"), "title": title, "start": start.isoformat(), "end": (start + timedelta(minutes=minutes)).isoformat(),
            "timezone": tz, "attendees": attendees, "organizer": organizer or self.me["email"], "location": "",
            "description": "", "status": "confirmed"})

    def add_ticket(self, subject: str, requester: str, description: str, status: str = "open", priority: str = "normal",
                   assignee: str | None = None) -> dict[str, Any]:
        return self.put("helpdesk.tickets", {
            "id": self.id("tkt"), "subject": subject, "requester": requester, "description": description,
            "status": status, "priority": priority, "assignee": assignee, "tags": [], "comments": [], "created": self.past()})

    def add_folder(self, name: str) -> dict[str, Any]:
        return self.put("docs.folders", {"id": self.id("fld"), "name": name, "parent_id": None})

    def add_doc(self, folder: dict[str, Any], title: str, content: str, owner: str | None = None,
                confidential: bool = False) -> dict[str, Any]:
        return self.put("docs.documents", {
            "id": self.id("doc"), "folder_id": folder["id"], "title": title, "content": content,
            "owner": owner or self.me["email"], "confidential": confidential, "shared_with": [], "updated": self.past()})

    def add_channel(self, name: str, members: list[str], private: bool = False) -> dict[str, Any]:
        return self.put("chat.channels", {"id": self.id("ch"), "name": name, "members": members, "private": private})

    def add_chat(self, channel: dict[str, Any], author: str, text: str) -> dict[str, Any]:
        return self.put("chat.messages", {"id": self.id("cm"), "channel_id": channel["id"], "author": author, "text": text,
                                          "at": self.past(3)})

    def add_task(self, title: str, assignee: str, due: str | None = None, status: str = "todo", related: str | None = None) -> dict[str, Any]:
        return self.put("tasks.tasks", {"id": self.id("tsk"), "title": title, "assignee": assignee, "due": due,
                                        "status": status, "priority": "normal", "notes": "", "related": related})

    # ---- background -----------------------------------------------------------------
    def background(self, n: int) -> None:
        """Unrelated records in every service, so the task is found among noise."""
        people = [self.add_person() for _ in range(max(2, n))]
        accounts = [self.add_account() for _ in range(max(1, n // 2))]
        for acc in accounts:
            self.add_contact(acc)
            self.add_invoice(acc)
            self.add_deal(acc)
        folder = self.add_folder("Shared")
        general = self.add_channel("general", [p["email"] for p in people] + [self.me["email"]])
        for i, p in enumerate(people[:n]):
            self.add_message(p["email"], [self.me["email"]], self.rng.choice(
                ["Lunch on Thursday?", "Quarterly numbers", "Parking update", "Offsite agenda", "Laptop refresh"]),
                f"Hi {self.me['name'].split()[0]}, quick note from {p['name'].split()[0]}.", read=bool(i % 2))
            self.add_doc(folder, f"Notes {i + 1}", f"Meeting notes by {p['name']}.", owner=p["email"])
            self.add_chat(general, p["email"], self.rng.choice(["Morning all!", "Build is green.", "Who has the projector?"]))
            self.add_task(self.rng.choice(["Update slides", "Review contract", "Book travel"]), p["email"])
            start = BASE + timedelta(days=self.rng.randint(0, 4), hours=self.rng.randint(0, 7))
            self.add_event(self.rng.choice(["1:1", "Standup", "Planning"]), start, 30, [p["email"]], organizer=p["email"])
