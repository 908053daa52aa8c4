"""Lake tests against real Delta tables in tmp dirs (no mocks)."""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from _concurrent import at_once

from cowork_pipeline.lake import (
    LINEAGE_COLUMNS,
    Lake,
    LakeError,
    Lineage,
    NotPromoted,
    PublishConflict,
    TableNotFound,
    Published,
)

LIN = Lineage(run_id="run-1", asset="environments", code_version="v1", upstream_versions={"b": 2, "a": 1})


def lin(run_id: str = "run-1", **upstream: int) -> Lineage:
    return Lineage(run_id=run_id, asset="environments", code_version="v1", upstream_versions=upstream)


@pytest.fixture()
def lake(tmp_path: Path) -> Lake:
    return Lake(str(tmp_path / "lake"))


def envs(ids: list[int], tag: str = "x") -> pl.DataFrame:
    return pl.DataFrame(
        {"env_id": [f"e{i}" for i in ids], "score": [float(i) for i in ids], "tag": [tag] * len(ids)}
    )


def sorted_data(df: pl.DataFrame) -> pl.DataFrame:
    return df.drop([c for c in LINEAGE_COLUMNS if c in df.columns]).sort("env_id")


# ----------------------------------------------------------------- basics
def test_round_trip_with_lineage_columns(lake: Lake) -> None:
    assert not lake.exists("envs") and lake.version("envs") is None
    v = lake.write("envs", envs([1, 2, 3]), lineage=LIN, key=["env_id"])
    assert v == 0 and lake.exists("envs") and lake.version("envs") == 0

    out = lake.read("envs")
    assert set(LINEAGE_COLUMNS) <= set(out.columns)
    assert_frame_equal(sorted_data(out), envs([1, 2, 3]), check_column_order=False)
    assert out["_run_id"].unique().to_list() == ["run-1"]
    assert out["_asset"].unique().to_list() == ["environments"]
    assert out["_code_version"].unique().to_list() == ["v1"]
    upstream = out["_upstream_versions"].unique().to_list()
    assert upstream == ['{"a": 1, "b": 2}']  # keys sorted
    assert json.loads(upstream[0]) == {"a": 1, "b": 2}

    # a frame read from one table and written to another gets fresh lineage, not stale copies
    down = Lineage.local("scored", upstream_versions={"envs": v})
    assert down.run_id.startswith("local-")
    lake.write("scored", out, lineage=down, key=["env_id"])
    scored = lake.read("scored")
    assert scored.columns.count("_run_id") == 1
    assert scored["_run_id"].unique().to_list() == [down.run_id]
    assert scored["_upstream_versions"].unique().to_list() == ['{"envs": 0}']

    assert lake.read("envs", columns=["env_id"]).columns == ["env_id"]
    with pytest.raises(LakeError, match="nope"):
        lake.read("envs", columns=["nope"])


def test_history_carries_commit_metadata(lake: Lake) -> None:
    lake.write("envs", envs([1]), lineage=lin("run-A", up=3), key=["env_id"])
    lake.write("envs", envs([2]), lineage=lin("run-B"), key=["env_id"])
    hist = lake.history("envs")
    assert [h["version"] for h in hist] == [1, 0]  # newest first
    assert [h["run_id"] for h in hist] == ["run-B", "run-A"]
    assert hist[0]["asset"] == "environments" and hist[0]["code_version"] == "v1"
    assert hist[0]["operation"] == "MERGE" and hist[1]["operation"] == "WRITE"
    assert hist[1]["upstream_versions"] == {"up": 3}
    assert hist[0]["timestamp"].endswith("+00:00")
    assert len(lake.history("envs", limit=1)) == 1


def test_merge_is_idempotent(lake: Lake) -> None:
    lake.write("envs", envs([1, 2, 3]), lineage=LIN, key=["env_id"])
    lake.write("envs", envs([1, 2, 3]), lineage=LIN, key=["env_id"])
    out = lake.read("envs")
    assert out.height == 3 and out["env_id"].n_unique() == 3
    # duplicate keys inside one batch collapse (last wins) instead of duplicating
    lake.write("envs", pl.concat([envs([4], "old"), envs([4], "new")]), lineage=LIN, key=["env_id"])
    out = lake.read("envs")
    assert out.height == 4 and out.filter(pl.col("env_id") == "e4")["tag"].to_list() == ["new"]


def test_merge_updates_by_key_and_time_travel(lake: Lake) -> None:
    v0 = lake.write("envs", envs([1, 2]), lineage=lin("r0"), key=["env_id"])
    v1 = lake.write("envs", envs([2, 3], tag="new"), lineage=lin("r1"), key=["env_id"])
    assert (v0, v1) == (0, 1)
    now = lake.read("envs").sort("env_id")
    assert now["env_id"].to_list() == ["e1", "e2", "e3"]
    assert now["tag"].to_list() == ["x", "new", "new"]
    assert now["_run_id"].to_list() == ["r0", "r1", "r1"]  # lineage follows the row's last writer

    assert_frame_equal(sorted_data(lake.read("envs", version=0)), envs([1, 2]), check_column_order=False)
    with pytest.raises(LakeError, match="no version 7"):
        lake.read("envs", version=7)


