"""Which registered checkpoint is the current one, and which weights nothing reads any more.

The checkpoint registry is a Delta table upserted by checkpoint id, and a merge keeps no row order: after a
re-run with other training settings the newly trained checkpoint may sit before the one it replaces. "Latest"
is therefore the checkpoint whose files were written last, not the last row."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cowork_pipeline.lake import is_remote

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from cowork_pipeline.lake import Lake


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


def latest_trained(rows: list[dict[str, Any]], trained: Callable[[str], float] = trained_at) -> dict[str, Any] | None:
    """The row of the most recently trained checkpoint among ``rows`` (each with a ``path``; ``trained`` says when the
    files at a path were written, -1 when unknown); a tie or a checkpoint not found keeps table order (the later row
    wins)."""
    best, best_t = None, float("-inf")
    for r in rows:
        t = trained(str(r.get("path") or ""))
        if t >= best_t:
            best, best_t = r, t
    return best


def checkpoint_key(row: dict[str, Any], files: list[tuple[str, int, Any]] | None = None, **settings: Any) -> str:
    """Identifies the weights a registry row stands for, plus the settings an agent runs them with. A checkpoint id
    alone does not: training again with other settings writes new weights under the same id and path. So the key
    covers the row (config, data versions, metrics of that training) and the files at the path (name, size, mtime):
    a retrain, or a user's checkpoint replaced in place, gives another key. ``files`` stands for the listing where
    the files are not on this machine (an object store's manifest)."""
    import hashlib
    import json

    if files is None:
        files, p = [], Path(str(row.get("path") or ""))
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


def current_checkpoints(rows: list[dict[str, Any]], trained: Callable[[str], float] = trained_at) -> list[dict[str, Any]]:
    """The base and SFT checkpoints trained last, and the RL checkpoints grown from that SFT one: what the benchmark
    scores and RL starts from. A re-run with other settings leaves the earlier rows registered: they are history."""
    out: list[dict[str, Any]] = []
    for kind in ("base", "sft"):
        latest = latest_trained([r for r in rows if r.get("kind") == kind], trained)
        out += [latest] if latest else []
    sft = out[-1]["checkpoint_id"] if out and out[-1]["kind"] == "sft" else None
    rl = [r for r in rows if r.get("kind") == "rl" and (sft is None or r.get("base_checkpoint_id") == sft)]
    return out + sorted(rl, key=lambda r: str(r["checkpoint_id"]))


class UnknownCheckpoint(LookupError):
    """A name that is no registered checkpoint (or stands for several)."""


def find_checkpoint(rows: list[dict[str, Any]], ref: str, trained: Callable[[str], float] = trained_at) -> dict[str, Any]:
    """The registry row ``ref`` names: a checkpoint id, or the current checkpoint of a kind (what the benchmark
    scores): ``base``, ``sft``, ``rl`` (when one RL configuration was trained) or ``rl:<configuration>``."""
    for r in rows:
        if str(r.get("checkpoint_id")) == ref:
            return r
    current = current_checkpoints(rows, trained)
    kind, _, config = ref.partition(":")
    if kind in ("base", "sft", "rl") and (not config or kind == "rl"):
        mine = [r for r in current if r.get("kind") == kind and (not config or str(r["checkpoint_id"]).startswith(f"rl-{config}-"))]
        if len(mine) == 1:
            return mine[0]
        if mine:
            raise UnknownCheckpoint(f"{len(mine)} current {kind} checkpoints; name one: "
                                    + ", ".join(f"rl:{str(r['checkpoint_id']).split('-')[1]}" for r in mine))
        raise UnknownCheckpoint(f"no current {ref} checkpoint is registered"
                                + (f"; current: {', '.join(str(r['checkpoint_id']) for r in current)}" if current else ""))
    listed = ", ".join(str(r["checkpoint_id"]) for r in current) or "none"
    raise UnknownCheckpoint(f"no checkpoint {ref!r} is registered ({len(rows)} in the registry; current: {listed})")


# ------------------------------------------------------------------ retention
# Weights are the lake's largest files (a merged 8B checkpoint is ~16 GB) and every retrain on new demonstrations
# registers new ones beside the old: without retention a lake regenerated nightly grows by its checkpoints each night.


@dataclass(frozen=True)
class StaleFiles:
    """A directory of model files nothing reads any more: a registered checkpoint's weights or a table version's
    export (the Hugging Face dataset of a demonstrations version)."""

    kind: str  # "checkpoint" | "export"
    name: str  # the checkpoint id, or the export's folder name
    path: Path | str  # a local folder, or a folder in the object store (URI)
    bytes: int


@dataclass(frozen=True)
class ModelFolder:
    """A folder of model files, on this machine or in the object store: when its newest file was written, its size."""

    name: str
    path: str
    written: float
    bytes: int


def local_folders(root: Path | None) -> list[ModelFolder]:
    return [ModelFolder(d.name, str(d), trained_at(str(d)), _size(d)) for d in _folders(root)]


def checkpoints_in_use(rows: list[dict[str, Any]], named: Iterable[str] = (), trained: Callable[[str], float] = trained_at) -> set[str]:
    """Ids whose weights something still reads: the current checkpoints (:func:`current_checkpoints`), the ``named``
    ones (those a retained score names), and the checkpoints each of them was trained from, transitively."""
    base_of = {str(r["checkpoint_id"]): r.get("base_checkpoint_id") for r in rows}
    todo = [str(r["checkpoint_id"]) for r in current_checkpoints(rows, trained)] + sorted(named)
    keep: set[str] = set()
    while todo:
        ckpt = todo.pop()
        if ckpt in keep:
            continue
        keep.add(ckpt)
        if base_of.get(ckpt):
            todo.append(str(base_of[ckpt]))
    return keep


_EXPORT = re.compile(r"^(?P<table>[A-Za-z0-9_]+)_v(?P<version>\d+)$")


def stale_model_files(models_root: Path | list[ModelFolder] | None, registered: list[dict[str, Any]], in_use: set[str],
                      exports_root: Path | list[ModelFolder] | None, retained_versions: dict[str, set[int]],
                      written_before: float) -> list[StaleFiles]:
    """What :func:`delete_stale` may delete: the folders under ``models_root`` (or those listed: the store's) named
    after a registered checkpoint not ``in_use``, and the folders ``<table>_v<N>`` under ``exports_root`` (or listed)
    whose table version is not retained, when their newest file was written before ``written_before`` (epoch
    seconds; younger ones may belong to a run still writing). A folder no registry row names (a user's own, a
    training that failed its checks before registering) and an export of a table the lake does not know are left
    alone."""
    out: list[StaleFiles] = []
    ids = {str(r["checkpoint_id"]) for r in registered}

    def where(f: ModelFolder) -> Path | str:
        return f.path if is_remote(f.path) else Path(f.path)

    for f in _listed(models_root):
        if f.name in ids and f.name not in in_use and f.written < written_before:
            out.append(StaleFiles("checkpoint", f.name, where(f), f.bytes))
    for f in _listed(exports_root):
        m = _EXPORT.match(f.name)
        if m and m["table"] in retained_versions and int(m["version"]) not in retained_versions[m["table"]] \
                and f.written < written_before:
            out.append(StaleFiles("export", f.name, where(f), f.bytes))
    return out


def _listed(root: Path | list[ModelFolder] | None) -> list[ModelFolder]:
    return root if isinstance(root, list) else local_folders(root)


def stale_in_lake(lake: Lake, models_root: Path | list[ModelFolder], exports_root: Path | list[ModelFolder] | None, retain_hours: float,
                  retained_versions: dict[str, set[int]] | None = None, now: float | None = None) -> list[StaleFiles]:
    """:func:`stale_model_files` for a lake: the registered checkpoints are the rows of its checkpoint tables; in use
    are the current ones among the promoted rows, those the last write of a checkpoint table registered, and those
    that a retained version (``Lake.retained_versions``) of any other table names in a ``checkpoint_id`` column (a
    score keeps the weights it scored)."""
    import time

    from cowork_pipeline.lake import NotPromoted
    from cowork_pipeline.lineage import CHECKPOINT_TABLES

    retained = lake.retained_versions() if retained_versions is None else retained_versions
    registered: list[dict[str, Any]] = []
    promoted: list[dict[str, Any]] = []
    newest: set[str] = set()
    for table in CHECKPOINT_TABLES:
        if not lake.exists(table):
            continue
        rows = lake.read(table).to_dicts()
        registered += rows
        # the newest registrations stay whatever their files' times say (a copied or restored folder keeps old ones)
        last = next((h["run_id"] for h in lake.history(table) if h.get("run_id")), None)
        newest |= {str(r["checkpoint_id"]) for r in rows if last is not None and r.get("_run_id") == last}
        try:
            promoted += lake.read_promoted(table)[0].to_dicts()
        except NotPromoted:
            pass
    named: set[str] = set()
    for table, versions in sorted(retained.items()):
        if table in CHECKPOINT_TABLES or not lake.exists(table):
            continue
        for v in sorted(versions):
            # an unreadable version raises: deleting weights that a version no one could read names is not safe
            if "checkpoint_id" in lake.columns(table, v):
                named |= {str(c) for c in lake.read(table, version=v, columns=["checkpoint_id"])["checkpoint_id"].unique() if c}
    # judge "trained last" by the folders this vacuum would delete (a lake copied or moved keeps its rows' old paths)
    folders = _listed(models_root)
    by_name = {f.name: f for f in folders}
    promoted = [{**r, "path": by_name[str(r["checkpoint_id"])].path} if str(r["checkpoint_id"]) in by_name else r for r in promoted]
    written = {f.path: f.written for f in folders}
    in_use = checkpoints_in_use(promoted, named | newest, trained=lambda p: written[p] if p in written else trained_at(p))
    written_before = (time.time() if now is None else now) - retain_hours * 3600
    return stale_model_files(folders, registered, in_use, exports_root, retained, written_before)


def delete_stale(files: list[StaleFiles], storage_options: dict[str, str] | None = None) -> None:
    """Delete each folder, local or in the object store (one that is already gone is no error: two vacuums may race)."""
    import shutil

    from cowork_pipeline.training.model_store import delete_folder

    for f in files:
        if isinstance(f.path, str) and is_remote(f.path):
            delete_folder(f.path, storage_options)
            continue
        try:
            shutil.rmtree(f.path)
        except FileNotFoundError:
            pass


def _folders(root: Path | None) -> list[Path]:
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.is_symlink()) if root is not None and root.is_dir() else []


def _size(d: Path) -> int:
    return sum(f.stat().st_size for f in _files(d) if f.is_file())
