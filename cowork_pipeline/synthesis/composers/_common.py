"""Helpers every composer module uses."""
from __future__ import annotations

from datetime import datetime
from typing import Any


def V(name: str) -> dict[str, str]:  # noqa: N802  (reads like a placeholder in reference programs)
    """A reference to a value bound from an earlier tool result."""
    return {"$var": name}


def first(name: str) -> str:
    return name.split()[0]


def mention(coll: str, field: str, value: str, role: str, partial: bool = False) -> dict[str, Any]:
    """How the user's request identifies a record (the validator checks it matches exactly one)."""
    return {"collection": coll, "field": field, "value": value, "role": role, "partial": partial}


def _at(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
