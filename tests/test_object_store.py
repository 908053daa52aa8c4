"""Delta on object storage: the Lake, the Dagster assets and the checkpoints against local S3 and Azure servers.

Every test runs against both stores: moto's S3 server (``moto[server]``) and Azurite, Microsoft's Azure Storage
emulator (from npm, installed by ``scripts/install_azurite.sh``; its cases skip where it is not installed). Each is
started by the test on 127.0.0.1 in its own process. An S3 server must not run in this process: some deltalake
calls (e.g. ``DeltaTable.history``) keep the GIL while they wait on HTTP, so an in-process (threaded) server could
not answer them and every such call would hang until the client's timeout. What the tests look for in a store they
read with the store's own client (boto3; pyarrow's AzureFileSystem configured here), not through the code under test.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import boto3  # dev dependency, with moto[server]
import dagster as dg
import polars as pl
import pyarrow as pa
import pytest

from cowork_pipeline.lake import Lake, LakeError, Lineage, NotPromoted

BUCKET = "cowork-lake"  # the S3 bucket, or the Azure container
CAPABILITY = "invoice_reconcile"
AZURITE = Path(__file__).resolve().parents[1] / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Store:
    """One object store the tests run against: its lake root, the Delta storage options that reach it, the
    environment variables that do the same for the CLI, and its own client's view of the objects in the bucket."""

    scheme: str  # "s3" or "az"
    options: dict[str, str]
    env: dict[str, str]
    keys: Callable[[str], list[str]]  # every object key under a prefix
    put: Callable[[str, bytes], None]
    get: Callable[[str], bytes]
    delete: Callable[[str], None]
    procs: list = field(default_factory=list)

    def uri(self, path: str = "", bucket: str = BUCKET) -> str:
        return f"{self.scheme}://{bucket}/{path}".rstrip("/")


def _serve(argv: list[str], ready_url: str, log_dir: Path, name: str) -> subprocess.Popen:
    """Start a local server in its own session and wait until ``ready_url`` answers (any HTTP status)."""
    log = open(log_dir / f"{name}.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(ready_url, timeout=2):
                return proc
        except urllib.error.HTTPError:
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                tail = open(log.name, errors="replace").read()[-2000:]
                _stop(proc)
                raise RuntimeError(f"{name} did not start at {ready_url} (exit code {proc.poll()}): {tail}")
            time.sleep(0.2)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def _moto(log_dir: Path) -> Store:
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = _serve([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], f"{endpoint}/moto-api/",
                  log_dir, "moto")
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"], region_name=creds["AWS_REGION"])
    try:
        s3.create_bucket(Bucket=BUCKET)
    except BaseException:
        _stop(proc)
        raise

    def keys(prefix: str) -> list[str]:
        out: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    options = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        **creds,
        # Commits are put-if-absent (If-None-Match: *), which AWS S3, MinIO and moto enforce, so concurrent
        # writers cannot overwrite each other's commit; "etag" also makes overwrites conditional (If-Match).
        "conditional_put": "etag",
    }
    return Store("s3", options, env={k: v for k, v in options.items() if k.startswith("AWS_")}, keys=keys,
                 put=lambda key, body: s3.put_object(Bucket=BUCKET, Key=key, Body=body),
                 get=lambda key: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read(),
                 delete=lambda key: s3.delete_object(Bucket=BUCKET, Key=key), procs=[proc])


