"""Chat: channels and messages."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import limit_rows, matches, pick
from cowork_pipeline.services.registry import P, ToolError, tool
from cowork_pipeline.services.workspace import Workspace

CH, MSG = "chat.channels", "chat.messages"


@tool("chat", "List the channels you can see.")
def list_channels(ws: Workspace) -> list[dict[str, Any]]:
    return [pick(c, "id", "name", "private") for c in sorted(ws.table(CH).values(), key=lambda c: c["id"])]


@tool("chat", "Read the latest messages of a channel, oldest first.",
      P("channel_id", "string", "Channel id"), P("limit", "integer", "How many (default 20)", required=False, minimum=1))
def read_channel(ws: Workspace, channel_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    ws.get(CH, channel_id, "channel")
    rows = sorted((m for m in ws.table(MSG).values() if m["channel_id"] == channel_id), key=lambda m: (m["at"], m["id"]))
    n = limit or 20
    return [pick(m, "id", "author", "text", "at") for m in rows[-n:]]


@tool("chat", "Post a message to a channel.",
      P("channel_id", "string", "Channel id"), P("text", "string", "Message"), mutates=True)
def post_message(ws: Workspace, channel_id: str, text: str) -> dict[str, Any]:
    ch = ws.get(CH, channel_id, "channel")
    if ch.get("archived"):
        raise ToolError("invalid_state", f"channel '{channel_id}' is archived")
    rec = ws.insert(MSG, {"id": ws.new_id("cmsg"), "channel_id": channel_id, "author": ws.profile["email"], "text": text, "at": ws.now()})
    return {"id": rec["id"], "channel_id": channel_id}


@tool("chat", "Search messages in all channels.",
      P("query", "string", "Words to find"), P("limit", "integer", "Maximum results", required=False, minimum=1))
def search(ws: Workspace, query: str, limit: int | None = None) -> list[dict[str, Any]]:
    rows = sorted((m for m in ws.table(MSG).values() if matches(query, m["text"], m["author"])), key=lambda m: (m["at"], m["id"]))
    return [pick(m, "id", "channel_id", "author", "text", "at") for m in limit_rows(rows, limit)]


@tool("chat", "A colleague posts a message (world event).", P("id", "string", "Message id"),
      P("channel_id", "string", "Channel id"), P("author", "string", "Author email"), P("text", "string", "Text"),
      hidden=True, mutates=True, name="chat_deliver")
def deliver(ws: Workspace, id: str, channel_id: str, author: str, text: str) -> dict[str, Any]:
    ws.get(CH, channel_id, "channel")
    ws.insert(MSG, {"id": id, "channel_id": channel_id, "author": author, "text": text, "at": ws.now()})
    return {"id": id}