def test_composite_key_and_mixed_case_columns(lake: Lake) -> None:
    df = pl.DataFrame({"taskId": ["t", "t", "u"], "Seed": [1, 2, 1], "v": [1, 2, 3]})
    lake.write("runs", df, lineage=LIN, key=["taskId", "Seed"])
    lake.write("runs", df.with_columns(pl.col("v") * 10), lineage=LIN, key=["taskId", "Seed"])
    out = lake.read("runs").sort("taskId", "Seed")
    assert out["v"].to_list() == [10, 20, 30]


def test_append_overwrite_and_replace_where(lake: Lake) -> None:
    lake.write("log", envs([1, 2]), lineage=LIN, mode="append")
    lake.write("log", envs([2]), lineage=LIN, mode="append")
    assert lake.read("log").height == 3
    lake.write("log", envs([9]), lineage=LIN, mode="overwrite")
    assert lake.read("log")["env_id"].to_list() == ["e9"]
    lake.write("log", envs([1, 2], tag="a"), lineage=LIN, mode="append")
    lake.write("log", envs([5], tag="a"), lineage=LIN, mode="overwrite", replace_where="tag = 'a'")
    assert sorted(lake.read("log")["env_id"].to_list()) == ["e5", "e9"]


def test_write_argument_errors(lake: Lake) -> None:
    with pytest.raises(ValueError, match="key"):
        lake.write("envs", envs([1]), lineage=LIN)  # merge without key
    with pytest.raises(ValueError, match="replace_where"):
        lake.write("envs", envs([1]), lineage=LIN, mode="append", replace_where="tag = 'x'")
    with pytest.raises(LakeError, match="not in the dataframe"):
        lake.write("envs", envs([1]), lineage=LIN, key=["nope"])
    with pytest.raises(LakeError, match="nulls"):
        lake.write("envs", pl.DataFrame({"env_id": ["a", None]}), lineage=LIN, key=["env_id"])
    with pytest.raises(ValueError, match="invalid table name"):
        lake.uri("../escape")
    assert not lake.exists("envs")


def test_remote_uri_layout() -> None:
    lake = Lake("s3://bucket/prefix/", storage_options={"AWS_ENDPOINT_URL": "http://localhost:9000"})
    assert lake.uri("envs") == "s3://bucket/prefix/envs"
    assert lake.uri("eval/runs") == "s3://bucket/prefix/eval/runs"


# ------------------------------------------------------ schema and types
def test_empty_df_creates_table_with_schema(lake: Lake) -> None:
    empty = pl.DataFrame(
        schema={"env_id": pl.String, "score": pl.Float64, "meta": pl.Struct({"k": pl.Int64})}
    )
    assert lake.write("envs", empty, lineage=LIN, key=["env_id"]) == 0
    out = lake.read("envs")
    assert out.height == 0
    assert out.schema["score"] == pl.Float64 and out.schema["meta"] == pl.Struct({"k": pl.Int64})
    assert set(LINEAGE_COLUMNS) <= set(out.columns)
    # an empty write to an existing table is a no-op, not a new version
    assert lake.write("envs", empty, lineage=LIN, key=["env_id"]) == 0


def test_nested_columns_and_large_json_round_trip(lake: Lake) -> None:
    big = json.dumps({"files": {f"f{i}.py": "x = 1\n" * 50 for i in range(200)}})  # ~70 KB
    df = pl.DataFrame(
        {
            "env_id": ["e1", "e2"],
            "spec": [
                {"task": "fix bug", "tools": ["bash", "edit"], "limits": {"steps": 30}},
                {"task": "write doc", "tools": [], "limits": {"steps": 5}},
            ],
            "tags": [["a", "b"], []],
            "payload": [big, "{}"],
        }
    )
    lake.write("envs", df, lineage=LIN, key=["env_id"])
    out = lake.read("envs").drop(list(LINEAGE_COLUMNS)).sort("env_id")
    assert_frame_equal(out, df)
    assert json.loads(out["payload"][0]) == json.loads(big)


def test_schema_evolution_and_null_columns(lake: Lake) -> None:
    lake.write("envs", envs([1]), lineage=LIN, key=["env_id"])
    lake.write("envs", envs([2]).with_columns(pl.lit(True).alias("verified")), lineage=LIN, key=["env_id"])
    out = lake.read("envs").sort("env_id")
    assert out["verified"].to_list() == [None, True]
    # an all-null (polars Null-typed) column takes the table's type
    lake.write("envs", pl.DataFrame({"env_id": ["e3"], "score": [None]}), lineage=LIN, key=["env_id"])
    assert lake.read("envs").schema["score"] == pl.Float64


