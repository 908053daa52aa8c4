"""Automation on a real (ephemeral) Dagster instance and real Delta tables: the catalog sensor adds partitions and
requests runs when a capability file appears or changes and nothing when it does not; the nightly schedule's
selection is exactly the missing and stale partitions; the synthesis assets carry a fitting automation condition."""
import datetime as dt
import json
import shutil

import dagster as dg
import polars as pl
import pytest

from assets import automation as auto
from assets.definitions import ALL_ASSETS, build_definitions, resources
from cowork_pipeline.capabilities import CATALOG_DIR
from cowork_pipeline.lake import Lake, Lineage
from resources import GeneratorResource, LakeResource, ProfileResource

CAPS = ("invoice_reconcile", "weekly_task_digest")
CURRENT = auto.SYNTH_CODE_VERSION


@pytest.fixture
def setup(tmp_path):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    for c in CAPS:
        shutil.copy(CATALOG_DIR / f"{c}.yaml", catalog / f"{c}.yaml")
    profile = ProfileResource(name="test-automation", catalog_dir=str(catalog), envs_per_capability=2)
    lake_res = LakeResource(root=str(tmp_path / "lake"))
    return dg.DagsterInstance.ephemeral(), catalog, profile, lake_res


def _tick(instance, cursor, profile, lake_res) -> dg.SensorResult | dg.SkipReason:
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"profile": profile, "lake": lake_res, "generator": GeneratorResource()})
    return auto.capability_catalog_sensor(ctx)


def _apply(instance, result: dg.SensorResult) -> list[str]:
    """What the sensor daemon does with the dynamic partition requests; returns the partitions added."""
    added = []
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        added += list(req.partition_keys)
    return added


def _requests(result) -> list[tuple[str, str | None]]:
    return [(r.job_name, r.partition_key) for r in (result.run_requests or [])]


def _materialize_specs(instance, profile, lake_res):
    res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("capability_specs")], instance=instance,
                         resources=resources(profile, lake_res))
    assert res.success


def test_sensor_adds_partitions_and_requests_runs_only_on_change(setup):
    instance, catalog, profile, lake_res = setup
    specs, synth = auto.capability_specs_job.name, auto.synthesis_job.name

    # 1. first tick, empty lake: both capabilities are new -> partitions added, capability_specs requested
    r1 = _tick(instance, None, profile, lake_res)
    assert _requests(r1) == [(specs, None)]
    assert sorted(_apply(instance, r1)) == sorted(CAPS)
    assert set(instance.get_dynamic_partitions("capability")) == set(CAPS)
    # unchanged, specs not promoted yet: nothing new is requested (the pending synthesis waits)
    r2 = _tick(instance, r1.cursor, profile, lake_res)
    assert not _requests(r2) and not r2.dynamic_partitions_requests and r2.skip_reason
    assert "waiting for capability_specs" in r2.skip_reason.skip_message

    # 2. capability_specs promoted with exactly these fingerprints -> one synthesis run per partition
    _materialize_specs(instance, profile, lake_res)
    r3 = _tick(instance, r2.cursor, profile, lake_res)
    assert sorted(_requests(r3)) == [(synth, c) for c in sorted(CAPS)]
    fps = json.loads(r3.cursor)["fingerprints"]
    assert {r.run_key for r in r3.run_requests} == {f"synthesize:{c}:{fps[c]}" for c in CAPS}
    r4 = _tick(instance, r3.cursor, profile, lake_res)
    assert not _requests(r4) and r4.skip_reason and "unchanged" in r4.skip_reason.skip_message

    # 3. a comment-only edit does not change the content fingerprint -> nothing
    path = catalog / "weekly_task_digest.yaml"
    path.write_text(path.read_text() + "\n# reviewed\n")
    assert not _requests(_tick(instance, r4.cursor, profile, lake_res))

    # 4. a real content change: specs refresh, then synthesis of that partition only; no new partition
    path.write_text(path.read_text().replace("title:", "title: Weekly", 1))
    r5 = _tick(instance, r4.cursor, profile, lake_res)
    assert _requests(r5) == [(specs, None)] and not r5.dynamic_partitions_requests
    assert not _requests(_tick(instance, r5.cursor, profile, lake_res))  # unchanged: not requested twice
    _materialize_specs(instance, profile, lake_res)
    r6 = _tick(instance, r5.cursor, profile, lake_res)
    assert _requests(r6) == [(synth, "weekly_task_digest")]

    # 5. a new file: its partition is added and the specs refreshed
    text = (CATALOG_DIR / "invoice_reconcile.yaml").read_text()
    (catalog / "invoice_reconcile_copy.yaml").write_text(text.replace("id: invoice_reconcile", "id: invoice_reconcile_copy", 1))
    r7 = _tick(instance, r6.cursor, profile, lake_res)
    assert _requests(r7) == [(specs, None)]
    assert _apply(instance, r7) == ["invoice_reconcile_copy"]
    _materialize_specs(instance, profile, lake_res)
    assert _requests(_tick(instance, r7.cursor, profile, lake_res)) == [(synth, "invoice_reconcile_copy")]

    # 6. an invalid file is skipped (logged), never requested
    (catalog / "broken.yaml").write_text("id: broken\ntitle: [unclosed\n")
    assert auto.catalog_fingerprints(catalog)[1]
    r8 = _tick(instance, r7.cursor, profile, lake_res)
    assert "broken" not in json.loads(r8.cursor)["fingerprints"]


