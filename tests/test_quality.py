"""Quality suites through real Great Expectations (no mocks)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from cowork_pipeline.quality import Expect, SuiteResult, validate

UNIQUE_ID = Expect("ExpectColumnValuesToBeUnique", {"column": "env_id"}, "Environment ids are unique.")
STATUS_IN_SET = Expect("ExpectColumnValuesToBeInSet", {"column": "status", "value_set": ["ok", "retry"]})
SCORE_RANGE = Expect("ExpectColumnValuesToBeBetween", {"column": "score", "min_value": 0, "max_value": 1})
HAS_ROWS = Expect("ExpectTableRowCountToBeBetween", {"min_value": 1})


def frame(**overrides: list) -> pl.DataFrame:
    data: dict[str, list] = {
        "env_id": ["e1", "e2", "e3", "e4"],
        "status": ["ok", "ok", "retry", "ok"],
        "score": [0.1, 0.5, 0.9, 1.0],
        "spec": [
            {"steps": 3, "tools": ["bash"]},
            {"steps": 1, "tools": []},
            {"steps": 2, "tools": ["edit"]},
            None,
        ],
    }
    data.update(overrides)
    return pl.DataFrame(data)


def test_passing_suite() -> None:
    suite = [
        UNIQUE_ID,
        STATUS_IN_SET,
        SCORE_RANGE,
        HAS_ROWS,
        Expect("ExpectColumnToExist", {"column": "spec"}),
        Expect("ExpectColumnValuesToNotBeNull", {"column": "env_id"}),
        Expect("ExpectColumnMeanToBeBetween", {"column": "score", "min_value": 0.5, "max_value": 0.7}),
    ]
    res = validate(frame(), "environments", suite)
    assert isinstance(res, SuiteResult)
    assert res.success and res.suite == "environments"
    assert res.evaluated == 7 and res.failures == []
    assert res.summary() == "7/7 expectations passed"


def test_failing_unique_reports_duplicated_rows() -> None:
    df = frame(env_id=["e1", "dup", "e3", "dup"])
    res = validate(df, "environments", [UNIQUE_ID, STATUS_IN_SET])
    assert not res.success and res.evaluated == 2 and len(res.failures) == 1
    f = res.failures[0]
    assert f["kind"] == "ExpectColumnValuesToBeUnique"
    assert f["kwargs"] == {"column": "env_id"}
    assert f["description"] == "Environment ids are unique."
    assert f["unexpected_count"] == 2
    # the sample rows are the full offending rows, nested values included
    assert f["sample_rows"] == [
        {"env_id": "dup", "status": "ok", "score": 0.5, "spec": {"steps": 1, "tools": []}},
        {"env_id": "dup", "status": "ok", "score": 1.0, "spec": None},
    ]
    json.dumps(res.failures)  # JSON-able, ready for check metadata
    assert res.summary() == (
        "1/2 expectations passed; failed: ExpectColumnValuesToBeUnique(env_id): 2 duplicate values (e.g. 'dup')"
    )


def test_failing_in_set_and_range() -> None:
    df = frame(status=["ok", "boom", "ok", "crashed"], score=[0.1, 0.2, 7.0, 0.3])
    res = validate(df, "environments", [STATUS_IN_SET, SCORE_RANGE, HAS_ROWS])
    assert [f["kind"] for f in res.failures] == [
        "ExpectColumnValuesToBeInSet",
        "ExpectColumnValuesToBeBetween",
    ]
    in_set, rng = res.failures
    assert in_set["unexpected_count"] == 2
    assert sorted(in_set["unexpected_values"]) == ["boom", "crashed"]
    assert [r["env_id"] for r in in_set["sample_rows"]] == ["e2", "e4"]
    assert [r["env_id"] for r in rng["sample_rows"]] == ["e3"]
    assert res.summary().startswith(
        "1/3 expectations passed; failed: ExpectColumnValuesToBeInSet(status): 2 values"
    )


def test_sample_rows_are_capped_at_five() -> None:
    df = pl.DataFrame({"env_id": ["same"] * 12, "n": list(range(12))})
    f = validate(df, "s", [UNIQUE_ID]).failures[0]
    assert f["unexpected_count"] == 12 and len(f["sample_rows"]) == 5


def test_missing_column_is_a_failure_not_an_exception() -> None:
    suite = [
        Expect("ExpectColumnValuesToNotBeNull", {"column": "grader"}, "Every env has a grader."),
        Expect("ExpectColumnToExist", {"column": "grader"}),
        HAS_ROWS,
    ]
    res = validate(frame(), "environments", suite)
    assert not res.success and len(res.failures) == 2
    assert all("grader" in f["error"] for f in res.failures)
    assert res.failures[0]["description"] == "Every env has a grader."
    assert "ExpectColumnValuesToNotBeNull(grader)" in res.summary()
    # table-level column checks report GX's own observation instead
    match = Expect("ExpectTableColumnsToMatchSet", {"column_set": ["env_id", "grader"], "exact_match": False})
    f = validate(frame(), "s", [match]).failures[0]
    assert f["error"] is None and "env_id" in f["observed_value"]


def test_empty_frame_does_not_crash() -> None:
    empty = frame().head(0)
    res = validate(empty, "environments", [UNIQUE_ID, STATUS_IN_SET, HAS_ROWS])
    assert res.evaluated == 3
    assert [f["kind"] for f in res.failures] == ["ExpectTableRowCountToBeBetween"]
    assert res.failures[0]["observed_value"] == 0
    assert res.summary().endswith("ExpectTableRowCountToBeBetween: observed 0")
    # no columns at all, and an empty suite
    assert validate(pl.DataFrame(), "nothing", [HAS_ROWS]).failures[0]["observed_value"] == 0
    assert validate(frame(), "none", []).success


def test_failure_of_aggregate_expectation_reports_observed_value() -> None:
    mean = Expect("ExpectColumnMeanToBeBetween", {"column": "score", "min_value": 0.9})
    f = validate(frame(), "s", [mean]).failures[0]
    assert f["observed_value"] == pytest.approx(0.625) and f["sample_rows"] == []


def test_suite_bugs_raise() -> None:
    with pytest.raises(ValueError, match="ExpectNonsense"):
        validate(frame(), "s", [Expect("ExpectNonsense", {"column": "env_id"})])
    with pytest.raises(ValueError, match="ExpectColumnValuesToBeInSet"):
        validate(frame(), "s", [Expect("ExpectColumnValuesToBeInSet", {"column": "status", "bogus": 1})])