# --------------------------------------------------- write-audit-publish
def test_promote_and_read_promoted(lake: Lake) -> None:
    with pytest.raises(NotPromoted, match="does not exist"):
        lake.read_promoted("envs")
    v0 = lake.write("envs", envs([1, 2]), lineage=lin("r0"), key=["env_id"])
    assert lake.promoted_version("envs") is None
    with pytest.raises(NotPromoted, match="envs"):
        lake.read_promoted("envs")

    lake.promote("envs", v0, run_id="r0", checks={"unique_ids": True})
    lake.promote("envs", v0, run_id="r0", checks={"unique_ids": True})  # idempotent
    assert lake.promotions("envs").height == 1
    assert json.loads(lake.promotions("envs")["checks"][0]) == {"unique_ids": True}

    v1 = lake.write("envs", envs([2, 3], tag="new"), lineage=lin("r1"), key=["env_id"])
    data, version = lake.read_promoted("envs")  # v1 is written but not audited yet
    assert version == v0 == 0
    assert_frame_equal(data, lake.read("envs", version=v0))
    assert sorted(data["env_id"].to_list()) == ["e1", "e2"]
    assert set(data["tag"].to_list()) == {"x"}

    lake.promote("envs", v1, run_id="r1")
    data, version = lake.read_promoted("envs", columns=["env_id", "tag"])
    assert version == v1 and data.columns == ["env_id", "tag"] and data.height == 3

    lake.promote("envs", v0, run_id="rollback")  # promoting an older version is a rollback
    assert lake.promoted_version("envs") == v0
    assert lake.promotions("envs")["version"].to_list() == [0, 1, 0]

    with pytest.raises(LakeError, match="version 5"):
        lake.promote("envs", 5, run_id="r")
    with pytest.raises(TableNotFound, match="ghost"):
        lake.promote("ghost", 0, run_id="r")
    # promotions of one table never leak into another
    lake.write("other", envs([7]), lineage=LIN, key=["env_id"])
    assert lake.promoted_version("other") is None


def test_conditional_promotion_publishes_only_on_the_version_it_was_planned_on(lake: Lake) -> None:
    v0 = lake.write("envs", envs([1]), lineage=lin("r0"), key=["env_id"])
    with pytest.raises(PublishConflict, match=r"planned on published version 3, and version None"):
        lake.promote("envs", v0, run_id="r0", if_published=3)
    assert not lake.exists("_promotions") or lake.promotions("envs").height == 0  # nothing recorded
    lake.promote("envs", v0, run_id="r0", if_published=None)  # nothing published yet, as planned
    v1 = lake.write("envs", envs([2]), lineage=lin("r1"), key=["env_id"])
    v2 = lake.write("envs", envs([3]), lineage=lin("r2"), key=["env_id"])
    lake.promote("envs", v1, run_id="r1", if_published=v0)
    with pytest.raises(PublishConflict, match=rf"version {v2}: it was planned on published version {v0}, and version {v1}"):
        lake.promote("envs", v2, run_id="r2", if_published=v0)  # r1 published meanwhile
    assert lake.promoted_version("envs") == v1 and lake.promotions("envs").height == 2
    lake.write("other", envs([7]), lineage=LIN, key=["env_id"])
    lake.promote("other", 0, run_id="o", if_published=None)  # other tables' promotions are no conflict
    lake.promote("envs", v2, run_id="r2", if_published=v1)
    assert lake.promoted_version("envs") == v2


class _Busy(Lake):
    """A real lake on which another run publishes some other table right after each read of the promotion log, so
    that this lake's conditional promotion loses the race to commit next, ``times`` times in a row."""

    def __init__(self, root: str, times: int, **kwargs) -> None:
        super().__init__(root, backoff_s=0.0001, max_backoff_s=0.001, **kwargs)
        self.times, self.other = times, Lake(root)

    def _promotion_rows(self, dt, table):
        rows = super()._promotion_rows(dt, table)
        if table == "envs" and self.times:
            self.times -= 1
            self.other.promote("other", self.times % 2, run_id=f"other-{self.times}")  # a change each time
        return rows