def test_the_sensor_compares_the_capabilities_as_the_profile_drafts_them(setup):
    """A profile that plants instructions (``injections``) publishes capabilities whose difficulty differs from
    their files': the sensor fingerprints them as that profile drafts them, so once capability_specs is promoted it
    asks for synthesis, not for the specs again and again; switching the setting off is a change it refreshes."""
    instance, catalog, plain, lake_res = setup
    profile = ProfileResource(name=plain.name, catalog_dir=plain.catalog_dir, envs_per_capability=2, injections="some")
    specs, synth = auto.capability_specs_job.name, auto.synthesis_job.name
    on, _ = auto.catalog_fingerprints(catalog, profile)
    assert on != auto.catalog_fingerprints(catalog)[0] and set(on) == set(CAPS)
    r1 = _tick(instance, None, profile, lake_res)
    assert _requests(r1) == [(specs, None)]
    _apply(instance, r1)
    _materialize_specs(instance, profile, lake_res)
    assert auto.published_fingerprints(lake_res.lake()) == on
    r2 = _tick(instance, r1.cursor, profile, lake_res)
    assert sorted(_requests(r2)) == [(synth, c) for c in sorted(CAPS)]
    assert _requests(_tick(instance, r2.cursor, plain, lake_res)) == [(specs, None)]
    bad = ProfileResource(catalog_dir=plain.catalog_dir, injections="most")
    assert set(auto.catalog_fingerprints(catalog, bad)[1]) == {f"{c}.yaml" for c in CAPS}


def test_fresh_sensor_cursor_starts_from_the_lake_state():
    """Enabling the sensor on a deployment whose partitions are synthesized from the current catalog requests nothing."""
    on_disk = {"a": "fa", "b": "fb"}
    states = {"a": auto.PartitionState(CURRENT, "fa"), "b": auto.PartitionState(CURRENT, "fb")}
    tick = auto.catalog_tick(None, on_disk, existing_partitions=["a", "b"], published=on_disk, states=states)
    assert not tick.changed and not tick.synthesize and not tick.refresh_specs and not tick.new_partitions
    # ... but a partition synthesized by an older code version, or from other content, counts as changed
    states["b"] = auto.PartitionState("embedded-0+certify-0", "fb")
    tick = auto.catalog_tick(None, on_disk, existing_partitions=["a", "b"], published=on_disk, states=states)
    assert tick.synthesize == {"b": "fb"}
    # a run already in flight for the partition is not requested again (it stays pending)
    tick = auto.catalog_tick(None, on_disk, existing_partitions=["a", "b"], published=on_disk, states=states, in_flight=["b"])
    assert not tick.synthesize and tick.cursor.pending == {"b": "fb"}