def _azurite(log_dir: Path) -> Store:
    import pyarrow.fs as pafs

    if not AZURITE.exists():
        pytest.skip("Azurite is not installed (bash scripts/install_azurite.sh; it needs node and npm)")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = _serve([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
                   str(log_dir / "azurite-data"), "--silent", "--skipApiVersionCheck", "--loose"], endpoint, log_dir,
                  "azurite")
    try:
        fs = pafs.AzureFileSystem(account_name=AZURITE_ACCOUNT, account_key=AZURITE_KEY,
                                  blob_storage_authority=f"127.0.0.1:{port}", blob_storage_scheme="http",
                                  dfs_storage_authority=f"127.0.0.1:{port}", dfs_storage_scheme="http")
        fs.create_dir(BUCKET)  # the container
    except BaseException:
        _stop(proc, signal.SIGKILL)
        raise

    def keys(prefix: str) -> list[str]:
        infos = fs.get_file_info(pafs.FileSelector(BUCKET, recursive=True))
        return [k for k in (i.path[len(BUCKET) + 1:] for i in infos if i.type == pafs.FileType.File) if k.startswith(prefix)]

    def put(key: str, body: bytes) -> None:
        with fs.open_output_stream(f"{BUCKET}/{key}") as out:
            out.write(body)

    def get(key: str) -> bytes:
        with fs.open_input_stream(f"{BUCKET}/{key}") as f:
            return f.read()

    # The account's key and endpoint, as a user of a real account gives them (delta-rs wants the account in the
    # emulator's endpoint); the CLI's variables use delta-rs's emulator switch instead, the other way in.
    options = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY,
               "azure_storage_endpoint": f"{endpoint}/{AZURITE_ACCOUNT}", "allow_http": "true"}
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": endpoint}
    return Store("az", options, env, keys=keys, put=put, get=get,
                 delete=lambda key: fs.delete_file(f"{BUCKET}/{key}"), procs=[proc])


@pytest.fixture(scope="module", params=["s3", "azure"])
def store(request, tmp_path_factory):
    """A local object store (moto's S3, or Azurite) with one empty bucket (container)."""
    # boto3 and delta-rs (reqwest) honour HTTP(S)_PROXY: keep requests to the local server off any proxy.
    no_proxy = ",".join(filter(None, ["127.0.0.1", "localhost", os.environ.get("NO_PROXY", "")]))
    env = pytest.MonkeyPatch()
    env.setenv("NO_PROXY", no_proxy)
    env.setenv("no_proxy", no_proxy)
    made = None
    try:
        made = (_moto if request.param == "s3" else _azurite)(tmp_path_factory.mktemp(request.param))
        yield made
    finally:
        for proc in made.procs if made else []:
            # Azurite waits out its clients' idle connections on SIGTERM; its data is a temp dir, so kill it
            _stop(proc, signal.SIGKILL if made.scheme == "az" else signal.SIGTERM)
        env.undo()


def test_lake_write_read_promote(store):
    opts = store.options
    lake = Lake(store.uri("unit/"), storage_options=opts)
    assert lake.root == store.uri("unit") and lake.uri("envs") == store.uri("unit/envs")
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

    keys = store.keys("unit/")
    assert f"unit/envs/_delta_log/{v1:020d}.json" in keys
    assert any(k.startswith("unit/_promotions/_delta_log/") for k in keys)
    assert any(k.endswith(".parquet") and k.startswith("unit/envs/") for k in keys)


def test_stale_writer_never_overwrites_a_commit(store):
    """Two writers that both saw version 0 both commit: the second must not replace the first's version 1."""
    from deltalake import DeltaTable, write_deltalake

    opts = store.options
    uri = store.uri("race/t")
    write_deltalake(uri, pa.table({"x": [0]}), storage_options=opts)
    first, second = DeltaTable(uri, storage_options=opts), DeltaTable(uri, storage_options=opts)
    write_deltalake(first, pa.table({"x": [1]}), mode="append")
    write_deltalake(second, pa.table({"x": [2]}), mode="append")  # conflict on version 1 -> retried as version 2
    lake = Lake(store.uri("race"), storage_options=opts)
    assert lake.version("t") == 2
    assert sorted(lake.read("t")["x"].to_list()) == [0, 1, 2]


def test_missing_bucket_fails_fast_with_a_lake_error_naming_the_table(store):
    opts = store.options
    lake = Lake(store.uri("x", bucket=f"{BUCKET}-missing"), storage_options=opts)
    t0 = time.monotonic()
    with pytest.raises(LakeError, match=f"table 't' \\({store.scheme}://{BUCKET}-missing/x/t\\)"):
        lake.write("t", pl.DataFrame({"a": [1]}), lineage=Lineage.local("t"), mode="append")
    assert time.monotonic() - t0 < 30  # a client error, not retried until a timeout


def test_assets_materialize_into_an_object_store_lake(store):
    from assets.definitions import ALL_ASSETS, resources
    from assets.synthesis import SYNTH_TABLES
    from resources import SMOKE_PROFILE, LakeResource, ProfileResource

    opts = store.options
    lake_res = LakeResource(root=store.uri("cowork"), storage_options=opts)
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
    assert mats["validated_environments"]["table_uri"].value == store.uri("cowork/validated_environments")
    keys = store.keys("cowork/")
    for table in ("capability_specs", *SYNTH_TABLES, "_promotions"):
        assert any(k.startswith(f"cowork/{table}/_delta_log/") for k in keys), table