def test_a_conditional_promotion_that_keeps_losing_the_race_retries_until_its_timeout(tmp_path: Path) -> None:
    """Each lost race is another run's commit (the lake progresses), so a promotion retries for a time, not a count of
    tries: one beaten 30 times in a row (a backfill's runs all publishing) still gets through; only a lake whose
    writers never let it commit gives up, after commit_timeout_s, naming the table."""
    root = str(tmp_path / "lake")
    plain = Lake(root)
    plain.write("other", envs([7]), lineage=LIN, key=["env_id"])
    plain.write("other", envs([8]), lineage=LIN, key=["env_id"])
    plain.promote("other", 0, run_id="other")
    busy = _Busy(root, times=30)
    v = busy.write("envs", envs([1]), lineage=LIN, key=["env_id"])
    busy.promote("envs", v, run_id="r", if_published=None)
    assert busy.times == 0 and busy.retries == 30 and plain.promoted_version("envs") == v
    assert plain.promotions("other").height == 31  # the other run's commits that beat it
    hopeless = _Busy(root, times=10**6, commit_timeout_s=0.5)
    v = hopeless.write("envs", envs([2]), lineage=LIN, key=["env_id"])
    with pytest.raises(LakeError, match=r"promotion to table '_promotions'.*still conflicted with concurrent writers after \d+ attempts in 0.5 s"):
        hopeless.promote("envs", v, run_id="r2", if_published=0)
    assert plain.promoted_version("envs") == 0 and plain.promotions("envs").height == 1  # nothing recorded
    with pytest.raises(ValueError, match="commit_timeout_s must be positive"):
        Lake(root, commit_timeout_s=0)


def test_until_published_runs_again_while_another_writer_publishes_first(lake: Lake) -> None:
    calls: list[int] = []
    quick = Lake(lake.root, backoff_s=0.0001, max_backoff_s=0.001)

    def op() -> str:
        calls.append(1)
        if len(calls) < 20:
            raise PublishConflict("another run published first")
        return "published"

    assert quick.until_published("envs", op) == "published" and len(calls) == 20 and quick.retries == 19
    impatient = Lake(lake.root, commit_timeout_s=0.05, backoff_s=0.0001, max_backoff_s=0.001)
    with pytest.raises(PublishConflict, match=r"publication to table 'envs'.*still conflicted.*attempts in 0.05 s: another"):
        impatient.until_published("envs", lambda: (_ for _ in ()).throw(PublishConflict("another run published first")))
    with pytest.raises(KeyError):  # anything else is the caller's own error, raised as is at once
        quick.until_published("envs", lambda: {}["missing"])
    assert quick.retries == 19


