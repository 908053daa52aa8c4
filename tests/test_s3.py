"""Delta on S3-compatible object storage: the Lake and the Dagster assets against a local S3 server.

The server is moto's (``moto[server]``), started by the test on 127.0.0.1 in its own process. It must not run in
this process: some deltalake calls (e.g. ``DeltaTable.history``) keep the GIL while they wait on HTTP, so an
in-process (threaded) server could not answer them and every such call would hang until the client's timeout.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3  # dev dependency, with moto[server]
import dagster as dg
import polars as pl
import pyarrow as pa
import pytest

from cowork_pipeline.lake import Lake, LakeError, Lineage, NotPromoted

BUCKET = "cowork-lake"
CAPABILITY = "invoice_reconcile"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """A local S3-compatible endpoint (moto) with one empty bucket; yields (endpoint, storage_options)."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # boto3 and delta-rs (reqwest) honour HTTP(S)_PROXY: keep requests to the local server off any proxy.
    no_proxy = ",".join(filter(None, ["127.0.0.1", "localhost", os.environ.get("NO_PROXY", "")]))
    env = pytest.MonkeyPatch()
    env.setenv("NO_PROXY", no_proxy)
    env.setenv("no_proxy", no_proxy)
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    proc = None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{endpoint}/moto-api/", timeout=2):
                    pass
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    tail = open(log.name, errors="replace").read()[-2000:]
                    raise RuntimeError(f"moto server did not start on {endpoint} (exit code {proc.poll()}): {tail}")
                time.sleep(0.2)
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
                     region_name=creds["AWS_REGION"]).create_bucket(Bucket=BUCKET)
        storage_options = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            **creds,
            # Commits are put-if-absent (If-None-Match: *), which AWS S3, MinIO and moto enforce, so concurrent
            # writers cannot overwrite each other's commit; "etag" also makes overwrites conditional (If-Match).
            "conditional_put": "etag",
        }
        yield endpoint, storage_options
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
        log.close()
        env.undo()


