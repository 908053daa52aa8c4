"""Every workspace tool: happy path, bad arguments, schemas, time zones, history, snapshots.

One rich fixture world (records in every collection) backs all cases. Each case runs on a
fresh :class:`Workspace`, so cases are independent. ``test_every_tool_is_covered`` fails
when a tool is added to ``REGISTRY`` without a happy-path and a bad-argument case here.
"""
from __future__ import annotations

import copy
import json
import math
import re
from datetime import datetime
from typing import Any, Callable

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cowork_pipeline.services import REGISTRY, SERVICES, Tool, ToolResult, Workspace, diff_states, tools_for
from cowork_pipeline.services.workspace import META

ME = "alex@northwind.example"
BOB = "bob@globex.example"
CAROL = "carol@northwind.example"
DANA = "dana@initech.example"
ERIN = "erin@globex.example"
HIDDEN = {"mail_deliver", "crm_external_edit", "helpdesk_requester_comment", "chat_deliver"}
ERROR_TYPES = {"invalid_arguments", "not_found", "invalid_state", "conflict", "forbidden", "unknown_tool"}

# ---------------------------------------------------------------------------------------
# The fixture world: every collection any service reads, with every field it reads.
# ---------------------------------------------------------------------------------------
WORLD: dict[str, dict[str, dict[str, Any]]] = {
    META: {"profile": {"name": "Alex Morgan", "email": ME, "timezone": "Europe/Berlin"}},
    "mail.messages": {
        "msg_a1": {"id": "msg_a1", "thread_id": "thr_a", "folder": "inbox", "from": BOB, "to": [ME], "cc": [CAROL],
                   "subject": "Invoice INV-1001 is wrong", "body": "The amount should be 1100, not 1200.",
                   "date": "2026-03-01T08:00:00Z", "read": False, "labels": ["finance"], "attachments": [], "in_reply_to": None},
        "msg_a2": {"id": "msg_a2", "thread_id": "thr_a", "folder": "sent", "from": ME, "to": [BOB], "cc": [],
                   "subject": "Re: Invoice INV-1001 is wrong", "body": "Looking into it.", "date": "2026-03-01T09:00:00Z",
                   "read": True, "labels": [], "attachments": [], "in_reply_to": "msg_a1"},
        "msg_b1": {"id": "msg_b1", "thread_id": "thr_b", "folder": "inbox", "from": DANA, "to": [ME], "cc": [],
                   "subject": "Contract draft", "body": "See the attached draft.", "date": "2026-02-27T16:30:00Z",
                   "read": True, "labels": [], "in_reply_to": None,
                   "attachments": [{"doc_id": "doc_1", "name": "Globex contract", "size": 21, "mime": "text/plain"}]},
        "draft_1": {"id": "draft_1", "thread_id": "thr_d", "folder": "drafts", "from": ME, "to": [BOB], "cc": [],
                    "subject": "Follow-up", "body": "Draft text", "date": "2026-03-01T12:00:00Z", "read": True,
                    "labels": [], "attachments": [], "in_reply_to": None},
    },
    "calendar.events": {
        "evt_1": {"id": "evt_1", "title": "Weekly sync", "start": "2026-03-03T15:00:00+00:00", "end": "2026-03-03T15:30:00+00:00",
                  "timezone": "UTC", "attendees": [ME, CAROL], "organizer": ME, "location": "Room 1", "description": "",
                  "status": "confirmed"},
        "evt_2": {"id": "evt_2", "title": "Globex QBR", "start": "2026-03-04T10:00:00-05:00", "end": "2026-03-04T11:00:00-05:00",
                  "timezone": "America/New_York", "attendees": [BOB, ME], "organizer": CAROL, "location": "Zoom",
                  "description": "Quarterly review", "status": "confirmed"},
        "evt_3": {"id": "evt_3", "title": "Old meeting", "start": "2026-03-03T08:00:00+00:00", "end": "2026-03-03T09:00:00+00:00",
                  "timezone": "UTC", "attendees": [ME], "organizer": ME, "location": "", "description": "", "status": "cancelled"},
    },
    "crm.accounts": {
        "acc_1": {"id": "acc_1", "name": "Globex", "domain": "globex.example", "industry": "Manufacturing", "owner": ME, "tier": "gold"},
        "acc_2": {"id": "acc_2", "name": "Initech", "domain": "initech.example", "industry": "Software", "owner": CAROL, "tier": "silver"},
    },
    "crm.contacts": {
        "con_1": {"id": "con_1", "account_id": "acc_1", "name": "Bob Stone", "email": BOB, "title": "CFO", "phone": "+1 555 0100", "history": []},
        "con_2": {"id": "con_2", "account_id": "acc_2", "name": "Dana Ruiz", "email": DANA, "title": "CTO", "phone": "", "history": []},
    },
    "crm.deals": {
        "deal_1": {"id": "deal_1", "account_id": "acc_1", "name": "Globex renewal 2026", "stage": "proposal", "amount": 50000.0,
                   "close_date": "2026-04-30", "history": []},
        "deal_2": {"id": "deal_2", "account_id": "acc_2", "name": "Initech pilot", "stage": "lead", "amount": 8000.0,
                   "close_date": "2026-06-30", "history": []},
    },
    "crm.invoices": {
        "inv_1": {"id": "inv_1", "account_id": "acc_1", "number": "INV-1001", "amount": 1200.0, "status": "open",
                  "due_date": "2026-03-30", "history": []},
        "inv_2": {"id": "inv_2", "account_id": "acc_2", "number": "INV-1002", "amount": 800.0, "status": "paid", "due_date": "2026-02-28",
                  "history": [{"at": "2026-02-20T10:00:00Z", "by": CAROL, "field": "status", "old": "open", "new": "paid"}]},
    },
    "helpdesk.tickets": {
        "tkt_1": {"id": "tkt_1", "subject": "VPN down", "requester": ERIN, "description": "Cannot connect to the VPN since Monday",
                  "status": "open", "priority": "high", "assignee": ME, "tags": ["network"], "created": "2026-03-01T07:00:00Z",
                  "comments": [{"author": ERIN, "body": "Still broken", "public": True, "at": "2026-03-01T08:00:00Z"}]},
        "tkt_2": {"id": "tkt_2", "subject": "Password reset", "requester": DANA, "description": "Locked out of the portal",
                  "status": "pending", "priority": "low", "assignee": None, "tags": [], "comments": [], "created": "2026-02-28T07:00:00Z"},
    },
    "docs.folders": {
        "fld_1": {"id": "fld_1", "name": "Contracts", "parent_id": None},
        "fld_2": {"id": "fld_2", "name": "Archive", "parent_id": None},
    },
    "docs.documents": {
        "doc_1": {"id": "doc_1", "folder_id": "fld_1", "title": "Globex contract", "content": "Renewal terms: net 30",
                  "owner": ME, "confidential": False, "shared_with": [], "updated": "2026-02-01T10:00:00Z"},
        "doc_2": {"id": "doc_2", "folder_id": "fld_1", "title": "Salary bands", "content": "Confidential figures",
                  "owner": "hr@northwind.example", "confidential": True, "shared_with": [ME], "updated": "2026-01-15T10:00:00Z"},
    },
    "chat.channels": {
        "ch_1": {"id": "ch_1", "name": "general", "private": False, "archived": False},
        "ch_2": {"id": "ch_2", "name": "old-project", "private": True, "archived": True},
    },
    "chat.messages": {
        "cm_1": {"id": "cm_1", "channel_id": "ch_1", "author": CAROL, "text": "Standup moved to 10:00", "at": "2026-03-01T10:00:00Z"},
        "cm_2": {"id": "cm_2", "channel_id": "ch_1", "author": "frank@northwind.example", "text": "Deploy done", "at": "2026-03-01T11:00:00Z"},
        "cm_3": {"id": "cm_3", "channel_id": "ch_2", "author": CAROL, "text": "Project closed", "at": "2026-01-01T11:00:00Z"},
    },
    "tasks.tasks": {
        "task_1": {"id": "task_1", "title": "Send Q1 report", "assignee": ME, "due": "2026-03-05", "status": "todo",
                   "priority": "high", "notes": "", "related": None},
        "task_2": {"id": "task_2", "title": "Review contract", "assignee": CAROL, "due": None, "status": "done",
                   "priority": "normal", "notes": "", "related": "doc_1"},
    },
    "directory.people": {
        "p_1": {"id": "p_1", "name": "Alex Morgan", "email": ME, "team": "Sales", "role": "Account executive", "timezone": "Europe/Berlin"},
        "p_2": {"id": "p_2", "name": "Carol Diaz", "email": CAROL, "team": "Finance", "role": "Controller", "timezone": "America/New_York"},
    },
}
WORLD_FROZEN = copy.deepcopy(WORLD)


