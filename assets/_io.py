"""Write-audit-publish for assets: write Delta, run the GX suite, promote only on success."""
from __future__ import annotations

import base64
import io
from typing import Any, Sequence

import dagster as dg
import polars as pl

from cowork_pipeline.lake import ANY_PUBLISHED, Lake, Lineage
from cowork_pipeline.quality import Expect, validate


# Downstream assets materialize when an upstream changes, and only once every upstream blocking check passed
# (a blocking check stops downstream inside a run; this condition carries that across runs).
GATED = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()


def lineage(context: Any, asset: str, code_version: str, upstream: dict[str, int]) -> Lineage:
    return Lineage(context.run.run_id, asset, code_version, upstream)


def write_checked(context: Any, lake: Lake, table: str, df: pl.DataFrame, *, suite: Sequence[Expect], lin: Lineage,
                  key: Sequence[str] | None = None, partition: tuple[str, str] | None = None,
                  audit_df: pl.DataFrame | None = None, if_published: int | None = ANY_PUBLISHED) -> tuple[dg.MaterializeResult, dg.AssetCheckResult]:
    """Write ``df`` (a partition's rows when ``partition=(column, value)``: replaced, never duplicated; keyed rows merged
    onto the published rows), validate it, and promote that exact Delta version only when the suite passes. Runs
    writing the table at once keep each other's work: a keyed merge is published only while the rows it was merged
    onto are (else merged again), a table or partition written before another run's published one is superseded,
    not promoted; with ``if_published`` the caller plans on that version itself (PublishConflict when another is
    published, see Lake.promote). Returns the asset's and check's results."""
    result = validate(audit_df if audit_df is not None else df, table, suite)
    scope = {"partition": partition[1], "partition_column": partition[0]} if partition else {}
    merged = bool(key) and partition is None
    replaced = not merged and if_published is ANY_PUBLISHED  # the whole table or a partition, by this write alone
    version: int | None = None
    superseded = None
    retries = lake.retries

    def publish() -> None:
        nonlocal version, superseded
        published = if_published
        if merged:
            # keyed rows go onto the published rows (never onto a failed write's), and are published only while those
            # still are: a run's merge published meanwhile is merged onto in the next attempt
            published = lake.promoted_version(table) if lake.exists(table) else None
            version = lake.write(table, df, lineage=lin, key=key, mode="merge", onto=published)
        elif version is None and partition is not None:
            col, value = partition
            version = lake.write(table, df, lineage=lin, mode="overwrite", replace_where=f"{col} = '{value}'")
        elif version is None:
            version = lake.write(table, df, lineage=lin, mode="overwrite")
        if not result.success:
            return
        if replaced:
            # a later version of the table (of the partition), published by another run meanwhile, is never rolled back
            published = lake.promoted_version(table, partition[1] if partition else None)
            if published is not None and published > version:
                superseded = published
                return
        lake.promote(table, version, run_id=lin.run_id, checks={f"gx:{table}": True}, **scope, if_published=published)

    if merged or replaced:
        lake.until_published(table, publish)  # another run publishing first: merge again, or check again
    else:
        publish()  # a caller that planned on what was published (benchmark_scores) merges again itself
    meta = {"delta_version": version, "rows": len(df), "table_uri": lake.uri(table), "run_id": lin.run_id,
            "promoted": result.success and superseded is None, "upstream_versions": dg.MetadataValue.json(dict(lin.upstream_versions)),
            "history": history_md(lake, table),
            "retries": lake.retries - retries}  # conflicts with other runs' commits, each written or checked again
    if superseded is not None:
        meta["superseded_by_version"] = superseded
    # The check judges the data, which passed; a passing write another run's later version overtook is not what
    # readers get, and the check says so (the asset's metadata too), so a green check is never read as "published".
    summary = result.summary() + (f"; not promoted: version {superseded}, published by another run meanwhile, is newer"
                                  if superseded is not None else "")
    check = dg.AssetCheckResult(
        asset_key=table, check_name=f"{table}_quality", passed=result.success,
        metadata={"summary": summary, "expectations": result.evaluated, "delta_version": version, "promoted": meta["promoted"],
                  "failures": dg.MetadataValue.json(result.failures[:10]),
                  **({"superseded_by_version": superseded} if superseded is not None else {})},
        description=summary)
    return dg.MaterializeResult(asset_key=table, metadata=meta), check


def check_spec(table: str, description: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(f"{table}_quality", asset=table, blocking=True, description=description)


def plot_md(fig: Any) -> dg.MetadataValue:
    """A matplotlib figure as inline markdown for the asset's metadata panel."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return dg.MetadataValue.md(f"![plot](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})")


def history_md(lake: Lake, table: str, limit: int = 8) -> dg.MetadataValue:
    rows = lake.history(table, limit=limit)
    lines = ["| version | operation | run id | when |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('version')} | {r.get('operation')} | {r.get('run_id') or ''} | {r.get('timestamp')} |")
    return dg.MetadataValue.md("\n".join(lines))
