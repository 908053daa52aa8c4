"""Which registered checkpoint is the current one.

The checkpoint registry is a Delta table upserted by checkpoint id, and a merge keeps no row order: after a
re-run with other training settings the newly trained checkpoint may sit before the one it replaces. "Latest"
is therefore the checkpoint whose files were written last, not the last row."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _files(p: Path) -> list[Path]:
    """The checkpoint's files: every file under a directory (sorted), or the path itself."""
    return sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]


def trained_at(path: str) -> float:
    """When the checkpoint at ``path`` was last written (its newest file); -1 when it is not on this machine."""
    p = Path(path)
    try:
        files = _files(p)
        return max(f.stat().st_mtime for f in files) if files else p.stat().st_mtime
    except (OSError, ValueError):
        return -1.0


def latest_trained(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of the most recently trained checkpoint among ``rows`` (each with a ``path``); a tie or a
    checkpoint not on disk keeps table order (the later row wins)."""
    best, best_t = None, float("-inf")
    for r in rows:
        t = trained_at(str(r.get("path") or ""))
        if t >= best_t:
            best, best_t = r, t
    return best


def checkpoint_key(row: dict[str, Any], **settings: Any) -> str:
    """Identifies the weights a registry row stands for, plus the settings an agent runs them with. A checkpoint id
    alone does not: training again with other settings writes new weights under the same id and path. So the key
    covers the row (config, data versions, metrics of that training) and the files at the path (name, size, mtime):
    a retrain, or a user's checkpoint replaced in place, gives another key."""
    import hashlib
    import json

    files: list[tuple[str, int, int]] = []
    p = Path(str(row.get("path") or ""))
    try:
        for f in _files(p):
            if f.is_file():  # (the path itself may be missing)
                st = f.stat()
                files.append((str(f.relative_to(p)) if p.is_dir() else f.name, st.st_size, st.st_mtime_ns))
    except OSError:
        files = [("unreadable", 0, 0)]
    fields = {k: row.get(k) for k in ("checkpoint_id", "kind", "path", "base_checkpoint_id", "base_model", "config_json",
                                      "data_versions_json", "metrics_json")}
    blob = json.dumps([fields, files, settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