def test_model_folders_round_trip_through_the_store(store, tmp_path):
    """A model folder uploaded to the store comes back byte for byte on another machine; fetched once per upload;
    a folder whose upload did not finish, or whose files do not match its manifest, is an error that leaves the
    copy already fetched as it was."""
    from cowork_pipeline.training.model_store import MANIFEST, ModelStoreError, fetch, upload, written_at

    opts = store.options
    local = tmp_path / "trained"
    (local / "sub").mkdir(parents=True)
    (local / "model.safetensors").write_bytes(os.urandom(300_000))
    (local / "sub" / "config.json").write_text('{"a": 1}')
    uri = store.uri("models-test/models/ckpt-a")
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
    assert not any(k.endswith("sub/config.json") for k in store.keys("models-test/"))  # gone from the store too

    store.put("models-test/models/ckpt-a/model.safetensors", b"damaged")
    with pytest.raises(ModelStoreError, match="does not match its manifest.*model.safetensors"):
        fetch(uri, tmp_path / "third", opts)
    assert not (tmp_path / "third").exists()
    store.delete(f"models-test/models/ckpt-a/{MANIFEST}")  # an upload under way
    with pytest.raises(ModelStoreError, match="upload did not finish"):
        fetch(uri, elsewhere, opts)
    assert (elsewhere / "model.safetensors").read_bytes() == b"retrained"  # the fetched copy is untouched
    with pytest.raises(ModelStoreError, match="no model folder to upload"):
        upload(tmp_path / "nothing", uri, opts)


