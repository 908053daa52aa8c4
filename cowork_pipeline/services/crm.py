"""Contacts/CRM: accounts, contacts, deals and invoices with typed fields and change history."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import limit_rows, matches, pick
from cowork_pipeline.services.registry import P, ToolError, tool
from cowork_pipeline.services.workspace import Workspace

ACC, CON, DEAL, INV = "crm.accounts", "crm.contacts", "crm.deals", "crm.invoices"
STAGES = ("lead", "qualified", "proposal", "negotiation", "won", "lost")
INVOICE_STATUS = ("open", "paid", "disputed", "void")


def _with_history(ws: Workspace, coll: str, rid: str, changes: dict[str, Any], note: str | None) -> dict[str, Any]:
    """Apply typed changes and append one history entry per changed field."""
    rec = ws.get(coll, rid)
    hist = list(rec.get("history", []))
    real = {k: v for k, v in changes.items() if v is not None and rec.get(k) != v}
    if not real and not note:
        raise ToolError("invalid_arguments", "nothing to change: every given field already has that value")
    for k, v in real.items():
        hist.append({"at": ws.now(), "by": ws.profile["email"], "field": k, "old": rec.get(k), "new": v})
    if note:
        hist.append({"at": ws.now(), "by": ws.profile["email"], "field": "note", "old": None, "new": note})
    return ws.update(coll, rid, **real, history=hist)


@tool("crm", "Search accounts (companies) by name or domain.",
      P("query", "string", "Words in the name or domain", required=False),
      P("limit", "integer", "Maximum results", required=False, minimum=1))
def search_accounts(ws: Workspace, query: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    rows = sorted((a for a in ws.table(ACC).values() if matches(query, a["name"], a["domain"])), key=lambda a: a["id"])
    return [pick(a, "id", "name", "domain", "tier") for a in limit_rows(rows, limit)]


@tool("crm", "Get an account with its contacts, deals and invoices.", P("account_id", "string", "Account id"))
def get_account(ws: Workspace, account_id: str) -> dict[str, Any]:
    a = ws.get(ACC, account_id, "account")
    return {
        **a,
        "contacts": [pick(c, "id", "name", "email", "title") for c in ws.table(CON).values() if c["account_id"] == account_id],
        "deals": [pick(d, "id", "name", "stage", "amount") for d in ws.table(DEAL).values() if d["account_id"] == account_id],
        "invoices": [pick(i, "id", "number", "amount", "status") for i in ws.table(INV).values() if i["account_id"] == account_id],
    }


@tool("crm", "Search contacts by name, email or account.",
      P("query", "string", "Words in name, email or title", required=False),
      P("account_id", "string", "Only contacts of this account", required=False))
def search_contacts(ws: Workspace, query: str | None = None, account_id: str | None = None) -> list[dict[str, Any]]:
    rows = sorted((c for c in ws.table(CON).values()
                   if (account_id is None or c["account_id"] == account_id) and matches(query, c["name"], c["email"], c["title"])),
                  key=lambda c: c["id"])
    return [pick(c, "id", "account_id", "name", "email", "title") for c in rows]


@tool("crm", "Create a contact under an account.",
      P("account_id", "string", "Account id"), P("name", "string", "Full name"),
      P("email", "string", "Email", format="email"), P("title", "string", "Job title", required=False),
      P("phone", "string", "Phone", required=False), mutates=True)
def create_contact(ws: Workspace, account_id: str, name: str, email: str, title: str | None = None, phone: str | None = None) -> dict[str, Any]:
    ws.get(ACC, account_id, "account")
    if any(c["email"].lower() == email.lower() for c in ws.table(CON).values()):
        raise ToolError("conflict", f"a contact with email {email} already exists")
    rec = ws.insert(CON, {"id": ws.new_id("con"), "account_id": account_id, "name": name, "email": email,
                          "title": title or "", "phone": phone or "", "history": []})
    return pick(rec, "id", "account_id", "name", "email")


@tool("crm", "Update a contact's fields.",
      P("contact_id", "string", "Contact id"), P("name", "string", "Name", required=False),
      P("email", "string", "Email", required=False, format="email"), P("title", "string", "Title", required=False),
      P("phone", "string", "Phone", required=False), mutates=True)
def update_contact(ws: Workspace, contact_id: str, name: str | None = None, email: str | None = None,
                   title: str | None = None, phone: str | None = None) -> dict[str, Any]:
    rec = _with_history(ws, CON, contact_id, {"name": name, "email": email, "title": title, "phone": phone}, None)
    return pick(rec, "id", "name", "email", "title", "phone")


@tool("crm", "Delete a contact.", P("contact_id", "string", "Contact id"), destructive=True)
def delete_contact(ws: Workspace, contact_id: str) -> dict[str, Any]:
    ws.delete(CON, contact_id)
    return {"id": contact_id, "deleted": True}


@tool("crm", "Search deals by account or stage.",
      P("account_id", "string", "Account id", required=False),
      P("stage", "string", "Stage", required=False, enum=STAGES),
      P("query", "string", "Words in the deal name", required=False))
def search_deals(ws: Workspace, account_id: str | None = None, stage: str | None = None, query: str | None = None) -> list[dict[str, Any]]:
    rows = sorted((d for d in ws.table(DEAL).values()
                   if (account_id is None or d["account_id"] == account_id) and (stage is None or d["stage"] == stage)
                   and matches(query, d["name"])), key=lambda d: d["id"])
    return [pick(d, "id", "account_id", "name", "stage", "amount", "close_date") for d in rows]


@tool("crm", "Update a deal (stage, amount, close date); every change is kept in its history.",
      P("deal_id", "string", "Deal id"), P("stage", "string", "Stage", required=False, enum=STAGES),
      P("amount", "number", "Amount in the deal currency", required=False, minimum=0),
      P("close_date", "string", "Expected close date", required=False, format="date"),
      P("note", "string", "Why it changed", required=False), mutates=True)
def update_deal(ws: Workspace, deal_id: str, stage: str | None = None, amount: float | None = None,
                close_date: str | None = None, note: str | None = None) -> dict[str, Any]:
    ws.get(DEAL, deal_id, "deal")
    rec = _with_history(ws, DEAL, deal_id, {"stage": stage, "amount": amount, "close_date": close_date}, note)
    return pick(rec, "id", "name", "stage", "amount", "close_date")


@tool("crm", "Search invoices by account, number or status.",
      P("account_id", "string", "Account id", required=False),
      P("number", "string", "Invoice number", required=False),
      P("status", "string", "Status", required=False, enum=INVOICE_STATUS))
def search_invoices(ws: Workspace, account_id: str | None = None, number: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    rows = sorted((i for i in ws.table(INV).values()
                   if (account_id is None or i["account_id"] == account_id) and (number is None or i["number"] == number)
                   and (status is None or i["status"] == status)), key=lambda i: i["id"])
    return [pick(i, "id", "account_id", "number", "amount", "status", "due_date") for i in rows]


@tool("crm", "Update an invoice's amount or status; the change is kept in its history.",
      P("invoice_id", "string", "Invoice id"),
      P("amount", "number", "Corrected amount", required=False, minimum=0),
      P("status", "string", "Status", required=False, enum=INVOICE_STATUS),
      P("note", "string", "Why it changed", required=False), mutates=True)
def update_invoice(ws: Workspace, invoice_id: str, amount: float | None = None, status: str | None = None, note: str | None = None) -> dict[str, Any]:
    ws.get(INV, invoice_id, "invoice")
    rec = _with_history(ws, INV, invoice_id, {"amount": amount, "status": status}, note)
    return pick(rec, "id", "number", "amount", "status")


@tool("crm", "Change history of a contact, deal or invoice.", P("record_id", "string", "Record id"))
def get_history(ws: Workspace, record_id: str) -> list[dict[str, Any]]:
    for coll in (CON, DEAL, INV):
        rec = ws.table(coll).get(record_id)
        if rec is not None:
            return list(rec.get("history", []))
    raise ToolError("not_found", f"no contact, deal or invoice with id '{record_id}'")


@tool("crm", "A colleague edits a record (world event).", P("collection", "string", "Collection"),
      P("record_id", "string", "Record id"), P("changes", "object", "Field changes"), P("by", "string", "Editor email"),
      hidden=True, mutates=True, name="crm_external_edit")
def external_edit(ws: Workspace, collection: str, record_id: str, changes: dict[str, Any], by: str) -> dict[str, Any]:
    rec = ws.get(collection, record_id)
    reserved = sorted({"id", "history"} & changes.keys())
    if reserved:
        raise ToolError("invalid_arguments", f"fields {reserved} cannot be edited")
    hist = list(rec.get("history", [])) + [{"at": ws.now(), "by": by, "field": k, "old": rec.get(k), "new": v} for k, v in changes.items()]
    ws.update(collection, record_id, **changes, history=hist)
    return {"id": record_id}