def new_ws() -> Workspace:
    return Workspace(WORLD)


def actor_for(name: str) -> str:
    return "world" if REGISTRY[name].hidden else "agent"


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in rows]


def rec(ws: Workspace, coll: str, rid: str) -> dict[str, Any]:
    return ws.table(coll)[rid]


# ---------------------------------------------------------------------------------------
# Happy paths: (tool, args, check(value, ws) -> truthy). Hidden tools run as actor "world".
# ---------------------------------------------------------------------------------------
Check = Callable[[Any, Workspace], Any]
HAPPY: list[tuple[str, dict[str, Any], Check]] = [
    # calendar
    ("calendar_list_events", {}, lambda v, ws: ids(v) == ["evt_1", "evt_2"]),  # cancelled evt_3 hidden, UTC order
    ("calendar_list_events", {"start": "2026-03-04T00:00:00Z", "end": "2026-03-05T00:00:00Z", "attendee": BOB},
     lambda v, ws: ids(v) == ["evt_2"]),
    ("calendar_list_events", {"attendee": CAROL}, lambda v, ws: ids(v) == ["evt_1", "evt_2"]),  # organizer counts
    ("calendar_get_event", {"event_id": "evt_2"}, lambda v, ws: v["organizer"] == CAROL and v["timezone"] == "America/New_York"),
    ("calendar_create_event", {"title": "Kickoff", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00",
                               "attendees": [BOB, BOB, CAROL], "timezone": "America/New_York", "location": "Zoom", "description": "Agenda"},
     lambda v, ws: v["start"] == "2026-03-10T10:00:00-04:00" and v["attendees"] == [BOB, CAROL]
     and rec(ws, "calendar.events", v["id"])["organizer"] == ME),
    ("calendar_create_event", {"title": "Solo", "start": "2026-03-10T10:00:00Z", "end": "2026-03-10T10:30:00Z", "attendees": []},
     lambda v, ws: v["timezone"] == "UTC" and v["start"] == "2026-03-10T10:00:00+00:00"),
    # (as JavaScript's toISOString writes it: milliseconds; stored as the same instant without them)
    ("calendar_create_event", {"title": "Solo", "start": "2026-03-10T10:00:00.000Z", "end": "2026-03-10T10:30:00.000Z", "attendees": []},
     lambda v, ws: v["start"] == "2026-03-10T10:00:00+00:00" and rec(ws, "calendar.events", v["id"])["end"] == "2026-03-10T10:30:00+00:00"),
    ("calendar_update_event", {"event_id": "evt_2", "title": "QBR (moved)", "start": "2026-03-04T12:00", "end": "2026-03-04T13:00",
                               "location": "Room 2", "description": "Moved"},
     lambda v, ws: v["start"] == "2026-03-04T12:00:00-05:00" and v["title"] == "QBR (moved)"),
    ("calendar_cancel_event", {"event_id": "evt_1"}, lambda v, ws: rec(ws, "calendar.events", "evt_1")["status"] == "cancelled"),
    ("calendar_add_attendees", {"event_id": "evt_1", "attendees": [DANA, ME]}, lambda v, ws: v["attendees"] == [ME, CAROL, DANA]),
    ("calendar_free_busy", {"people": [ME, BOB, DANA], "start": "2026-03-03T00:00:00Z", "end": "2026-03-05T00:00:00Z"},
     lambda v, ws: v == {ME: [["2026-03-03T15:00Z", "2026-03-03T15:30Z"], ["2026-03-04T15:00Z", "2026-03-04T16:00Z"]],
                         BOB: [["2026-03-04T15:00Z", "2026-03-04T16:00Z"]], DANA: []}),
    # chat
    ("chat_list_channels", {}, lambda v, ws: ids(v) == ["ch_1", "ch_2"] and v[1]["private"] is True),
    ("chat_read_channel", {"channel_id": "ch_1"}, lambda v, ws: ids(v) == ["cm_1", "cm_2"]),
    ("chat_read_channel", {"channel_id": "ch_1", "limit": 1}, lambda v, ws: ids(v) == ["cm_2"]),
    ("chat_post_message", {"channel_id": "ch_1", "text": "Hello team"},
     lambda v, ws: rec(ws, "chat.messages", v["id"])["author"] == ME and v["channel_id"] == "ch_1"),
    ("chat_search", {"query": "deploy"}, lambda v, ws: ids(v) == ["cm_2"]),
    ("chat_search", {"query": "carol", "limit": 1}, lambda v, ws: ids(v) == ["cm_3"]),
    # crm
    ("crm_search_accounts", {"query": "globex"}, lambda v, ws: ids(v) == ["acc_1"] and v[0]["tier"] == "gold"),
    ("crm_search_accounts", {"limit": 1}, lambda v, ws: ids(v) == ["acc_1"]),
    ("crm_get_account", {"account_id": "acc_1"},
     lambda v, ws: ids(v["contacts"]) == ["con_1"] and ids(v["deals"]) == ["deal_1"] and ids(v["invoices"]) == ["inv_1"]),
    ("crm_search_contacts", {"account_id": "acc_2"}, lambda v, ws: ids(v) == ["con_2"]),
    ("crm_search_contacts", {"query": "cfo"}, lambda v, ws: ids(v) == ["con_1"]),
    ("crm_create_contact", {"account_id": "acc_1", "name": "Gina Park", "email": "gina@globex.example", "title": "Buyer", "phone": "1"},
     lambda v, ws: rec(ws, "crm.contacts", v["id"])["account_id"] == "acc_1" and v["email"] == "gina@globex.example"),
    ("crm_update_contact", {"contact_id": "con_1", "title": "CEO", "phone": "+1 555 0199"},
     lambda v, ws: v["title"] == "CEO" and [(h["field"], h["old"], h["new"]) for h in rec(ws, "crm.contacts", "con_1")["history"]]
     == [("title", "CFO", "CEO"), ("phone", "+1 555 0100", "+1 555 0199")]),
    ("crm_delete_contact", {"contact_id": "con_2"}, lambda v, ws: "con_2" not in ws.table("crm.contacts")),
    ("crm_search_deals", {"stage": "proposal"}, lambda v, ws: ids(v) == ["deal_1"]),
    ("crm_search_deals", {"account_id": "acc_2", "query": "pilot"}, lambda v, ws: ids(v) == ["deal_2"]),
    ("crm_update_deal", {"deal_id": "deal_1", "stage": "negotiation", "amount": 45000, "close_date": "2026-05-15", "note": "Discount"},
     lambda v, ws: (v["stage"], v["amount"], v["close_date"]) == ("negotiation", 45000, "2026-05-15")
     and [h["field"] for h in rec(ws, "crm.deals", "deal_1")["history"]] == ["stage", "amount", "close_date", "note"]),
    ("crm_search_invoices", {"status": "open"}, lambda v, ws: ids(v) == ["inv_1"]),
    ("crm_search_invoices", {"number": "INV-1002", "account_id": "acc_2"}, lambda v, ws: ids(v) == ["inv_2"]),
    ("crm_update_invoice", {"invoice_id": "inv_1", "amount": 1100.0},
     lambda v, ws: v["amount"] == 1100.0 and rec(ws, "crm.invoices", "inv_1")["history"][-1]["old"] == 1200.0),
    ("crm_update_invoice", {"invoice_id": "inv_1", "status": "disputed", "note": "Customer disputes the amount"},
     lambda v, ws: v["status"] == "disputed"),
    ("crm_get_history", {"record_id": "inv_2"}, lambda v, ws: v == WORLD["crm.invoices"]["inv_2"]["history"]),
    ("crm_get_history", {"record_id": "con_1"}, lambda v, ws: v == []),
    # directory
    ("directory_search", {"query": "finance"}, lambda v, ws: ids(v) == ["p_2"] and v[0]["timezone"] == "America/New_York"),
    # docs
    ("docs_list_folder", {}, lambda v, ws: ids(v) == ["fld_1", "fld_2"]),
    ("docs_list_folder", {"folder_id": "fld_1"}, lambda v, ws: ids(v) == ["doc_1", "doc_2"] and v[1]["confidential"] is True),
    ("docs_search", {"query": "renewal net"}, lambda v, ws: ids(v) == ["doc_1"]),
    ("docs_read", {"doc_id": "doc_1"}, lambda v, ws: v["content"] == "Renewal terms: net 30"),
    ("docs_create", {"folder_id": "fld_2", "title": "Notes", "content": "Call notes"},
     lambda v, ws: v["owner"] == ME and rec(ws, "docs.documents", v["id"])["content"] == "Call notes"),
    ("docs_update", {"doc_id": "doc_1", "title": "Globex contract v2", "content": "Renewal terms: net 45"},
     lambda v, ws: rec(ws, "docs.documents", "doc_1")["content"] == "Renewal terms: net 45"),
    ("docs_share", {"doc_id": "doc_2", "people": [CAROL, ME]}, lambda v, ws: v["shared_with"] == [ME, CAROL]),
    ("docs_move", {"doc_id": "doc_1", "folder_id": "fld_2"}, lambda v, ws: rec(ws, "docs.documents", "doc_1")["folder_id"] == "fld_2"),
    ("docs_delete", {"doc_id": "doc_1"}, lambda v, ws: "doc_1" not in ws.table("docs.documents")),
    # helpdesk
    ("helpdesk_search_tickets", {"status": "open"}, lambda v, ws: ids(v) == ["tkt_1"]),
    ("helpdesk_search_tickets", {"query": "vpn", "assignee": ME, "requester": ERIN}, lambda v, ws: ids(v) == ["tkt_1"]),
    ("helpdesk_get_ticket", {"ticket_id": "tkt_1"}, lambda v, ws: len(v["comments"]) == 1),
    ("helpdesk_create_ticket", {"subject": "Printer jam", "requester": ERIN, "description": "Tray 2", "priority": "urgent"},
     lambda v, ws: (v["status"], v["priority"], v["assignee"]) == ("open", "urgent", None)),
    ("helpdesk_update_ticket", {"ticket_id": "tkt_2", "status": "solved", "priority": "normal", "assignee": ME, "tags": ["password"]},
     lambda v, ws: (v["status"], v["assignee"]) == ("solved", ME) and rec(ws, "helpdesk.tickets", "tkt_2")["tags"] == ["password"]),
    ("helpdesk_add_comment", {"ticket_id": "tkt_1", "body": "On it", "public": True},
     lambda v, ws: v["comments"] == 2 and rec(ws, "helpdesk.tickets", "tkt_1")["comments"][-1]["author"] == ME),
    ("helpdesk_delete_ticket", {"ticket_id": "tkt_2"}, lambda v, ws: "tkt_2" not in ws.table("helpdesk.tickets")),
    # mail
    ("mail_search", {}, lambda v, ws: ids(v) == ["draft_1", "msg_a2", "msg_a1", "msg_b1"]),
    ("mail_search", {"folder": "inbox", "unread_only": True}, lambda v, ws: ids(v) == ["msg_a1"]),
    ("mail_search", {"query": "invoice", "sender": "GLOBEX", "limit": 5}, lambda v, ws: ids(v) == ["msg_a1"]),
    ("mail_read", {"message_id": "msg_a1"},
     lambda v, ws: v["body"].startswith("The amount") and "labels" not in v and rec(ws, "mail.messages", "msg_a1")["read"] is True),
    ("mail_read_thread", {"thread_id": "thr_a"}, lambda v, ws: ids(v) == ["msg_a1", "msg_a2"]),
    ("mail_send", {"to": [BOB], "subject": "Contract", "body": "Attached", "cc": [CAROL], "attachment_doc_ids": ["doc_1"]},
     lambda v, ws: rec(ws, "mail.messages", v["id"])["attachments"][0]["name"] == "Globex contract"
     and rec(ws, "mail.messages", v["id"])["folder"] == "sent"),
    ("mail_reply", {"message_id": "msg_a1", "body": "Fixed, sorry.", "reply_all": True},
     lambda v, ws: v["to"] == [BOB] and v["thread_id"] == "thr_a"
     and (rec(ws, "mail.messages", v["id"])["cc"], rec(ws, "mail.messages", v["id"])["subject"]) == ([CAROL], "Re: Invoice INV-1001 is wrong")),
    ("mail_reply", {"message_id": "msg_a2", "body": "Ping"},  # replying to my own mail goes to its recipients
     lambda v, ws: v["to"] == [BOB] and rec(ws, "mail.messages", v["id"])["subject"] == "Re: Invoice INV-1001 is wrong"),
    ("mail_forward", {"message_id": "msg_b1", "to": [CAROL], "note": "FYI"},
     lambda v, ws: rec(ws, "mail.messages", v["id"])["subject"] == "Fwd: Contract draft"
     and rec(ws, "mail.messages", v["id"])["attachments"] == WORLD["mail.messages"]["msg_b1"]["attachments"]),
    ("mail_create_draft", {"to": [BOB], "subject": "Later", "body": "Text"}, lambda v, ws: rec(ws, "mail.messages", v["id"])["folder"] == "drafts"),
    ("mail_send_draft", {"draft_id": "draft_1"}, lambda v, ws: rec(ws, "mail.messages", "draft_1")["folder"] == "sent"),
    ("mail_move", {"message_id": "msg_b1", "folder": "archive"}, lambda v, ws: rec(ws, "mail.messages", "msg_b1")["folder"] == "archive"),
    ("mail_mark_read", {"message_id": "msg_a1", "read": True}, lambda v, ws: rec(ws, "mail.messages", "msg_a1")["read"] is True),
    ("mail_delete", {"message_id": "msg_b1"}, lambda v, ws: "msg_b1" not in ws.table("mail.messages")),
    # tasks
    ("tasks_list", {"assignee": ME}, lambda v, ws: ids(v) == ["task_1"]),
    ("tasks_list", {"status": "done"}, lambda v, ws: ids(v) == ["task_2"]),
    ("tasks_create", {"title": "Call Bob", "due": "2026-03-06", "priority": "high", "notes": "re invoice", "related": "inv_1"},
     lambda v, ws: (v["assignee"], v["status"], v["related"]) == (ME, "todo", "inv_1")),
    ("tasks_create", {"title": "Delegate", "assignee": CAROL}, lambda v, ws: v["assignee"] == CAROL and v["priority"] == "normal"),
    ("tasks_update", {"task_id": "task_1", "title": "Send Q1 report (final)", "status": "in_progress", "due": "2026-03-07",
                      "assignee": CAROL, "priority": "low", "notes": "waiting on numbers"},
     lambda v, ws: (v["status"], v["due"], v["assignee"]) == ("in_progress", "2026-03-07", CAROL)),
    ("tasks_complete", {"task_id": "task_1"}, lambda v, ws: rec(ws, "tasks.tasks", "task_1")["status"] == "done"),
    ("tasks_delete", {"task_id": "task_2"}, lambda v, ws: "task_2" not in ws.table("tasks.tasks")),
    # hidden world-event tools (actor "world")
    ("mail_deliver", {"id": "msg_in", "sender": DANA, "to": [ME], "subject": "Re: Contract draft", "body": "Signed",
                      "thread_id": "thr_b", "attachments": [{"doc_id": "doc_1", "name": "Signed", "size": 3, "mime": "text/plain"}]},
     lambda v, ws: rec(ws, "mail.messages", "msg_in")["folder"] == "inbox" and rec(ws, "mail.messages", "msg_in")["read"] is False),
    ("crm_external_edit", {"collection": "crm.deals", "record_id": "deal_1", "changes": {"amount": 60000.0}, "by": CAROL},
     lambda v, ws: rec(ws, "crm.deals", "deal_1")["history"][-1] | {"at": None}
     == {"at": None, "by": CAROL, "field": "amount", "old": 50000.0, "new": 60000.0}),
    ("helpdesk_requester_comment", {"ticket_id": "tkt_2", "author": DANA, "body": "Any news?"},
     lambda v, ws: rec(ws, "helpdesk.tickets", "tkt_2")["status"] == "open" and rec(ws, "helpdesk.tickets", "tkt_2")["comments"][-1]["public"]),
    ("chat_deliver", {"id": "cm_new", "channel_id": "ch_1", "author": CAROL, "text": "Lunch?"},
     lambda v, ws: rec(ws, "chat.messages", "cm_new")["author"] == CAROL),
]