_LOG_ROW = st.tuples(st.integers(0, 9), st.sampled_from([None, "a", "b", "c"]), st.sampled_from([None, "cap", "cap", "split"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_LOG_ROW, max_size=30))
def test_replaying_the_promotion_log_on_columns_is_applying_each_promotion_in_turn(log: list) -> None:
    """Whole-table promotions, partition promotions and a change of partition column, in any order: the state read off
    the log's columns at once is the one reached by applying its promotions one by one."""
    folded = Published()
    for version, partition, column in log:
        folded = folded.apply(version, partition, column)
    frame = pl.DataFrame(log, schema={"version": pl.Int64, "partition": pl.String, "partition_column": pl.String}, orient="row")
    assert Published.replay(frame) == folded
    for as_of in sorted({v for v, _, _ in log}):  # what a reader of version as_of saw: the promotions up to it
        folded = Published()
        for version, partition, column in log:
            folded = folded.apply(version, partition, column) if version <= as_of else folded
        assert Published.replay(frame, as_of) == folded


def test_lineage_reads_the_promotion_log_as_read_promoted_does(lake: Lake) -> None:
    """After a change of partition column the old scheme's partitions are read at the switching version: lineage's
    "published as of" says so too (it kept the old partition's own version, which no reader got)."""
    from cowork_pipeline.lineage import _Tracer

    for cap in ("A", "B"):
        v = lake.write("envs", envs([1]).with_columns(cap=pl.lit(cap), kind=pl.lit("k")), lineage=LIN, mode="append")
        lake.promote("envs", v, run_id="r", partition=cap, partition_column="cap")
    v2 = lake.write("envs", envs([2]).with_columns(cap=pl.lit("C"), kind=pl.lit("x")), lineage=LIN, mode="append")
    lake.promote("envs", v2, run_id="r", partition="x", partition_column="kind")
    tracer = _Tracer(lake)
    for as_of in (None, 0, 1, 2):
        for part in ("A", "B", "x", None):
            assert tracer.published("envs", as_of=as_of, partition=part) == \
                Published.replay(lake.promotions("envs"), as_of).version(part)
    assert tracer.published("envs", partition="A") == lake.promoted_version("envs", "A") == 2
    assert tracer.published("envs", as_of=1, partition="A") == 0 and tracer.published("envs", as_of=1) == 1


def test_merge_onto_the_published_version_undoes_the_versions_after_it(lake: Lake) -> None:
    v0 = lake.write("envs", envs([1, 2]), lineage=lin("r0"), key=["env_id"])
    lake.promote("envs", v0, run_id="r0")
    lake.write("envs", envs([2, 9], tag="failed"), lineage=lin("bad"), key=["env_id"])  # never promoted
    v = lake.write("envs", envs([3]), lineage=lin("r2"), key=["env_id"], onto=v0)
    assert v == lake.version("envs") == 3  # a restore to v0 (2), then the merge (3)
    assert sorted_data(lake.read("envs")).equals(sorted_data(pl.concat([envs([1, 2]), envs([3])])))
    assert set(lake.read("envs")["_run_id"]) == {"r0", "r2"}  # rows written before keep their lineage
    assert lake.write("envs", envs([]), lineage=lin("r3"), key=["env_id"], onto=v0) == 4  # nothing to add: just undone
    assert sorted(lake.read("envs")["env_id"]) == ["e1", "e2"]
    assert lake.write("envs", envs([5]), lineage=lin("r4"), key=["env_id"], onto=None) == 6  # nothing published: no rows
    assert lake.read("envs")["env_id"].to_list() == ["e5"]
    assert lake.write("envs", envs([6]), lineage=lin("r5"), key=["env_id"], onto=6) == 7  # at it already: a merge only
    with pytest.raises(ValueError, match="onto is only valid with mode='merge'"):
        lake.write("envs", envs([1]), lineage=LIN, mode="append", onto=0)


def test_read_merge_publish_writers_never_drop_each_others_rows(lake: Lake) -> None:
    """Writers that read the published table, add their row and overwrite it (as benchmark_scores does) keep every
    row when each publishes conditionally and merges again on a conflict: all read the same version first, so all but
    one conflict at least once."""
    lake.write("scores", envs([0]), lineage=lin("seed"), mode="overwrite")
    lake.promote("scores", 0, run_id="seed")
    writers = 4
    first_read = threading.Barrier(writers)
    conflicts: list[int] = []

    def work(w: int) -> None:
        for attempt in range(20):
            published, v = lake.read_promoted("scores")
            if attempt == 0:
                first_read.wait()
            merged = pl.concat([published.drop(LINEAGE_COLUMNS), envs([w + 1])])
            written = lake.write("scores", merged, lineage=lin(f"w{w}"), mode="overwrite")
            try:
                lake.promote("scores", written, run_id=f"w{w}", if_published=v)
                return
            except PublishConflict:
                conflicts.append(w)
        raise AssertionError(f"writer {w} never published")

    at_once(work, [(w,) for w in range(writers)])
    assert sorted(lake.read_promoted("scores")[0]["env_id"].to_list()) == [f"e{i}" for i in range(writers + 1)]
    assert len(conflicts) >= writers - 1


def caps(cap: str, n: int, tag: str) -> pl.DataFrame:
    return pl.DataFrame({"cap": [cap] * n, "env_id": [f"{cap}{i}" for i in range(n)], "tag": [tag] * n})


def test_partitioned_promotion_never_leaks_a_failed_partition(lake: Lake) -> None:
    def write_part(df: pl.DataFrame, cap: str) -> int:
        return lake.write("envs", df, lineage=LIN, mode="overwrite", replace_where=f"cap = '{cap}'")

    a0 = write_part(caps("A", 2, "good"), "A")  # creates the table
    lake.promote("envs", a0, run_id="r", partition="A", partition_column="cap")
    b1 = write_part(caps("B", 3, "good"), "B")
    lake.promote("envs", b1, run_id="r", partition="B", partition_column="cap")
    write_part(caps("A", 5, "BAD"), "A")  # its checks fail: never promoted
    b3 = write_part(caps("B", 1, "good2"), "B")
    lake.promote("envs", b3, run_id="r", partition="B", partition_column="cap")
    lake.promote("envs", b3, run_id="r", partition="B", partition_column="cap")  # idempotent
    assert lake.promotions("envs").height == 3

    data, version = lake.read_promoted("envs")
    assert version == b3 == 3 and lake.promoted_version("envs") == 3
    assert sorted(zip(data["env_id"], data["tag"], strict=True)) == [
        ("A0", "good"),
        ("A1", "good"),
        ("B0", "good2"),
    ]
    data, _ = lake.read_promoted("envs", columns=["env_id"])  # filter column need not be selected
    assert sorted(data["env_id"]) == ["A0", "A1", "B0"]
    # an empty partition overwrite deletes that partition's rows
    b4 = write_part(caps("B", 0, "x"), "B")
    assert lake.read("envs", version=b4)["cap"].unique().to_list() == ["A"]

    # a whole-table promotion (or one naming only the partition value) publishes that version as is
    lake.promote("envs", 2, run_id="r", partition="A")
    data, version = lake.read_promoted("envs")
    assert version == 2 and sorted(data["tag"].unique()) == ["BAD", "good"]


_STEP = st.tuples(st.sampled_from(["replace", "replace", "replace", "merge", "append", "overwrite", "promote", "promote_all"]),
                  st.sampled_from(["A", "B", "C"]), st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=12))