def _s3(endpoint: str, opts: dict):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=opts["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=opts["AWS_SECRET_ACCESS_KEY"], region_name=opts["AWS_REGION"])


def _keys(endpoint: str, opts: dict, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in _s3(endpoint, opts).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def test_lake_write_read_promote_on_s3(s3_endpoint):
    endpoint, opts = s3_endpoint
    lake = Lake(f"s3://{BUCKET}/unit/", storage_options=opts)
    assert lake.root == f"s3://{BUCKET}/unit" and lake.uri("envs") == f"s3://{BUCKET}/unit/envs"
    assert not lake.exists("envs") and lake.version("envs") is None

    v0 = lake.write("envs", pl.DataFrame({"env_id": ["a", "b"], "score": [1, 2]}), lineage=Lineage.local("envs"),
                    key=["env_id"], mode="merge")
    with pytest.raises(NotPromoted):
        lake.read_promoted("envs")
    lake.promote("envs", v0, run_id="run-0", checks={"unique": True})
    v1 = lake.write("envs", pl.DataFrame({"env_id": ["b", "c"], "score": [20, 3]}), lineage=Lineage.local("envs"),
                    key=["env_id"], mode="merge")
    assert v1 == v0 + 1 == lake.version("envs")

    latest = lake.read("envs").sort("env_id")
    assert latest["env_id"].to_list() == ["a", "b", "c"] and latest["score"].to_list() == [1, 20, 3]
    promoted, v = lake.read_promoted("envs")  # readers still see the audited version, not "latest"
    assert v == v0 and sorted(promoted["env_id"].to_list()) == ["a", "b"]
    lake.promote("envs", v1, run_id="run-1")
    promoted, v = lake.read_promoted("envs")
    assert v == v1 and promoted.sort("env_id")["score"].to_list() == [1, 20, 3]
    assert [h["version"] for h in lake.history("envs")] == [v1, v0]
    assert lake.history("envs")[0]["operation"] == "MERGE"

    # partitioned write-audit-publish on object storage too
    lake.write("parts", pl.DataFrame({"cap": ["x", "y"], "n": [1, 1]}), lineage=Lineage.local("parts"), mode="overwrite")
    lake.promote("parts", 0, run_id="r", partition="x", partition_column="cap")
    lake.promote("parts", 0, run_id="r", partition="y", partition_column="cap")
    v = lake.write("parts", pl.DataFrame({"cap": ["x"], "n": [2]}), lineage=Lineage.local("parts"), mode="overwrite",
                   replace_where="cap = 'x'")
    lake.promote("parts", v, run_id="r", partition="x", partition_column="cap")
    df, _ = lake.read_promoted("parts")
    assert dict(df.select("cap", "n").iter_rows()) == {"x": 2, "y": 1}

    keys = _keys(endpoint, opts, "unit/")
    assert f"unit/envs/_delta_log/{v1:020d}.json" in keys
    assert any(k.startswith("unit/_promotions/_delta_log/") for k in keys)
    assert any(k.endswith(".parquet") and k.startswith("unit/envs/") for k in keys)


def test_stale_writer_never_overwrites_a_commit_on_s3(s3_endpoint):
    """Two writers that both saw version 0 both commit: the second must not replace the first's version 1."""
    from deltalake import DeltaTable, write_deltalake

    _, opts = s3_endpoint
    uri = f"s3://{BUCKET}/race/t"
    write_deltalake(uri, pa.table({"x": [0]}), storage_options=opts)
    first, second = DeltaTable(uri, storage_options=opts), DeltaTable(uri, storage_options=opts)
    write_deltalake(first, pa.table({"x": [1]}), mode="append")
    write_deltalake(second, pa.table({"x": [2]}), mode="append")  # conflict on version 1 -> retried as version 2
    lake = Lake(f"s3://{BUCKET}/race", storage_options=opts)
    assert lake.version("t") == 2
    assert sorted(lake.read("t")["x"].to_list()) == [0, 1, 2]


def test_missing_bucket_fails_fast_with_a_lake_error_naming_the_table(s3_endpoint):
    _, opts = s3_endpoint
    lake = Lake(f"s3://{BUCKET}-missing/x", storage_options=opts)
    t0 = time.monotonic()
    with pytest.raises(LakeError, match=f"table 't' \\(s3://{BUCKET}-missing/x/t\\)"):
        lake.write("t", pl.DataFrame({"a": [1]}), lineage=Lineage.local("t"), mode="append")
    assert time.monotonic() - t0 < 30  # a client error, not retried until a timeout


def test_assets_materialize_into_s3_lake(s3_endpoint):
    from assets.definitions import ALL_ASSETS, resources
    from assets.synthesis import SYNTH_TABLES
    from resources import SMOKE_PROFILE, LakeResource, ProfileResource

    endpoint, opts = s3_endpoint
    lake_res = LakeResource(root=f"s3://{BUCKET}/cowork", storage_options=opts)
    res = resources(ProfileResource(**SMOKE_PROFILE), lake_res)
    instance = dg.DagsterInstance.ephemeral()

    specs_run = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("capability_specs")], instance=instance, resources=res)
    assert specs_run.success
    assert all(e.passed for e in specs_run.get_asset_check_evaluations())
    assert CAPABILITY in instance.get_dynamic_partitions("capability")

    synth_run = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey(t) for t in SYNTH_TABLES], partition_key=CAPABILITY,
                               instance=instance, resources=res)
    assert synth_run.success
    checks = {e.asset_check_key.name: e.passed for e in synth_run.get_asset_check_evaluations()}
    assert checks == {f"{t}_quality": True for t in SYNTH_TABLES}, checks

    lake = lake_res.lake()
    specs, v_spec = lake.read_promoted("capability_specs")
    assert CAPABILITY in specs["capability_id"].to_list()
    envs, _ = lake.read_promoted("validated_environments")
    assert len(envs) > 0 and set(envs["capability_id"]) == {CAPABILITY}
    assert envs["env_id"].n_unique() == len(envs)
    assert set(envs["_run_id"]) == {synth_run.run_id}
    telemetry, _ = lake.read_promoted("repair_telemetry")
    assert telemetry["capability_id"].to_list() == [CAPABILITY]
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in synth_run.get_asset_materialization_events()}
    assert mats["validated_environments"]["table_uri"].value == f"s3://{BUCKET}/cowork/validated_environments"
    keys = _keys(endpoint, opts, "cowork/")
    for table in ("capability_specs", *SYNTH_TABLES, "_promotions"):
        assert any(k.startswith(f"cowork/{table}/_delta_log/") for k in keys), table


