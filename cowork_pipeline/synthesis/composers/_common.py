"""Helpers every composer module uses."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Callable

from cowork_pipeline.synthesis.checks import name_words
from cowork_pipeline.synthesis.world import DOMAIN, slug


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


def dates_given(*texts: str, own: tuple[str, ...] = (), ends: tuple[str, ...] = (), was: tuple[str, ...] = ()) -> list[str]:
    """The ``when_allowed`` parameter of a record's or a message's checks: the record's ``own`` dates and times (ISO dates, ISO instants
    read as their date and HH:MM), the times it ``ends`` (as a range's end only: "14:00-15:00", not "at 15:00"), what
    it ``was`` before a move (only as what it was: "moved from 10:00", not "moved to 10:00") and every ISO date and
    HH:MM time ``texts`` give (the request, the colleague's update, the workspace's today): a note on the record may
    name those, and no other, and a day the texts give that is not the record's own not as its day ("^2026-03-02":
    "set up on 2026-03-02", not "2026-03-02 at 13:00" nor "due 2026-03-02"). Times are given only for a record with a
    time of day (a meeting, not a task). A time a text gives as a window's bound ("between 09:00 and 17:00", "09:00-17:00",
    "after 09:00") may stand only as one again ("~09:00": "inside your 09:00-17:00 window", not "at 09:00")."""
    out: list[str] = []
    for v in own:
        out += [v[:10]] + ([v[11:16]] if len(v) >= 16 else [])
    for v in ends:
        out += [v[:10], ".." + v[11:16]]
    for v in was:
        out += ["<" + v[:10]] + (["<" + v[11:16]] if len(v) >= 16 else [])
    # A record without a time of day (a task: its due date) has no time a note could misstate: times are judged only
    # where a time is allowed, so none is taken from the texts either (an email's "07:00" would judge "call at 15:30").
    timed = any(len(v) >= 16 for v in own + ends + was)
    given: list[str] = []
    for text in texts:
        for m in re.finditer(r"(?<![0-9])[0-9]{4}-[0-9]{2}-[0-9]{2}(?![0-9])" + (r"|(?<![0-9:])[0-9]{2}:[0-9]{2}(?![0-9])" if timed else ""), text):
            bound = len(m.group(0)) == 5 and (_WINDOW_BEFORE.search(text[max(0, m.start() - 24):m.start()].lower()) is not None
                                              or _WINDOW_AFTER.match(text[m.end():m.end() + 24].lower()) is not None)
            given.append(("~" if bound else "") + m.group(0))
    # a time given as a bound and also plainly (or as the record's own) stands plainly; a day the texts give that is
    # not the record's own may be named, but not as its day ("^": "set up on 2026-03-02", not "due 2026-03-02")
    dated = any(len(v) >= 10 for v in own)  # (a record with no day of its own, a task without a due date, has none to misstate)
    for v in given:
        if len(v) == 10:
            out.append(v if v in out or not dated else "^" + v)
        elif not (v[0] == "~" and (v[1:] in given or v[1:] in out)):
            out.append(v)
    return sorted(set(out))


# A window's bound in a task's text: after "between", "from" (with an end), "after", "before", "until", or a time and "-",
# "to", "and"; or before "-", "to", "and" and another time.
_WINDOW_BEFORE = re.compile(r"(?:between|after|before|until|till|no earlier than|no later than|[0-9]{2}:[0-9]{2}(?: ?utc)? ?(?:-|–|to|and))\s*$")
_WINDOW_AFTER = re.compile(r"(?: ?utc)? ?(?:-|–|to|and) ?[0-9]{1,2}(?::[0-9]{2})?")


def other_names(state: dict[str, dict[str, dict[str, Any]]], coll: str, field: str, *right: str, similar: bool = False) -> list[str]:
    """The ``field`` of the other records of ``coll``: what a message about the right record must not name
    in its place (another invoice's number, another customer's name). Values the right ones contain are
    left out ('Hiring debrief' is named by 'Hiring debrief prep' itself; when it is the wrong one, the
    right title is missing anyway). ``similar``: only values sharing a word with a right one (titles
    such as 'Standup' or 'Notes 1' are ordinary words a correct message may use; 'Hiring debrief prep'
    next to 'Hiring debrief' is the confusable one)."""
    want = [" ".join(r.lower().split()) for r in right]
    words = set().union(*(name_words(r) for r in right)) if right else set()
    out = set()
    for rec in state.get(coll, {}).values():
        v = rec.get(field)
        if not isinstance(v, str) or not v.strip() or any(" ".join(v.lower().split()) in w for w in want):
            continue
        if not similar or name_words(v) & words:
            out.add(v)
    return sorted(out)


def position(wb, coll: str, target: str, keep: Callable[[dict[str, Any]], bool],
             key: Callable[[dict[str, Any]], Any] = lambda r: r["id"]) -> int:
    """Where ``target`` lands in a listing of ``coll`` (the service's filter and order), so the
    reference binds the row it would observe. A record the filter drops is placed where it would be."""
    rows = sorted((r for r in wb.state.get(coll, {}).values() if keep(r) or r["id"] == target), key=key)
    return [r["id"] for r in rows].index(target)


def twin_person(wb, like: dict[str, Any], team: str, role: str = "Contractor") -> dict[str, Any]:
    """A second directory entry with exactly the same name (a generator collision)."""
    f, l = like["name"].split(" ", 1)
    return wb.put("directory.people", {"id": wb.id("usr"), "name": like["name"], "email": f"{slug(f)}.{slug(l)}2@{DOMAIN}",
                                       "team": team, "role": role, "timezone": "UTC"})
