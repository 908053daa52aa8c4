"""Helpdesk tickets: status, priority, assignee, tags, comments."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import matches, pick, requested_changes
from cowork_pipeline.services.registry import P, tool
from cowork_pipeline.services.workspace import Workspace

TK = "helpdesk.tickets"
STATUS = ("open", "pending", "solved", "closed")
PRIORITY = ("low", "normal", "high", "urgent")
_SUMMARY = ("id", "subject", "requester", "status", "priority", "assignee")


@tool("helpdesk", "Search tickets; all filters optional.",
      P("query", "string", "Words in subject or description", required=False),
      P("status", "string", "Status", required=False, enum=STATUS),
      P("requester", "string", "Requester email", required=False),
      P("assignee", "string", "Assignee email", required=False))
def search_tickets(ws: Workspace, query: str | None = None, status: str | None = None, requester: str | None = None,
                   assignee: str | None = None) -> list[dict[str, Any]]:
    rows = sorted((t for t in ws.table(TK).values()
                   if (status is None or t["status"] == status) and (requester is None or t["requester"] == requester)
                   and (assignee is None or t["assignee"] == assignee) and matches(query, t["subject"], t["description"])),
                  key=lambda t: t["id"])
    return [pick(t, *_SUMMARY) for t in rows]


@tool("helpdesk", "Get a ticket with its comments.", P("ticket_id", "string", "Ticket id"))
def get_ticket(ws: Workspace, ticket_id: str) -> dict[str, Any]:
    return ws.get(TK, ticket_id, "ticket")


@tool("helpdesk", "Open a new ticket.",
      P("subject", "string", "Subject"), P("requester", "string", "Requester email", format="email"),
      P("description", "string", "Problem description"),
      P("priority", "string", "Priority (default normal)", required=False, enum=PRIORITY), mutates=True)
def create_ticket(ws: Workspace, subject: str, requester: str, description: str, priority: str | None = None) -> dict[str, Any]:
    rec = ws.insert(TK, {"id": ws.new_id("tkt"), "subject": subject, "requester": requester, "description": description,
                         "status": "open", "priority": priority or "normal", "assignee": None, "tags": [], "comments": [],
                         "created": ws.now()})
    return pick(rec, *_SUMMARY)


@tool("helpdesk", "Update a ticket's status, priority, assignee or tags.",
      P("ticket_id", "string", "Ticket id"),
      P("status", "string", "Status", required=False, enum=STATUS),
      P("priority", "string", "Priority", required=False, enum=PRIORITY),
      P("assignee", "string", "Assignee email", required=False, format="email"),
      P("tags", "array[string]", "Replace the tags", required=False), mutates=True)
def update_ticket(ws: Workspace, ticket_id: str, status: str | None = None, priority: str | None = None,
                  assignee: str | None = None, tags: list[str] | None = None) -> dict[str, Any]:
    ws.get(TK, ticket_id, "ticket")
    changes = requested_changes(status=status, priority=priority, assignee=assignee, tags=tags)
    return pick(ws.update(TK, ticket_id, **changes), *_SUMMARY)


@tool("helpdesk", "Add a comment to a ticket (public comments are emailed to the requester).",
      P("ticket_id", "string", "Ticket id"), P("body", "string", "Comment text"),
      P("public", "boolean", "Visible to the requester (default false)", required=False), mutates=True)
def add_comment(ws: Workspace, ticket_id: str, body: str, public: bool | None = None) -> dict[str, Any]:
    t = ws.get(TK, ticket_id, "ticket")
    comment = {"author": ws.profile["email"], "body": body, "public": bool(public), "at": ws.now()}
    ws.update(TK, ticket_id, comments=t["comments"] + [comment])
    return {"ticket_id": ticket_id, "comments": len(t["comments"]) + 1}


@tool("helpdesk", "Delete a ticket permanently.", P("ticket_id", "string", "Ticket id"), destructive=True)
def delete_ticket(ws: Workspace, ticket_id: str) -> dict[str, Any]:
    ws.delete(TK, ticket_id)
    return {"id": ticket_id, "deleted": True}


@tool("helpdesk", "A requester adds a comment (world event).", P("ticket_id", "string", "Ticket id"),
      P("author", "string", "Author email"), P("body", "string", "Text"), hidden=True, mutates=True, name="helpdesk_requester_comment")
def requester_comment(ws: Workspace, ticket_id: str, author: str, body: str) -> dict[str, Any]:
    t = ws.get(TK, ticket_id, "ticket")
    ws.update(TK, ticket_id, comments=t["comments"] + [{"author": author, "body": body, "public": True, "at": ws.now()}],
              status="open")
    return {"ticket_id": ticket_id}
