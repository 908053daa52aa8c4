"""The Dagster shell on a real instance and real Delta tables: definitions load, write-audit-publish
holds within and across runs, lineage columns and commit metadata are right, a smoke run works."""
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from _concurrent import at_once
from assets._io import check_spec, write_checked
from assets.definitions import ALL_ASSETS, build_definitions, resources
from assets.run import ensure_home, run_all
from cowork_pipeline.lake import LINEAGE_COLUMNS, Lake, Lineage, NotPromoted
from cowork_pipeline.quality import Expect
from cowork_pipeline.splits import with_tasks
from resources import SMOKE_PROFILE, LakeResource, ProfileResource

ROOT = Path(__file__).resolve().parent.parent


def test_workspace_definitions_validate():
    out = subprocess.run([sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr


def test_every_artifact_is_an_asset_with_a_blocking_check_and_gpu_pool_for_training():
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    keys = {k.path[-1] for k in graph.get_all_asset_keys()}
    assert {"capability_specs", "environment_drafts", "validated_environments", "repair_log", "rejected_environments",
            "environment_splits", "teacher_trajectories", "demonstrations", "sft_checkpoint", "checkpoints", "benchmark_scores"} <= keys
    checks = {ck.asset_key.path[-1]: ck for a in ALL_ASSETS for ck in a.check_keys}
    assert {"validated_environments", "environment_splits", "demonstrations"} <= set(checks)
    for a in ALL_ASSETS:
        for spec in a.check_specs:
            assert spec.blocking, spec
    sft = next(a for a in ALL_ASSETS if dg.AssetKey("sft_checkpoint") in a.keys)
    assert sft.op.pool == "gpu"


# --- write-audit-publish, with the same mechanism the real assets use -------------------------------------
@dg.asset(check_specs=[check_spec("wap_table", "ids unique")])
def wap_table(context: dg.AssetExecutionContext, lake: LakeResource, config: dg.PermissiveConfig):
    ids = config.ids if hasattr(config, "ids") else config.model_dump()["ids"]
    df = pl.DataFrame({"id": ids, "value": list(range(len(ids)))})
    lin = Lineage(context.run.run_id, "wap_table", "1", {})
    mat, check = write_checked(context, lake.lake(), "wap_table", df, lin=lin,
                               suite=[Expect("ExpectColumnValuesToBeUnique", {"column": "id"})])
    yield mat
    yield check


@dg.asset(deps=[wap_table])
def wap_downstream(context: dg.AssetExecutionContext, lake: LakeResource):
    df, version = lake.lake().read_promoted("wap_table")
    context.add_output_metadata({"read_version": version, "rows": len(df)})
    return None


class RegistryRows(dg.Config):
    rows: dict[str, int]


@dg.asset(check_specs=[check_spec("wap_registry", "values not negative")])
def wap_registry(context: dg.AssetExecutionContext, lake: LakeResource, config: RegistryRows):
    """Keyed rows merged into the table, as the checkpoint registries are."""
    rows = config.rows
    df = pl.DataFrame({"id": list(rows), "value": list(rows.values())})
    mat, check = write_checked(context, lake.lake(), "wap_registry", df, key=["id"], lin=Lineage(context.run.run_id, "wap_registry", "1", {}),
                               suite=[Expect("ExpectColumnValuesToBeBetween", {"column": "value", "min_value": 0})])
    yield mat
    yield check


def _register(instance, lake_res, rows):
    return dg.materialize([wap_registry], instance=instance, resources={"lake": lake_res},
                          run_config={"ops": {"wap_registry": {"config": {"rows": rows}}}}, raise_on_error=False)


def test_merged_rows_that_failed_their_check_are_never_published_by_a_later_merge(tmp_path):
    """A keyed merge writes onto the published rows, not onto a failed write's: the rows that failed their check stay
    in the table's history and out of every later published version."""
    instance = dg.DagsterInstance.ephemeral()
    lake_res = LakeResource(root=str(tmp_path / "lake"))
    lake = lake_res.lake()
    assert _register(instance, lake_res, {"a": 1, "b": 2}).success
    bad = _register(instance, lake_res, {"bad": -1, "a": -5})
    assert not bad.get_asset_check_evaluations()[0].passed
    assert sorted(lake.read("wap_registry")["id"].to_list()) == ["a", "b", "bad"]  # written: the audit trail
    assert _register(instance, lake_res, {"c": 3, "b": 20}).success
    df, v = lake.read_promoted("wap_registry")
    assert v == lake.version("wap_registry")
    assert dict(zip(*df.sort("id").select("id", "value").to_dict(as_series=False).values())) == {"a": 1, "b": 20, "c": 3}
    assert set(df["_run_id"]) == {r.run_id for r in instance.get_runs() if r.run_config["ops"]["wap_registry"]["config"]["rows"].get("a") != -5}
    # a table whose only write failed publishes nothing of it
    lake_res2 = LakeResource(root=str(tmp_path / "lake2"))
    assert not _register(instance, lake_res2, {"bad": -1}).get_asset_check_evaluations()[0].passed
    assert _register(instance, lake_res2, {"ok": 1}).success
    assert lake_res2.lake().read_promoted("wap_registry")[0]["id"].to_list() == ["ok"]


def _materialize(instance, lake_res, ids):
    return dg.materialize([wap_table, wap_downstream], instance=instance, resources={"lake": lake_res},
                          run_config={"ops": {"wap_table": {"config": {"ids": ids}}}}, raise_on_error=False)


def test_failed_check_blocks_downstream_and_never_promotes(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    lake_res = LakeResource(root=str(tmp_path / "lake"))
    lake = lake_res.lake()
    good = _materialize(instance, lake_res, ["a", "b", "c"])
    assert good.success
    v_good = lake.promoted_version("wap_table")
    assert v_good == lake.version("wap_table")
    bad = _materialize(instance, lake_res, ["x", "x", "y"])  # duplicate ids: the blocking check fails
    checks = bad.get_asset_check_evaluations()
    assert checks and not checks[0].passed
    assert "duplicate" in checks[0].metadata["summary"].value
    failures = checks[0].metadata["failures"].value
    assert failures and failures[0]["sample_rows"], "failing expectations carry sample rows"
    # the bad rows were written (audit trail) but not promoted: readers still see the good version
    assert lake.version("wap_table") > v_good
    assert lake.promoted_version("wap_table") == v_good
    df, v = lake.read_promoted("wap_table")
    assert v == v_good and sorted(df["id"].to_list()) == ["a", "b", "c"]
    # same run: the downstream step did not run (blocking check)
    downstream_mats = [e for e in bad.get_asset_materialization_events() if e.asset_key == dg.AssetKey("wap_downstream")]
    assert not downstream_mats
    # across runs: materializing downstream alone still reads the last promoted version exactly
    alone = dg.materialize([wap_table, wap_downstream], selection=[dg.AssetKey("wap_downstream")], instance=instance,
                           resources={"lake": lake_res})
    mat = alone.get_asset_materialization_events()[0].materialization
    assert mat.metadata["read_version"].value == v_good and mat.metadata["rows"].value == 3


def test_concurrent_keyed_writes_publish_every_passing_row_and_no_failing_one(tmp_path):
    """Runs merging keyed rows into one table at once (two RL runs registering checkpoints): each passing write is
    published, together with the others' (none is rolled back by a later promotion of an earlier merge), and the
    failing one never is, whatever the interleaving."""
    lake = Lake(str(tmp_path / "lake"))
    suite = [Expect("ExpectColumnValuesToBeBetween", {"column": "value", "min_value": 0})]
    write_checked(None, lake, "registry", pl.DataFrame({"id": ["seed"], "value": [0]}), key=["id"], suite=suite,
                  lin=Lineage("seed", "registry", "1", {}))
    rows = {f"w{w}": (-1 if w == 2 else w) for w in range(6)}

    def work(name: str) -> None:
        write_checked(None, lake, "registry", pl.DataFrame({"id": [name], "value": [rows[name]]}), key=["id"], suite=suite,
                      lin=Lineage(name, "registry", "1", {}))

    at_once(work, [(n,) for n in rows])
    df, _ = lake.read_promoted("registry")
    assert sorted(df["id"].to_list()) == sorted(["seed", *(n for n, v in rows.items() if v >= 0)])
    # the failing rows were written (the audit trail), then undone before the next merge
    assert any("w2" in lake.read("registry", version=v)["id"].to_list() for v in range(lake.version("registry") + 1))


def test_a_whole_table_write_never_rolls_back_a_later_one_published_meanwhile(tmp_path):
    """Runs replacing one whole table at once: whatever the interleaving, the published version is the latest write
    that passed (an earlier write promoted after it would roll it back); the earlier ones say they were superseded."""
    lake = Lake(str(tmp_path / "lake"))
    suite = [Expect("ExpectColumnValuesToNotBeNull", {"column": "id"})]
    results = {}

    def work(w: int) -> None:
        mat, _ = write_checked(None, lake, "splits", pl.DataFrame({"id": [f"w{w}"]}), suite=suite, lin=Lineage(f"w{w}", "splits", "1", {}))
        results[w] = mat.metadata

    at_once(work, [(w,) for w in range(6)])
    latest = max(m["delta_version"] for m in results.values())
    df, v = lake.read_promoted("splits")
    assert v == latest and df["id"].to_list() == [f"w{w}" for w, m in results.items() if m["delta_version"] == latest]
    for m in results.values():
        assert m["promoted"] or m["superseded_by_version"] > m["delta_version"]
    # promoted in version order: no promotion of an earlier version follows a later one
    promoted = lake.promotions("splits")["version"].to_list()
    assert promoted == sorted(promoted), promoted


class _Overtaken(Lake):
    """A real lake on which another run writes and publishes the same table right after this run's write (before
    this run promotes), one other run after each write: the interleaving of runs, made certain."""

    def __init__(self, root: str, *other_runs) -> None:
        super().__init__(root, backoff_s=0.001, max_backoff_s=0.01)
        self.other_runs = [r for r in other_runs if r is not None]

    def write(self, table, df, **kwargs):
        version = super().write(table, df, **kwargs)
        if self.other_runs:
            self.other_runs.pop(0)()
        return version


@pytest.mark.parametrize("partition", [None, ("capability_id", "a")])
def test_a_write_overtaken_by_another_run_does_not_roll_it_back(tmp_path, partition):
    """Run 1 writes the table (or a partition), run 2 writes and publishes it after that, then run 1's checks pass:
    run 1 is superseded, run 2's rows stay published; a run publishing another partition meanwhile supersedes nothing."""
    root, suite = str(tmp_path / "lake"), [Expect("ExpectColumnValuesToNotBeNull", {"column": "id"})]

    def rows(i: str, cap: str = "a") -> pl.DataFrame:
        return pl.DataFrame({"capability_id": [cap], "id": [i]})

    plain = Lake(root)
    second = {}
    run2 = lambda: second.update(write_checked(None, plain, "envs", rows("run2"), suite=suite, partition=partition,  # noqa: E731
                                               lin=Lineage("run2", "envs", "1", {}))[0].metadata)
    first, check = write_checked(None, _Overtaken(root, run2), "envs", rows("run1"), suite=suite, partition=partition, lin=Lineage("run1", "envs", "1", {}))
    assert second["promoted"] and second["delta_version"] > first.metadata["delta_version"]
    assert not first.metadata["promoted"] and first.metadata["superseded_by_version"] == second["delta_version"]
    # the check passed (the data is fine) and says it was not promoted, and why
    assert check.passed and not check.metadata["promoted"].value and check.metadata["superseded_by_version"].value == second["delta_version"]
    assert check.description.endswith(f"not promoted: version {second['delta_version']}, published by another run meanwhile, is newer")
    published, _ = plain.read_promoted("envs")
    assert published.filter(pl.col("capability_id") == "a")["id"].to_list() == ["run2"]
    # overtaken by another partition's run only (or by no run): published all the same
    other = (lambda: write_checked(None, plain, "envs", rows("b0", "b"), suite=suite, partition=("capability_id", "b"),
                                   lin=Lineage("b", "envs", "1", {}))) if partition else None
    third, check = write_checked(None, _Overtaken(root, other), "envs", rows("run3"), suite=suite, partition=partition, lin=Lineage("run3", "envs", "1", {}))
    assert check.metadata["promoted"].value and "not promoted" not in check.description
    assert third.metadata["promoted"] and plain.read_promoted("envs")[0].filter(pl.col("capability_id") == "a")["id"].to_list() == ["run3"]
    if partition:
        assert plain.promoted_version("envs", "b") > third.metadata["delta_version"] == plain.promoted_version("envs", "a")


def test_a_keyed_write_overtaken_again_and_again_merges_again_until_it_is_published(tmp_path):
    """A busy table: eight other runs each publish a keyed row between this run's merge and its promotion. It merges
    onto their rows each time and is published in the end, every run's row with it (five tries used to give up)."""
    root, suite = str(tmp_path / "lake"), [Expect("ExpectColumnValuesToNotBeNull", {"column": "id"})]
    plain = Lake(root)

    def publish(lake: Lake, name: str):
        return write_checked(None, lake, "registry", pl.DataFrame({"id": [name]}), key=["id"], suite=suite,
                             lin=Lineage(name, "registry", "1", {}))[0]

    publish(plain, "seed")
    others = [lambda i=i: publish(plain, f"other{i}") for i in range(8)]
    lake = _Overtaken(root, *others)
    mat = publish(lake, "mine")
    assert mat.metadata["promoted"] and not lake.other_runs and lake.retries == mat.metadata["retries"] == 8
    published, version = plain.read_promoted("registry")
    assert version == mat.metadata["delta_version"]
    assert sorted(published["id"]) == sorted(["seed", "mine", *(f"other{i}" for i in range(8))])


def test_downstream_of_never_promoted_table_fails_clearly(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    lake.write("t", pl.DataFrame({"id": ["a"]}), lineage=Lineage.local("t"), mode="append")
    with pytest.raises(NotPromoted, match="t"):
        lake.read_promoted("t")


# --- a real smoke run of the whole graph -----------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    home = tmp_path_factory.mktemp("cowork")
    instance = ensure_home(home / "dagster_home")
    profile = ProfileResource(**SMOKE_PROFILE)
    lake_res = LakeResource(root=str(home / "lake"))
    lines: list[str] = []
    timings = run_all(profile, lake_res, instance, log=lines.append,
                      capabilities=["invoice_reconcile", "ticket_triage_followup", "weekly_task_digest"])
    return lake_res.lake(), instance, timings, lines


def test_smoke_run_materializes_every_table_with_lineage(smoke_run):
    lake, instance, timings, lines = smoke_run
    assert all("FAILED" not in line for line in lines), "\n".join(lines)
    for table in ("capability_specs", "validated_environments", "repair_log", "environment_splits", "teacher_trajectories",
                  "demonstrations", "checkpoints", "benchmark_scores"):
        df, version = lake.read_promoted(table)
        assert len(df) > 0, table
        for col in LINEAGE_COLUMNS:
            assert col in df.columns, (table, col)
        committed = {h["run_id"] for h in lake.history(table, limit=None)}
        assert set(df["_run_id"]) <= committed, table  # every row's run id is on a commit of the table
        for run_id in set(df["_run_id"]):
            assert instance.get_run_by_id(run_id) is not None, f"{table}: {run_id} is a real Dagster run"
    envs, v_env = lake.read_promoted("validated_environments")
    splits, _ = lake.read_promoted("environment_splits")
    up = json.loads(splits["_upstream_versions"][0])
    assert up["validated_environments"] == v_env  # the exact version it was computed from
    assert set(envs["capability_id"]) == {"invoice_reconcile", "ticket_triage_followup", "weekly_task_digest"}
    assert set(splits.filter(pl.col("capability_id") == "weekly_task_digest")["split"]) == {"heldout_capability"}
    # the distinct tasks, and per capability that repeats itself its environments and tasks
    meta = instance.get_latest_materialization_event(dg.AssetKey("environment_splits")).asset_materialization.metadata
    tasks = with_tasks(envs).group_by("capability_id").agg(n=pl.len(), k=pl.col("task").n_unique())
    assert meta["n_distinct_tasks"].value == with_tasks(envs)["task"].n_unique() == tasks["k"].sum()
    assert meta["repeated_tasks_by_capability"].value == {c: {"environments": n, "distinct_tasks": k} for c, n, k in tasks.iter_rows() if k < n}
    demos, _ = lake.read_promoted("demonstrations")
    assert set(demos["split"]) == {"train"}
    assert "weekly_task_digest" not in set(demos["capability_id"])
    scores, _ = lake.read_promoted("benchmark_scores")
    assert {"base", "sft", "teacher"} <= {a.split(":")[0] for a in scores["agent"].unique()}
    assert set(scores["split"]) <= {"heldout_env", "heldout_capability"}
    # the report, in the UI and on disk, says per trained agent why it failed
    meta = instance.get_latest_materialization_event(dg.AssetKey("benchmark_scores")).asset_materialization.metadata
    assert "## Failures" in meta["report"].value and "### sft:" in meta["report"].value
    assert Path(meta["report_path"].value).read_text() == meta["report"].value


def test_partition_rerun_is_idempotent_and_leaves_other_partitions_untouched(smoke_run, tmp_path):
    lake, instance, _, _ = smoke_run
    before, _ = lake.read_promoted("validated_environments")
    other_before = before.filter(pl.col("capability_id") != "invoice_reconcile").sort("env_id")
    res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey(t) for t in ("environment_drafts", "repair_log", "validated_environments",
                                                                          "rejected_environments", "repair_telemetry")],
                         partition_key="invoice_reconcile", instance=instance,
                         resources=resources(ProfileResource(**SMOKE_PROFILE), LakeResource(root=lake.root)))
    assert res.success
    after, _ = lake.read_promoted("validated_environments")
    assert len(after) == len(before)  # no duplicate rows
    assert after["env_id"].n_unique() == len(after)
    other_after = after.filter(pl.col("capability_id") != "invoice_reconcile").sort("env_id")
    assert other_after["_run_id"].to_list() == other_before["_run_id"].to_list()  # untouched
    assert other_after["spec_hash"].to_list() == other_before["spec_hash"].to_list()


def test_another_student_seed_trains_beside_seed_0_and_leaves_its_weights_alone(smoke_run, tmp_path):
    """`--student-seed N` re-trains the student from the same demonstrations: its checkpoints are registered under their
    own ids, the new ones are what the benchmark scores next, and seed 0's weights (which earlier scores trace back to)
    stay where they were, unchanged."""
    import hashlib
    import shutil

    from assets.cli import parse_args
    from cowork_pipeline.training.registry import current_checkpoints

    def digest(folder: str) -> str:
        files = sorted(f for f in Path(folder).rglob("*") if f.is_file())
        return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()

    lake = Lake(str(shutil.copytree(smoke_run[0].root, tmp_path / "lake")))
    before = lake.read_promoted("checkpoints")[0].to_dicts()
    seed0 = {r["checkpoint_id"]: digest(r["path"]) for r in before}
    assert parse_args(["run", "--student-seed", "1"]).student_seed == 1
    res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("sft_checkpoint"), dg.AssetKey("checkpoints")],
                         instance=dg.DagsterInstance.ephemeral(),
                         resources=resources(ProfileResource(**SMOKE_PROFILE, student_seed=1), LakeResource(root=lake.root)))
    assert res.success
    rows = lake.read_promoted("checkpoints")[0].to_dicts()
    new = {r["checkpoint_id"] for r in rows} - seed0.keys()
    assert {r["checkpoint_id"] for r in rows} >= seed0.keys()  # seed 0's stay registered
    assert sorted(k.split("-")[0] for k in new) == ["sft", "student"] and all("-seed1" in k for k in new), new
    assert {r["checkpoint_id"] for r in current_checkpoints(rows)} == new
    assert {r["checkpoint_id"]: digest(r["path"]) for r in before} == seed0  # untouched
    by_id = {r["checkpoint_id"]: r for r in rows}
    base0, base1 = (next(k for k in ids if k.startswith("student-base")) for ids in (seed0, new))
    assert digest(by_id[base1]["path"]) != seed0[base0]  # another initialization
    assert json.loads(by_id[base1]["config_json"])["seed"] == 1