@example([("replace", "A", 2), ("promote", "A", 0), ("replace", "A", 2)])  # published, then replaced again
@example([("replace", "A", 2), ("promote", "A", 0), ("replace", "B", 1), ("merge", "A", 1)])  # then merged into
def test_read_promoted_reads_each_partition_as_it_was_published(tmp_path_factory, steps: list) -> None:
    """Partition overwrites (and the odd merge, append or whole-table overwrite) with partition and whole-table
    promotions in any order: read_promoted gives each partition's rows as they were at its own published version,
    the rest as at the whole-table one, whichever version it actually reads them at."""
    lake = Lake(str(tmp_path_factory.mktemp("lake")))
    for i, (op, cap, n) in enumerate(steps):
        rows = caps(cap, n, f"s{i}")
        if op == "replace" or not lake.exists("envs"):
            lake.write("envs", rows, lineage=LIN, mode="overwrite", replace_where=f"cap = '{cap}'")
        elif op == "merge":
            lake.write("envs", rows, lineage=LIN, key=["env_id"])
        elif op == "append":
            lake.write("envs", caps(cap, n, f"s{i}").with_columns(pl.col("env_id") + f"-{i}"), lineage=LIN, mode="append")
        elif op == "overwrite":
            lake.write("envs", pl.concat([caps(c, n, f"s{i}") for c in "AB"]), lineage=LIN, mode="overwrite")
        elif op == "promote":
            lake.promote("envs", lake.version("envs") - n % 2 * (lake.version("envs") > 0), run_id="r", partition=cap, partition_column="cap")
        else:
            lake.promote("envs", lake.version("envs"), run_id="r")
    if lake.promoted_version("envs") is None:
        return
    state = Published.replay(lake.promotions("envs"))
    expected = [lake.read("envs", version=v).filter(pl.col("cap") == p) for p, v in state.parts.items()]
    if state.base is not None:
        expected.append(lake.read("envs", version=state.base).filter(~pl.col("cap").is_in(list(state.parts))))
    got, version = lake.read_promoted("envs")
    assert version == state.version()
    assert_frame_equal(sorted_data(got).sort("env_id", "tag"), sorted_data(pl.concat(expected)).sort("env_id", "tag"))
    # a filtered read (on the partition column, which also prunes the versions read, or on another) is the same
    # read filtered afterwards
    for where in ({"cap": ["A"]}, {"cap": ["B", "C"]}, {"cap": ["Z"]}, {"cap": []}, {"tag": [f"s{len(steps) - 1}"]},
                  {"cap": ["A", "C"], "tag": ["s0", "s1"]}):
        want = got.filter(pl.all_horizontal(pl.col(c).is_in(vals) for c, vals in where.items()))
        part, v = lake.read_promoted("envs", where=where)
        assert v == version
        assert_frame_equal(sorted_data(part).sort("env_id", "tag"), sorted_data(want).sort("env_id", "tag"), check_dtypes=False)
        latest = lake.read("envs")
        assert_frame_equal(lake.read("envs", where=where).sort("env_id", "tag"),
                           latest.filter(pl.all_horizontal(pl.col(c).is_in(vals) for c, vals in where.items())).sort("env_id", "tag"),
                           check_dtypes=False)


def test_a_backfills_partitions_are_read_at_the_latest_version_when_nothing_changed_them_since(lake: Lake) -> None:
    """Each partition published at its own version, and every later commit replaced another partition: all are read
    in one read of the latest version; a merge after a partition's version sends that one back to its own version."""
    for cap in "ABCD":
        v = lake.write("envs", caps(cap, 2, f"{cap}-published"), lineage=LIN, mode="overwrite", replace_where=f"cap = '{cap}'")
        lake.promote("envs", v, run_id="r", partition=cap, partition_column="cap")
    lake.write("envs", caps("A", 2, "A-unpublished"), lineage=LIN, mode="overwrite", replace_where="cap = 'A'")
    latest = lake.version("envs")
    assert lake._unchanged_since("envs", "cap", {c: lake.promoted_version("envs", c) for c in "ABCD"}) == (latest, set("BCD"))
    assert set(lake.read_promoted("envs")[0]["tag"]) == {f"{c}-published" for c in "ABCD"}
    lake.write("envs", caps("D", 1, "merged"), lineage=LIN, key=["env_id"])
    assert lake._unchanged_since("envs", "cap", {"C": 2, "D": 3}) == (latest + 1, set())
    assert set(lake.read_promoted("envs")[0]["tag"]) == {f"{c}-published" for c in "ABCD"}
    # another tool's commit with something else under the key: it may have changed anything, and breaks nothing
    from deltalake import CommitProperties, write_deltalake
    write_deltalake(lake.uri("envs"), caps("B", 1, "foreign").to_arrow(), mode="append", schema_mode="merge",
                    commit_properties=CommitProperties(custom_metadata={"replaces_partition": "{not json"}))
    assert lake._unchanged_since("envs", "cap", {"B": 1}) == (latest + 2, set())
    assert set(lake.read_promoted("envs")[0]["tag"]) == {f"{c}-published" for c in "ABCD"}