def test_model_folders_round_trip_through_the_store(s3_endpoint, tmp_path):
    """A model folder uploaded to the store comes back byte for byte on another machine; fetched once per upload;
    a folder whose upload did not finish, or whose files do not match its manifest, is an error that leaves the
    copy already fetched as it was."""
    from cowork_pipeline.training.model_store import MANIFEST, ModelStoreError, fetch, upload, written_at

    endpoint, opts = s3_endpoint
    local = tmp_path / "trained"
    (local / "sub").mkdir(parents=True)
    (local / "model.safetensors").write_bytes(os.urandom(300_000))
    (local / "sub" / "config.json").write_text('{"a": 1}')
    uri = f"s3://{BUCKET}/models-test/models/ckpt-a"
    assert written_at(uri, opts) == -1.0
    manifest = upload(local, uri, opts)
    assert set(manifest["files"]) == {"model.safetensors", "sub/config.json"}
    assert written_at(uri, opts) == manifest["written_at"] > 0

    elsewhere = tmp_path / "other-machine" / "ckpt-a"
    assert fetch(uri, elsewhere, opts) == elsewhere
    for rel in ("model.safetensors", "sub/config.json"):
        assert (elsewhere / rel).read_bytes() == (local / rel).read_bytes()
    inode = (elsewhere / "model.safetensors").stat().st_ino
    fetch(uri, elsewhere, opts)
    assert (elsewhere / "model.safetensors").stat().st_ino == inode  # the same upload: not downloaded again
    assert fetch(uri, local, opts) == local and (local / MANIFEST).is_file()  # the trainer's own folder is that upload

    (local / "model.safetensors").write_bytes(b"retrained")  # a retrain under the same id replaces the files
    (local / "sub" / "config.json").unlink()
    upload(local, uri, opts)
    fetch(uri, elsewhere, opts)
    assert (elsewhere / "model.safetensors").read_bytes() == b"retrained" and not (elsewhere / "sub" / "config.json").exists()
    assert not any(k.endswith("sub/config.json") for k in _keys(endpoint, opts, "models-test/"))  # gone from the store too

    s3 = _s3(endpoint, opts)
    s3.put_object(Bucket=BUCKET, Key="models-test/models/ckpt-a/model.safetensors", Body=b"damaged")
    with pytest.raises(ModelStoreError, match="does not match its manifest.*model.safetensors"):
        fetch(uri, tmp_path / "third", opts)
    assert not (tmp_path / "third").exists()
    s3.delete_object(Bucket=BUCKET, Key=f"models-test/models/ckpt-a/{MANIFEST}")  # an upload under way
    with pytest.raises(ModelStoreError, match="upload did not finish"):
        fetch(uri, elsewhere, opts)
    assert (elsewhere / "model.safetensors").read_bytes() == b"retrained"  # the fetched copy is untouched
    with pytest.raises(ModelStoreError, match="no model folder to upload"):
        upload(tmp_path / "nothing", uri, opts)


