"""Retention of model files: `cowork vacuum` deletes the weights of registered checkpoints nothing reads any more
(neither current nor named by a retained score, nor the base of one that is) and the dataset exports of table
versions the lake no longer retains, on real folders and a real Delta lake."""
from __future__ import annotations

import os
import time
from pathlib import Path

import polars as pl

from cowork_pipeline.lake import Lake, Lineage
from cowork_pipeline.training.registry import checkpoints_in_use, delete_stale, stale_model_files

DAY = 86_400


def folder(path: Path, age_days: float, size: int = 10) -> Path:
    """A model folder whose files were written ``age_days`` ago."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"w" * size)
    (path / "config.json").write_text("{}")
    t = time.time() - age_days * DAY
    for f in path.iterdir():
        os.utime(f, (t, t))
    return path


def generation(models: Path, d: int, age_days: float) -> list[dict]:
    """What one nightly run registers: a base student, an SFT checkpoint on demonstrations version ``d``, an RL one."""
    rows = [{"checkpoint_id": f"base-d{d}", "kind": "base", "base_checkpoint_id": None},
            {"checkpoint_id": f"sft-d{d}", "kind": "sft", "base_checkpoint_id": f"base-d{d}"},
            {"checkpoint_id": f"rl-a-sft-d{d}", "kind": "rl", "base_checkpoint_id": f"sft-d{d}"}]
    for r in rows:
        r["path"] = str(folder(models / r["checkpoint_id"], age_days))
    return rows


def test_the_weights_of_superseded_checkpoints_go_and_those_in_use_stay(tmp_path: Path) -> None:
    """Three nightly generations: the newest is current, a score names the previous one's RL checkpoint (so it keeps
    its SFT and base checkpoints too), the oldest is read by nothing and goes; young, unregistered and unknown
    folders stay."""
    models, exports = tmp_path / "models", tmp_path / "datasets"
    rows = generation(models, 0, 30) + generation(models, 1, 20) + generation(models, 2, 10)
    rows.append({"checkpoint_id": "sft-d1-retrained", "kind": "sft", "base_checkpoint_id": "base-d1",
                 "path": str(folder(models / "sft-d1-retrained", 0.01))})  # younger than the retention: a run may still use it
    folder(models / "my-own-model", 30)  # no registry row names it
    in_use = checkpoints_in_use([r for r in rows if r["checkpoint_id"] != "sft-d1-retrained"], {"rl-a-sft-d1"})
    assert in_use == {"base-d2", "sft-d2", "rl-a-sft-d2", "rl-a-sft-d1", "sft-d1", "base-d1"}

    for name, age in (("demonstrations_v0", 30), ("demonstrations_v1", 0.01), ("demonstrations_v2", 10),
                      ("teacher_trajectories_v0", 30), ("notes", 30)):
        folder(exports / name, age)
    retained = {"demonstrations": {2}}
    stale = stale_model_files(models, rows, in_use, exports, retained, written_before=time.time() - DAY)
    assert [(f.kind, f.name) for f in stale] == [
        ("checkpoint", "base-d0"), ("checkpoint", "rl-a-sft-d0"), ("checkpoint", "sft-d0"), ("export", "demonstrations_v0")]
    assert all(f.bytes == 12 for f in stale)  # 10 bytes of weights + "{}"
    delete_stale(stale)
    delete_stale(stale)  # a second vacuum racing the first finds them gone: no error
    assert sorted(p.name for p in models.iterdir()) == [
        "base-d1", "base-d2", "my-own-model", "rl-a-sft-d1", "rl-a-sft-d2", "sft-d1", "sft-d1-retrained", "sft-d2"]
    assert sorted(p.name for p in exports.iterdir()) == [
        "demonstrations_v1", "demonstrations_v2", "notes", "teacher_trajectories_v0"]
    # nothing to delete where the folders are missing
    assert stale_model_files(tmp_path / "none", rows, in_use, None, retained, written_before=time.time()) == []


def nightly_lake(tmp_path: Path) -> Lake:
    """Two nightly generations, each registered by its own run and published; the published scores name generation
    1's SFT and RL checkpoints, an earlier (unretained) scores version named sft-d0; both demonstrations versions
    were exported."""
    lake = Lake(str(tmp_path / "lake"))
    models = tmp_path / "lake" / "models"
    old, new = generation(models, 0, 30), generation(models, 1, 10)
    folder(tmp_path / "lake" / "datasets" / "demonstrations_v0", 30)
    folder(tmp_path / "lake" / "datasets" / "demonstrations_v1", 30)

    def publish(table: str, df: pl.DataFrame, **upstream: int) -> int:
        v = lake.write(table, df, lineage=Lineage.local(table, upstream_versions=upstream), mode="overwrite")
        lake.promote(table, v, run_id="r")
        return v

    for d in (0, 1):
        publish("demonstrations", pl.DataFrame({"demo_id": [f"demo-{d}"]}))
    schema = {"checkpoint_id": pl.String, "kind": pl.String, "base_checkpoint_id": pl.String, "path": pl.String}
    for night, d in ((old, 0), (new, 1)):  # each night's run registers its checkpoints (a keyed write) and publishes
        registry = [{k: r[k] for k in schema} for r in night]
        for table, rows in (("checkpoints", [r for r in registry if r["kind"] != "rl"]),
                            ("rl_checkpoints", [r for r in registry if r["kind"] == "rl"])):
            v = lake.write(table, pl.DataFrame(rows, schema=schema), key=["checkpoint_id"],
                           lineage=Lineage.local(table, upstream_versions={"demonstrations": d}))
            lake.promote(table, v, run_id=f"night-{d}")
    publish("benchmark_scores", pl.DataFrame({"checkpoint_id": ["sft-d0"], "score": [0.5]}), checkpoints=0)
    publish("benchmark_scores", pl.DataFrame({"checkpoint_id": ["sft-d1", "rl-a-sft-d1"], "score": [0.6, 0.7]}), checkpoints=1)
    return lake


def test_cowork_vacuum_deletes_the_weights_no_score_and_no_current_checkpoint_reads(tmp_path: Path, capsys) -> None:
    from assets.cli import main

    lake = nightly_lake(tmp_path)
    models = tmp_path / "lake" / "models"
    assert main(["vacuum", "--lake", lake.root, "--dry-run", "--retain-hours", "24"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint weights: would delete 3 folders (0.0 MB): base-d0, rl-a-sft-d0, sft-d0" in out
    # the registry's merged rows of night 0 still name demonstrations v0 as their lineage: that version, and its export,
    # stay (an export goes with its version only: the first test)
    assert "dataset exports" not in out
    assert (models / "sft-d0").is_dir()

    assert main(["vacuum", "--lake", lake.root, "--retain-hours", "24"]) == 0
    assert "checkpoint weights: deleted 3 folders" in capsys.readouterr().out
    assert sorted(p.name for p in models.iterdir()) == ["base-d1", "rl-a-sft-d1", "sft-d1"]
    assert sorted(p.name for p in (tmp_path / "lake" / "datasets").iterdir()) == ["demonstrations_v0", "demonstrations_v1"]
    # the registry keeps its rows (lineage still names what trained a score); a second vacuum finds nothing more
    assert lake.read_promoted("checkpoints")[0].height == 4
    assert main(["vacuum", "--lake", lake.root, "--retain-hours", "24"]) == 0
    assert "and 0 model folders" in capsys.readouterr().out
    # and the lineage of a checkpoint says whether its weights are still there
    import json

    for ckpt, on_disk in (("sft-d0", False), ("sft-d1", True)):
        assert main(["lineage", ckpt, "--lake", lake.root, "--json"]) == 0
        tree = json.loads(capsys.readouterr().out)
        assert tree["tree"]["attrs"]["weights_on_disk"] is on_disk, tree


def test_the_lake_vacuum_job_and_its_schedule(tmp_path: Path) -> None:
    """The same vacuum as a Dagster job (a real instance), with its summary in the run's metadata; its weekly
    schedule starts stopped."""
    import dagster as dg

    from assets.definitions import build_definitions
    from resources import LakeResource

    lake = nightly_lake(tmp_path)
    defs = build_definitions(lake=LakeResource(root=lake.root))
    job = defs.resolve_job_def("lake_vacuum")
    with dg.instance_for_test() as instance:
        dry = job.execute_in_process(run_config={"ops": {"vacuum_lake": {"config": {"dry_run": True, "retain_hours": 24}}}},
                                     instance=instance)
        assert dry.success
        meta = [e for e in dry.all_node_events if e.event_type_value == "STEP_OUTPUT"][0].event_specific_data.metadata
        assert meta["model_folders"].value == ["base-d0", "rl-a-sft-d0", "sft-d0"]
        assert (tmp_path / "lake" / "models" / "sft-d0").is_dir()
        assert job.execute_in_process(instance=instance).success  # default config: a week; these folders are 10-30 days old
        assert sorted(p.name for p in (tmp_path / "lake" / "models").iterdir()) == ["base-d1", "rl-a-sft-d1", "sft-d1"]
        bad = job.execute_in_process(run_config={"ops": {"vacuum_lake": {"config": {"retain_hours": 0}}}},
                                     instance=instance, raise_on_error=False)
        assert not bad.success
    schedule = defs.resolve_schedule_def("weekly_vacuum")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED and schedule.job_name == "lake_vacuum"


def test_what_is_current_and_newest_is_judged_by_the_lake_itself(tmp_path: Path) -> None:
    """A lake moved elsewhere keeps its rows' old paths: "trained last" is read off the folders under its own models
    root. And the checkpoints the registry's last write registered stay even when their files look older (a folder
    restored from a backup): only what a later registration superseded goes."""
    from cowork_pipeline.training.registry import stale_in_lake

    lake = nightly_lake(tmp_path)
    moved = tmp_path / "moved"
    (tmp_path / "lake").rename(moved)
    lake = Lake(str(moved))
    stale = stale_in_lake(lake, moved / "models", moved / "datasets", retain_hours=24)
    assert [f.name for f in stale] == ["base-d0", "rl-a-sft-d0", "sft-d0"]

    t = time.time() - 40 * DAY  # generation 1's files now look older than generation 0's
    for f in (moved / "models").glob("*-d1/*"):
        os.utime(f, (t, t))
    stale = stale_in_lake(lake, moved / "models", moved / "datasets", retain_hours=24)
    # generation 0 now looks trained last, so it is current; generation 1 stays as the newest registration
    assert stale == []