def test_concurrent_partition_overwrites_lose_nothing(lake: Lake) -> None:
    def work(cap: str) -> None:
        for round_ in range(4):
            df = caps(cap, 3, f"round{round_}")
            lake.write("envs", df, lineage=LIN, mode="overwrite", replace_where=f"cap = '{cap}'")

    at_once(work, [(c,) for c in "ABCD"])
    out = lake.read("envs")
    assert out.height == 12 and out["env_id"].n_unique() == 12
    assert out["tag"].unique().to_list() == ["round3"]  # each partition holds its last write only


# ------------------------------------------------------------ failures
def test_missing_table_raises_table_not_found(lake: Lake) -> None:
    with pytest.raises(TableNotFound, match="ghost"):
        lake.read("ghost")
    with pytest.raises(TableNotFound):
        lake.history("ghost")


def test_corrupt_log_raises_lake_error_naming_table(lake: Lake) -> None:
    lake.write("envs", envs([1]), lineage=LIN, key=["env_id"])
    lake.write("envs", envs([2]), lineage=LIN, key=["env_id"])
    Path(lake.uri("envs"), "_delta_log", "00000000000000000001.json").write_text("{garbage")
    with pytest.raises(LakeError, match=r"'envs'.*(corrupt|unreadable)") as info:
        lake.read("envs")
    assert not isinstance(info.value, TableNotFound)
    assert info.value.__cause__ is not None


def test_missing_data_file_raises_lake_error_naming_table(lake: Lake) -> None:
    lake.write("envs", envs([1, 2]), lineage=LIN, key=["env_id"])
    for f in glob.glob(os.path.join(lake.uri("envs"), "*.parquet")):
        os.remove(f)
    with pytest.raises(LakeError, match=r"'envs'.*(corrupt|unreadable)") as info:
        lake.read("envs")
    assert info.value.__cause__ is not None


# ---------------------------------------------------------- concurrency
def test_concurrent_threads_lose_nothing(lake: Lake) -> None:
    writers, writes = 4, 8
    versions: list[int] = []

    def work(w: int) -> None:  # all threads race to create the table at once
        for i in range(writes):
            versions.append(lake.write("envs", envs([w * 100 + i]), lineage=lin(f"t{w}"), key=["env_id"]))

    at_once(work, [(w,) for w in range(writers)])
    out = lake.read("envs")
    assert out.height == writers * writes and out["env_id"].n_unique() == writers * writes
    assert lake.version("envs") == writers * writes - 1  # one commit per write...
    assert sorted(versions) == list(range(writers * writes))  # ...and each write knows its own
    ops = [h["operation"] for h in lake.history("envs", limit=None)]
    assert ops.count("WRITE") == 1  # exactly one creator won; the others merged


def _process_writer(root: str, worker: int, writes: int) -> list[int]:
    # Module-level so the spawn start method can pickle it.
    lake = Lake(root)
    return [
        lake.write("envs", envs([worker * 1000 + i]), lineage=lin(f"p{worker}"), key=["env_id"])
        for i in range(writes)
    ]


def test_concurrent_processes_lose_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    # spawn, not fork: forking a process whose Rust/Arrow thread pools are live is unsafe.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        futures = [pool.submit(_process_writer, root, w, 10) for w in range(2)]
        versions = [v for f in futures for v in f.result()]
    assert len(set(versions)) == 20  # each write got its own commit version
    out = Lake(root).read("envs")
    assert out.height == 20 and out["env_id"].n_unique() == 20
    assert out.group_by("_run_id").len().sort("_run_id")["len"].to_list() == [10, 10]


# ----------------------------------------------------------------- vacuum
def test_vacuum_deletes_only_what_nothing_published_and_no_lineage_reads(lake: Lake, capsys) -> None:
    """specs v0..v3 (v3 never promoted), envs computed from specs v0 then v2, and a score still published that was
    computed from envs v0: vacuum keeps specs v0 (the score's lineage), v2 (published) and v3 (latest), drops v1."""
    for i in range(4):
        v = lake.write("specs", envs([i], f"s{i}"), lineage=lin(), mode="overwrite")
        if i < 3:
            lake.promote("specs", v, run_id="r")
    lake.promote("envs", lake.write("envs", envs([1], "e0"), lineage=lin(specs=0), mode="overwrite"), run_id="r")
    lake.promote("envs", lake.write("envs", envs([2], "e1"), lineage=lin(specs=2), mode="overwrite"), run_id="r")
    lake.write("envs", envs([3], "BAD"), lineage=lin(specs=2), mode="overwrite")  # its checks failed: latest, unpublished
    lake.promote("scores", lake.write("scores", envs([9], "x"), lineage=lin(envs=0), mode="overwrite"), run_id="r")
    before = {t: sorted_data(lake.read_promoted(t)[0]) for t in ("specs", "envs", "scores")}

    assert lake.retained_versions() == {"specs": {0, 2, 3}, "envs": {0, 1, 2}, "scores": {0}}
    dry = {v.table: v for v in lake.vacuum(0, dry_run=True)}
    assert len(dry["specs"].files) == 1 and dry["envs"].files == () and dry["scores"].files == ()
    assert lake.read("specs", version=1)["tag"].to_list() == ["s1"]  # a dry run deletes nothing

    done = {v.table: v for v in lake.vacuum(0)}
    assert done["specs"].files == dry["specs"].files and done["specs"].kept_versions == (0, 2, 3)
    with pytest.raises(LakeError, match="specs"):
        lake.read("specs", version=1)
    assert [lake.read("specs", version=v)["tag"][0] for v in (0, 2, 3)] == ["s0", "s2", "s3"]
    for t, df in before.items():  # what readers get is untouched, and writing goes on
        assert sorted_data(lake.read_promoted(t)[0]).equals(df)
    assert lake.vacuum(0)[0].files == ()  # idempotent
    lake.promote("specs", lake.write("specs", envs([5], "s5"), lineage=lin(), mode="overwrite"), run_id="r")
    assert lake.read_promoted("specs")[0]["tag"].to_list() == ["s5"]