def test_a_student_trained_on_one_machine_is_scored_on_another(s3_endpoint, tmp_path, monkeypatch):
    """With an object-store lake the checkpoints go to the store (<lake>/models/<id>), so a step on another machine
    (a pod per step, with nothing of the training pod's disk) loads them from there: the benchmark on a fresh
    COWORK_HOME fetches the students it scores and scores them as the training machine did."""
    from assets.definitions import ALL_ASSETS, resources
    from assets.run import ensure_home, run_all
    from assets.models import CHECKPOINT_SCHEMA
    from cowork_pipeline.training.model_store import ModelStoreError, fetch, store_folders, upload
    from cowork_pipeline.training.registry import delete_stale, stale_in_lake
    from resources import SMOKE_PROFILE, AgentsResource, LakeResource, ProfileResource

    endpoint, opts = s3_endpoint
    lake_res = LakeResource(root=f"s3://{BUCKET}/two-machines", storage_options=opts)
    profile = ProfileResource(**SMOKE_PROFILE)
    monkeypatch.setenv("COWORK_HOME", str(tmp_path / "trainer"))
    # an earlier night's SFT checkpoint, in the store and registered: nothing will read it after this run
    old = tmp_path / "old-sft"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old weights")
    upload(old, f"s3://{BUCKET}/two-machines/models/sft-old", opts)
    upload(old, f"s3://{BUCKET}/two-machines/models/my-own-model", opts)  # a folder no registry row names
    registered = lake_res.lake().write(
        "checkpoints", pl.DataFrame([{"checkpoint_id": "sft-old", "kind": "sft", "path": f"s3://{BUCKET}/two-machines/models/sft-old"}],
                                    schema=CHECKPOINT_SCHEMA), lineage=Lineage.local("checkpoints"), key=["checkpoint_id"])
    lake_res.lake().promote("checkpoints", registered, run_id="earlier-night", checks={})
    upload(old, f"s3://{BUCKET}/two-machines/datasets/demonstrations_v99", opts)  # an export of a version not retained
    lines: list[str] = []
    instance = ensure_home(tmp_path / "trainer" / "dagster_home")
    run_all(profile, lake_res, instance, log=lines.append, capabilities=["invoice_reconcile", "weekly_task_digest"])
    assert all("FAILED" not in line for line in lines), "\n".join(lines)
    lake = lake_res.lake()
    rows = lake.read_promoted("checkpoints")[0].to_dicts() + lake.read_promoted("rl_checkpoints")[0].to_dicts()
    rows = [r for r in rows if r["checkpoint_id"] != "sft-old"]
    assert {r["kind"] for r in rows} == {"base", "sft", "rl"}
    keys = _keys(endpoint, opts, "two-machines/models/")
    for r in rows:
        assert r["path"] == f"s3://{BUCKET}/two-machines/models/{r['checkpoint_id']}"
        assert f"two-machines/models/{r['checkpoint_id']}/_cowork_manifest.json" in keys
    first, _ = lake.read_promoted("benchmark_scores")
    # the demonstrations' Hugging Face dataset and the benchmark's report are in the store too, for any pod to read
    import datasets

    demos, v_demos = lake.read_promoted("demonstrations")
    meta = {k: instance.get_latest_materialization_event(dg.AssetKey(k)).asset_materialization.metadata
            for k in ("demonstrations", "benchmark_scores")}
    export = meta["demonstrations"]["hf_dataset"].value
    assert export == f"s3://{BUCKET}/two-machines/datasets/demonstrations_v{v_demos}"
    assert len(datasets.load_from_disk(str(fetch(export, tmp_path / "export", opts)))) == demos.height > 0
    report = meta["benchmark_scores"]["report_path"].value
    assert report.startswith(f"s3://{BUCKET}/two-machines/reports/benchmark_") and report.endswith(".md")
    assert _s3(endpoint, opts).get_object(Bucket=BUCKET, Key=report.split(f"{BUCKET}/", 1)[1])["Body"].read() == meta["benchmark_scores"]["report"].value.encode()

    shutil.rmtree(tmp_path / "trainer" / "models")  # the training pod is gone, and its disk with it
    monkeypatch.setenv("COWORK_HOME", str(tmp_path / "scorer"))  # another machine
    res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("benchmark_scores")], instance=dg.DagsterInstance.ephemeral(),
                         resources=resources(profile, lake_res, agents=AgentsResource(rescore=True)))
    assert res.success
    again, _ = lake.read_promoted("benchmark_scores")
    assert set(again["_run_id"]) == {res.run_id}  # every agent scored anew, by this run
    students = sorted(a for a in again["agent"].unique() if not a.startswith("teacher"))
    assert students and all((tmp_path / "scorer" / "models" / "models" / a.split(":", 1)[1]).is_dir() for a in students)
    cols = ["agent", "env_id", "trial", "score", "passed"]
    assert again.select(cols).sort(cols).equals(first.select(cols).sort(cols))  # the same weights, the same verdicts

    from cowork_pipeline.lineage import trace

    sft = next(r["checkpoint_id"] for r in rows if r["kind"] == "sft")
    assert trace(lake, sft).attrs["weights_in_store"] is True  # `cowork lineage` says the weights are there

    # `cowork serve sft` on a third machine (the store's settings in AWS_* variables, as the CLI reads them) fetches
    # the current SFT checkpoint and serves it under its id; a store folder's URI is fetched the same way
    from assets.cli import parse_args, served_checkpoint

    for key in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(key, opts[key])
    monkeypatch.setenv("COWORK_HOME", str(tmp_path / "server"))
    rl = next(r for r in rows if r["kind"] == "rl")
    for ref, row in (("sft", next(r for r in rows if r["kind"] == "sft")), (rl["path"], rl)):
        path, name = served_checkpoint(parse_args(["serve", ref, "--lake", lake.root]))
        assert (path, name) == (str(tmp_path / "server" / "models" / "models" / row["checkpoint_id"]), row["checkpoint_id"])
        assert (Path(path) / "config.json").is_file()

    # a base checkpoint a user copied into the store with any S3 tool (no manifest) is fine-tuned from a copy there
    s3 = _s3(endpoint, opts)
    base = next(r for r in rows if r["kind"] == "base")
    mine = fetch(base["path"], tmp_path / "user-base", opts)
    for f in sorted(p for p in mine.rglob("*") if p.is_file() and p.name != "_cowork_manifest.json"):
        s3.put_object(Bucket=BUCKET, Key=f"user-models/tiny/{f.relative_to(mine).as_posix()}", Body=f.read_bytes())
    external = f"s3://{BUCKET}/user-models/tiny"
    res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("sft_checkpoint"), dg.AssetKey("checkpoints")],
                         instance=dg.DagsterInstance.ephemeral(),
                         resources=resources(ProfileResource(**SMOKE_PROFILE, base_checkpoint=external), lake_res))
    assert res.success
    tuned = next(r for r in lake.read_promoted("checkpoints")[0].to_dicts() if r["base_checkpoint_id"] == "external:tiny")
    assert tuned["base_model"] == external and tuned["path"] == f"s3://{BUCKET}/two-machines/models/{tuned['checkpoint_id']}"
    copy = tmp_path / "server" / "models" / "external" / "tiny"
    assert (copy / "config.json").read_bytes() == (mine / "config.json").read_bytes()
    # a file replaced in the store is downloaded again (the listing changed); an empty place is an error naming it
    s3.put_object(Bucket=BUCKET, Key="user-models/tiny/notes.txt", Body=b"v2")
    assert (fetch(external, copy, opts, uploaded=False) / "notes.txt").read_bytes() == b"v2"
    with pytest.raises(ModelStoreError, match="no model at"):
        fetch(f"s3://{BUCKET}/user-models/nothing-here", tmp_path / "nothing", opts, uploaded=False)
    rows += [tuned]

    # the vacuum (here judged two hours on, past a one-hour retention) deletes from the store the weights nothing reads
    store = store_folders(f"s3://{BUCKET}/two-machines/models", opts)
    assert {f.name for f in store} == {"sft-old", "my-own-model", *(r["checkpoint_id"] for r in rows)}
    exports = store_folders(f"s3://{BUCKET}/two-machines/datasets", opts)
    assert {f.name for f in exports} == {"demonstrations_v99", f"demonstrations_v{v_demos}"}
    stale = stale_in_lake(lake, store, exports, retain_hours=1, now=time.time() + 2 * 3600)
    assert [(f.kind, f.name, f.path) for f in stale] == [
        ("checkpoint", "sft-old", f"s3://{BUCKET}/two-machines/models/sft-old"),
        ("export", "demonstrations_v99", f"s3://{BUCKET}/two-machines/datasets/demonstrations_v99")]
    assert stale_in_lake(lake, store, exports, retain_hours=1) == []  # younger than the retention: kept
    delete_stale(stale, opts)
    delete_stale(stale, opts)  # a second vacuum racing the first finds it gone: no error
    assert {f.name for f in store_folders(f"s3://{BUCKET}/two-machines/models", opts)} == {f.name for f in store} - {"sft-old"}
    assert [f.name for f in store_folders(f"s3://{BUCKET}/two-machines/datasets", opts)] == [f"demonstrations_v{v_demos}"]