def test_a_student_trained_on_one_machine_is_scored_on_another(store, tmp_path, monkeypatch):
    """With an object-store lake the checkpoints go to the store (<lake>/models/<id>), so a step on another machine
    (a pod per step, with nothing of the training pod's disk) loads them from there: the benchmark on a fresh
    COWORK_HOME fetches the students it scores and scores them as the training machine did."""
    from assets.definitions import ALL_ASSETS, resources
    from assets.run import ensure_home, run_all
    from assets.models import CHECKPOINT_SCHEMA
    from cowork_pipeline.training.model_store import ModelStoreError, fetch, store_folders, upload
    from cowork_pipeline.training.registry import delete_stale, stale_in_lake
    from resources import SMOKE_PROFILE, AgentsResource, LakeResource, ProfileResource

    opts = store.options
    lake_res = LakeResource(root=store.uri("two-machines"), storage_options=opts)
    profile = ProfileResource(**SMOKE_PROFILE)
    monkeypatch.setenv("COWORK_HOME", str(tmp_path / "trainer"))
    # an earlier night's SFT checkpoint, in the store and registered: nothing will read it after this run
    old = tmp_path / "old-sft"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old weights")
    upload(old, f"{store.uri()}/two-machines/models/sft-old", opts)
    upload(old, f"{store.uri()}/two-machines/models/my-own-model", opts)  # a folder no registry row names
    registered = lake_res.lake().write(
        "checkpoints", pl.DataFrame([{"checkpoint_id": "sft-old", "kind": "sft", "path": f"{store.uri()}/two-machines/models/sft-old"}],
                                    schema=CHECKPOINT_SCHEMA), lineage=Lineage.local("checkpoints"), key=["checkpoint_id"])
    lake_res.lake().promote("checkpoints", registered, run_id="earlier-night", checks={})
    upload(old, f"{store.uri()}/two-machines/datasets/demonstrations_v99", opts)  # an export of a version not retained
    lines: list[str] = []
    instance = ensure_home(tmp_path / "trainer" / "dagster_home")
    run_all(profile, lake_res, instance, log=lines.append, capabilities=["invoice_reconcile", "weekly_task_digest"])
    assert all("FAILED" not in line for line in lines), "\n".join(lines)
    lake = lake_res.lake()
    rows = lake.read_promoted("checkpoints")[0].to_dicts() + lake.read_promoted("rl_checkpoints")[0].to_dicts()
    rows = [r for r in rows if r["checkpoint_id"] != "sft-old"]
    assert {r["kind"] for r in rows} == {"base", "sft", "rl"}
    keys = store.keys("two-machines/models/")
    for r in rows:
        assert r["path"] == f"{store.uri()}/two-machines/models/{r['checkpoint_id']}"
        assert f"two-machines/models/{r['checkpoint_id']}/_cowork_manifest.json" in keys
    first, _ = lake.read_promoted("benchmark_scores")
    # the demonstrations' Hugging Face dataset and the benchmark's report are in the store too, for any pod to read
    import datasets

    demos, v_demos = lake.read_promoted("demonstrations")
    meta = {k: instance.get_latest_materialization_event(dg.AssetKey(k)).asset_materialization.metadata
            for k in ("demonstrations", "benchmark_scores")}
    export = meta["demonstrations"]["hf_dataset"].value
    assert export == f"{store.uri()}/two-machines/datasets/demonstrations_v{v_demos}"
    assert len(datasets.load_from_disk(str(fetch(export, tmp_path / "export", opts)))) == demos.height > 0
    report = meta["benchmark_scores"]["report_path"].value
    assert report.startswith(f"{store.uri()}/two-machines/reports/benchmark_") and report.endswith(".md")
    assert store.get(report.split(f"{BUCKET}/", 1)[1]) == meta["benchmark_scores"]["report"].value.encode()

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

    # `cowork serve sft` on a third machine (the store's settings in environment variables, as the CLI reads them) fetches
    # the current SFT checkpoint and serves it under its id; a store folder's URI is fetched the same way
    from assets.cli import parse_args, served_checkpoint

    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("COWORK_HOME", str(tmp_path / "server"))
    rl = next(r for r in rows if r["kind"] == "rl")
    for ref, row in (("sft", next(r for r in rows if r["kind"] == "sft")), (rl["path"], rl)):
        path, name = served_checkpoint(parse_args(["serve", ref, "--lake", lake.root]))
        assert (path, name) == (str(tmp_path / "server" / "models" / "models" / row["checkpoint_id"]), row["checkpoint_id"])
        assert (Path(path) / "config.json").is_file()

    # a base checkpoint a user copied into the store with any tool (no manifest) is fine-tuned from a copy there
    base = next(r for r in rows if r["kind"] == "base")
    mine = fetch(base["path"], tmp_path / "user-base", opts)
    for f in sorted(p for p in mine.rglob("*") if p.is_file() and p.name != "_cowork_manifest.json"):
        store.put(f"user-models/tiny/{f.relative_to(mine).as_posix()}", f.read_bytes())
    external = store.uri("user-models/tiny")
    res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("sft_checkpoint"), dg.AssetKey("checkpoints")],
                         instance=dg.DagsterInstance.ephemeral(),
                         resources=resources(ProfileResource(**SMOKE_PROFILE, base_checkpoint=external), lake_res))
    assert res.success
    tuned = next(r for r in lake.read_promoted("checkpoints")[0].to_dicts() if r["base_checkpoint_id"] == "external:tiny")
    assert tuned["base_model"] == external and tuned["path"] == f"{store.uri()}/two-machines/models/{tuned['checkpoint_id']}"
    copy = tmp_path / "server" / "models" / "external" / "tiny"
    assert (copy / "config.json").read_bytes() == (mine / "config.json").read_bytes()
    # a file replaced in the store is downloaded again (the listing changed); an empty place is an error naming it
    store.put("user-models/tiny/notes.txt", b"v2")
    assert (fetch(external, copy, opts, uploaded=False) / "notes.txt").read_bytes() == b"v2"
    with pytest.raises(ModelStoreError, match="no model at"):
        fetch(store.uri("user-models/nothing-here"), tmp_path / "nothing", opts, uploaded=False)
    rows += [tuned]

    # the vacuum (here judged two hours on, past a one-hour retention) deletes from the store the weights nothing reads
    folders = store_folders(f"{store.uri()}/two-machines/models", opts)
    assert {f.name for f in folders} == {"sft-old", "my-own-model", *(r["checkpoint_id"] for r in rows)}
    exports = store_folders(f"{store.uri()}/two-machines/datasets", opts)
    assert {f.name for f in exports} == {"demonstrations_v99", f"demonstrations_v{v_demos}"}
    stale = stale_in_lake(lake, folders, exports, retain_hours=1, now=time.time() + 2 * 3600)
    assert [(f.kind, f.name, f.path) for f in stale] == [
        ("checkpoint", "sft-old", f"{store.uri()}/two-machines/models/sft-old"),
        ("export", "demonstrations_v99", f"{store.uri()}/two-machines/datasets/demonstrations_v99")]
    assert stale_in_lake(lake, folders, exports, retain_hours=1) == []  # younger than the retention: kept
    delete_stale(stale, opts)
    delete_stale(stale, opts)  # a second vacuum racing the first finds it gone: no error
    assert {f.name for f in store_folders(f"{store.uri()}/two-machines/models", opts)} == {f.name for f in folders} - {"sft-old"}
    assert [f.name for f in store_folders(f"{store.uri()}/two-machines/datasets", opts)] == [f"demonstrations_v{v_demos}"]