# --- the nightly schedule ----------------------------------------------------------------------------------
def _plant(lake: Lake) -> None:
    """capability_specs v0 -> v1 (beta's content changed) and one promoted repair_telemetry row per partition:
    alpha current, beta from the old spec, gamma from an old code version, delta never synthesized,
    epsilon's capability no longer in the catalog."""
    def specs(fps):
        return pl.DataFrame({"capability_id": list(fps), "fingerprint": list(fps.values()), "yaml": ["x"] * len(fps)})

    v0 = lake.write("capability_specs", specs({"alpha": "fa", "beta": "fb", "gamma": "fg", "delta": "fd"}),
                    lineage=Lineage("run-specs-0", "capability_specs", "1"), mode="overwrite")
    lake.promote("capability_specs", v0, run_id="run-specs-0")
    v1 = lake.write("capability_specs", specs({"alpha": "fa", "beta": "fb2", "gamma": "fg", "delta": "fd"}),
                    lineage=Lineage("run-specs-1", "capability_specs", "1"), mode="overwrite")
    lake.promote("capability_specs", v1, run_id="run-specs-1")

    def telemetry(cap, code_version, specs_version, run_id, promote=True):
        df = pl.DataFrame({"capability_id": [cap], "drafts": [2], "accepted": [2], "survival_rate": [1.0]})
        v = lake.write("repair_telemetry", df, lineage=Lineage(run_id, "repair_telemetry", code_version,
                                                               {"capability_specs": specs_version}),
                       mode="overwrite", replace_where=f"capability_id = '{cap}'")
        if promote:
            lake.promote("repair_telemetry", v, run_id=run_id, partition=cap, partition_column="capability_id")

    telemetry("alpha", CURRENT, v1, "run-alpha")
    telemetry("beta", CURRENT, v0, "run-beta")  # synthesized before beta's spec changed
    telemetry("gamma", "embedded-0+certify-0", v1, "run-gamma")
    telemetry("epsilon", CURRENT, v0, "run-epsilon")
    telemetry("alpha", "embedded-0+certify-0", v1, "run-alpha-failed", promote=False)  # failed checks: never published


def test_schedule_selects_exactly_the_missing_and_stale_partitions(tmp_path):
    lake_res = LakeResource(root=str(tmp_path / "lake"))
    lake = lake_res.lake()
    _plant(lake)
    states = auto.partition_states(lake)
    assert states["alpha"] == auto.PartitionState(CURRENT, "fa", "run-alpha")  # the promoted row, not the failed write
    assert states["beta"].capability_fingerprint == "fb"  # time travel to the specs version the synthesis read
    published = auto.published_fingerprints(lake)
    assert published["beta"] == "fb2"

    plan = auto.plan_regeneration(["alpha", "beta", "gamma", "delta", "epsilon"], published, states)
    assert list(plan.selection) == ["beta", "delta", "gamma"]
    assert plan.selection["delta"] == "missing"
    assert plan.selection["beta"].startswith("capability fingerprint fb -> fb2")
    assert plan.selection["gamma"].startswith("code version embedded-0+certify-0")
    assert list(plan.skipped) == ["epsilon"]

    # the schedule itself, on a real (persistent: schedule contexts need an instance ref) instance with the partitions
    (tmp_path / "dagster_home").mkdir()
    instance = dg.DagsterInstance.local_temp(str(tmp_path / "dagster_home"))
    instance.add_dynamic_partitions("capability", ["alpha", "beta", "gamma", "delta", "epsilon"])
    empty_catalog = tmp_path / "catalog"
    empty_catalog.mkdir()
    ctx = dg.build_schedule_context(instance=instance, scheduled_execution_time=dt.datetime(2026, 3, 2, 3, 0),
                                    resources={"lake": lake_res, "profile": ProfileResource(catalog_dir=str(empty_catalog)),
                                               "generator": GeneratorResource()})
    requests = list(auto.nightly_regeneration(ctx))
    assert [r.partition_key for r in requests] == ["beta", "delta", "gamma"]
    assert all(r.tags["cowork/trigger"] == "nightly_regeneration" for r in requests)
    assert len({r.run_key for r in requests}) == 3

    # nothing stale -> a skip, not an empty run list
    up_to_date = {p: auto.PartitionState(CURRENT, published[p]) for p in published}
    assert not auto.plan_regeneration(published, published, up_to_date).selection


def test_definitions_register_automation_stopped_with_fitting_conditions():
    defs = build_definitions()
    repo = defs.get_repository_def()
    for name in ("capability_catalog_sensor", "cowork_automation_sensor"):
        assert repo.get_sensor_def(name).default_status == dg.DefaultSensorStatus.STOPPED
    sched = repo.get_schedule_def("nightly_regeneration")
    assert sched.default_status == dg.DefaultScheduleStatus.STOPPED and sched.job_name == auto.synthesis_job.name
    graph = defs.resolve_asset_graph()
    for key in ("environment_drafts", "repair_log", "validated_environments", "rejected_environments", "repair_telemetry"):
        cond = graph.get(dg.AssetKey(key)).automation_condition
        assert cond is not None and "on_missing" in str(cond.get_label() or cond) + repr(cond)
    # downstream conditions are left as declared (eager, gated on blocking checks)
    assert "eager" in repr(graph.get(dg.AssetKey("environment_splits")).automation_condition)
    assert repo.get_job(auto.synthesis_job.name).partitions_def is not None
