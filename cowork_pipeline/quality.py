"""Data-quality suites on polars frames, evaluated by Great Expectations 1.x.

GX has no polars engine, so frames are validated as pandas. GX is imported
lazily (the import costs seconds) and one ephemeral context is shared per
process. Columns an expectation names but the frame lacks are reported as
failures up front: GX would only surface them as opaque metric exceptions.
"""

from __future__ import annotations

import base64
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import polars as pl

__all__ = ["Expect", "SuiteResult", "validate"]

SAMPLE_ROWS = 5
_COLUMN_KWARGS = ("column", "column_A", "column_B")
_COLUMN_LIST_KWARGS = ("column_list", "column_set")
# Words for the summary line, by expectation kind.
_UNEXPECTED_NOUN = {
    "ExpectColumnValuesToBeUnique": "duplicate values",
    "ExpectCompoundColumnsToBeUnique": "duplicate rows",
    "ExpectSelectColumnValuesToBeUniqueWithinRecord": "rows with repeated values",
    "ExpectColumnValuesToBeInSet": "values not in set",
    "ExpectColumnValuesToNotBeInSet": "values in forbidden set",
    "ExpectColumnValuesToNotBeNull": "null values",
    "ExpectColumnValuesToBeNull": "non-null values",
    "ExpectColumnValuesToBeBetween": "values out of range",
    "ExpectColumnValueLengthsToBeBetween": "values with length out of range",
    "ExpectColumnValuesToMatchRegex": "values not matching regex",
}


@dataclass(frozen=True)
class Expect:
    kind: str  # GX expectation class name, e.g. "ExpectColumnValuesToBeUnique"
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""  # human sentence shown in check metadata

    def target(self) -> str:
        """The column(s) the expectation is about, for messages ('' if table-level)."""
        return ",".join(self.columns())

    def label(self) -> str:
        t = self.target()
        return f"{self.kind}({t})" if t else self.kind

    def columns(self) -> list[str]:
        cols = [self.kwargs[k] for k in _COLUMN_KWARGS if k in self.kwargs]
        for k in _COLUMN_LIST_KWARGS:
            cols.extend(self.kwargs.get(k) or [])
        return [str(c) for c in cols]


@dataclass
class SuiteResult:
    suite: str
    success: bool
    evaluated: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    # Each failure: kind, kwargs, description, observed_value, unexpected_count,
    # unexpected_values (up to 5), sample_rows (up to 5 offending rows), error.

    @property
    def passed(self) -> int:
        return self.evaluated - len(self.failures)

    def summary(self) -> str:
        head = f"{self.passed}/{self.evaluated} expectations passed"
        if not self.failures:
            return head
        return head + "; failed: " + "; ".join(_describe(f) for f in self.failures)


def validate(df: pl.DataFrame, suite: str, expectations: Sequence[Expect]) -> SuiteResult:
    """Run ``expectations`` against ``df``; never raises for data problems
    (missing columns, empty frames) -- those become failures. Raises ValueError
    for an unknown expectation kind or bad kwargs (a bug in the suite itself)."""
    found: list[tuple[int, dict[str, Any]]] = []  # (position in suite, failure)
    to_run: list[tuple[int, Expect]] = []
    for i, exp in enumerate(expectations):
        # Table-level kinds (ExpectTableColumnsToMatchSet...) judge missing columns themselves.
        needed = [] if exp.kind.startswith("ExpectTable") else exp.columns()
        absent = [c for c in needed if c not in df.columns]
        if absent:
            found.append((i, _failure(exp, error=f"column(s) {absent} not in frame")))
        else:
            to_run.append((i, exp))
    if to_run:
        found.extend(_run_gx(df, suite, to_run))
    found.sort(key=lambda pair: pair[0])  # report in suite order
    failures = [f for _, f in found]
    return SuiteResult(suite=suite, success=not failures, evaluated=len(expectations), failures=failures)


# ---------------------------------------------------------------- GX glue
_lock = threading.Lock()
_ctx: Any = None
_batch_definition: Any = None


def _gx_batch_definition() -> Any:
    """Create the ephemeral context + in-memory pandas asset once per process."""
    global _ctx, _batch_definition
    if _batch_definition is None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no phoning home from workers
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx = gx.get_context(mode="ephemeral")
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        asset = ctx.data_sources.add_pandas("cowork_frames").add_dataframe_asset("frame")
        _batch_definition = asset.add_batch_definition_whole_dataframe("whole")
        _ctx = ctx
    return _batch_definition


def _build(exp: Expect, index: int) -> Any:
    import great_expectations.expectations as gxe

    cls = getattr(gxe, exp.kind, None)
    if cls is None or not isinstance(cls, type):
        raise ValueError(f"unknown GX expectation kind {exp.kind!r}")
    try:
        # meta carries our index so results map back to the Expect that produced them.
        return cls(**exp.kwargs, meta={"cowork_index": index})
    except Exception as exc:  # pydantic validation of kwargs
        raise ValueError(f"bad kwargs for {exp.kind}: {exc}") from exc


