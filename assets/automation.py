"""Automation: react to catalog edits, regenerate stale partitions nightly, declarative conditions.

Three mechanisms, all **stopped by default** (nothing runs by itself after `cowork ui` / `dagster dev`):

``capability_catalog_sensor`` (every 30 s)
    Fingerprints every ``*.yaml`` of the catalog folder (``ProfileResource.catalog_dir``, else the catalog
    shipped in the package), as the profile drafts them (its ``injections`` setting), with ``Capability.fingerprint()`` (a content hash of the validated spec, so
    comment or whitespace edits do not count). The cursor holds the fingerprints last seen and the
    capabilities whose synthesis is pending. When a file appears or its fingerprint changes, the sensor
    (1) adds the capability's dynamic partition, (2) requests a ``capability_specs_job`` run (the synthesis
    assets read the capability from the *promoted* ``capability_specs``), and (3) on a later tick, once
    ``capability_specs`` is promoted with exactly that fingerprint, requests a ``synthesize_capability``
    run for that partition only. Unchanged files request nothing; partitions already synthesized from the
    same fingerprint with the current code version are not re-run (a fresh cursor starts from the lake's
    state, so enabling the sensor on an existing deployment does not regenerate everything). Files that fail
    validation are reported and skipped; removed files are forgotten (their data stays in the lake).

``nightly_regeneration`` (cron ``0 3 * * *`` UTC)
    Requests one ``synthesize_capability`` run per partition that is *missing* (no promoted synthesis) or
    *stale*: its promoted ``repair_telemetry`` row was written by another code version than the configured
    generator's (``GeneratorResource.code_version()``: generator, model and prompt version, validator), or
    from a capability fingerprint other than the one in today's promoted ``capability_specs`` (read by
    time travel at the ``capability_specs`` version the row recorded). The
    selection is :func:`plan_regeneration`, a pure function. Catalog files that differ from the promoted
    ``capability_specs`` are reported; refreshing the specs is the sensor's job (a run of
    ``capability_specs_job``), after which those partitions count as stale.

Declarative automation
    :func:`with_automation_conditions` gives the synthesis assets ``on_missing() | code_version_changed()``
    (a new partition is synthesized once, after ``capability_specs`` has finished; a new generator or
    validator version regenerates every partition), gated on ``capability_specs``'s blocking checks.
    Downstream assets already carry ``eager() & all_deps_blocking_checks_passed()``. The conditions are
    evaluated by ``cowork_automation_sensor`` (an ``AutomationConditionSensorDefinition`` over every asset),
    which starts **stopped**: turn it on in the UI (Automation -> cowork_automation_sensor -> toggle on) or
    with ``dagster sensor start cowork_automation_sensor -w workspace.yaml`` while the daemon runs (``cowork
    ui`` / ``dagster dev`` start one). The other two are turned on the same way
    (``dagster sensor start capability_catalog_sensor``, ``dagster schedule start nightly_regeneration``).
    Run either the catalog sensor or the automation sensor for new partitions, not both: with both on, a new
    partition may be synthesized twice (harmless, partition writes replace, but wasted work).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import dagster as dg

from assets.synthesis import SYNTH_TABLES, capability_partitions
from cowork_pipeline.capabilities import CATALOG_DIR, CapabilityError, load_capability
from cowork_pipeline.lake import Lake, LakeError
from resources import GeneratorResource, LakeResource, ProfileResource

# The synthesis assets' code version with the default (embedded) generator; with another generator the
# sensor and the schedule compare against ``GeneratorResource.code_version()``, which the assets record.
SYNTH_CODE_VERSION = GeneratorResource().code_version()
PARTITIONS = "capability"

capability_specs_job = dg.define_asset_job(
    "capability_specs_job", selection=dg.AssetSelection.assets("capability_specs"),
    description="Re-read the capability catalog into capability_specs (adds a partition per new capability).")
synthesis_job = dg.define_asset_job(
    "synthesize_capability", selection=dg.AssetSelection.assets(*SYNTH_TABLES),  # partitioned like its assets
    description="Draft, certify and repair one capability's environments (one partition).")


# ------------------------------------------------------------------------------------------ catalog state
def catalog_folder(profile: ProfileResource | None) -> Path:
    return Path(profile.catalog_dir) if profile is not None and profile.catalog_dir else CATALOG_DIR


def catalog_fingerprints(folder: str | Path, profile: ProfileResource | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """({capability id: fingerprint} of every valid file, {file name: error} of the invalid ones); with a
    ``profile``, the fingerprints of the capabilities as it drafts them (what ``capability_specs`` publishes)."""
    fps: dict[str, str] = {}
    errors: dict[str, str] = {}
    folder = Path(folder)
    if not folder.is_dir():
        return fps, {str(folder): "catalog folder does not exist"}
    for path in sorted(folder.glob("*.yaml")):
        try:
            cap = load_capability(path)
            if profile is not None:
                cap = profile.capability(cap, path.read_text(encoding="utf-8"))[0]
        except (CapabilityError, ValueError) as e:  # (ValueError: the profile's own setting is bad)
            errors[path.name] = str(e).splitlines()[0]
            continue
        fps[cap.id] = cap.fingerprint()
    return fps, errors


def published_fingerprints(lake: Lake) -> dict[str, str]:
    """{capability id: fingerprint} of the promoted capability_specs ({} before the first promotion)."""
    try:
        df, _ = lake.read_promoted("capability_specs", columns=["capability_id", "fingerprint"])
    except LakeError:
        return {}
    return dict(df.select("capability_id", "fingerprint").iter_rows())


@dataclass(frozen=True)
class PartitionState:
    """What a partition's promoted synthesis was made from."""

    code_version: str | None
    capability_fingerprint: str | None
    run_id: str | None = None


