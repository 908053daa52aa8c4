"""Tasks/todo."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import pick, requested_changes
from cowork_pipeline.services.registry import P, ToolError, tool
from cowork_pipeline.services.workspace import Workspace

TSK = "tasks.tasks"
STATUS = ("todo", "in_progress", "done")
PRIORITY = ("low", "normal", "high")
_SUMMARY = ("id", "title", "assignee", "due", "status", "priority", "related")


@tool("tasks", "List tasks, optionally by assignee and status.",
      P("assignee", "string", "Assignee email", required=False), P("status", "string", "Status", required=False, enum=STATUS), name="tasks_list")
def list_tasks(ws: Workspace, assignee: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    rows = sorted((t for t in ws.table(TSK).values()
                   if (assignee is None or t["assignee"] == assignee) and (status is None or t["status"] == status)),
                  key=lambda t: t["id"])
    return [pick(t, *_SUMMARY) for t in rows]


@tool("tasks", "Create a task.",
      P("title", "string", "What to do"), P("assignee", "string", "Assignee email (default: you)", required=False, format="email"),
      P("due", "string", "Due date", required=False, format="date"),
      P("priority", "string", "Priority (default normal)", required=False, enum=PRIORITY),
      P("notes", "string", "Details", required=False),
      P("related", "string", "Id of a related record (ticket, deal, message...)", required=False), mutates=True)
def create(ws: Workspace, title: str, assignee: str | None = None, due: str | None = None, priority: str | None = None,
           notes: str | None = None, related: str | None = None) -> dict[str, Any]:
    rec = ws.insert(TSK, {"id": ws.new_id("task"), "title": title, "assignee": assignee or ws.profile["email"], "due": due,
                          "status": "todo", "priority": priority or "normal", "notes": notes or "", "related": related})
    return pick(rec, *_SUMMARY)


@tool("tasks", "Update a task.",
      P("task_id", "string", "Task id"), P("title", "string", "Title", required=False),
      P("assignee", "string", "Assignee email", required=False, format="email"),
      P("due", "string", "Due date", required=False, format="date"),
      P("status", "string", "Status", required=False, enum=STATUS),
      P("priority", "string", "Priority", required=False, enum=PRIORITY),
      P("notes", "string", "Notes", required=False), mutates=True)
def update(ws: Workspace, task_id: str, title: str | None = None, assignee: str | None = None, due: str | None = None,
           status: str | None = None, priority: str | None = None, notes: str | None = None) -> dict[str, Any]:
    ws.get(TSK, task_id, "task")
    changes = requested_changes(title=title, assignee=assignee, due=due, status=status, priority=priority, notes=notes)
    return pick(ws.update(TSK, task_id, **changes), *_SUMMARY)


@tool("tasks", "Mark a task done.", P("task_id", "string", "Task id"), mutates=True)
def complete(ws: Workspace, task_id: str) -> dict[str, Any]:
    t = ws.get(TSK, task_id, "task")
    if t["status"] == "done":
        raise ToolError("invalid_state", f"task '{task_id}' is already done")
    ws.update(TSK, task_id, status="done")
    return {"id": task_id, "status": "done"}


@tool("tasks", "Delete a task.", P("task_id", "string", "Task id"), destructive=True)
def delete(ws: Workspace, task_id: str) -> dict[str, Any]:
    ws.delete(TSK, task_id)
    return {"id": task_id, "deleted": True}