def test_vacuum_keeps_each_partition_as_published_and_as_a_reader_saw_it(lake: Lake) -> None:
    def write_part(df: pl.DataFrame, cap: str) -> int:
        return lake.write("envs", df, lineage=LIN, mode="overwrite", replace_where=f"cap = '{cap}'")

    lake.promote("envs", write_part(caps("A", 2, "a0"), "A"), run_id="r", partition="A", partition_column="cap")  # v0
    lake.promote("envs", write_part(caps("B", 2, "b1"), "B"), run_id="r", partition="B", partition_column="cap")  # v1
    # a benchmark read the published envs (A@0, B@1) and recorded version 1
    lake.promote("scores", lake.write("scores", envs([1]), lineage=lin(envs=1), mode="overwrite"), run_id="r")
    write_part(caps("A", 3, "BAD"), "A")  # v2, v3: their checks failed, never promoted
    write_part(caps("A", 3, "BAD2"), "A")
    lake.promote("envs", write_part(caps("B", 1, "b4"), "B"), run_id="r", partition="B", partition_column="cap")  # v4
    write_part(caps("C", 1, "c5"), "C")  # v5: latest, never promoted
    before = sorted_data(lake.read_promoted("envs")[0].sort("env_id"))

    assert lake.retained_versions()["envs"] == {0, 1, 4, 5}
    assert len({v.table: v for v in lake.vacuum(0)}["envs"].files) == 1  # v2's rows of A, which v3 replaced
    with pytest.raises(LakeError):
        lake.read("envs", version=2)
    assert sorted(lake.read("envs", version=1)["tag"].unique()) == ["a0", "b1"]  # what the benchmark read
    after = lake.read_promoted("envs")[0]
    assert sorted_data(after.sort("env_id")).equals(before)
    assert sorted(zip(after["env_id"], after["tag"])) == [("A0", "a0"), ("A1", "a0"), ("B0", "b4")]
    # the vacuum's two commits change no data: B, which no later commit replaced, is still read at the latest version
    assert lake._unchanged_since("envs", "cap", {"A": 0, "B": 4}) == (7, {"B"})


def test_cowork_vacuum_command(lake: Lake, tmp_path: Path, capsys) -> None:
    from assets.cli import main

    for i in range(3):
        lake.promote("specs", lake.write("specs", envs([i]), lineage=lin(), mode="overwrite"), run_id="r")
    assert main(["vacuum", "--lake", lake.root, "--dry-run", "--retain-hours", "1"]) == 0
    out = capsys.readouterr().out
    assert "specs: would delete 0 files; versions kept readable: 2" in out  # removed less than an hour ago
    assert lake.read("specs", version=0)["env_id"].to_list() == ["e0"]
    assert main(["vacuum", "--lake", str(tmp_path / "nowhere")]) == 2
    assert "no lake at" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["vacuum", "--lake", lake.root, "--retain-hours", "0"])
    assert e.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_a_filtered_read_names_a_bad_filter_instead_of_reading_as_corrupt(lake: Lake) -> None:
    lake.write("envs", caps("A", 2, "t").with_columns(pl.lit(3).alias("n")), lineage=LIN, mode="append")
    lake.promote("envs", 0, run_id="r")
    assert lake.read("envs", where={"n": [3]}).height == 2 and lake.read("envs", where={"n": [4]}).height == 0
    for read in (lambda w: lake.read("envs", where=w), lambda w: lake.read_promoted("envs", where=w)):
        with pytest.raises(LakeError, match=r"has no column\(s\) \['capability'\]"):
            read({"capability": ["A"]})
        with pytest.raises(TypeError, match="lists of values"):
            read({"cap": "A"})  # a bare string would filter on its letters
        with pytest.raises(TypeError, match="string or an integer"):
            read({"cap": [None]})
    assert lake.read("envs", where={"cap": ["it's"]}).is_empty()  # quoted, not SQL