def partition_states(lake: Lake) -> dict[str, PartitionState]:
    """Per capability partition: the code version and capability fingerprint of its promoted synthesis.

    From the promoted ``repair_telemetry`` (one row per partition, even when nothing was accepted): its
    ``_code_version``, and the capability's fingerprint in ``capability_specs`` at the version recorded in the
    row's ``_upstream_versions`` (time travel: the spec the synthesis actually read)."""
    try:
        tel, _ = lake.read_promoted("repair_telemetry", columns=["capability_id", "_run_id", "_code_version", "_upstream_versions"])
    except LakeError:
        return {}
    spec_fps: dict[int, dict[str, str]] = {}
    out: dict[str, PartitionState] = {}
    for cap, run_id, code_version, upstream in tel.iter_rows():
        v = json.loads(upstream or "{}").get("capability_specs")
        fp = None
        if v is not None:
            if v not in spec_fps:
                try:
                    df = lake.read("capability_specs", version=int(v), columns=["capability_id", "fingerprint"])
                    spec_fps[v] = dict(df.iter_rows())
                except LakeError:
                    spec_fps[v] = {}
            fp = spec_fps[v].get(cap)
        out[cap] = PartitionState(code_version, fp, run_id)
    return out


# ------------------------------------------------------------------------------------------------ sensor
@dataclass
class CatalogCursor:
    fingerprints: dict[str, str] = field(default_factory=dict)  # last seen on disk
    pending: dict[str, str] = field(default_factory=dict)  # capability -> fingerprint still to synthesize
    specs_requested: str = ""  # digest of the catalog a capability_specs run was last requested for

    @classmethod
    def parse(cls, text: str | None) -> "CatalogCursor | None":
        if not text:
            return None
        data = json.loads(text)
        return cls(dict(data.get("fingerprints", {})), dict(data.get("pending", {})), str(data.get("specs_requested", "")))

    def dumps(self) -> str:
        return json.dumps({"fingerprints": self.fingerprints, "pending": self.pending,
                           "specs_requested": self.specs_requested}, sort_keys=True)


@dataclass
class CatalogTick:
    """What one sensor evaluation decided (pure: no Dagster, no I/O)."""

    cursor: CatalogCursor
    changed: dict[str, str]  # capability -> new fingerprint (new files included)
    new_partitions: list[str]
    refresh_specs: bool  # request a capability_specs run: a pending fingerprint is not promoted yet (asked once per content)
    synthesize: dict[str, str]  # partition -> fingerprint, ready to run now
    removed: list[str]


