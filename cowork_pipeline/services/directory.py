"""Company directory: colleagues, teams and their time zones (read-only)."""
from __future__ import annotations

from typing import Any

from cowork_pipeline.services._util import matches, pick
from cowork_pipeline.services.registry import P, tool
from cowork_pipeline.services.workspace import Workspace

PPL = "directory.people"


@tool("directory", "Find colleagues by name, email, team or role.", P("query", "string", "Words to find"))
def search(ws: Workspace, query: str) -> list[dict[str, Any]]:
    return [pick(p, "id", "name", "email", "team", "role", "timezone")
            for p in sorted(ws.table(PPL).values(), key=lambda p: p["id"]) if matches(query, p["name"], p["email"], p["team"], p["role"])]
