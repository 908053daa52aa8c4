"""The workspace: every service's state, the tool dispatcher and the evidence it records.

State is ``{collection: {record_id: record}}`` with collections named ``service.kind``
(``mail.messages``). Records are treated as immutable values: tools never edit a
record in place, they store a new dict (:meth:`Workspace.update`), and a collection's
index is copied on its first write after a snapshot. That makes a snapshot a shallow
copy of the collection map (structural sharing) instead of a deep copy of every record,
and lets the diff skip unchanged collections and records by identity.
"""
from __future__ import annotations

import copy
import functools
import json
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

from cowork_pipeline.services.registry import REGISTRY, Tool, ToolError

State = dict[str, dict[str, dict[str, Any]]]
META = "_meta"  # collection holding id counters, the clock and the user's profile

FAULT_KINDS = ("rate_limit", "server_error", "timeout")
_FAULT_MESSAGES = {
    "rate_limit": "429 Too Many Requests: rate limit exceeded, retry the same call",
    "server_error": "500 Internal Server Error: transient failure, retry the same call",
    "timeout": "504 Gateway Timeout: the service did not answer in time, retry the same call",
}


@dataclass(frozen=True)
class FaultConfig:
    """Seeded transient failures of agent tool calls. A faulted call changes nothing,
    so retrying it is always safe; ``max_consecutive`` bounds bad luck so that a
    policy that retries can always finish."""

    rate: float = 0.0
    seed: int = 0
    kinds: tuple[str, ...] = FAULT_KINDS
    max_consecutive: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"fault rate must be in [0, 1), got {self.rate}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")


# json.dumps(..., separators=(",", ":"), ensure_ascii=False) builds this encoder on every call.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


@dataclass
class ToolResult:
    ok: bool
    value: Any = None
    error: dict[str, str] | None = None
    fault: str | None = None

    def content(self) -> str:
        """What the agent reads in the ``role: tool`` message (compact JSON)."""
        if self.ok:
            return _COMPACT.encode(self.value)
        return _COMPACT.encode({"error": self.error})


BASE_TIME = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
_BASE_NAIVE_UTC = BASE_TIME.replace(tzinfo=None)  # naive isoformat() is ~3x cheaper than strftime