def _azure_settings(uri: str, options: dict[str, str]) -> tuple[str, dict]:
    from cowork_pipeline.training.model_store import filesystem

    fs, path = filesystem(uri, options)
    return path, fs.__reduce__()[1][0]  # AzureFileSystem's own settings, as it pickles them


def test_azure_uris_and_keys_reach_pyarrow_as_delta_rs_reads_them(monkeypatch):
    """Checkpoints of an Azure lake move through pyarrow's AzureFileSystem: it gets the account, the credentials and
    the endpoint from the same storage options (and environment variables) and URI forms the Delta tables use."""
    from cowork_pipeline.training.model_store import ModelStoreError, filesystem

    for name in [n for n in os.environ if n.startswith(("AZURE_", "AZURITE_"))]:
        monkeypatch.delenv(name)
    # the Hadoop form names the account; a key under any of delta-rs's names
    path, got = _azure_settings("abfss://lake@acct.dfs.core.windows.net/cowork/models/m",
                                {"azure_storage_account_key": "a2V5"})
    assert path == "lake/cowork/models/m"
    assert (got["account_name"], got["account_key"], got["blob_storage_authority"]) == ("acct", "a2V5", ".blob.core.windows.net")
    # az:// names only the container: the account comes from the options, else AZURE_STORAGE_ACCOUNT_NAME
    path, got = _azure_settings("az://lake/cowork/", {"account_name": "mine", "sas_token": "?sv=1&sig=x"})
    assert path == "lake/cowork" and got["account_name"] == "mine" and got["sas_token"] == "sv=1&sig=x"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "fromenv")
    monkeypatch.setenv("AZURE_CLIENT_ID", "app")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "secret")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant")
    _, got = _azure_settings("adl://lake/x", {})
    assert (got["account_name"], got["client_id"], got["client_secret"], got["tenant_id"]) == ("fromenv", "app", "secret", "tenant")
    # another cloud's endpoint is pyarrow's ".blob.<cloud>" authority; an emulator's keeps the account in the path
    _, got = _azure_settings("az://lake/x", {"account_key": "a2V5", "endpoint": "https://fromenv.blob.core.chinacloudapi.cn"})
    assert (got["blob_storage_authority"], got["dfs_storage_authority"]) == (".blob.core.chinacloudapi.cn", ".dfs.core.chinacloudapi.cn")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    _, got = _azure_settings("az://lake/x", {"use_emulator": "true"})  # the key, whatever client the environment names
    assert (got["account_name"], got["blob_storage_authority"], got["blob_storage_scheme"]) == (
        "devstoreaccount1", "127.0.0.1:10000", "http") and got["account_key"] == AZURITE_KEY
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:4321")
    _, got = _azure_settings("az://lake/x", {"azure_storage_use_emulator": "true", "endpoint": "http://ignored:1"})
    assert got["blob_storage_authority"] == "127.0.0.1:4321"  # delta-rs's emulator address, whatever the endpoint

    with pytest.raises(ModelStoreError, match="name the storage account.*AZURE_STORAGE_ACCOUNT_NAME"):
        filesystem("az://lake/x", {})
    with pytest.raises(ModelStoreError, match="bearer token"):
        filesystem("az://lake/x", {"account_name": "a", "bearer_token": "t", "client_id": ""})
    with pytest.raises(ModelStoreError, match="expected <container>@<account>"):
        filesystem("abfss://lake@example.com/x", {})
    with pytest.raises(ModelStoreError, match="GOOGLE_APPLICATION_CREDENTIALS.*google_service_account"):
        filesystem("gs://bucket/lake/models/m", {"google_service_account": "/keys/sa.json"})