def catalog_tick(cursor: CatalogCursor | None, on_disk: Mapping[str, str], *, existing_partitions: Iterable[str],
                 published: Mapping[str, str], states: Mapping[str, PartitionState],
                 code_version: str = SYNTH_CODE_VERSION, in_flight: Iterable[str] = ()) -> CatalogTick:
    """Diff the catalog against the cursor and decide the requests.

    A fresh cursor (None) starts from the lake: a capability counts as already seen when its partition's
    promoted synthesis was made from the same fingerprint and code version."""
    if cursor is None:
        cursor = CatalogCursor({c: s.capability_fingerprint for c, s in states.items()
                                if s.capability_fingerprint is not None and s.code_version == code_version})
    existing = set(existing_partitions)
    changed = {c: fp for c, fp in sorted(on_disk.items()) if cursor.fingerprints.get(c) != fp}
    removed = sorted(set(cursor.fingerprints) - set(on_disk))
    pending = {c: fp for c, fp in cursor.pending.items() if c in on_disk}
    pending.update(changed)
    synthesize: dict[str, str] = {}
    busy = set(in_flight)
    for cap, fp in sorted(pending.items()):
        if published.get(cap) != fp:
            continue  # capability_specs does not publish this content yet
        st = states.get(cap)
        if st is not None and st.capability_fingerprint == fp and st.code_version == code_version:
            continue  # already synthesized from exactly this spec (e.g. by hand or by the automation sensor)
        if cap not in busy:
            synthesize[cap] = fp
    for cap in list(pending):
        if published.get(cap) == pending[cap] and cap not in busy:
            del pending[cap]  # requested now, or already up to date
    # Ask for a capability_specs run once per catalog content (a failed one is retried when a file changes again).
    digest = catalog_digest(on_disk)
    refresh = any(published.get(c) != fp for c, fp in pending.items()) and cursor.specs_requested != digest
    return CatalogTick(
        cursor=CatalogCursor(dict(on_disk), pending, digest if refresh else cursor.specs_requested), changed=changed,
        new_partitions=sorted(c for c in on_disk if c not in existing and (c in changed or c in pending)),
        refresh_specs=refresh, synthesize=synthesize, removed=removed)


def catalog_digest(fps: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(sorted(fps.items()))).encode()).hexdigest()[:12]


def _in_flight_partitions(instance: dg.DagsterInstance) -> set[str]:
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=synthesis_job.name, statuses=[
        dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]))
    return {r.tags.get("dagster/partition") for r in runs if r.tags.get("dagster/partition")}


@dg.sensor(name="capability_catalog_sensor", jobs=[capability_specs_job, synthesis_job], minimum_interval_seconds=30,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="Adds a partition and synthesizes it when a capability file appears or its content changes.")
def capability_catalog_sensor(context: dg.SensorEvaluationContext, profile: ProfileResource, lake: LakeResource,
                              generator: GeneratorResource):
    folder = catalog_folder(profile)
    on_disk, errors = catalog_fingerprints(folder, profile)
    for name, err in errors.items():
        context.log.warning(f"capability file skipped: {err}")
    lk = lake.lake()
    tick = catalog_tick(CatalogCursor.parse(context.cursor), on_disk,
                        existing_partitions=context.instance.get_dynamic_partitions(PARTITIONS),
                        published=published_fingerprints(lk), states=partition_states(lk),
                        code_version=generator.code_version(), in_flight=_in_flight_partitions(context.instance))
    requests: list[dg.RunRequest] = []
    if tick.refresh_specs:
        requests.append(dg.RunRequest(job_name=capability_specs_job.name, run_key=f"capability_specs:{tick.cursor.specs_requested}",
                                      tags={"cowork/trigger": "capability_catalog_sensor",
                                            "cowork/changed": ",".join(sorted(tick.cursor.pending))[:200]}))
    for cap, fp in tick.synthesize.items():
        requests.append(dg.RunRequest(job_name=synthesis_job.name, partition_key=cap, run_key=f"synthesize:{cap}:{fp}",
                                      tags={"cowork/trigger": "capability_catalog_sensor", "cowork/capability_fingerprint": fp}))
    partition_requests = [capability_partitions.build_add_request(tick.new_partitions)] if tick.new_partitions else []
    if tick.removed:
        context.log.info(f"capability files removed (partitions and data kept): {', '.join(tick.removed)}")
    if not requests and not partition_requests:
        waiting = f"; waiting for capability_specs to publish {sorted(tick.cursor.pending)}" if tick.cursor.pending else ""
        return dg.SensorResult(skip_reason=f"catalog unchanged ({len(on_disk)} capabilities in {folder}){waiting}",
                               cursor=tick.cursor.dumps())
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=partition_requests, cursor=tick.cursor.dumps())


# ---------------------------------------------------------------------------------------------- schedule
@dataclass
class RegenerationPlan:
    selection: dict[str, str]  # partition -> why it is regenerated ("missing" / "code version …" / "capability …")
    skipped: dict[str, str]  # partition / capability -> why not (not in the promoted specs, specs not refreshed yet)