def _run_gx(
    df: pl.DataFrame, suite: str, to_run: list[tuple[int, Expect]]
) -> list[tuple[int, dict[str, Any]]]:
    with _lock:  # the shared GX context is not thread-safe
        import great_expectations as gx

        batch_def = _gx_batch_definition()
        gx_suite = gx.ExpectationSuite(name=suite)
        for i, exp in to_run:
            gx_suite.add_expectation(_build(exp, i))
        pdf = df.to_pandas()
        batch = batch_def.get_batch(batch_parameters={"dataframe": pdf})
        result = batch.validate(
            gx_suite,
            # SUMMARY keeps memory bounded on big frames and still reports the
            # first offending row indices, which is all the samples need.
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_ROWS},
        )

    by_index = dict(to_run)
    failures: list[tuple[int, dict[str, Any]]] = []
    for r in result.results:
        if r.success:
            continue
        meta_idx = (r.expectation_config.meta or {}).get("cowork_index")
        found = by_index.get(meta_idx) if isinstance(meta_idx, int) else None
        if isinstance(meta_idx, int) and found is not None:
            idx, exp = meta_idx, found
        else:  # only if GX dropped our meta; still report the failure, last
            cfg = r.expectation_config
            idx, exp = len(by_index) + len(failures), Expect(kind=cfg.type, kwargs=dict(cfg.kwargs))
        res = dict(r.result or {})
        failure = _failure(
            exp,
            observed_value=_jsonable(res.get("observed_value")),
            unexpected_count=res.get("unexpected_count"),
            unexpected_values=_jsonable(list(res.get("partial_unexpected_list") or [])[:SAMPLE_ROWS]),
            sample_rows=_sample_rows(df, res.get("partial_unexpected_index_list")),
            error=_exception_text(r.exception_info),
        )
        failures.append((idx, failure))
    return failures


def _failure(exp: Expect, **fields: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "kind": exp.kind,
        "kwargs": _jsonable(exp.kwargs),
        "description": exp.description,
        "observed_value": None,
        "unexpected_count": None,
        "unexpected_values": [],
        "sample_rows": [],
        "error": None,
    }
    f.update(fields)
    return f


def _sample_rows(df: pl.DataFrame, index_list: Any) -> list[dict[str, Any]]:
    # to_pandas() gives a RangeIndex, so GX's index labels are row positions in df.
    if not index_list:
        return []
    rows = []
    for i in list(index_list)[:SAMPLE_ROWS]:
        if isinstance(i, int) and 0 <= i < df.height:
            rows.append(_jsonable(df.row(i, named=True)))
    return rows


def _exception_text(info: Any) -> str | None:
    """GX reports per-metric exceptions as nested dicts; flatten to one message."""
    if not isinstance(info, Mapping):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "exception during validation")
    msgs = [
        str(v.get("exception_message") or "exception during validation")
        for v in info.values()
        if isinstance(v, Mapping) and v.get("raised_exception")
    ]
    return "; ".join(dict.fromkeys(msgs)) or None


def _describe(f: dict[str, Any]) -> str:
    exp = Expect(f["kind"], f["kwargs"])
    if f.get("error"):
        detail = str(f["error"])
    elif f.get("unexpected_count"):
        n = f["unexpected_count"]
        noun = _UNEXPECTED_NOUN.get(f["kind"], "unexpected values")
        if n == 1:  # "1 null value", not "1 null values"
            noun = (
                noun.replace("values", "value", 1) if "rows" not in noun else noun.replace("rows", "row", 1)
            )
        detail = f"{n} {noun}"
        if f.get("unexpected_values"):
            shown = ", ".join(repr(v) for v in dict.fromkeys(map(_hashable, f["unexpected_values"])))
            detail += f" (e.g. {shown})"
    elif f.get("observed_value") is not None:
        detail = f"observed {f['observed_value']}"
    else:
        detail = "no observed value (empty frame or all-null column?)"
    return f"{exp.label()}: {detail}"


def _hashable(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def _jsonable(v: Any) -> Any:
    """Plain JSON types only, so failures can go straight into Dagster metadata."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        # pandas marks missing values as NaN; report them as null. +/-inf stay visible.
        return v if math.isfinite(v) else (None if math.isnan(v) else str(v))
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (datetime, date, time)):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if getattr(v, "ndim", 0) and callable(getattr(v, "tolist", None)):
        return _jsonable(v.tolist())  # numpy arrays (list columns come back as these)
    item = getattr(v, "item", None)  # numpy / pandas scalars
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    try:
        import pandas as pd

        if pd.isna(v):
            return None
    except (TypeError, ValueError, ImportError):
        pass
    return str(v)
