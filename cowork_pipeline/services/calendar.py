"""Calendar: events with attendees and time zones, free/busy."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cowork_pipeline.services._util import parse_dt, pick, zone
from cowork_pipeline.services.registry import P, ToolError, tool
from cowork_pipeline.services.workspace import Workspace

EV = "calendar.events"
_SUMMARY = ("id", "title", "start", "end", "timezone", "attendees", "status")


def _utc(ev: dict[str, Any], key: str) -> datetime:
    return parse_dt(ev[key], key).astimezone(timezone.utc)


def _overlaps(ev: dict[str, Any], start: datetime, end: datetime) -> bool:
    return _utc(ev, "start") < end and _utc(ev, "end") > start


def _span(start: str, end: str, tz: str | None) -> tuple[datetime, datetime]:
    s, e = parse_dt(start, "start", tz), parse_dt(end, "end", tz)
    if e <= s:
        raise ToolError("invalid_arguments", f"'end' ({end}) must be after 'start' ({start})")
    return s, e


@tool("calendar", "List events, optionally in a time window and/or for one attendee.",
      P("start", "string", "Window start, ISO 8601", required=False, format="date-time"),
      P("end", "string", "Window end, ISO 8601", required=False, format="date-time"),
      P("attendee", "string", "Only events with this attendee email", required=False))
def list_events(ws: Workspace, start: str | None = None, end: str | None = None, attendee: str | None = None) -> list[dict[str, Any]]:
    lo = parse_dt(start, "start") if start else datetime.min.replace(tzinfo=timezone.utc)
    hi = parse_dt(end, "end") if end else datetime.max.replace(tzinfo=timezone.utc)
    rows = [e for e in ws.table(EV).values()
            if e["status"] != "cancelled" and _overlaps(e, lo, hi)
            and (attendee is None or attendee in e["attendees"] or attendee == e["organizer"])]
    rows.sort(key=lambda e: (_utc(e, "start"), e["id"]))
    return [pick(e, *_SUMMARY) for e in rows]


@tool("calendar", "Get one event in full.", P("event_id", "string", "Event id"))
def get_event(ws: Workspace, event_id: str) -> dict[str, Any]:
    return ws.get(EV, event_id, "event")


@tool("calendar", "Create an event and invite its attendees.",
      P("title", "string", "Title"),
      P("start", "string", "Start, ISO 8601 (naive times are read in 'timezone')", format="date-time"),
      P("end", "string", "End, ISO 8601", format="date-time"),
      P("attendees", "array[string]", "Attendee emails", format="email"),
      P("timezone", "string", "IANA time zone of the event (default UTC)", required=False),
      P("location", "string", "Room or link", required=False),
      P("description", "string", "Agenda", required=False),
      mutates=True)
def create_event(ws: Workspace, title: str, start: str, end: str, attendees: list[str], timezone: str | None = None,
                 location: str | None = None, description: str | None = None) -> dict[str, Any]:
    tz = timezone or "UTC"
    zone(tz)
    s, e = _span(start, end, tz)
    rec = ws.insert(EV, {
        "id": ws.new_id("evt"), "title": title, "start": s.isoformat(), "end": e.isoformat(), "timezone": tz,
        "attendees": list(dict.fromkeys(attendees)), "organizer": ws.profile["email"], "location": location or "",
        "description": description or "", "status": "confirmed",
    })
    return pick(rec, *_SUMMARY)


@tool("calendar", "Change an event's title, time, location or description.",
      P("event_id", "string", "Event id"),
      P("title", "string", "New title", required=False),
      P("start", "string", "New start, ISO 8601", required=False, format="date-time"),
      P("end", "string", "New end, ISO 8601", required=False, format="date-time"),
      P("location", "string", "New location", required=False),
      P("description", "string", "New description", required=False),
      mutates=True)
def update_event(ws: Workspace, event_id: str, title: str | None = None, start: str | None = None, end: str | None = None,
                 location: str | None = None, description: str | None = None) -> dict[str, Any]:
    ev = ws.get(EV, event_id, "event")
    changes: dict[str, Any] = {k: v for k, v in (("title", title), ("location", location), ("description", description)) if v is not None}
    if start is not None or end is not None:
        s, e = _span(start or ev["start"], end or ev["end"], ev["timezone"])
        changes.update(start=s.isoformat(), end=e.isoformat())
    if not changes:
        raise ToolError("invalid_arguments", "nothing to change: pass at least one field")
    return pick(ws.update(EV, event_id, **changes), *_SUMMARY)


@tool("calendar", "Cancel an event (attendees are notified).", P("event_id", "string", "Event id"), destructive=True)
def cancel_event(ws: Workspace, event_id: str) -> dict[str, Any]:
    ev = ws.get(EV, event_id, "event")
    if ev["status"] == "cancelled":
        raise ToolError("invalid_state", f"event '{event_id}' is already cancelled")
    ws.update(EV, event_id, status="cancelled")
    return {"id": event_id, "status": "cancelled"}


@tool("calendar", "Invite more people to an event.",
      P("event_id", "string", "Event id"), P("attendees", "array[string]", "Emails to add", format="email"), mutates=True)
def add_attendees(ws: Workspace, event_id: str, attendees: list[str]) -> dict[str, Any]:
    ev = ws.get(EV, event_id, "event")
    merged = list(dict.fromkeys(ev["attendees"] + attendees))
    ws.update(EV, event_id, attendees=merged)
    return {"id": event_id, "attendees": merged}


@tool("calendar", "Busy intervals of each person in a window (from their calendars).",
      P("people", "array[string]", "Emails", format="email"),
      P("start", "string", "Window start, ISO 8601", format="date-time"),
      P("end", "string", "Window end, ISO 8601", format="date-time"))
def free_busy(ws: Workspace, people: list[str], start: str, end: str) -> dict[str, list[list[str]]]:
    lo, hi = _span(start, end, None)
    out: dict[str, list[list[str]]] = {}
    for person in people:
        busy = sorted(
            (_utc(e, "start"), _utc(e, "end")) for e in ws.table(EV).values()
            if e["status"] != "cancelled" and (person in e["attendees"] or person == e["organizer"]) and _overlaps(e, lo, hi)
        )
        out[person] = [[s.strftime("%Y-%m-%dT%H:%MZ"), e.strftime("%Y-%m-%dT%H:%MZ")] for s, e in busy]
    return out