class Workspace:
    def __init__(self, state: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None, faults: FaultConfig | None = None):
        # Copy the caller's records once so later writes never reach their objects.
        self._data: State = {c: {k: dict(v) for k, v in recs.items()} for c, recs in (state or {}).items()}
        self._data.setdefault(META, {}).setdefault("clock", {"minutes": 0})
        # Copy-on-write collections: a snapshot shares every collection's index with the live
        # workspace, and the first write to a collection after a snapshot or restore copies that
        # index (only this one). ``_owned``: the collections this workspace may write in place.
        self._owned: set[str] = set(self._data)
        # Ids written per collection since the workspace was built or restored (a superset of what
        # changed since any snapshot taken since then): lets a diff look at those records only.
        self.touched: dict[str, set[str]] = {}
        self.audit: list[dict[str, Any]] = []
        self.turn = 0
        self._faults = faults or FaultConfig()
        self._rng: random.Random | None = None  # seeded on the first draw (Random() costs ~7 µs per reset)
        self._consecutive_faults = 0
        self.faults_injected: list[dict[str, Any]] = []
        self._now_cache: tuple[int | None, str] = (None, "")

    # ---- records -------------------------------------------------------------------
    def table(self, collection: str) -> dict[str, dict[str, Any]]:
        """Read-only view by convention: mutate through insert/update/delete only."""
        return self._data.get(collection, {})

    def _writable(self, collection: str, record_id: str | None = None) -> dict[str, Any]:
        """``collection``'s index, copied first if a snapshot may share it; ``record_id``: the
        record about to be written (journalled in ``touched``)."""
        if record_id is not None:
            ids = self.touched.get(collection)
            if ids is None:
                ids = self.touched[collection] = set()
            ids.add(record_id)
        if collection in self._owned:
            return self._data[collection]
        coll = self._data[collection] = dict(self._data.get(collection, {}))
        self._owned.add(collection)
        return coll

    def get(self, collection: str, record_id: str, what: str | None = None) -> dict[str, Any]:
        rec = self._data.get(collection, {}).get(record_id)
        if rec is None:
            raise ToolError("not_found", f"no {what or collection.split('.')[-1].rstrip('s')} with id '{record_id}'")
        return rec

    def new_id(self, prefix: str) -> str:
        """The next free ``<prefix>_NNNN``: ids already used by the world's records are skipped
        (a world seeded with ``task_0001`` must not make the agent's first insert a conflict)."""
        meta = self._data[META]
        counters = meta.get("counters", {})
        n = counters.get(prefix, 0)
        colls = self._data.values()
        while True:
            n += 1
            rid = f"{prefix}_{n:04d}"
            for recs in colls:
                if rid in recs:
                    break
            else:
                break
        self._writable(META)["counters"] = {**counters, prefix: n}
        return rid

    def insert(self, collection: str, record: dict[str, Any], prefix: str | None = None) -> dict[str, Any]:
        rid = record.get("id") or self.new_id(prefix or collection.split(".")[-1][:4])
        if rid in self._data.get(collection, ()):
            raise ToolError("conflict", f"id '{rid}' already exists in {collection}")
        rec = {"id": rid, **{k: v for k, v in record.items() if k != "id"}}
        self._writable(collection, rid)[rid] = rec
        return rec

    def update(self, collection: str, record_id: str, **changes: Any) -> dict[str, Any]:
        old = self.get(collection, record_id)
        new = {**old, **changes}
        self._writable(collection, record_id)[record_id] = new
        return new

    def delete(self, collection: str, record_id: str) -> dict[str, Any]:
        rec = self.get(collection, record_id)
        del self._writable(collection, record_id)[record_id]
        return rec

    # ---- clock -----------------------------------------------------------------------
    def now(self) -> str:
        minutes = self._data[META]["clock"]["minutes"]
        cached_minutes, text = self._now_cache
        if cached_minutes != minutes:  # formatting is a visible part of a write's cost: once per tick
            text = (_BASE_NAIVE_UTC + timedelta(minutes=minutes)).isoformat(timespec="seconds") + "Z"
            self._now_cache = (minutes, text)
        return text

    def tick(self, minutes: int = 1) -> None:
        self._writable(META)["clock"] = {"minutes": self._data[META]["clock"]["minutes"] + minutes}

    @property
    def profile(self) -> dict[str, Any]:
        return self._data[META].get("profile", {"name": "Alex Morgan", "email": "alex.morgan@northwind.example", "timezone": "UTC"})

    # ---- dispatch --------------------------------------------------------------------
    def call(self, name: str, args: Any, actor: str = "agent") -> ToolResult:
        """Run one tool call and log it. Agent calls may be faulted; world events never are."""
        tool: Tool | None = REGISTRY.get(name)
        entry: dict[str, Any] = {"seq": len(self.audit), "turn": self.turn, "actor": actor, "tool": name, "args": args}
        if tool is None or (tool.hidden and actor == "agent"):
            res = ToolResult(False, error={"type": "unknown_tool", "message": f"unknown tool '{name}'"})
        else:
            entry["service"] = tool.service
            fault = self._draw_fault() if actor == "agent" and self._faults.rate > 0.0 else None
            if fault is not None:
                res = ToolResult(False, error={"type": fault, "message": _FAULT_MESSAGES[fault]}, fault=fault)
                self.faults_injected.append({"seq": entry["seq"], "tool": name, "kind": fault})
            else:
                try:
                    value = tool.fn(self, **tool.validate(args))
                    res = ToolResult(True, value)
                    if tool.mutates:
                        self.tick()
                except ToolError as e:
                    res = ToolResult(False, error=e.to_dict())
                except Exception as e:  # a tool bug or a malformed world record must not kill the episode
                    res = ToolResult(False, error={"type": "internal_error", "message": f"{name}: {type(e).__name__}: {e}"})
        entry["ok"] = res.ok
        if res.ok:
            entry["result"] = res.value
        else:
            entry["error"] = res.error
            if res.fault:
                entry["fault"] = res.fault
        self.audit.append(entry)
        return res

    def _draw_fault(self) -> str | None:
        cfg = self._faults
        if cfg.rate <= 0.0:
            return None
        # Always consume the same number of draws per call so the fault sequence
        # depends only on the seed and the call index.
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random(cfg.seed)
        hit = rng.random() < cfg.rate
        kind = cfg.kinds[rng.randrange(len(cfg.kinds))]
        if hit and self._consecutive_faults < cfg.max_consecutive:
            self._consecutive_faults += 1
            return kind
        self._consecutive_faults = 0
        return None

    # ---- snapshots -------------------------------------------------------------------
    def snapshot(self) -> State:
        """O(#collections): collections and records are shared with the workspace, which copies a
        collection's index before it next writes to it. Treat a snapshot as read-only."""
        self._owned.clear()
        return dict(self._data)

    def restore(self, snap: State, faults: FaultConfig | None = None, touched: Mapping[str, Iterable[str]] | None = None) -> None:
        """Back to ``snap`` with a fresh audit log (episodes start from a pristine copy).
        ``touched``: the ids written between the diff base and ``snap`` (a checkpoint's), if any."""
        self._data = dict(snap)
        self._owned = set()
        self.touched = {c: set(ids) for c, ids in touched.items()} if touched else {}
        self.audit = []
        self.turn = 0
        self.faults_injected = []
        if faults is not None:
            self._faults = faults
        self._rng = None
        self._consecutive_faults = 0

    def state(self) -> State:
        """A JSON-safe deep copy of the current state (for evidence that leaves the process)."""
        return copy.deepcopy(self._data)

    def audit_by_service(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for e in self.audit:
            out.setdefault(e.get("service", "unknown"), []).append(e)
        return out


_ABSENT: Any = object()


def diff_states(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
                touched: Mapping[str, Iterable[str]] | None = None) -> dict[str, Any]:
    """Structural diff: per collection, added / removed records and changed fields ``[old, new]``.

    ``touched``: per collection, ids that include every record that differs (a workspace's
    ``touched`` since ``before`` was taken); only those are compared. Same result, without a
    pass over every record of every changed collection."""
    out: dict[str, Any] = {}
    empty: Mapping[str, Any] = {}
    for coll in sorted(touched if touched is not None else before.keys() | after.keys()):
        b, a = before.get(coll, empty), after.get(coll, empty)
        # unchanged: records and collections are shared between snapshots (identity compares, in C)
        if coll == META or b is a or (touched is None and b == a):
            continue
        added: dict[str, Any] = {}
        removed: dict[str, Any] = {}
        changed: dict[str, Any] = {}
        for k in touched[coll] if touched is not None else a.keys() | b.keys():
            ra, rb = a.get(k, _ABSENT), b.get(k, _ABSENT)
            if ra is rb:
                continue
            if rb is _ABSENT:
                added[k] = ra
            elif ra is _ABSENT:
                removed[k] = rb
            elif ra != rb:
                changed[k] = {f: [rb.get(f), ra.get(f)] for f in sorted(ra.keys() | rb.keys()) if ra.get(f) != rb.get(f)}
        if added or removed or changed:
            out[coll] = {
                "added": dict(sorted(added.items())),
                "removed": dict(sorted(removed.items())),
                "changed": dict(sorted(changed.items())),
            }
    return out


def tools_for(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI function schemas for the given tools (all agent-visible tools if None).
    The list is shared between callers (cached): treat it as read-only."""
    return _tools_for(None if names is None else tuple(names))


@functools.lru_cache(maxsize=4096)
def _tools_for(names: tuple[str, ...] | None) -> list[dict[str, Any]]:
    if names is None:
        return [t.schema() for t in REGISTRY.values() if not t.hidden]
    out = []
    for n in names:
        t = REGISTRY.get(n)
        if t is None or t.hidden:
            raise KeyError(f"unknown or hidden tool '{n}'")
        out.append(t.schema())
    return out


def timed_call(ws: Workspace, name: str, args: Any, actor: str = "agent") -> tuple[ToolResult, float]:
    t0 = time.perf_counter()
    res = ws.call(name, args, actor)
    return res, time.perf_counter() - t0