def test_cowork_serve_serves_a_registered_checkpoint_by_id_or_by_kind(smoke_run, tmp_path, capsys):
    """`cowork serve sft` (or base, rl:CONFIG, or a checkpoint id) serves the checkpoint the lake's registry names, the
    one the benchmark scores, under its id, so a user need not dig out its folder; a folder still works, and a name
    that is no checkpoint says which ones are current."""
    import time
    import urllib.request

    from assets.cli import main, parse_args, served_checkpoint

    lake = smoke_run[0]
    home = Path(lake.root).parent
    rows = lake.read_promoted("checkpoints")[0].to_dicts() + lake.read_promoted("rl_checkpoints")[0].to_dicts()
    by_kind = {k: [r for r in rows if r["kind"] == k] for k in ("base", "sft", "rl")}
    assert len(by_kind["base"]) == len(by_kind["sft"]) == 1 and len(by_kind["rl"]) == 2  # the smoke profile's
    (sft,), (base,) = by_kind["sft"], by_kind["base"]
    partial_turn = next(r for r in by_kind["rl"] if r["checkpoint_id"].startswith("rl-partial_turn-"))

    def resolve(ref: str) -> tuple[str, str | None]:
        return served_checkpoint(parse_args(["--home", str(home), "serve", ref, "--lake", lake.root]))

    for ref, row in (("sft", sft), (sft["checkpoint_id"], sft), ("base", base), ("rl:partial_turn", partial_turn)):
        assert resolve(ref) == (row["path"], row["checkpoint_id"]), ref
    assert resolve(sft["path"]) == (sft["path"], None)  # a folder is served as it is
    # names that are no single checkpoint: the error lists what there is, nothing is served
    assert main(["--home", str(home), "serve", "rl", "--lake", lake.root]) == 2
    assert "2 current rl checkpoints; name one: rl:binary_traj, rl:partial_turn" in capsys.readouterr().err
    assert main(["--home", str(home), "serve", "sft-nope", "--lake", lake.root]) == 2
    assert "no checkpoint 'sft-nope' is registered" in (err := capsys.readouterr().err) and sft["checkpoint_id"] in err
    assert main(["--home", str(tmp_path), "serve", "sft"]) == 2
    assert "no lake at" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "gone")]) == 1
    assert "does not exist" in capsys.readouterr().err
    # the real command: a free port, the URL printed once the model is loaded, the checkpoint served under its id
    proc = subprocess.Popen([sys.executable, "-m", "assets.cli", "--home", str(home), "serve", "sft", "--lake", lake.root,
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {sft['checkpoint_id']} at http://127.0.0.1:"), (line, proc.stderr.read() if not line else "")
        url = line.split(" at ")[1].split()[0]
        deadline = time.time() + 60
        while True:  # (the URL is printed as uvicorn starts listening)
            try:
                with urllib.request.urlopen(url + "/models", timeout=10) as r:
                    models = json.load(r)
                break
            except OSError:
                assert time.time() < deadline, "the server did not answer"
                time.sleep(0.2)
        assert [m["id"] for m in models["data"]] == [sft["checkpoint_id"]]
        body = json.dumps({"model": sft["checkpoint_id"], "messages": [{"role": "user", "content": "Which invoices are overdue?"}],
                           "max_tokens": 8}).encode()
        req = urllib.request.Request(url + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.load(r)
        assert answer["model"] == sft["checkpoint_id"] and answer["choices"][0]["message"]["role"] == "assistant"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_each_capability_drafts_its_own_number_of_environments_unless_the_profile_says(tmp_path, monkeypatch):
    """A capability's ``environments`` sets its seeds; a profile's ``envs_per_capability`` overrides it for all."""
    from cowork_pipeline.capabilities import CATALOG_DIR

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    for cap_id, n in (("invoice_reconcile", 2), ("schedule_meeting", 3)):
        text = (CATALOG_DIR / f"{cap_id}.yaml").read_text()
        assert "\nenvironments:" not in text
        (catalog / f"{cap_id}.yaml").write_text(text + f"environments: {n}\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    instance = ensure_home(tmp_path / "dagster_home")

    def drafted(profile: ProfileResource, lake_dir: str) -> dict[str, int]:
        lake_res = LakeResource(root=str(tmp_path / lake_dir))
        run_all(profile, lake_res, instance, log=lambda _: None, until="validated_environments")
        drafts, _ = lake_res.lake().read_promoted("environment_drafts")
        firsts = drafts.filter(pl.col("round") == 0)
        return dict(firsts.group_by("capability_id").len().sort("capability_id").iter_rows())

    assert drafted(ProfileResource(name="own-counts", catalog_dir=str(catalog)), "lake1") == {"invoice_reconcile": 2, "schedule_meeting": 3}
    assert drafted(ProfileResource(name="override", catalog_dir=str(catalog), envs_per_capability=1), "lake2") == {
        "invoice_reconcile": 1, "schedule_meeting": 1}


def test_the_profile_plants_instructions_for_every_capability_where_one_fits(tmp_path, monkeypatch):
    """``ProfileResource.injections`` (``cowork run --injections``) sets every capability's difficulty.injections
    over its file's: capability_specs stores the text as drafted (the knob's line replaced or added, saying why, every
    other line kept) and its fingerprint, and the synthesis plants one in each seed where an outside email or ticket
    is read. A bad setting stops the run before anything runs."""
    from cowork_pipeline.capabilities import CATALOG_DIR, parse_capability

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    for cap_id in ("invoice_reconcile", "ticket_triage_followup", "schedule_meeting"):
        (catalog / f"{cap_id}.yaml").write_text((CATALOG_DIR / f"{cap_id}.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    instance = ensure_home(tmp_path / "dagster_home")
    lake_res = LakeResource(root=str(tmp_path / "lake"))
    profile = ProfileResource(name="planted", catalog_dir=str(catalog), envs_per_capability=3, injections="all")
    with pytest.raises(ValueError, match="unknown injections setting 'most'"):
        run_all(ProfileResource(catalog_dir=str(catalog), injections="most"), lake_res, instance, log=lambda _: None)
    assert not lake_res.lake().exists("capability_specs")
    run_all(profile, lake_res, instance, log=lambda _: None, until="validated_environments")
    specs, _ = lake_res.lake().read_promoted("capability_specs")
    for cap_id, text, fp in specs.select("capability_id", "yaml", "fingerprint").iter_rows():
        original = (catalog / f"{cap_id}.yaml").read_text()
        cap = parse_capability(text)
        assert cap.difficulty.injections.min == cap.difficulty.injections.max == 1 and fp == cap.fingerprint()
        assert "  injections: {min: 1, max: 1}  # set by the profile 'planted': injections=all" in text.splitlines()
        kept = [line for line in original.splitlines() if not line.lstrip().startswith("injections:")]
        assert [line for line in text.splitlines() if not line.lstrip().startswith("injections:")] == kept
        assert cap == parse_capability(original).model_copy(update={"difficulty": cap.difficulty})
    envs, _ = lake_res.lake().read_promoted("validated_environments")
    planted = {}
    for cap_id, spec_json in envs.select("capability_id", "spec_json").iter_rows():
        spec = json.loads(spec_json)
        planted.setdefault(cap_id, []).append(spec["difficulty"]["injections"])
        assert ("injection" in spec["facts"]) is (spec["difficulty"]["injections"] == 1)
    assert planted["invoice_reconcile"] == [1, 1, 1] and sum(planted["ticket_triage_followup"]) >= 2
    assert planted["schedule_meeting"] == [0] * len(planted["schedule_meeting"])  # (nothing from outside is read)


def _heldout_oracle(lake):
    """The lake's held-out environments and an agent that answers each with its reference (a perfect model)."""
    from assets.models import envs_by_split
    from cowork_pipeline.agents.program import ProgramAgent

    envs, _ = envs_by_split(lake, ("heldout_env", "heldout_capability"), SMOKE_PROFILE["eval_envs_per_capability"])
    programs = {env.turns[0].user: ProgramAgent(env.reference) for env, _ in envs}

    class Oracle:
        name = "oracle"

        def act(self, messages, tools):
            return programs[next(m["content"] for m in messages if m["role"] == "user")].act(messages, tools)

    return envs, Oracle()


def _trials(df: pl.DataFrame) -> list[tuple]:
    """What a trial came out as (not who wrote the row), in a fixed order."""
    cols = ["agent", "checkpoint_id", "env_id", "trial", "passed", "score", "failed_items", "messages_json", "benchmark_key",
            "agent_key", "run_id"]
    return sorted(df.select(cols).rows())


def test_cowork_eval_scores_an_endpoint_beside_the_students(smoke_run, capsys):
    """`cowork eval --endpoint URL --endpoint-model NAME`: a model behind an OpenAI-compatible endpoint (here our
    own server, answering each held-out task with its reference, as a perfect model would) is scored on the lake's
    held-out environments in the same run and table as the students and the teacher, and traces through lineage."""
    from _servers import running
    from assets.cli import main
    from cowork_pipeline.lineage import score_id, trace
    from cowork_pipeline.serving.server import make_app

    lake, instance, _, _ = smoke_run
    envs, oracle = _heldout_oracle(lake)
    before, _ = lake.read_promoted("benchmark_scores")
    (first_run,) = set(before["run_id"])
    home = Path(lake.root).parent
    with running(make_app(oracle, model_name="oracle")) as base:
        code = main(["--home", str(home), "eval", "--profile", "smoke", "--lake", lake.root, "--endpoint", base + "/v1",
                     "--endpoint-model", "oracle", "--endpoint-name", "perfect model", "--no-agent-cache"])
    out = capsys.readouterr().out
    assert code == 0, out
    scores, _ = lake.read_promoted("benchmark_scores")
    mine = scores.filter(pl.col("agent") == "endpoint:perfect-model")
    teacher = scores.filter(pl.col("agent") == "teacher:embedded")
    assert set(mine["checkpoint_id"]) == {"endpoint-perfect-model"} and mine.height == teacher.height > 0
    assert mine["passed"].all() and set(mine["env_id"]) == {env.env_id for env, _ in envs}
    assert {"base", "sft", "teacher", "endpoint"} <= {a.split(":")[0] for a in scores["agent"].unique()}  # one table, one run
    assert "endpoint:perfect-model" in out
    # the summary says which run scored each agent: this one for the endpoint, the smoke run for the kept ones
    lines = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("  ") and ":" in line.split()[0]}
    assert lines["endpoint:perfect-model"] == mine["run_id"][0][:8] != first_run[:8] == lines["teacher:embedded"]
    meta = instance.get_latest_materialization_event(dg.AssetKey("benchmark_scores")).asset_materialization.metadata
    (endpoint,) = meta["endpoints"].value
    # the students and the teacher, unchanged since the smoke run scored them, keep those trials (and that run's id)
    assert meta["scored"].value == ["endpoint:perfect-model"]
    assert meta["kept"].value == {a: first_run for a in sorted(set(before["agent"]))} != {}
    assert _trials(scores.filter(pl.col("agent") != "endpoint:perfect-model")) == _trials(before)
    assert endpoint["model"] == "oracle" and endpoint["requests"] == endpoint["http_attempts"] > 0 and endpoint["adapted"] == {}
    assert "### endpoint:perfect-model\n\nNo failed trial." in meta["report"].value
    row = mine.row(0, named=True)
    tree = trace(lake, score_id(row["run_id"], row["checkpoint_id"], row["env_id"], row["trial"]))
    kinds = {c.kind: c for c in tree.children}
    assert kinds["checkpoint"].attrs["kind"] == "endpoint" and kinds["environment"].id.endswith(row["env_id"])
    # the model and where it was served are in the score's row, so lineage names them after later runs too
    assert (kinds["checkpoint"].attrs["model"], kinds["checkpoint"].attrs["base_url"]) == ("oracle", base + "/v1")
    # a bad invocation says what is wrong and runs nothing
    assert main(["--home", str(home), "eval", "--lake", lake.root, "--endpoint", "ftp://x", "--endpoint-model", "m"]) == 2
    assert "http(s) URL" in capsys.readouterr().err


def test_cowork_eval_keeps_what_has_not_changed_and_rescores_on_request(smoke_run, capsys):
    """Each `cowork eval` scores the endpoints it is given; earlier endpoints stay in the comparison (unless
    --drop-earlier-endpoints) and unchanged students keep their trials; --rescore scores everyone again, with the
    same outcomes (scoring is deterministic); a student retrained in place is scored again."""
    from _servers import running
    from assets.cli import main
    from cowork_pipeline.serving.server import make_app

    lake, instance, _, _ = smoke_run
    _, oracle = _heldout_oracle(lake)
    home = Path(lake.root).parent

    def scored_run(*flags):
        with running(make_app(oracle, model_name="oracle")) as base:
            code = main(["--home", str(home), "eval", "--profile", "smoke", "--lake", lake.root, "--no-agent-cache", *flags,
                         *([a.replace("BASE", base) for a in ("--endpoint", "BASE/v1", "--endpoint-model", "oracle")]
                           if "--rescore" not in flags else [])])
        assert code == 0, capsys.readouterr()
        meta = instance.get_latest_materialization_event(dg.AssetKey("benchmark_scores")).asset_materialization.metadata
        return lake.read_promoted("benchmark_scores")[0], meta

    first, meta = scored_run("--endpoint-name", "copy one")
    second, meta = scored_run("--endpoint-name", "copy two")
    assert meta["scored"].value == ["endpoint:copy-two"] and "endpoint:copy-one" in meta["kept"].value
    assert _trials(second.filter(pl.col("agent") != "endpoint:copy-two")) == _trials(first)
    assert "endpoint:copy-one" in meta["comparison"].value and "endpoint:copy-two" in meta["comparison"].value
    # one earlier endpoint left out by its label, the others kept
    forgot, meta = scored_run("--endpoint-name", "copy three", "--forget-endpoint", "copy one")
    endpoints = lambda df: {a for a in df["agent"].unique() if a.startswith("endpoint:")}  # noqa: E731
    assert endpoints(forgot) == endpoints(second) - {"endpoint:copy-one"} | {"endpoint:copy-three"}
    third, meta = scored_run("--endpoint-name", "copy two", "--drop-earlier-endpoints")
    assert {a for a in third["agent"].unique() if a.startswith("endpoint:")} == {"endpoint:copy-two"}
    # everyone again: other run ids, the same outcomes
    again, meta = scored_run("--rescore")
    assert meta["kept"].value == {} and len(meta["scored"].value) == third.filter(~pl.col("agent").str.starts_with("endpoint:"))["agent"].n_unique()
    drop_run = [c for c in _trials(third) if not c[0].startswith("endpoint:")]
    assert [c[:-1] for c in _trials(again)] == [c[:-1] for c in drop_run]
    assert set(again["run_id"]).isdisjoint({c[-1] for c in drop_run})
    # a checkpoint trained again under the same id (new files) is another agent to score
    ckpts, _ = lake.read_promoted("checkpoints")
    sft = ckpts.filter(pl.col("kind") == "sft").row(0, named=True)
    weights = next(p for p in Path(sft["path"]).iterdir() if p.suffix == ".safetensors")
    weights.touch()
    _, meta = scored_run("--endpoint-name", "copy two")
    assert f"sft:{sft['checkpoint_id']}" in meta["scored"].value and f"sft:{sft['checkpoint_id']}" not in meta["kept"].value
    assert any(a.startswith("base:") for a in meta["kept"].value)


def test_an_endpoint_teacher_demonstrates_the_training_environments(smoke_run):
    """The `agents` resource's teacher (`cowork run --teacher-endpoint URL --teacher-model NAME`) replaces the
    embedded one in teacher_trajectories; the code version names it, and demonstrations keep what passes."""
    from _servers import running
    from assets.models import envs_by_split
    from cowork_pipeline.agents.program import ProgramAgent
    from cowork_pipeline.serving.server import make_app
    from resources import AgentsResource, EndpointConfig

    lake, instance, _, _ = smoke_run
    envs, _ = envs_by_split(lake, ("train",), SMOKE_PROFILE["demos_per_capability"])
    programs = {env.turns[0].user: ProgramAgent(env.reference) for env, _ in envs}

    class Model:
        name = "model"

        def act(self, messages, tools):
            return programs[next(m["content"] for m in messages if m["role"] == "user")].act(messages, tools)

    with running(make_app(Model(), model_name="teacher-model")) as base:
        agents = AgentsResource(teacher=EndpointConfig(base_url=base + "/v1", model="teacher-model"), response_cache=False)
        res = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey("teacher_trajectories"), dg.AssetKey("demonstrations")], instance=instance,
                             resources=resources(ProfileResource(**SMOKE_PROFILE), LakeResource(root=lake.root), agents=agents))
    assert res.success
    trajs, _ = lake.read_promoted("teacher_trajectories")
    assert set(trajs["teacher"]) == {"endpoint:teacher-model"} and trajs["passed"].all() and trajs.height == len(envs)
    assert set(trajs["_code_version"]) == {f"1+endpoint:teacher-model@{base}/v1"}
    demos, _ = lake.read_promoted("demonstrations")
    assert demos.height == len(envs) and set(demos["split"]) == {"train"}
