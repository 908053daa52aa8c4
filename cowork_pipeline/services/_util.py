"""Small helpers shared by the service modules."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cowork_pipeline.services.registry import ToolError


def matches(query: str | None, *fields: Any) -> bool:
    """Every whitespace-separated query term occurs (case-insensitively) in some field."""
    if not query:
        return True
    hay = " ".join(str(f) for f in fields if f is not None).lower()
    return all(term in hay for term in query.lower().split())


def requested_changes(**fields: Any) -> dict[str, Any]:
    """The fields a partial update actually sets (None = leave as is); an update that sets nothing is an error."""
    changes = {k: v for k, v in fields.items() if v is not None}
    if not changes:
        names = list(fields)
        listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise ToolError("invalid_arguments", f"nothing to change: pass {listed}")
    return changes


def limit_rows(rows: Iterable[dict[str, Any]], limit: int | None, default: int = 20) -> list[dict[str, Any]]:
    n = default if limit is None else limit
    return list(rows)[:n]


def pick(rec: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: rec[k] for k in keys if k in rec}


def parse_dt(value: str, field: str, tz: str | None = None) -> datetime:
    """Parse ISO 8601; a naive time is read in ``tz`` (default UTC)."""
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ToolError("invalid_arguments", f"'{field}' is not an ISO 8601 date-time: {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=zone(tz or "UTC"))
    return dt


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: 'America' is a directory, over-long names
        raise ToolError("invalid_arguments", f"unknown time zone {name!r} (use an IANA name like 'Europe/Berlin')") from None


def domain_of(email: str) -> str:
    return email.rsplit("@", 1)[-1].lower()
