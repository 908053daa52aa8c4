"""Lake maintenance: one vacuum for `cowork vacuum` and for the `lake_vacuum` job and its weekly schedule (stopped
by default, like every schedule here). No ``from __future__ import annotations``: Dagster reads the op's config
class from its annotation."""
from dataclasses import dataclass

import dagster as dg

from assets.models import model_dir
from cowork_pipeline.lake import Lake, Vacuumed, is_remote
from cowork_pipeline.training.model_store import store_folders
from cowork_pipeline.training.registry import StaleFiles, delete_stale, stale_in_lake
from resources import LakeResource


@dataclass(frozen=True)
class LakeVacuum:
    tables: list[Vacuumed]
    folders: list[StaleFiles]  # checkpoint weights and dataset exports
    retain_hours: int
    dry_run: bool

    def lines(self) -> list[str]:
        verb = "would delete" if self.dry_run else "deleted"
        out = []
        for v in self.tables:
            kept = ", ".join(map(str, v.kept_versions[:8])) + (", ..." if len(v.kept_versions) > 8 else "")
            out.append(f"{v.table}: {verb} {len(v.files)} files; versions kept readable: {kept}")
        for kind, remote, label in (("checkpoint", False, "checkpoint weights"), ("checkpoint", True, "checkpoint weights in the store"),
                                    ("export", False, "dataset exports")):
            some = [f for f in self.folders if f.kind == kind and isinstance(f.path, str) == remote]
            if some:
                names = ", ".join(f.name for f in some[:6]) + (", ..." if len(some) > 6 else "")
                out.append(f"{label}: {verb} {len(some)} folders ({_mb(sum(f.bytes for f in some))}): {names}")
        out.append(f"{verb} {sum(len(v.files) for v in self.tables)} files of {len(self.tables)} tables and "
                   f"{len(self.folders)} model folders ({_mb(sum(f.bytes for f in self.folders))}) (written or removed "
                   f"more than {self.retain_hours} h ago, read by no published version nor by the lineage of any; "
                   "weights: of no current, newly registered or scored checkpoint)")
        return out


def vacuum(lake: Lake, retain_hours: int, dry_run: bool = False) -> LakeVacuum:
    """Delete what nothing reads any more: the files of table versions (``Lake.vacuum``) and the folders of model
    files (superseded checkpoints' weights, exports of versions no longer retained; for an object-store lake both
    the store's folders and this machine's copies); ``retain_hours`` >= 1, so a run writing meanwhile keeps what it
    has not committed or registered yet."""
    if retain_hours < 1:
        raise ValueError(f"retain_hours must be at least 1 (a run writing meanwhile needs its files), got {retain_hours}")
    retained = lake.retained_versions()
    # folders first: what they keep is decided from versions that the table vacuum keeps readable anyway
    folders = stale_in_lake(lake, model_dir(lake), None if is_remote(lake.root) else model_dir(lake, "..", "datasets"),
                            retain_hours, retained)
    if is_remote(lake.root):  # an object-store lake: the store's folders, and this machine's copies of models (above)
        store, exports = (store_folders(f"{lake.root.rstrip('/')}/{kind}", lake.storage_options) for kind in ("models", "datasets"))
        folders += stale_in_lake(lake, store, exports, retain_hours, retained)
    if not dry_run:
        delete_stale(folders, lake.storage_options)
    return LakeVacuum(lake.vacuum(retain_hours, dry_run=dry_run, retained=retained), folders, retain_hours, dry_run)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class VacuumConfig(dg.Config):
    retain_hours: int = 168  # a week: keep it above the longest run
    dry_run: bool = False


@dg.op(description="Delete the lake's files and model folders that nothing reads any more (see `cowork vacuum`).")
def vacuum_lake(context: dg.OpExecutionContext, config: VacuumConfig, lake: LakeResource) -> dg.Output[None]:
    try:
        done = vacuum(lake.lake(), config.retain_hours, config.dry_run)
    except ValueError as e:
        raise dg.Failure(str(e)) from e
    for line in done.lines():
        context.log.info(line)
    return dg.Output(None, metadata={
        "dry_run": config.dry_run, "table_files": sum(len(v.files) for v in done.tables),
        "model_folders": [f.name for f in done.folders], "model_bytes": sum(f.bytes for f in done.folders),
        "summary": dg.MetadataValue.md("\n".join(f"- {line}" for line in done.lines()))})


@dg.job(description="Vacuum the lake: table versions and model folders nothing reads any more.")
def lake_vacuum():
    vacuum_lake()


weekly_vacuum = dg.ScheduleDefinition(
    name="weekly_vacuum", cron_schedule="0 5 * * 0", execution_timezone="UTC", job=lake_vacuum,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Sundays 05:00 UTC: vacuum the lake, keeping a week of removed files (stopped by default).")
