"""Documents/files: folders, text documents, search, sharing."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import matches, pick, requested_changes
from cowork_pipeline.services.registry import P, ToolError, tool
from cowork_pipeline.services.workspace import Workspace

FOLD, DOC = "docs.folders", "docs.documents"
_SUMMARY = ("id", "folder_id", "title", "owner", "confidential")


@tool("docs", "List folders, or the documents in one folder.",
      P("folder_id", "string", "Folder id (omit to list all folders)", required=False))
def list_folder(ws: Workspace, folder_id: str | None = None) -> list[dict[str, Any]]:
    if folder_id is None:
        return [pick(f, "id", "name", "parent_id") for f in sorted(ws.table(FOLD).values(), key=lambda f: f["id"])]
    ws.get(FOLD, folder_id, "folder")
    return [pick(d, *_SUMMARY) for d in sorted(ws.table(DOC).values(), key=lambda d: d["id"]) if d["folder_id"] == folder_id]


@tool("docs", "Full-text search over document titles and contents.", P("query", "string", "Words to find"))
def search(ws: Workspace, query: str) -> list[dict[str, Any]]:
    return [pick(d, *_SUMMARY) for d in sorted(ws.table(DOC).values(), key=lambda d: d["id"]) if matches(query, d["title"], d["content"])]


@tool("docs", "Read a document.", P("doc_id", "string", "Document id"))
def read(ws: Workspace, doc_id: str) -> dict[str, Any]:
    return ws.get(DOC, doc_id, "document")


@tool("docs", "Create a text document in a folder.",
      P("folder_id", "string", "Folder id"), P("title", "string", "Title"), P("content", "string", "Text"), mutates=True)
def create(ws: Workspace, folder_id: str, title: str, content: str) -> dict[str, Any]:
    ws.get(FOLD, folder_id, "folder")
    rec = ws.insert(DOC, {"id": ws.new_id("doc"), "folder_id": folder_id, "title": title, "content": content,
                          "owner": ws.profile["email"], "confidential": False, "shared_with": [], "updated": ws.now()})
    return pick(rec, *_SUMMARY)


@tool("docs", "Replace a document's title and/or content.",
      P("doc_id", "string", "Document id"), P("title", "string", "New title", required=False),
      P("content", "string", "New full text", required=False), mutates=True)
def update(ws: Workspace, doc_id: str, title: str | None = None, content: str | None = None) -> dict[str, Any]:
    ws.get(DOC, doc_id, "document")
    changes = requested_changes(title=title, content=content)
    return pick(ws.update(DOC, doc_id, **changes, updated=ws.now()), *_SUMMARY)


@tool("docs", "Share a document with people.",
      P("doc_id", "string", "Document id"), P("people", "array[string]", "Emails", format="email"), mutates=True)
def share(ws: Workspace, doc_id: str, people: list[str]) -> dict[str, Any]:
    d = ws.get(DOC, doc_id, "document")
    merged = list(dict.fromkeys(d["shared_with"] + people))
    ws.update(DOC, doc_id, shared_with=merged)
    return {"id": doc_id, "shared_with": merged}


@tool("docs", "Move a document to another folder.",
      P("doc_id", "string", "Document id"), P("folder_id", "string", "Target folder id"), mutates=True)
def move(ws: Workspace, doc_id: str, folder_id: str) -> dict[str, Any]:
    ws.get(DOC, doc_id, "document")
    ws.get(FOLD, folder_id, "folder")
    ws.update(DOC, doc_id, folder_id=folder_id)
    return {"id": doc_id, "folder_id": folder_id}


@tool("docs", "Delete a document permanently.", P("doc_id", "string", "Document id"), destructive=True)
def delete(ws: Workspace, doc_id: str) -> dict[str, Any]:
    d = ws.get(DOC, doc_id, "document")
    if d["owner"] != ws.profile["email"] and d["confidential"]:
        raise ToolError("forbidden", f"only the owner may delete confidential document '{doc_id}'")
    ws.delete(DOC, doc_id)
    return {"id": doc_id, "deleted": True}
