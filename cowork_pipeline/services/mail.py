"""Mail: mailboxes (folders), threads, send/reply/forward, drafts, attachments as metadata."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import limit_rows, matches, pick
from cowork_pipeline.services.registry import P, ToolError, tool
from cowork_pipeline.services.workspace import Workspace

MSG = "mail.messages"
FOLDERS = ("inbox", "sent", "drafts", "archive", "trash")
_SUMMARY = ("id", "thread_id", "folder", "from", "to", "subject", "date", "read")


def _summary(m: dict[str, Any]) -> dict[str, Any]:
    return pick(m, *_SUMMARY)


def _new_message(ws: Workspace, *, to: list[str], subject: str, body: str, cc: list[str] | None, folder: str,
                 thread_id: str | None = None, attachments: list[dict[str, Any]] | None = None,
                 in_reply_to: str | None = None) -> dict[str, Any]:
    if not to:
        raise ToolError("invalid_arguments", "'to' must name at least one recipient")
    mid = ws.new_id("msg")
    rec = {
        "id": mid, "thread_id": thread_id or f"thr_{mid[4:]}", "folder": folder, "from": ws.profile["email"],
        "to": list(to), "cc": list(cc or []), "subject": subject, "body": body, "date": ws.now(),
        "read": True, "labels": [], "attachments": list(attachments or []), "in_reply_to": in_reply_to,
    }
    return ws.insert(MSG, rec)


@tool("mail", "Search the mailbox. All filters are optional; returns message summaries, newest first.",
      P("query", "string", "Words to find in subject, body or sender", required=False),
      P("folder", "string", "Folder to search", required=False, enum=FOLDERS),
      P("sender", "string", "Sender address (substring match)", required=False),
      P("unread_only", "boolean", "Only unread messages", required=False),
      P("limit", "integer", "Maximum results (default 20)", required=False, minimum=1))
def search(ws: Workspace, query: str | None = None, folder: str | None = None, sender: str | None = None,
           unread_only: bool | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    rows = [
        m for m in ws.table(MSG).values()
        if (folder is None or m["folder"] == folder)
        and (sender is None or sender.lower() in m["from"].lower())
        and (not unread_only or not m["read"])
        and matches(query, m["subject"], m["body"], m["from"])
    ]
    rows.sort(key=lambda m: (m["date"], m["id"]), reverse=True)
    return [_summary(m) for m in limit_rows(rows, limit)]


@tool("mail", "Read one message in full (marks it read).", P("message_id", "string", "Message id"), mutates=True)
def read(ws: Workspace, message_id: str) -> dict[str, Any]:
    m = ws.get(MSG, message_id, "message")
    if not m["read"]:
        m = ws.update(MSG, message_id, read=True)
    return {k: v for k, v in m.items() if k != "labels"}


@tool("mail", "Read every message of a thread, oldest first.", P("thread_id", "string", "Thread id"))
def read_thread(ws: Workspace, thread_id: str) -> list[dict[str, Any]]:
    rows = sorted((m for m in ws.table(MSG).values() if m["thread_id"] == thread_id), key=lambda m: (m["date"], m["id"]))
    if not rows:
        raise ToolError("not_found", f"no thread with id '{thread_id}'")
    return [pick(m, "id", "from", "to", "cc", "subject", "body", "date", "attachments") for m in rows]


@tool("mail", "Send a new email.",
      P("to", "array[string]", "Recipient addresses", format="email"),
      P("subject", "string", "Subject line"),
      P("body", "string", "Message body"),
      P("cc", "array[string]", "Cc addresses", required=False, format="email"),
      P("attachment_doc_ids", "array[string]", "Ids of documents to attach", required=False),
      mutates=True)
def send(ws: Workspace, to: list[str], subject: str, body: str, cc: list[str] | None = None,
         attachment_doc_ids: list[str] | None = None) -> dict[str, Any]:
    atts = []
    for did in attachment_doc_ids or []:
        d = ws.get("docs.documents", did, "document")
        atts.append({"doc_id": did, "name": d["title"], "size": len(d["content"]), "mime": "text/plain"})
    m = _new_message(ws, to=to, subject=subject, body=body, cc=cc, folder="sent", attachments=atts)
    return {"id": m["id"], "thread_id": m["thread_id"], "status": "sent"}


@tool("mail", "Reply to a message (in its thread).",
      P("message_id", "string", "Id of the message to answer"),
      P("body", "string", "Reply text"),
      P("reply_all", "boolean", "Also answer everyone on the original message", required=False),
      mutates=True)
def reply(ws: Workspace, message_id: str, body: str, reply_all: bool | None = None) -> dict[str, Any]:
    orig = ws.get(MSG, message_id, "message")
    me = ws.profile["email"]
    to = [orig["from"]] if orig["from"] != me else list(orig["to"])
    cc = [a for a in orig["to"] + orig["cc"] if a != me and a not in to] if reply_all else []
    subject = orig["subject"] if orig["subject"].lower().startswith("re:") else f"Re: {orig['subject']}"
    m = _new_message(ws, to=to, subject=subject, body=body, cc=cc, folder="sent", thread_id=orig["thread_id"], in_reply_to=message_id)
    return {"id": m["id"], "thread_id": m["thread_id"], "to": m["to"], "status": "sent"}


@tool("mail", "Forward a message, with its attachments, to new recipients.",
      P("message_id", "string", "Id of the message to forward"),
      P("to", "array[string]", "Recipient addresses", format="email"),
      P("note", "string", "Text to put above the forwarded message", required=False),
      mutates=True)
def forward(ws: Workspace, message_id: str, to: list[str], note: str | None = None) -> dict[str, Any]:
    orig = ws.get(MSG, message_id, "message")
    body = f"{note or ''}\n\n---------- Forwarded message ----------\nFrom: {orig['from']}\nSubject: {orig['subject']}\n\n{orig['body']}"
    m = _new_message(ws, to=to, subject=f"Fwd: {orig['subject']}", body=body.strip(), cc=None, folder="sent",
                     attachments=orig["attachments"])
    return {"id": m["id"], "thread_id": m["thread_id"], "status": "sent"}


@tool("mail", "Save a draft without sending it.",
      P("to", "array[string]", "Recipient addresses", format="email"),
      P("subject", "string", "Subject line"),
      P("body", "string", "Message body"),
      mutates=True)
def create_draft(ws: Workspace, to: list[str], subject: str, body: str) -> dict[str, Any]:
    m = _new_message(ws, to=to, subject=subject, body=body, cc=None, folder="drafts")
    return {"id": m["id"], "status": "draft"}


@tool("mail", "Send a saved draft.", P("draft_id", "string", "Draft message id"), mutates=True)
def send_draft(ws: Workspace, draft_id: str) -> dict[str, Any]:
    d = ws.get(MSG, draft_id, "draft")
    if d["folder"] != "drafts":
        raise ToolError("invalid_state", f"message '{draft_id}' is not a draft (folder: {d['folder']})")
    ws.update(MSG, draft_id, folder="sent", date=ws.now())
    return {"id": draft_id, "status": "sent"}


@tool("mail", "Move a message to another folder.",
      P("message_id", "string", "Message id"), P("folder", "string", "Target folder", enum=("inbox", "archive", "trash")),
      mutates=True)
def move(ws: Workspace, message_id: str, folder: str) -> dict[str, Any]:
    ws.get(MSG, message_id, "message")
    ws.update(MSG, message_id, folder=folder)
    return {"id": message_id, "folder": folder}


@tool("mail", "Mark a message read or unread.",
      P("message_id", "string", "Message id"), P("read", "boolean", "True for read, false for unread"), mutates=True)
def mark_read(ws: Workspace, message_id: str, read: bool) -> dict[str, Any]:
    ws.get(MSG, message_id, "message")
    ws.update(MSG, message_id, read=read)
    return {"id": message_id, "read": read}


@tool("mail", "Permanently delete a message.", P("message_id", "string", "Message id"), destructive=True)
def delete(ws: Workspace, message_id: str) -> dict[str, Any]:
    ws.delete(MSG, message_id)
    return {"id": message_id, "deleted": True}


@tool("mail", "Deliver an inbound message (world event).",
      P("id", "string", "Message id"), P("sender", "string", "From address"), P("to", "array[string]", "Recipients"),
      P("subject", "string", "Subject"), P("body", "string", "Body"),
      P("thread_id", "string", "Thread id", required=False),
      P("attachments", "array[object]", "Attachment metadata", required=False),
      hidden=True, mutates=True, name="mail_deliver")
def deliver(ws: Workspace, id: str, sender: str, to: list[str], subject: str, body: str, thread_id: str | None = None,
            attachments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rec = {"id": id, "thread_id": thread_id or f"thr_{id}", "folder": "inbox", "from": sender, "to": list(to), "cc": [],
           "subject": subject, "body": body, "date": ws.now(), "read": False, "labels": [],
           "attachments": list(attachments or []), "in_reply_to": None}
    ws.insert(MSG, rec)
    return {"id": id}
