"""Delta Lake storage for every pipeline artifact.

Each artifact is one Delta table ``<root>/<table>``. Every row carries lineage
columns (which run / asset / code version wrote it, which upstream versions it
was derived from) and every commit carries the same facts as custom commit
metadata, so ``history()`` answers "who wrote this version".

Write-audit-publish: writers commit a version, checks run against exactly that
version, and only then is it *promoted* (a row in the append-only
``_promotions`` table). Downstream consumers read the promoted version, never
"latest", so a half-checked write is never seen.

Note on reads: we read through deltalake's ``QueryBuilder`` (DataFusion, in
Rust) rather than ``DeltaTable.to_pyarrow_table()``: the pyarrow dataset path
leaves Arrow C++ worker threads alive and, on Linux, aborts most processes at
interpreter exit ("terminate called without an active exception",
delta-io/delta-rs#2184). QueryBuilder exits cleanly.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, TypeVar

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

__all__ = [
    "LINEAGE_COLUMNS",
    "PROMOTIONS_TABLE",
    "Lake",
    "LakeError",
    "Lineage",
    "NotPromoted",
    "Published",
    "TableNotFound",
    "Vacuumed",
]

LINEAGE_COLUMNS = ("_run_id", "_asset", "_code_version", "_upstream_versions")
PROMOTIONS_TABLE = "_promotions"

WriteMode = Literal["merge", "append", "overwrite"]
T = TypeVar("T")


def is_remote(root: str) -> bool:
    """Whether ``root`` is a URI (an object store: s3://, gs://, az://...), not a path on this machine."""
    return "://" in root


# Table names become path segments (and SQL string literals in _promotions
# queries), so keep them to a safe alphabet; "/" allows namespaces like "eval/runs".
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_][A-Za-z0-9_.\-]*)*$")
# Commit races surface as CommitFailedError, but a few (e.g. two writers
# creating the same table) can arrive as a plain DeltaError; match those by text.
_CONFLICT_TEXT = re.compile(
    r"concurrent|conflict|version \d+ already exists|already exists at|protocol changed|metadata changed",
    re.IGNORECASE,
)


class LakeError(Exception):
    """Any failure of the lake; the message names the table and its URI."""


class TableNotFound(LakeError):
    """The table has never been written."""


class NotPromoted(LakeError):
    """The table has no promoted version yet (write-audit-publish not completed)."""


class PublishConflict(LakeError):
    """A conditional promotion found another version published than the one it was planned on."""


ANY_PUBLISHED: Any = object()  # promote(..., if_published=ANY_PUBLISHED): publish whatever is published now


@dataclass(frozen=True)
class Lineage:
    run_id: str  # Dagster run id (or "local-..." outside Dagster)
    asset: str  # producing asset key, e.g. "validated_environments"
    code_version: str
    upstream_versions: dict[str, int] = field(default_factory=dict)  # {table: delta version read}

    @classmethod
    def local(
        cls, asset: str, code_version: str = "dev", upstream_versions: dict[str, int] | None = None
    ) -> Lineage:
        """Lineage for a write made outside Dagster (scripts, notebooks, tests)."""
        return cls(f"local-{uuid.uuid4().hex[:12]}", asset, code_version, dict(upstream_versions or {}))

    def upstream_json(self) -> str:
        # Sorted keys so equal lineage always serialises to the same string.
        return json.dumps({k: int(v) for k, v in self.upstream_versions.items()}, sort_keys=True)

    def commit_metadata(self) -> dict[str, str]:
        return {
            "run_id": self.run_id,
            "asset": self.asset,
            "code_version": self.code_version,
            "upstream_versions": self.upstream_json(),
        }


def _first_line(exc: BaseException) -> str:
    # delta-rs errors often append a multi-line Rust backtrace; keep messages readable.
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _quote_ident(name: str) -> str:
    # DataFusion lower-cases unquoted identifiers; quote so "envId" stays "envId".
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _is_conflict(exc: BaseException) -> bool:
    if isinstance(exc, CommitFailedError):
        return True
    return isinstance(exc, DeltaError) and bool(_CONFLICT_TEXT.search(str(exc)))