def plan_regeneration(partitions: Iterable[str], published: Mapping[str, str], states: Mapping[str, PartitionState],
                      code_version: str = SYNTH_CODE_VERSION, on_disk: Mapping[str, str] | None = None) -> RegenerationPlan:
    """The partitions to regenerate: missing ones and stale ones (other code version, or synthesized from a
    capability fingerprint that differs from the promoted capability_specs). Pure; sorted by partition."""
    selection: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for p in sorted(set(partitions)):
        if p not in published:
            skipped[p] = "not in the promoted capability_specs (removed from the catalog, or specs not refreshed)"
            continue
        st = states.get(p)
        if st is None:
            selection[p] = "missing"
        elif st.code_version != code_version:
            selection[p] = f"code version {st.code_version} -> {code_version}"
        elif st.capability_fingerprint != published[p]:
            selection[p] = f"capability fingerprint {st.capability_fingerprint} -> {published[p]}"
    for cap, fp in sorted((on_disk or {}).items()):
        if published.get(cap) != fp and cap not in selection:
            skipped.setdefault(cap, "catalog file differs from the promoted capability_specs: run capability_specs_job "
                                    "(the capability_catalog_sensor does) first")
    return RegenerationPlan(selection, skipped)


@dg.schedule(name="nightly_regeneration", cron_schedule="0 3 * * *", execution_timezone="UTC", job=synthesis_job,
             default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Regenerates capability partitions that are missing or stale (code version or capability changed).")
def nightly_regeneration(context: dg.ScheduleEvaluationContext, lake: LakeResource, profile: ProfileResource,
                         generator: GeneratorResource):
    lk = lake.lake()
    on_disk, _ = catalog_fingerprints(catalog_folder(profile), profile)
    plan = plan_regeneration(context.instance.get_dynamic_partitions(PARTITIONS), published_fingerprints(lk),
                             partition_states(lk), code_version=generator.code_version(), on_disk=on_disk)
    for cap, why in plan.skipped.items():
        context.log.info(f"not regenerating {cap}: {why}")
    if not plan.selection:
        return dg.SkipReason(f"every capability partition is up to date ({len(plan.skipped)} skipped)")
    stamp = context.scheduled_execution_time.strftime("%Y%m%dT%H%M") if context.scheduled_execution_time else "manual"
    return [dg.RunRequest(partition_key=cap, run_key=f"nightly:{stamp}:{cap}",
                          tags={"cowork/trigger": "nightly_regeneration", "cowork/reason": why[:200]})
            for cap, why in plan.selection.items()]


# ---------------------------------------------------------------------------------- declarative automation
_AC = dg.AutomationCondition
SYNTHESIS_CONDITION = (
    ((_AC.on_missing() & ~_AC.any_deps_in_progress()) | _AC.code_version_changed())
    & _AC.all_deps_blocking_checks_passed() & ~_AC.in_progress()
).with_label("on_missing_or_code_version_changed")
CAPABILITY_SPECS_CONDITION = dg.AutomationCondition.on_missing() | dg.AutomationCondition.code_version_changed()

automation_sensor = dg.AutomationConditionSensorDefinition(
    "cowork_automation_sensor", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.STOPPED,
    minimum_interval_seconds=30, description="Evaluates every asset's AutomationCondition (stopped by default).")


def with_automation_conditions(assets: Sequence[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    """``assets`` with the synthesis conditions attached where an asset has none (others unchanged)."""
    out = []
    for a in assets:
        conditions: dict[dg.AssetKey, dg.AutomationCondition] = {}
        for key in a.keys:
            if a.specs_by_key[key].automation_condition is not None:
                continue
            if key.to_user_string() in SYNTH_TABLES:
                conditions[key] = SYNTHESIS_CONDITION
            elif key.to_user_string() == "capability_specs":
                conditions[key] = CAPABILITY_SPECS_CONDITION
        out.append(a.with_attributes(automation_condition=conditions) if conditions else a)
    return out


JOBS = [capability_specs_job, synthesis_job]
SENSORS = [capability_catalog_sensor, automation_sensor]
SCHEDULES = [nightly_regeneration]


def selection_keys(job_name: str) -> list[dg.AssetKey]:
    """The asset keys a run request of one of our jobs materializes (to execute it in-process)."""
    if job_name == capability_specs_job.name:
        return [dg.AssetKey("capability_specs")]
    if job_name == synthesis_job.name:
        return [dg.AssetKey(t) for t in SYNTH_TABLES]
    raise KeyError(job_name)


__all__ = ["CatalogCursor", "PartitionState", "RegenerationPlan", "catalog_fingerprints", "catalog_tick", "partition_states",
           "plan_regeneration", "published_fingerprints", "with_automation_conditions", "capability_catalog_sensor",
           "nightly_regeneration", "automation_sensor", "capability_specs_job", "synthesis_job"]