# ---------------------------------------------------------------------------------------
# Explicit bad calls: (tool, args, error type, does the JSON schema reject it too?).
# Schema-level errors (type, enum, required, unknown key, minimum, date/email format) must be
# caught by both; semantic ones (unknown id, wrong state, end before start) only by the tool.
# ---------------------------------------------------------------------------------------
BAD: list[tuple[str, Any, str, bool]] = [
    ("calendar_list_events", {"start": "yesterday"}, "invalid_arguments", True),
    ("calendar_list_events", {"attendee": 5}, "invalid_arguments", True),
    ("calendar_get_event", {"event_id": "evt_nope"}, "not_found", False),
    ("calendar_create_event", {"title": "x", "start": "2026-03-10T11:00", "end": "2026-03-10T10:00", "attendees": []}, "invalid_arguments", False),
    ("calendar_create_event", {"title": "x", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00", "attendees": [], "timezone": "Mars/Olympus"},
     "invalid_arguments", False),
    ("calendar_create_event", {"title": "x", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00", "attendees": [], "timezone": "America"},
     "invalid_arguments", False),  # a tz *directory*: used to raise IsADirectoryError
    ("calendar_create_event", {"title": "x", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00", "attendees": [], "timezone": "x" * 300},
     "invalid_arguments", False),  # used to raise OSError (file name too long)
    ("calendar_create_event", {"title": "x", "start": "2026-02-30T10:00", "end": "2026-03-10T11:00", "attendees": []}, "invalid_arguments", True),
    ("calendar_create_event", {"title": "x", "start": "2026-03-10 10:00", "end": "2026-03-10T11:00", "attendees": []}, "invalid_arguments", True),
    ("calendar_create_event", {"title": "x", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00", "attendees": ["bob"]}, "invalid_arguments", True),
    ("calendar_update_event", {"event_id": "evt_1"}, "invalid_arguments", False),
    ("calendar_update_event", {"event_id": "evt_1", "end": "2026-03-03T14:00:00Z"}, "invalid_arguments", False),
    ("calendar_update_event", {"event_id": "evt_x", "title": "t"}, "not_found", False),
    ("calendar_cancel_event", {"event_id": "evt_3"}, "invalid_state", False),
    ("calendar_add_attendees", {"event_id": "evt_1", "attendees": ["not-an-email"]}, "invalid_arguments", True),
    ("calendar_add_attendees", {"event_id": "evt_x", "attendees": [BOB]}, "not_found", False),
    ("calendar_free_busy", {"people": [ME], "start": "2026-03-05T00:00:00Z", "end": "2026-03-03T00:00:00Z"}, "invalid_arguments", False),
    ("calendar_free_busy", {"people": ME, "start": "2026-03-03T00:00:00Z", "end": "2026-03-05T00:00:00Z"}, "invalid_arguments", True),
    ("chat_list_channels", {"private": True}, "invalid_arguments", True),
    ("chat_read_channel", {"channel_id": "ch_x"}, "not_found", False),
    ("chat_read_channel", {"channel_id": "ch_1", "limit": 0}, "invalid_arguments", True),
    ("chat_read_channel", {"channel_id": "ch_1", "limit": 2.5}, "invalid_arguments", True),
    ("chat_post_message", {"channel_id": "ch_2", "text": "hi"}, "invalid_state", False),
    ("chat_post_message", {"channel_id": "ch_x", "text": "hi"}, "not_found", False),
    ("chat_search", {}, "invalid_arguments", True),
    ("crm_search_accounts", {"limit": 0}, "invalid_arguments", True),
    ("crm_get_account", {"account_id": "acc_x"}, "not_found", False),
    ("crm_search_contacts", {"account_id": 5}, "invalid_arguments", True),
    ("crm_create_contact", {"account_id": "acc_1", "name": "Bob", "email": "BOB@globex.example"}, "conflict", False),
    ("crm_create_contact", {"account_id": "acc_x", "name": "N", "email": "n@x.example"}, "not_found", False),
    ("crm_create_contact", {"account_id": "acc_1", "name": "N", "email": "n.example"}, "invalid_arguments", True),
    ("crm_create_contact", {"account_id": "acc_1", "name": "N", "email": "@"}, "invalid_arguments", False),  # "contains @"
    ("docs_share", {"doc_id": "doc_1", "people": ["n@example"]}, "invalid_arguments", False),  # passes jsonschema's email
    ("crm_update_contact", {"contact_id": "con_1", "title": "CFO"}, "invalid_arguments", False),  # nothing changes
    ("crm_update_contact", {"contact_id": "con_x", "title": "CEO"}, "not_found", False),
    ("crm_delete_contact", {"contact_id": "con_x"}, "not_found", False),
    ("crm_search_deals", {"stage": "won!"}, "invalid_arguments", True),
    ("crm_update_deal", {"deal_id": "deal_1", "amount": -5}, "invalid_arguments", True),
    ("crm_update_deal", {"deal_id": "deal_1", "close_date": "30/04/2026"}, "invalid_arguments", True),
    ("crm_update_deal", {"deal_id": "deal_1", "close_date": "2026-02-30"}, "invalid_arguments", True),
    ("crm_update_deal", {"deal_id": "deal_x", "stage": "won"}, "not_found", False),
    ("crm_search_invoices", {"number": 1001}, "invalid_arguments", True),
    ("crm_update_invoice", {"invoice_id": "inv_1", "status": "cancelled"}, "invalid_arguments", True),
    ("crm_update_invoice", {"invoice_id": "inv_1", "amount": "1100"}, "invalid_arguments", True),
    ("crm_update_invoice", {"invoice_id": "inv_1", "amount": True}, "invalid_arguments", True),
    ("crm_update_invoice", {"invoice_id": "inv_1", "amount": float("nan")}, "invalid_arguments", False),  # not JSON
    ("crm_update_invoice", {"invoice_id": "inv_1", "amount": 1200}, "invalid_arguments", False),  # same value: nothing to change
    ("crm_get_history", {"record_id": "acc_1"}, "not_found", False),  # accounts keep no history
    ("directory_search", {}, "invalid_arguments", True),
    ("directory_search", {"query": None}, "invalid_arguments", True),
    ("docs_list_folder", {"folder_id": "fld_x"}, "not_found", False),
    ("docs_search", {"query": ["renewal"]}, "invalid_arguments", True),
    ("docs_read", {"doc_id": "doc_x"}, "not_found", False),
    ("docs_create", {"folder_id": "fld_x", "title": "t", "content": "c"}, "not_found", False),
    ("docs_update", {"doc_id": "doc_1"}, "invalid_arguments", False),
    ("docs_share", {"doc_id": "doc_1", "people": ["carol"]}, "invalid_arguments", True),
    ("docs_move", {"doc_id": "doc_1", "folder_id": "fld_x"}, "not_found", False),
    ("docs_delete", {"doc_id": "doc_2"}, "forbidden", False),  # confidential and not mine
    ("helpdesk_search_tickets", {"status": "resolved"}, "invalid_arguments", True),
    ("helpdesk_get_ticket", {"ticket_id": "tkt_x"}, "not_found", False),
    ("helpdesk_create_ticket", {"subject": "s", "requester": "erin", "description": "d"}, "invalid_arguments", True),
    ("helpdesk_create_ticket", {"subject": "s", "requester": ERIN, "description": "d", "priority": "critical"}, "invalid_arguments", True),
    ("helpdesk_update_ticket", {"ticket_id": "tkt_1"}, "invalid_arguments", False),
    ("helpdesk_update_ticket", {"ticket_id": "tkt_1", "tags": "network"}, "invalid_arguments", True),
    ("helpdesk_update_ticket", {"ticket_id": "tkt_1", "tags": ["ok", 3]}, "invalid_arguments", True),
    ("helpdesk_add_comment", {"ticket_id": "tkt_1", "body": "b", "public": "yes"}, "invalid_arguments", True),
    ("helpdesk_add_comment", {"ticket_id": "tkt_x", "body": "b"}, "not_found", False),
    ("helpdesk_delete_ticket", {"ticket_id": "tkt_x"}, "not_found", False),
    ("mail_search", {"folder": "spam"}, "invalid_arguments", True),
    ("mail_search", {"unread_only": 1}, "invalid_arguments", True),
    ("mail_search", {"limit": 0}, "invalid_arguments", True),
    ("mail_read", {"message_id": "msg_x"}, "not_found", False),
    ("mail_read_thread", {"thread_id": "thr_x"}, "not_found", False),
    ("mail_send", {"to": BOB, "subject": "s", "body": "b"}, "invalid_arguments", True),
    ("mail_send", {"to": [], "subject": "s", "body": "b"}, "invalid_arguments", False),
    ("mail_send", {"to": ["bob"], "subject": "s", "body": "b"}, "invalid_arguments", True),
    ("mail_send", {"to": [BOB + "\n"], "subject": "s", "body": "b"}, "invalid_arguments", False),  # used to pass the regex
    ("mail_send", {"to": [BOB], "subject": "s", "body": "b", "attachment_doc_ids": ["doc_x"]}, "not_found", False),
    ("mail_reply", {"message_id": "msg_a1"}, "invalid_arguments", True),
    ("mail_reply", {"message_id": "msg_x", "body": "b"}, "not_found", False),
    ("mail_forward", {"message_id": "msg_b1", "to": ["carol"]}, "invalid_arguments", True),
    ("mail_forward", {"message_id": "msg_x", "to": [CAROL]}, "not_found", False),
    ("mail_create_draft", {"to": [BOB], "body": "b"}, "invalid_arguments", True),
    ("mail_send_draft", {"draft_id": "msg_a1"}, "invalid_state", False),
    ("mail_send_draft", {"draft_id": "msg_x"}, "not_found", False),
    ("mail_move", {"message_id": "msg_a1", "folder": "sent"}, "invalid_arguments", True),
    ("mail_move", {"message_id": "msg_x", "folder": "trash"}, "not_found", False),
    ("mail_mark_read", {"message_id": "msg_a1", "read": "true"}, "invalid_arguments", True),
    ("mail_mark_read", {"message_id": "msg_x", "read": True}, "not_found", False),
    ("mail_delete", {"message_id": "msg_x"}, "not_found", False),
    ("tasks_list", {"status": "blocked"}, "invalid_arguments", True),
    ("tasks_create", {"title": "t", "due": "tomorrow"}, "invalid_arguments", True),
    ("tasks_create", {"title": "t", "due": "2026-02-30"}, "invalid_arguments", True),  # used to be stored as is
    ("tasks_create", {"title": "t", "due": "2026-03-02\n"}, "invalid_arguments", True),  # used to pass the regex
    ("tasks_create", {"title": "t", "assignee": "carol"}, "invalid_arguments", True),
    ("tasks_update", {"task_id": "task_1"}, "invalid_arguments", False),
    ("tasks_update", {"task_id": "task_x", "status": "done"}, "not_found", False),
    ("tasks_complete", {"task_id": "task_2"}, "invalid_state", False),
    ("tasks_complete", {"task_id": "task_x"}, "not_found", False),
    ("tasks_delete", {"task_id": "task_x"}, "not_found", False),
    # hidden tools, as the world
    ("mail_deliver", {"id": "msg_a1", "sender": BOB, "to": [ME], "subject": "s", "body": "b"}, "conflict", False),
    ("crm_external_edit", {"collection": "crm.deals", "record_id": "deal_1", "changes": {"history": []}, "by": CAROL},
     "invalid_arguments", False),  # used to raise TypeError (history given twice)
    ("crm_external_edit", {"collection": "crm.deals", "record_id": "deal_x", "changes": {}, "by": CAROL}, "not_found", False),
    ("helpdesk_requester_comment", {"ticket_id": "tkt_x", "author": ERIN, "body": "b"}, "not_found", False),
    ("chat_deliver", {"id": "cm_9", "channel_id": "ch_x", "author": CAROL, "text": "t"}, "not_found", False),
]


# ---------------------------------------------------------------------------------------
# Schema side: a strict JSON-schema validator (Draft 2020-12) with format checking.
# Two documented choices of ours: an integral float (5.0) is *not* an integer (strict JSON
# typing, Draft 4 style), and "date-time" means ISO 8601 with optional seconds (and fraction)/offset
# (a naive time is read in the event's time zone), which jsonschema does not check itself.
# ---------------------------------------------------------------------------------------
_DT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?([+-][0-9]{2}:[0-9]{2}|Z)?\Z")
FORMAT_CHECKER = jsonschema.FormatChecker(["date", "email"])


@FORMAT_CHECKER.checks("date-time", raises=ValueError)
def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    return bool(_DT.match(value)) and bool(datetime.fromisoformat(value.replace("Z", "+00:00")))


_Base = jsonschema.Draft202012Validator
StrictValidator = jsonschema.validators.extend(
    _Base, type_checker=_Base.TYPE_CHECKER.redefine("integer", lambda _c, v: isinstance(v, int) and not isinstance(v, bool))
)
VALIDATORS = {name: StrictValidator(t.schema()["function"]["parameters"], format_checker=FORMAT_CHECKER) for name, t in REGISTRY.items()}


def schema_ok(name: str, args: Any) -> bool:
    return VALIDATORS[name].is_valid(args)


def ours_ok(name: str, args: Any) -> bool:
    try:
        REGISTRY[name].validate(args)
    except Exception as e:  # only ToolError is acceptable, anything else fails the test
        assert type(e).__name__ == "ToolError", f"validator raised {type(e).__name__}: {e}"
        assert e.code == "invalid_arguments"  # type: ignore[attr-defined]
        return False
    return True


def assert_error(res: ToolResult, etype: str) -> None:
    assert isinstance(res, ToolResult) and res.ok is False, res
    assert set(res.error) == {"type", "message"} and isinstance(res.error["message"], str) and res.error["message"], res.error
    assert res.error["type"] == etype, res.error
    assert json.loads(res.content()) == {"error": res.error}


# ---------------------------------------------------------------------------------------
# Auto-generated bad calls for every tool: non-object, unknown key, missing required, null
# for a required value, a value of the wrong JSON type for every parameter.
# ---------------------------------------------------------------------------------------
WRONG_TYPE = {"string": 123, "integer": "5", "number": "5", "boolean": "true", "object": "x"}


def _wrong_value(ptype: str) -> Any:
    if ptype.startswith("array["):
        return "not-a-list"
    return WRONG_TYPE[ptype]


def _reference_args(name: str) -> dict[str, Any]:
    return next(a for n, a, _ in HAPPY if n == name)


def generated_bad() -> list[tuple[str, Any, str]]:
    out: list[tuple[str, Any, str]] = []
    for name, t in REGISTRY.items():
        if not any(n == name for n, _, _ in HAPPY):
            continue  # reported by test_every_tool_is_covered
        ref = _reference_args(name)
        out += [(name, [], "non-object"), (name, "{}", "json-string"), (name, None, "null"), (name, {**ref, "bogus_arg": 1}, "unknown-arg")]
        for p in t.params:
            args = {**ref, p.name: _wrong_value(p.type)}
            out.append((name, args, f"wrong-type-{p.name}"))
            if p.type.startswith("array[") and p.type != "array[object]":
                out.append((name, {**ref, p.name: [7]}, f"wrong-item-{p.name}"))
            if p.required:
                out.append((name, {k: v for k, v in ref.items() if k != p.name}, f"missing-{p.name}"))
                out.append((name, {**ref, p.name: None}, f"null-{p.name}"))
    return out


GENERATED_BAD = generated_bad()


# =======================================================================================
# Coverage and schema tests
# =======================================================================================
def test_every_tool_is_covered() -> None:
    happy = {n for n, _, _ in HAPPY}
    bad = {n for n, *_ in BAD} | {n for n, *_ in GENERATED_BAD}
    missing_happy = sorted(set(REGISTRY) - happy)
    missing_bad = sorted(set(REGISTRY) - bad)
    assert not missing_happy, f"tools without a happy-path case: {missing_happy}"
    assert not missing_bad, f"tools without a bad-argument case: {missing_bad}"
    assert {n for n, t in REGISTRY.items() if t.hidden} == HIDDEN
    assert {t.service for t in REGISTRY.values()} == set(SERVICES)
    assert len([t for t in REGISTRY.values() if not t.hidden]) >= 53


def test_fixture_world_has_every_collection() -> None:
    colls = set(WORLD) - {META}
    assert colls == {"mail.messages", "calendar.events", "crm.accounts", "crm.contacts", "crm.deals", "crm.invoices",
                     "helpdesk.tickets", "docs.folders", "docs.documents", "chat.channels", "chat.messages", "tasks.tasks",
                     "directory.people"}
    assert all(WORLD[c] for c in colls)


NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_schema_is_valid_openai_function(name: str) -> None:
    t = REGISTRY[name]
    s = t.schema()
    assert set(s) == {"type", "function"} and s["type"] == "function"
    fn = s["function"]
    assert set(fn) == {"name", "description", "parameters"}
    assert fn["name"] == name and NAME_RE.match(name)
    assert isinstance(fn["description"], str) and fn["description"].strip()
    params = fn["parameters"]
    jsonschema.Draft202012Validator.check_schema(params)
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert set(params["required"]) <= set(params["properties"])
    assert len(params["required"]) == len(set(params["required"]))
    for pname, ps in params["properties"].items():
        assert NAME_RE.match(pname) and ps.get("description")
        assert ps["type"] in {"string", "integer", "number", "boolean", "object", "array"}
    assert json.loads(json.dumps(s)) == s


def test_tools_for() -> None:
    visible = tools_for()
    names = [s["function"]["name"] for s in visible]
    assert len(names) == len(set(names)) and not HIDDEN & set(names)
    assert set(names) == {n for n, t in REGISTRY.items() if not t.hidden}
    assert [s["function"]["name"] for s in tools_for(["mail_send", "crm_get_account"])] == ["mail_send", "crm_get_account"]
    for bad in ("mail_deliver", "no_such_tool"):
        with pytest.raises(KeyError):
            tools_for([bad])


# =======================================================================================
# Happy paths
# =======================================================================================
@pytest.mark.parametrize("name,args,check", HAPPY, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(HAPPY)])
def test_happy_path(name: str, args: dict[str, Any], check: Check) -> None:
    assert schema_ok(name, args), list(VALIDATORS[name].iter_errors(args))  # reference args fit the tool's own schema
    ws = new_ws()
    res = ws.call(name, copy.deepcopy(args), actor=actor_for(name))
    assert res.ok, res.error
    assert check(res.value, ws), res.value
    json.loads(res.content())  # what the agent reads is JSON
    entry = ws.audit[-1]
    assert (entry["tool"], entry["ok"], entry["service"], entry["actor"]) == (name, True, REGISTRY[name].service, actor_for(name))
    assert entry["result"] == res.value
    # the clock moves only for writes
    assert ws.now() == ("2026-03-02T09:01:00Z" if REGISTRY[name].mutates else "2026-03-02T09:00:00Z")


# =======================================================================================
# Bad arguments: a clean error result, never an exception, and nothing changes
# =======================================================================================
def _run_bad(name: str, args: Any, etype: str) -> None:
    ws = new_ws()
    before = ws.state()
    res = ws.call(name, args, actor=actor_for(name))
    assert_error(res, etype)
    assert ws.state() == before, "a failed call changed the state"
    assert ws.audit[-1]["ok"] is False and ws.audit[-1]["error"] == res.error


@pytest.mark.parametrize("name,args,etype,schema_rejects", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_call(name: str, args: Any, etype: str, schema_rejects: bool) -> None:
    _run_bad(name, args, etype)
    if isinstance(args, dict) and not any(isinstance(v, float) and math.isnan(v) for v in args.values()):
        assert schema_ok(name, args) is (not schema_rejects)


@pytest.mark.parametrize("name,args,label", GENERATED_BAD, ids=[f"{n}-{lab}" for n, _, lab in GENERATED_BAD])
def test_generated_bad_arguments(name: str, args: Any, label: str) -> None:
    _run_bad(name, args, "invalid_arguments")
    assert not schema_ok(name, args), "the JSON schema accepts what the validator rejects"


def test_error_messages_name_the_problem() -> None:
    ws = new_ws()
    assert "missing required argument 'body'" in ws.call("mail_reply", {"message_id": "msg_a1"}).error["message"]
    assert "unknown argument 'recipient'" in ws.call("mail_send", {"recipient": [BOB], "subject": "s", "body": "b"}).error["message"]
    assert "must be one of" in ws.call("mail_move", {"message_id": "msg_a1", "folder": "spam"}).error["message"]
    assert "must be a date string" in ws.call("tasks_create", {"title": "t", "due": "3/5"}).error["message"]
    assert "must be >= 0" in ws.call("crm_update_deal", {"deal_id": "deal_1", "amount": -1}).error["message"]
    assert "must be integer, got boolean" in ws.call("mail_search", {"limit": True}).error["message"]
    # a number or a truth value sent as a string, as models often send them: the error says what to pass
    assert ws.call("crm_update_deal", {"deal_id": "deal_1", "amount": "$15,200.50"}).error["message"].endswith(
        "must be number, got string (pass 15200.5 as a JSON number, not a string)")
    assert ws.call("mail_search", {"limit": "5"}).error["message"].endswith("(pass 5 as a JSON number, not a string)")
    assert ws.call("mail_search", {"unread_only": "True"}).error["message"].endswith("(pass true as a JSON boolean, not a string)")
    for args in ({"limit": "5.5"}, {"limit": "five"}, {"unread_only": "yes"}):
        assert "(pass" not in ws.call("mail_search", args).error["message"], args
    assert "unknown time zone" in ws.call("calendar_create_event", {"title": "x", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00",
                                                                     "attendees": [], "timezone": "Europe"}).error["message"]


def test_an_address_as_mail_clients_write_it_is_refused_with_the_address_to_pass() -> None:
    """Models write recipients as mail clients show them: with a display name, in brackets, as a mailto: link, several
    in one string, or one address without its list. None is an address (each would reach nobody, or read as an outside
    domain); the error says what to pass instead, so the retry can be right, and nothing is sent."""
    ws = new_ws()
    sent_before = len(ws.state()["mail.messages"])
    for to, fix in [(["Bob Stone <Bob@Globex.example>"], "(pass 'Bob@Globex.example' alone)"),
                    ([f"<{BOB}>"], f"(pass '{BOB}' alone)"), ([f"mailto:{BOB}"], f"(pass '{BOB}' alone)"),
                    ([f"{BOB}, {CAROL}"], f'(one address per item: ["{BOB}", "{CAROL}"])'),
                    ([f"{BOB}; Carol <{CAROL}>"], f'(one address per item: ["{BOB}", "{CAROL}"])'),
                    ([f"{BOB}."], f"(pass '{BOB}' alone)"), (BOB, f'(a list even for one: ["{BOB}"])')]:
        res = ws.call("mail_send", {"to": to, "subject": "s", "body": "b"})
        assert res.error["type"] == "invalid_arguments" and res.error["message"].endswith(fix), (to, res.error)
    for to in (["Bob Stone"], ["bob@globex"]):
        msg = ws.call("mail_send", {"to": to, "subject": "s", "body": "b"}).error["message"]
        assert "must be an email address string, the address alone (name@example.com)" in msg and "(pass" not in msg, msg
    assert len(ws.state()["mail.messages"]) == sent_before
    assert ws.call("mail_send", {"to": ["o'neil.ana+q3@sub.globex-eu.example"], "subject": "s", "body": "b"}).ok


def test_addresses_are_case_insensitive() -> None:
    """An address written in any case reaches the same person and is stored in lower case (as the
    world's records are), so checkers and searches see one spelling; the caller's arguments are kept."""
    ws = new_ws()
    args = {"to": ["Bob@Globex.EXAMPLE"], "cc": [CAROL.upper()], "subject": "s", "body": "b"}
    res = ws.call("mail_send", args)
    assert res.ok
    sent = ws.state()["mail.messages"][res.value["id"]]
    assert sent["to"] == [BOB] and sent["cc"] == [CAROL]
    assert args["to"] == ["Bob@Globex.EXAMPLE"], "the caller's dict was edited"
    res = ws.call("tasks_create", {"title": "t", "assignee": CAROL.title()})
    assert res.ok and ws.state()["tasks.tasks"][res.value["id"]]["assignee"] == CAROL
    assert_error(ws.call("mail_send", {"to": ["NOT AN ADDRESS"], "subject": "s", "body": "b"}), "invalid_arguments")


def test_unknown_tool() -> None:
    ws = new_ws()
    assert_error(ws.call("mail_teleport", {}), "unknown_tool")
    assert ws.audit[-1]["tool"] == "mail_teleport" and "service" not in ws.audit[-1]


def test_null_for_optional_argument_means_absent() -> None:
    """Deliberate leniency (models often send null for optional fields); required ones stay strict."""
    ws = new_ws()
    res = ws.call("mail_search", {"folder": None, "limit": None, "query": "invoice"})
    assert res.ok and ids(res.value) == ["msg_a2", "msg_a1"]
    assert_error(ws.call("mail_read", {"message_id": None}), "invalid_arguments")


def test_integral_float_is_not_an_integer() -> None:
    ws = new_ws()
    assert_error(ws.call("mail_search", {"limit": 2.0}), "invalid_arguments")
    assert not schema_ok("mail_search", {"limit": 2.0})
    assert ws.call("crm_update_deal", {"deal_id": "deal_1", "amount": 7}).ok  # an int is a number


def test_huge_and_unicode_values_do_not_crash() -> None:
    ws = new_ws()
    assert ws.call("mail_search", {"limit": 10**40}).ok
    assert ws.call("crm_update_deal", {"deal_id": "deal_1", "amount": 10**400}).ok
    assert_error(ws.call("crm_update_deal", {"deal_id": "deal_2", "amount": float("inf")}), "invalid_arguments")
    assert_error(ws.call("tasks_create", {"title": "t", "due": "٢٠٢٦-٠٣-٠٥"}), "invalid_arguments")  # non-ASCII digits
    res = ws.call("docs_search", {"query": "\u0000 \ud800 émoji 🎉"})
    assert res.ok and res.value == []


# =======================================================================================
# Our validator vs. jsonschema on generated argument dicts (property test)
# =======================================================================================
_TEXT = st.text(max_size=6)
_JUNK = st.one_of(st.integers(-5, 5), st.booleans(), st.floats(allow_nan=False, allow_infinity=False, width=32), _TEXT,
                  st.lists(st.integers(0, 3), max_size=2), st.dictionaries(_TEXT, st.integers(), max_size=1))
_FORMAT_GOOD = {
    "date": ["2026-03-05", "2026-12-31", "2028-02-29"],
    "date-time": ["2026-03-05T10:00", "2026-03-05T10:00:30Z", "2026-03-05T10:00:00-05:00"],
    "email": ["a@b.co", BOB],
}
_FORMAT_BAD = {
    "date": ["2026-02-30", "2026-3-5", "05/03/2026", "2026-03-05T10:00", "", "2026-03-05\n"],
    "date-time": ["2026-03-05T25:00", "2026-03-05", "2026-03-05 10:00", "now", "2026-03-05T10:00+5"],
    # values on which "contains @" (jsonschema) and our stricter pattern agree
    "email": ["bob", "", "bob.globex.example"],
}


def _mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """About one value in eight is bad, so that valid argument dicts are common too."""
    return st.integers(0, 7).flatmap(lambda i: bad if i == 0 else good)


def _scalar(p_type: str, fmt: str | None, enum: tuple[Any, ...] | None, minimum: float | None) -> st.SearchStrategy[Any]:
    if enum is not None:
        good = st.sampled_from(list(enum))
    elif fmt is not None:
        # jsonschema's "email" is any text with an @, ours is name@domain.tld: junk text in that gap (e.g. "@") is
        # compared where the gap is pinned, in BAD, not here
        junk = _JUNK.filter(lambda v: not (isinstance(v, str) and "@" in v)) if fmt == "email" else _JUNK
        return _mostly(st.sampled_from(_FORMAT_GOOD[fmt]), st.one_of(st.sampled_from(_FORMAT_BAD[fmt]), junk))
    elif p_type == "string":
        good = _TEXT
    elif p_type == "integer":
        lo = int(minimum) - 2 if minimum is not None else -5
        good = st.one_of(st.integers(lo, 50), st.floats(0.5, 9.5).filter(lambda x: not x.is_integer()))
    elif p_type == "number":
        good = st.one_of(st.integers(-3, 10**6), st.floats(-10, 1e6, allow_nan=False))
    elif p_type == "boolean":
        good = st.one_of(st.booleans(), st.integers(0, 1))
    elif p_type == "object":
        good = st.dictionaries(_TEXT, st.integers(), max_size=2)
    else:  # pragma: no cover
        raise AssertionError(p_type)
    return _mostly(good, _JUNK)


def _value(p) -> st.SearchStrategy[Any]:  # noqa: ANN001
    if p.type.startswith("array["):
        item = _scalar(p.type[6:-1], p.format, p.enum, None)
        return _mostly(st.lists(item, max_size=3), _JUNK)
    return _scalar(p.type, p.format, p.enum, p.minimum)


def args_for(t: Tool) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts over the tool's parameters: each present or not (required ones mostly present),
    values valid or not, sometimes an unknown key. No nulls: see the leniency test above."""
    parts = []
    for p in t.params:
        keep = _mostly(st.just(True), st.just(False)) if p.required else st.booleans()
        parts.append(st.tuples(st.just(p.name), keep, _value(p)))
    extra = _mostly(st.just({}), st.dictionaries(st.sampled_from(["bogus", "Query", "id_"]), st.integers(), min_size=1, max_size=1))
    return st.builds(lambda items, ex: {**{k: v for k, keep, v in items if keep}, **ex}, st.tuples(*parts), extra)


PROPERTY_TOOLS = ["crm_update_deal", "mail_search", "helpdesk_update_ticket", "tasks_create", "calendar_create_event", "mail_send",
                  "chat_read_channel", "crm_update_invoice", "calendar_free_busy", "crm_external_edit", "tasks_update", "docs_share"]


@pytest.mark.parametrize("name", PROPERTY_TOOLS)
def test_validator_agrees_with_jsonschema(name: str) -> None:
    t = REGISTRY[name]

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(args_for(t))
    def prop(args: dict[str, Any]) -> None:
        assert ours_ok(name, args) == schema_ok(name, args), args

    prop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], database=None)
@given(st.data())
def test_any_generated_call_returns_a_result(data: st.DataObject) -> None:
    """Fuzz every visible tool through Workspace.call: always a ToolResult, never an internal error."""
    name = data.draw(st.sampled_from(sorted(n for n, t in REGISTRY.items() if not t.hidden)))
    args = data.draw(args_for(REGISTRY[name]))
    ws = new_ws()
    res = ws.call(name, args)
    assert isinstance(res, ToolResult)
    if not res.ok:
        assert res.error["type"] in ERROR_TYPES, res.error
    json.loads(res.content())


# =======================================================================================
# Hidden world-event tools
# =======================================================================================
@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_hidden_tools_refused_for_agent(name: str) -> None:
    ws = new_ws()
    before = ws.state()
    res = ws.call(name, _reference_args(name), actor="agent")
    assert_error(res, "unknown_tool")
    assert ws.state() == before
    assert ws.call(name, _reference_args(name), actor="customer").ok  # any non-agent actor may cause world events


# =======================================================================================
# Calendar time zones
# =======================================================================================
def test_calendar_naive_time_gets_the_zone_offset_including_dst() -> None:
    ws = new_ws()
    # US DST starts on 2026-03-08: EST (-05:00) before, EDT (-04:00) after.
    before = ws.call("calendar_create_event", {"title": "a", "start": "2026-03-06T10:00", "end": "2026-03-06T11:00",
                                               "attendees": [DANA], "timezone": "America/New_York"}).value
    after = ws.call("calendar_create_event", {"title": "b", "start": "2026-03-10T10:00", "end": "2026-03-10T11:00",
                                              "attendees": [DANA], "timezone": "America/New_York"}).value
    explicit = ws.call("calendar_create_event", {"title": "c", "start": "2026-03-12T16:00:00+01:00", "end": "2026-03-12T17:00:00+01:00",
                                                 "attendees": [DANA], "timezone": "America/New_York"}).value
    berlin = ws.call("calendar_create_event", {"title": "d", "start": "2026-03-13T09:00", "end": "2026-03-13T09:30",
                                               "attendees": [DANA], "timezone": "Europe/Berlin"}).value
    assert before["start"] == "2026-03-06T10:00:00-05:00" and before["end"] == "2026-03-06T11:00:00-05:00"
    assert after["start"] == "2026-03-10T10:00:00-04:00"
    assert explicit["start"] == "2026-03-12T16:00:00+01:00"  # an explicit offset is kept as given
    assert berlin["start"] == "2026-03-13T09:00:00+01:00"
    fb = ws.call("calendar_free_busy", {"people": [DANA], "start": "2026-03-06T00:00:00Z", "end": "2026-03-14T00:00:00Z"}).value
    assert fb == {DANA: [["2026-03-06T15:00Z", "2026-03-06T16:00Z"], ["2026-03-10T14:00Z", "2026-03-10T15:00Z"],
                         ["2026-03-12T15:00Z", "2026-03-12T16:00Z"], ["2026-03-13T08:00Z", "2026-03-13T08:30Z"]]}
    # naive window bounds are UTC; the 22:00 New York event is on the 11th in UTC
    late = ws.call("calendar_create_event", {"title": "late", "start": "2026-03-10T22:00", "end": "2026-03-10T23:00",
                                             "attendees": [], "timezone": "America/New_York"}).value
    listed = ws.call("calendar_list_events", {"start": "2026-03-11T00:00", "end": "2026-03-11T06:00"}).value
    assert ids(listed) == [late["id"]]


def test_calendar_update_reads_naive_times_in_the_event_zone() -> None:
    ws = new_ws()
    v = ws.call("calendar_update_event", {"event_id": "evt_2", "start": "2026-03-09T09:00", "end": "2026-03-09T09:45"}).value
    assert (v["start"], v["end"]) == ("2026-03-09T09:00:00-04:00", "2026-03-09T09:45:00-04:00")
    v = ws.call("calendar_update_event", {"event_id": "evt_2", "end": "2026-03-09T10:30"}).value  # start kept
    assert (v["start"], v["end"]) == ("2026-03-09T09:00:00-04:00", "2026-03-09T10:30:00-04:00")


def test_free_busy_ignores_cancelled_and_out_of_window_events() -> None:
    ws = new_ws()
    fb = ws.call("calendar_free_busy", {"people": [ME], "start": "2026-03-03T00:00:00Z", "end": "2026-03-03T12:00:00Z"}).value
    assert fb == {ME: []}  # evt_3 at 08:00Z is cancelled; evt_1 is at 15:00Z
    ws.call("calendar_cancel_event", {"event_id": "evt_1"})
    fb = ws.call("calendar_free_busy", {"people": [ME], "start": "2026-03-03T00:00:00Z", "end": "2026-03-04T00:00:00Z"}).value
    assert fb == {ME: []}


# =======================================================================================
# CRM change history
# =======================================================================================
def test_crm_history_records_old_and_new_values() -> None:
    ws = new_ws()
    assert ws.call("crm_update_invoice", {"invoice_id": "inv_1", "amount": 1100.0, "note": "credit note"}).ok
    assert ws.call("crm_update_invoice", {"invoice_id": "inv_1", "amount": 1050.0, "status": "disputed"}).ok
    hist = ws.call("crm_get_history", {"record_id": "inv_1"}).value
    assert [(h["field"], h["old"], h["new"]) for h in hist] == [
        ("amount", 1200.0, 1100.0), ("note", None, "credit note"), ("amount", 1100.0, 1050.0), ("status", "open", "disputed")]
    assert all(h["by"] == ME for h in hist)
    assert [h["at"] for h in hist] == ["2026-03-02T09:00:00Z"] * 2 + ["2026-03-02T09:01:00Z"] * 2
    # an update to the same value is refused and leaves the history alone
    assert_error(ws.call("crm_update_invoice", {"invoice_id": "inv_1", "amount": 1050}), "invalid_arguments")
    assert len(ws.call("crm_get_history", {"record_id": "inv_1"}).value) == 4
    # note-only updates are kept
    assert ws.call("crm_update_deal", {"deal_id": "deal_2", "note": "called them"}).ok
    assert ws.call("crm_get_history", {"record_id": "deal_2"}).value[-1]["new"] == "called them"
    # a colleague's edit is attributed to them
    assert ws.call("crm_external_edit", {"collection": "crm.contacts", "record_id": "con_2", "changes": {"title": "VP Eng"}, "by": CAROL},
                   actor="world").ok
    assert [(h["by"], h["old"], h["new"]) for h in ws.call("crm_get_history", {"record_id": "con_2"}).value] == [(CAROL, "CTO", "VP Eng")]
    # the diff shows the field change with old and new values
    diff = diff_states(Workspace(WORLD).snapshot(), ws.snapshot())
    assert diff["crm.invoices"]["changed"]["inv_1"]["amount"] == [1200.0, 1050.0]
    assert diff["crm.invoices"]["changed"]["inv_1"]["status"] == ["open", "disputed"]


# =======================================================================================
# Ids, snapshots and the "records are never mutated in place" invariant
# =======================================================================================
def test_generated_ids_skip_ids_already_in_the_world() -> None:
    ws = Workspace({**WORLD, "tasks.tasks": {"task_0001": {**WORLD["tasks.tasks"]["task_1"], "id": "task_0001"}}})
    res = ws.call("tasks_create", {"title": "new"})
    assert res.ok and res.value["id"] == "task_0002"
    assert ws.call("tasks_create", {"title": "newer"}).value["id"] == "task_0003"


MUTATING = [(n, a) for n, a, _ in HAPPY if REGISTRY[n].mutates]


@pytest.mark.parametrize("name,args", MUTATING, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MUTATING)])
def test_snapshot_is_unchanged_by_every_mutating_tool(name: str, args: dict[str, Any]) -> None:
    ws = new_ws()
    snap = ws.snapshot()
    frozen = copy.deepcopy(snap)
    res = ws.call(name, copy.deepcopy(args), actor=actor_for(name))
    assert res.ok, res.error
    assert snap == frozen, f"{name} mutated a record in place"
    assert WORLD == WORLD_FROZEN, f"{name} mutated the caller's world"
    assert diff_states(snap, ws.snapshot()), f"{name} changed nothing"
    # restore: the exact state, an empty audit, and the same call replays identically
    ws.restore(snap)
    assert ws.state() == frozen and ws.audit == [] and ws.faults_injected == []
    again = ws.call(name, copy.deepcopy(args), actor=actor_for(name))
    assert again.ok and again.value == res.value


def test_read_only_tools_do_not_change_state() -> None:
    for name, args, _ in HAPPY:
        if REGISTRY[name].mutates:
            continue
        ws = new_ws()
        before = ws.state()
        assert ws.call(name, copy.deepcopy(args)).ok
        assert ws.state() == before, name


def test_restore_after_a_whole_session() -> None:
    ws = new_ws()
    snap = ws.snapshot()
    frozen = copy.deepcopy(snap)
    for name, args, _ in HAPPY:
        ws.call(name, copy.deepcopy(args), actor=actor_for(name))
    assert ws.state() != frozen and len(ws.audit) == len(HAPPY)
    ws.restore(snap)
    assert ws.state() == frozen and ws.audit == [] and ws.now() == "2026-03-02T09:00:00Z"
    assert snap == frozen
    json.dumps(ws.state())


def test_snapshots_share_unchanged_collections_and_stay_isolated() -> None:
    """Copy-on-write: a snapshot shares every collection with the workspace until the workspace
    writes to it; each snapshot in a sequence keeps its own state, and two workspaces restored
    from the same snapshot never see each other's writes."""
    ws = new_ws()
    s0 = ws.snapshot()
    assert all(s0[c] is ws.table(c) for c in s0)  # O(#collections), nothing copied
    frozen0 = copy.deepcopy(s0)
    ws.call("tasks_update", {"task_id": "task_1", "status": "done"})
    s1 = ws.snapshot()
    assert s1["tasks.tasks"] is not s0["tasks.tasks"]  # copied on the first write only
    assert all(s1[c] is s0[c] for c in s0 if c not in ("tasks.tasks", "_meta"))
    frozen1 = copy.deepcopy(s1)
    ws.call("tasks_update", {"task_id": "task_1", "status": "todo"})
    ws.call("tasks_delete", {"task_id": "task_2"})
    ws.call("tasks_create", {"title": "x"})
    assert s0 == frozen0 and s1 == frozen1
    a, b = Workspace(None), Workspace(None)
    a.restore(s1)
    b.restore(s1)
    a.call("tasks_delete", {"task_id": "task_1"})
    b.call("tasks_create", {"title": "y"})
    assert "task_1" in b.table("tasks.tasks") and "task_1" not in a.table("tasks.tasks")
    assert len(a.table("tasks.tasks")) == len(frozen1["tasks.tasks"]) - 1
    assert len(b.table("tasks.tasks")) == len(frozen1["tasks.tasks"]) + 1
    assert s1 == frozen1 and a.now() == b.now()
    assert a.table("_meta")["clock"]["minutes"] == frozen1["_meta"]["clock"]["minutes"] + 1  # one write each


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=len(HAPPY) - 1), min_size=1, max_size=14),
       st.integers(min_value=0, max_value=13), st.booleans())
def test_diff_over_touched_records_equals_the_full_diff(calls: list[int], snap_at: int, resume: bool) -> None:
    """The runner diffs only the records the workspace journalled as written (``touched``); for any
    sequence of tool calls, snapshot point and restore with a carried-over journal, that diff is
    the full one."""
    ws = new_ws()
    base = ws.snapshot()
    snaps = []
    for i, k in enumerate(calls):
        if i == snap_at:
            snaps.append(ws.snapshot())
            if resume:  # as a resumed episode does: restore a checkpoint's state and journal
                mid, touched = ws.snapshot(), {c: set(ids) for c, ids in ws.touched.items()}
                ws = Workspace(None)
                ws.restore(mid, touched=touched)
        name, args, _ = HAPPY[k]
        ws.call(name, copy.deepcopy(args), actor=actor_for(name))
    final = ws.snapshot()
    for before in [base, *snaps, final]:  # every record that differs between any two of them was journalled
        for after in [base, *snaps, final]:
            assert diff_states(before, after, ws.touched) == diff_states(before, after)
    assert json.dumps(diff_states(base, final, ws.touched)) == json.dumps(diff_states(base, final))  # same order too


def test_diff_states_added_removed_changed() -> None:
    ws = new_ws()
    before = ws.snapshot()
    ws.call("tasks_delete", {"task_id": "task_2"})
    new_id = ws.call("tasks_create", {"title": "x"}).value["id"]
    ws.call("tasks_update", {"task_id": "task_1", "status": "done"})
    d = diff_states(before, ws.snapshot())
    assert set(d) == {"tasks.tasks"}  # _meta (clock, counters) is not part of the diff
    t = d["tasks.tasks"]
    assert list(t["added"]) == [new_id] and list(t["removed"]) == ["task_2"]
    assert t["changed"] == {"task_1": {"status": ["todo", "done"]}}
    assert diff_states(before, before) == {}
    json.dumps(d)