class Lake:
    """A set of Delta tables under one root (local folder or object-store URI).

    For concurrent writers on S3, pass storage options that make commits atomic
    (e.g. ``{"conditional_put": "etag"}`` on stores that support it, or a DynamoDB
    locking provider); local filesystems, GCS and Azure are atomic already.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        storage_options: dict[str, str] | None = None,
        *,
        commit_timeout_s: float = 300.0,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ) -> None:
        root = os.fspath(root)
        if not root:
            raise ValueError("Lake root must not be empty")
        self._is_remote = is_remote(root)
        self.root = root.rstrip("/") if self._is_remote else os.path.abspath(root)
        self.storage_options: dict[str, str] | None = dict(storage_options) if storage_options else None
        if commit_timeout_s <= 0:
            raise ValueError(f"commit_timeout_s must be positive, got {commit_timeout_s}")
        self.commit_timeout_s = commit_timeout_s
        self.retries = 0  # conflicts with other writers retried by this Lake (telemetry)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s

    def __repr__(self) -> str:
        return f"Lake({self.root!r})"

    # ------------------------------------------------------------------ paths
    def uri(self, table: str) -> str:
        if not _TABLE_NAME.match(table) or ".." in table.split("/"):
            raise ValueError(f"invalid table name {table!r}: use letters, digits, _ . - and / separators")
        return f"{self.root}/{table}" if self._is_remote else os.path.join(self.root, *table.split("/"))

    def _where(self, table: str) -> str:
        return f"table {table!r} ({self.uri(table)})"

    # -------------------------------------------------------------- metadata
    def _open(self, table: str, version: int | None = None) -> DeltaTable:
        """Open a table (reads the log only), translating errors into LakeError subclasses."""
        uri = self.uri(table)
        try:
            return DeltaTable(uri, version=version, storage_options=self.storage_options)
        except TableNotFoundError as exc:
            raise TableNotFound(f"{self._where(table)} does not exist") from exc
        except Exception as exc:
            if version is not None:
                latest = self._latest_or_none(table)
                if latest is not None and not 0 <= version <= latest:
                    raise LakeError(
                        f"{self._where(table)} has no version {version} (latest is {latest})"
                    ) from exc
            raise LakeError(
                f"{self._where(table)} is unreadable (corrupt or inaccessible): {_first_line(exc)}"
            ) from exc

    def _latest_or_none(self, table: str) -> int | None:
        try:
            return DeltaTable(self.uri(table), storage_options=self.storage_options).version()
        except Exception:
            return None

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options)

    def version(self, table: str) -> int | None:
        """Latest committed version, or None if the table does not exist."""
        try:
            return self._open(table).version()
        except TableNotFound:
            return None

    def history(self, table: str, limit: int | None = 20) -> list[dict[str, Any]]:
        """Commits newest first: version, timestamp (ISO-8601 UTC), operation,
        run_id / asset / code_version / upstream_versions (from our commit
        metadata; None for commits made by other tools) and operation metrics."""
        raw = self._raw_history(table, limit)
        out: list[dict[str, Any]] = []
        for c in raw:
            ts = c.get("timestamp")
            upstream = c.get("upstream_versions")
            out.append(
                {
                    "version": c.get("version"),
                    "timestamp": (
                        datetime.fromtimestamp(ts / 1000, tz=timezone.utc).isoformat()
                        if isinstance(ts, (int, float))
                        else None
                    ),
                    "operation": c.get("operation"),
                    "run_id": c.get("run_id"),
                    "asset": c.get("asset"),
                    "code_version": c.get("code_version"),
                    "upstream_versions": json.loads(upstream) if isinstance(upstream, str) else None,
                    "metrics": c.get("operationMetrics") or {},
                }
            )
        return out

    # ----------------------------------------------------------------- write
    def write(
        self,
        table: str,
        df: pl.DataFrame,
        *,
        lineage: Lineage,
        key: Sequence[str] | None = None,
        mode: WriteMode = "merge",
        partition_by: Sequence[str] | None = None,
        replace_where: str | None = None,
        onto: int | None = ANY_PUBLISHED,
    ) -> int:
        """Write ``df`` (plus lineage columns) and return the new Delta version.

        merge     -- upsert keyed by ``key``: existing keys updated, new keys inserted
                     (re-running the same write never duplicates rows). Duplicate keys
                     inside ``df`` are collapsed, last row wins.
        append    -- add rows.
        overwrite -- replace the table (schema included), or only the rows matching
                     ``replace_where`` (a SQL predicate all of ``df`` must satisfy).

        New columns are added to the table schema (schema evolution). ``partition_by``
        applies when the table is created. Commit conflicts with concurrent writers
        are retried with jittered backoff for up to ``commit_timeout_s``. An empty ``df`` still creates the table.

        ``onto`` (merge only: a version, or None for no rows) merges onto that version of
        the table, its published one, instead of the latest: versions written after it
        (rows that failed their checks, or a concurrent writer's not yet promoted) are
        undone first by a restore committed right before the merge, so publishing the
        result publishes only what was published plus ``df``.
        """
        if mode not in ("merge", "append", "overwrite"):
            raise ValueError(f"unknown write mode {mode!r}")
        keys = list(key or [])
        if mode == "merge" and not keys:
            raise ValueError(f"write to {table!r}: mode='merge' needs key=[...] (or use mode='append')")
        if replace_where is not None and mode != "overwrite":
            raise ValueError("replace_where is only valid with mode='overwrite'")
        rebase = onto is not ANY_PUBLISHED
        if rebase and mode != "merge":
            raise ValueError("onto is only valid with mode='merge'")
        uri = self.uri(table)
        missing = [k for k in [*keys, *(partition_by or [])] if k not in df.columns]
        if missing:
            raise LakeError(f"write to {self._where(table)}: column(s) {missing} not in the dataframe")
        if keys:
            nulls = [k for k in keys if df[k].null_count()]
            if nulls:
                # NULL never equals NULL in a merge predicate, so such rows would be
                # inserted again on every re-run: refuse rather than duplicate.
                raise LakeError(f"write to {self._where(table)}: key column(s) {nulls} contain nulls")
            if mode == "merge":
                df = df.unique(subset=keys, keep="last", maintain_order=True)

        df = _with_lineage(df, lineage)
        replaced = _replaced_partition(replace_where)
        # recorded so that read_promoted can tell which partitions a commit left as they were
        extra = {"replaces_partition": json.dumps(replaced)} if replaced else {}
        commit = CommitProperties(custom_metadata={**lineage.commit_metadata(), **extra})

        def attempt() -> int:
            try:
                dt: DeltaTable | None = DeltaTable(uri, storage_options=self.storage_options)
            except TableNotFoundError:
                dt = None
            data = _to_arrow(df, _target_schema(dt))
            if dt is None:
                # Creation must be exclusive: with mode="error" and no internal commit
                # retries, a writer that loses the race gets a conflict, backs off, and
                # then takes the existing-table path. (With retries on, delta-rs would
                # re-commit the losing "create" later, replacing the table metadata.)
                # The commit is located by a unique id rather than assumed to be 0.
                write_id = uuid.uuid4().hex
                write_deltalake(
                    uri,
                    data,
                    mode="error",
                    partition_by=list(partition_by) if partition_by else None,
                    storage_options=self.storage_options,
                    commit_properties=CommitProperties(
                        custom_metadata={**lineage.commit_metadata(), "write_id": write_id},
                        max_commit_retries=0,
                    ),
                )
                return self._find_commit(table, write_id)
            if rebase and dt.version() != onto:
                # Undo what was written after ``onto``; the merge must then commit right
                # after this restore (no retries by delta-rs, which would merge onto
                # whatever landed in between): a conflict comes back here to look again.
                undo = CommitProperties(custom_metadata={**lineage.commit_metadata(), "onto": str(onto)}, max_commit_retries=0)
                if onto is None:
                    dt.delete(commit_properties=undo)
                else:
                    dt.restore(onto, commit_properties=undo)
                data = _to_arrow(df, _target_schema(dt))
            if data.num_rows == 0 and mode != "overwrite":
                return dt.version()  # nothing to add; don't make an empty commit
            if mode == "merge":
                predicate = " AND ".join(f"t.{_quote_ident(k)} = s.{_quote_ident(k)}" for k in keys)
                (
                    dt.merge(
                        data,
                        predicate,
                        source_alias="s",
                        target_alias="t",
                        merge_schema=True,
                        commit_properties=CommitProperties(custom_metadata=lineage.commit_metadata(), max_commit_retries=0) if rebase else commit,
                    )
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute()
                )
            elif mode == "append":
                write_deltalake(
                    dt,  # passing the object (not the URI) leaves dt at our commit's version
                    data,
                    mode="append",
                    schema_mode="merge",
                    storage_options=self.storage_options,
                    commit_properties=commit,
                )
            else:
                full = replace_where is None
                write_deltalake(
                    dt,
                    data,
                    mode="overwrite",
                    predicate=replace_where,
                    # A full overwrite replaces the schema too; a partial one must fit it.
                    schema_mode="overwrite" if full else "merge",
                    partition_by=list(partition_by) if (partition_by and full) else None,
                    storage_options=self.storage_options,
                    commit_properties=commit,
                )
            return dt.version()

        return self._with_retry(table, f"{mode} write", attempt)

    def _raw_history(self, table: str, limit: int | None, since: int | None = None) -> list[dict[str, Any]]:
        """DeltaTable.history() with trustworthy version numbers (with ``since``: the commits after that version,
        at least one, read from the same open table).

        delta-rs lists every commit on storage but numbers them down from the
        snapshot's version, so a commit landing meanwhile shifts all numbers
        (delta-io/delta-rs#4488). Accept a listing only if the table did not move.
        """
        dt = self._open(table)
        for _ in range(10):
            before = dt.version()
            try:
                raw = dt.history(max(1, before - since) if since is not None else limit)
                dt.update_incremental()
            except Exception as exc:
                raise LakeError(f"{self._where(table)} history is unreadable: {_first_line(exc)}") from exc
            if dt.version() == before:
                return raw
        raise LakeError(f"{self._where(table)} history kept changing under concurrent writes; try again")

    def _find_commit(self, table: str, write_id: str) -> int:
        for limit in (8, None):  # the commit is almost always among the newest few
            for c in self._raw_history(table, limit):
                if c.get("write_id") == write_id:
                    return int(c["version"])
        raise LakeError(f"{self._where(table)}: committed write {write_id} missing from history")

    def _with_retry(
        self, table: str, what: str, op: Callable[[], T], again: Callable[[BaseException], bool] = _is_conflict,
        wrap: bool = True,
    ) -> T:
        # A conflict means another writer committed, so the lake as a whole progresses however many
        # writers contend (a backfill's runs all promoting at once): retry for a time, not a count of tries,
        # so that a writer that loses many rounds in a row still gets through.
        deadline = time.monotonic() + self.commit_timeout_s
        n = 0
        while True:
            n += 1
            try:
                return op()
            except Exception as exc:
                if not again(exc):
                    if isinstance(exc, LakeError) or not wrap:
                        raise
                    raise LakeError(f"{what} to {self._where(table)} failed: {_first_line(exc)}") from exc
                pause = random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** min(n, 30)))
                if time.monotonic() + pause > deadline:
                    kind = PublishConflict if isinstance(exc, PublishConflict) else LakeError
                    raise kind(
                        f"{what} to {self._where(table)} still conflicted with concurrent "
                        f"writers after {n} attempts in {self.commit_timeout_s:g} s: {_first_line(exc)}"
                    ) from exc
                # Full jitter keeps two colliding writers from colliding again.
                self.retries += 1
                time.sleep(pause)

    def until_published(self, table: str, op: Callable[[], T]) -> T:
        """Run ``op`` again while it raises PublishConflict, with the backoff and the
        ``commit_timeout_s`` of commit conflicts: ``op`` reads what is published, writes
        on it and promotes with ``if_published``, and another writer publishing first
        only means reading and writing again."""
        return self._with_retry(table, "publication", op, lambda exc: isinstance(exc, PublishConflict), wrap=False)

    # ------------------------------------------------------------------ read
    def read(
        self, table: str, version: int | None = None, columns: Sequence[str] | None = None,
        where: Mapping[str, Sequence[str | int]] | None = None,
    ) -> pl.DataFrame:
        """The table (optionally at ``version``, optionally only ``columns``, optionally only the rows whose
        column holds one of the values ``where`` gives it, filtered in the scan)."""
        return self._select(table, version, columns, _in_predicate(where), filtered=list(where or ()))

    def columns(self, table: str, version: int | None = None) -> list[str]:
        """The table's column names (at ``version``), from its schema: no data is read."""
        return list(self._open(table, version).schema().to_arrow().names)

    def _select(
        self, table: str, version: int | None, columns: Sequence[str] | None, where: str = "",
        filtered: Sequence[str] = (),
    ) -> pl.DataFrame:
        """``columns`` of the rows ``where`` keeps; ``filtered``: the columns ``where`` names, checked as ``columns``
        are (else an unknown one reads as a corrupt table)."""
        dt = self._open(table, version)
        select = "*"
        if columns is not None or filtered:
            known = set(dt.schema().to_arrow().names)
            unknown = [c for c in dict.fromkeys([*(columns or ()), *filtered]) if c not in known]
            if unknown:
                at = "" if version is None else f" at version {version}"
                raise LakeError(f"{self._where(table)}{at} has no column(s) {unknown}")
        if columns is not None:
            if not columns:
                return pl.DataFrame()
            select = ", ".join(_quote_ident(c) for c in columns)
        try:
            return _query(dt, f"SELECT {select} FROM t{' WHERE ' + where if where else ''}")
        except Exception as exc:
            at = "" if version is None else f" at version {version}"
            raise LakeError(
                f"{self._where(table)}{at} is unreadable (corrupt or inaccessible): {_first_line(exc)}"
            ) from exc

    # ------------------------------------------------------ write-audit-publish
    def promote(
        self,
        table: str,
        version: int,
        *,
        run_id: str,
        checks: dict[str, bool] | None = None,
        partition: str | None = None,
        partition_column: str | None = None,
        if_published: int | None = ANY_PUBLISHED,
    ) -> None:
        """Publish ``version`` of ``table`` to downstream readers.

        Call only after the blocking checks on that version passed; ``checks``
        (check name -> passed) is recorded for audit. Promoting what is already
        published is a no-op; promoting an older version is a rollback.

        Partitioned write-audit-publish: with ``partition_column`` and ``partition``
        (e.g. "capability_id", "crm_invoices"), only that partition's rows at
        ``version`` are published; other partitions stay at their own promoted
        versions, so a partition whose checks failed never leaks into readers via
        a later version promoted for another partition. ``partition`` alone is
        recorded for audit but publishes the whole table at ``version``.

        ``if_published`` (a version, or None for "nothing yet") makes it a compare-and-set:
        ``version`` is published only while the table's published version (a partition's,
        with ``partition_column``) is that one, else
        PublishConflict and nothing is recorded. A writer that read the published rows, merged
        its own in and wrote the result uses it so that it never drops what another writer
        published meanwhile: on a conflict it reads again and merges again.
        """
        if partition_column is not None and partition is None:
            raise ValueError("partition_column needs partition (the partition's value)")
        latest = self.version(table)
        if latest is None:
            raise TableNotFound(f"cannot promote: {self._where(table)} does not exist")
        if not 0 <= version <= latest:
            raise LakeError(f"cannot promote {self._where(table)} version {version}: latest is {latest}")
        row = pl.DataFrame(
            {
                "table": [table],
                "version": [version],
                "run_id": [run_id],
                "promoted_at": [datetime.now(timezone.utc)],
                "checks": [json.dumps({k: bool(v) for k, v in (checks or {}).items()}, sort_keys=True)],
                "partition": [partition],
                "partition_column": [partition_column],
            },
            schema=_PROMOTIONS_SCHEMA,
        )
        uri = self.uri(PROMOTIONS_TABLE)
        target = f"{table}@{version}" + (f" [{partition}]" if partition is not None else "")
        metadata = {"run_id": run_id, "asset": "promote", "promoted": target}

        conditional = if_published is not ANY_PUBLISHED

        def attempt() -> None:
            # Append-only: appends never conflict with each other (delta-rs retries
            # them itself); creation is exclusive, as in write(), and retried by us.
            # A conditional append is checked against the log it commits after and
            # must commit right after it (no retries by delta-rs, which would not
            # check again): a conflict comes back here to check the new log.
            try:
                log: DeltaTable | None = DeltaTable(uri, storage_options=self.storage_options)
            except TableNotFoundError:
                log = None
            # one read of the log decides both whether anything changes and, conditional, whether it may
            state = Published.replay(self._promotion_rows(log, table)) if log is not None else Published()
            if state.apply(version, partition, partition_column) == state:
                return  # already published exactly like this: idempotent
            if conditional:
                now = state.version(partition if partition_column is not None else None)
                if now != if_published:
                    raise PublishConflict(
                        f"cannot promote {self._where(table)} version {version}: it was planned on "
                        f"published version {if_published}, and version {now} is published now"
                    )
            write_deltalake(
                uri if log is None else log,
                row.to_arrow(),
                mode="error" if log is None else "append",
                # Many tiny commits: checkpoint often so opening the log stays fast.
                configuration={"delta.checkpointInterval": "10"} if log is None else None,
                storage_options=self.storage_options,
                commit_properties=CommitProperties(
                    custom_metadata=metadata, max_commit_retries=0 if log is None or conditional else None
                ),
            )

        self._with_retry(PROMOTIONS_TABLE, "promotion", attempt)
        self._compact_promotions_now_and_then()

    def _compact_promotions_now_and_then(self, every: int = 25) -> None:
        # Each promotion appends one tiny file; compact periodically so reading the
        # log stays one or two files, not thousands (which hurts on object stores).
        try:
            dt = DeltaTable(self.uri(PROMOTIONS_TABLE), storage_options=self.storage_options)
            if dt.version() > 0 and dt.version() % every == 0:
                dt.optimize.compact()
        except Exception:  # best effort: a failed compaction loses nothing
            pass

    def promotions(self, table: str | None = None) -> pl.DataFrame:
        """The promotion log (oldest first), optionally for one table."""
        if not self.exists(PROMOTIONS_TABLE):
            return pl.DataFrame(schema=_PROMOTIONS_SCHEMA)
        return self._promotion_rows(self._open(PROMOTIONS_TABLE), table)

    def _promotion_rows(self, dt: DeltaTable, table: str | None) -> pl.DataFrame:
        where = "" if table is None else f' WHERE "table" = {_quote_literal(table)}'
        try:
            # promoted_at orders promotions; version breaks exact-microsecond ties.
            return _query(dt, f'SELECT * FROM t{where} ORDER BY promoted_at, "version"')
        except Exception as exc:
            raise LakeError(
                f"{self._where(PROMOTIONS_TABLE)} is unreadable (corrupt or inaccessible): {_first_line(exc)}"
            ) from exc

    def promoted_version(self, table: str, partition: str | None = None) -> int | None:
        """The published version: that of the latest promotion, or with partitioned
        promotions the newest version any published partition is read at; with
        ``partition``, the version that partition's rows are read at."""
        return Published.replay(self.promotions(table)).version(partition)

    def read_promoted(
        self, table: str, columns: Sequence[str] | None = None, where: Mapping[str, Sequence[str | int]] | None = None
    ) -> tuple[pl.DataFrame, int]:
        """(published data, its version): exactly the promoted version's rows, or with
        partitioned promotions each partition's rows at its own promoted version.

        ``where`` (column -> values) keeps only the rows whose column holds one of the values, filtered in the
        scan; on the promotions' partition column it also skips the other partitions' versions (one capability
        of a large lake reads only that capability's files)."""
        state = Published.replay(self.promotions(table))
        published = state.version()
        if published is None:
            status = "exists but" if self.exists(table) else "does not exist and"
            raise NotPromoted(f"{self._where(table)} {status} has no promoted version")
        only, filtered = _in_predicate(where), list(where or ())
        if not state.parts:
            return self._select(table, published, columns, only, filtered=filtered), published

        col = _quote_ident(state.column())
        wanted = set(where[state.column()]) if where and state.column() in where else None
        parts = {value: v for value, v in state.parts.items() if wanted is None or value in wanted}
        # a partition no later commit can have changed is read at the latest version, all such in one read: a
        # backfill publishes each partition at its own version, and opening the table at each costs ~15 ms
        latest, unchanged = self._unchanged_since(table, state.column(), parts) if parts else (published, set())
        by_version: dict[int, list[str]] = {}
        for value, v in parts.items():
            by_version.setdefault(latest if value in unchanged else v, []).append(value)
        frames = [
            self._select(table, v, columns, _both(_in_predicate({state.column(): values}), only), filtered=filtered)
            for v, values in sorted(by_version.items())
        ]
        if state.base is not None and (wanted is None or wanted - set(state.parts)):  # partitions not promoted on their own
            others = ", ".join(map(_quote_literal, sorted(state.parts)))
            frames.append(
                self._select(table, state.base, columns, _both(f"({col} NOT IN ({others}) OR {col} IS NULL)", only),
                             filtered=filtered)
            )
        if not frames:  # none of the wanted partitions is published: no rows, the published version's columns
            return self._select(table, published, columns, "FALSE", filtered=filtered), published
        # Versions may differ in schema (evolution): align columns, null-fill the gaps.
        return pl.concat(frames, how="diagonal_relaxed"), published

    # ------------------------------------------------------------ maintenance
    def retained_versions(self) -> dict[str, set[int]]:
        """Per published table, the versions something still reads: its latest, the versions the promotion log
        publishes (each partition's), and every version the rows of a retained version were computed from (their
        ``_upstream_versions``, with the partitions published as of it), transitively. So today's data, and the
        lineage of every row in it back to the capability specs, stay readable after :meth:`vacuum`."""
        log = self.promotions()
        by_table = {t: log.filter(pl.col("table") == t) for t in sorted(set(log["table"].to_list()))}

        def published(table: str, as_of: int | None = None) -> set[int]:
            rows = by_table.get(table)
            if rows is None:
                return set()
            state = Published.replay(rows, as_of)
            return {v for v in (state.base, *state.parts.values()) if v is not None}

        todo: list[tuple[str, int]] = []
        for table in by_table:
            latest = self._latest_or_none(table)
            todo += [(table, v) for v in published(table) | ({latest} if latest is not None else set())]
        keep: dict[str, set[int]] = {}
        while todo:
            table, version = todo.pop()
            if version in keep.setdefault(table, set()):
                continue
            keep[table].add(version)
            for upstream, v in self._upstreams(table, version):
                todo += [(upstream, v), *((upstream, p) for p in published(upstream, as_of=v))]
        return keep

    def _upstreams(self, table: str, version: int) -> set[tuple[str, int]]:
        """The (table, version) pairs the rows of ``table`` at ``version`` name as what they were computed from."""
        try:
            df = self._select(table, version, ["_upstream_versions"])
        except LakeError:  # no lineage column (a table written by other means), or a version already gone
            return set()
        out: set[tuple[str, int]] = set()
        for text in df["_upstream_versions"].unique().to_list():
            try:
                ups = json.loads(text or "{}")
            except ValueError:
                continue
            out |= {(t, int(v)) for t, v in ups.items() if isinstance(t, str) and isinstance(v, int)} if isinstance(ups, dict) else set()
        return out

    def vacuum(self, retain_hours: int = 168, *, dry_run: bool = False,
               retained: dict[str, set[int]] | None = None) -> list[Vacuumed]:
        """Delete the files of every published table that no retained version (:meth:`retained_versions`, or
        ``retained`` when the caller computed them already) reads and that were removed from the table more than
        ``retain_hours`` ago. Reading an older version (time travel, the lineage of an id a later write replaced)
        then fails, for the versions it deleted only. A run writing at the same time keeps its files for
        ``retain_hours`` (keep it above the longest run)."""
        if retain_hours < 0:
            raise ValueError(f"retain_hours must be >= 0, got {retain_hours}")
        keep = {t: set(v) for t, v in (self.retained_versions() if retained is None else retained).items()}
        if self.exists(PROMOTIONS_TABLE):
            keep[PROMOTIONS_TABLE] = {self._open(PROMOTIONS_TABLE).version()}
        out = []
        for table in sorted(keep):
            if not self.exists(table):
                continue
            try:
                files = self._open(table).vacuum(retention_hours=retain_hours, dry_run=dry_run, enforce_retention_duration=False,
                                                 keep_versions=sorted(keep[table]))
            except Exception as exc:
                raise LakeError(f"{self._where(table)} could not be vacuumed: {_first_line(exc)}") from exc
            out.append(Vacuumed(table, tuple(sorted(keep[table])), tuple(sorted(files)), dry_run))
        return out

    def _unchanged_since(self, table: str, column: str, parts: dict[str, int]) -> tuple[int, set[str]]:
        """(a version L, the partitions of ``column`` whose rows at L are those at their version in ``parts``):
        those that every commit after their version replaced another partition of ``column`` alone, by the
        commits' own record (any other commit may have changed every partition)."""
        oldest = min(parts.values())
        history = self._raw_history(table, None, since=oldest)
        commits = {int(c["version"]): c for c in history if int(c["version"]) > oldest}
        latest = max(commits, default=oldest)
        if sorted(commits) != list(range(oldest + 1, latest + 1)):
            return oldest, set()  # a gap in the listing: trust nothing
        everything_since, since = -1, {}  # the last commit that may have changed every partition, or one of them
        for version, commit in commits.items():
            if commit.get("operation") in _NO_DATA_CHANGE:
                continue
            try:
                replaced = json.loads(commit.get("replaces_partition") or "null")
            except (TypeError, ValueError):  # another tool's metadata under our key: it may have changed anything
                replaced = None
            if isinstance(replaced, list) and len(replaced) == 2 and replaced[0] == column and isinstance(replaced[1], str):
                since[replaced[1]] = max(since.get(replaced[1], -1), version)
            else:
                everything_since = max(everything_since, version)
        return latest, {p for p, v in parts.items() if v >= everything_since and since.get(p, -1) <= v}


def _in_predicate(where: Mapping[str, Sequence[str | int]] | None) -> str:
    """SQL keeping the rows whose column holds one of the given values (an empty list keeps none)."""
    def literal(v: object) -> str:
        if isinstance(v, str):
            return _quote_literal(v)
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        raise TypeError(f"a filter value must be a string or an integer, got {v!r}")

    if not isinstance(where or {}, Mapping) or any(isinstance(v, (str, bytes)) for v in (where or {}).values()):
        raise TypeError(f"where must map column names to lists of values, got {where!r}")
    return " AND ".join(f"{_quote_ident(c)} IN ({', '.join(sorted(map(literal, vals)))})" if vals else "FALSE"
                        for c, vals in sorted((where or {}).items()))


def _both(a: str, b: str) -> str:
    return f"({a}) AND ({b})" if a and b else a or b


_NO_DATA_CHANGE = ("VACUUM START", "VACUUM END")  # commits that remove unreferenced files only


@dataclass(frozen=True)
class Vacuumed:
    """What :meth:`Lake.vacuum` did to one table: the versions it kept readable and the files it deleted (or,
    in a dry run, would delete)."""

    table: str
    kept_versions: tuple[int, ...]
    files: tuple[str, ...]
    dry_run: bool


_PROMOTIONS_SCHEMA = pl.Schema(
    [
        ("table", pl.String()),
        ("version", pl.Int64()),
        ("run_id", pl.String()),
        ("promoted_at", pl.Datetime("us", "UTC")),
        ("checks", pl.String()),  # JSON {check name: passed}
        ("partition", pl.String()),  # null: whole-table promotion
        ("partition_column", pl.String()),
    ]
)


@dataclass(frozen=True)
class Published:
    """What a table's promotion log publishes (the one reading of it: ``read_promoted``, vacuum's retention and
    lineage's "published as of" all replay it here): a whole-table version (``base``) and
    per-partition versions (``parts``) that override it for their partition."""

    base: int | None = None
    partition_column: str | None = None
    parts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def replay(cls, log: pl.DataFrame, as_of: int | None = None) -> Published:
        """The state after applying every row of ``log`` (oldest first) in turn, computed on the columns
        (a long-lived lake's log has a row per publication: a fold in Python took 0.3 s per 170,000). With
        ``as_of``, what a reader that read version ``as_of`` saw: the promotions of versions up to it only."""
        if not log.is_empty() and as_of is not None:
            log = log.filter(pl.col("version") <= as_of)
        if log.is_empty():
            return cls()
        rows = log.select("version", "partition", "partition_column").with_row_index("i")
        whole = rows.filter(pl.col("partition").is_null() | pl.col("partition_column").is_null())["i"]
        last_whole = int(whole.max()) if len(whole) else -1  # type: ignore[arg-type]
        tail = rows.filter(pl.col("i") > last_whole)  # partition promotions only, after the last whole-table one
        # a partition promotion under another partition column than the one before it starts afresh (see apply)
        changed = tail.filter(pl.col("partition_column") != pl.col("partition_column").shift(1))["i"]
        start = int(changed.max()) if len(changed) else last_whole  # type: ignore[arg-type]
        base = None if start < 0 else int(rows["version"][start])
        if tail.is_empty():
            return cls(base=base)
        parts = tail.filter(pl.col("i") >= start).group_by("partition").agg(pl.col("version").sort_by("i").last())
        return cls(base, tail["partition_column"][-1], dict(zip(parts["partition"].to_list(), parts["version"].to_list())))

    def apply(self, version: int, partition: str | None, column: str | None) -> Published:
        if column is None or partition is None:
            return Published(base=version)  # a whole-table promotion supersedes partitions
        if self.partition_column not in (None, column):
            # The partition scheme changed; partitions of the old scheme can't be
            # combined with the new one, so publish the table as of this version.
            return Published(base=version, partition_column=column, parts={partition: version})
        return Published(self.base, column, {**self.parts, partition: version})

    def version(self, partition: str | None = None) -> int | None:
        if partition is not None:  # the version that partition's rows are read at
            return self.parts.get(partition, self.base)
        versions = [*self.parts.values(), *([] if self.base is None else [self.base])]
        return max(versions) if versions else None

    def column(self) -> str:
        assert self.partition_column is not None
        return self.partition_column


# ---------------------------------------------------------------- helpers
def _with_lineage(df: pl.DataFrame, lineage: Lineage) -> pl.DataFrame:
    # Replace (not duplicate) lineage columns that came along from an upstream read.
    return df.drop([c for c in LINEAGE_COLUMNS if c in df.columns]).with_columns(
        pl.lit(lineage.run_id, dtype=pl.String).alias("_run_id"),
        pl.lit(lineage.asset, dtype=pl.String).alias("_asset"),
        pl.lit(lineage.code_version, dtype=pl.String).alias("_code_version"),
        pl.lit(lineage.upstream_json(), dtype=pl.String).alias("_upstream_versions"),
    )


_PARTITION_PREDICATE = re.compile(r"""\s*("?)([A-Za-z_][A-Za-z0-9_]*)\1\s*=\s*'((?:[^']|'')*)'\s*""")


def _replaced_partition(replace_where: str | None) -> list[str] | None:
    """[column, value] when ``replace_where`` is ``column = 'value'``: the one partition an overwrite replaces."""
    m = _PARTITION_PREDICATE.fullmatch(replace_where or "")
    return [m.group(2), m.group(3).replace("''", "'")] if m else None


def _target_schema(dt: DeltaTable | None) -> pl.Schema | None:
    if dt is None:
        return None
    return pl.DataFrame(pa.schema(dt.schema().to_arrow()).empty_table()).schema


def _to_arrow(df: pl.DataFrame, target: pl.Schema | None) -> pa.Table:
    # All-null columns have polars type Null, which Delta can't store portably:
    # give them the table's existing type, or String for a brand-new column.
    nulls = [c for c, t in df.schema.items() if t == pl.Null]
    if nulls:
        df = df.with_columns(
            pl.col(c).cast(target[c] if target is not None and c in target else pl.String) for c in nulls
        )
    return df.to_arrow()


def _query(dt: DeltaTable, sql: str) -> pl.DataFrame:
    reader = QueryBuilder().register("t", dt).execute(sql)
    return pl.DataFrame(reader.read_all())
