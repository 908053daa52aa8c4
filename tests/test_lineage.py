"""`cowork lineage` on a real small run: from a benchmark score and from a demonstration back to the capability
spec, the generator and every repair attempt (with diagnostics), with Delta versions and Dagster run ids at
each node; JSON output; RL rollouts; unknown ids exit with code 2."""
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.cli import main
from assets.definitions import ALL_ASSETS, resources
from assets.run import ensure_home
from cowork_pipeline.lake import Lake, Lineage
from cowork_pipeline.lineage import LineageError, score_id, trace
from resources import SMOKE_PROFILE, LakeResource, ProfileResource

ROOT = Path(__file__).resolve().parent.parent
CAPS = ["invoice_reconcile", "weekly_task_digest"]  # weekly_task_digest is a held-out capability
# The smoke profile, smaller: 3 environments per capability (all of invoice_reconcile's land in train), one clean
# trial per held-out environment, two SFT steps.
PROFILE = dict(SMOKE_PROFILE, name="lineage-test", envs_per_capability=3, eval_envs_per_capability=1, eval_trials=1,
               eval_fault_rate=0.0, sft_max_steps=2)
STEPS = (["capability_specs"], None, ["environment_splits"], ["teacher_trajectories"], ["demonstrations"],
         ["sft_checkpoint", "checkpoints"], ["benchmark_scores"])  # None: every capability partition (RL is not needed here)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    home = tmp_path_factory.mktemp("lineage")
    instance = ensure_home(home / "dagster_home")
    lake_res = LakeResource(root=str(home / "lake"))
    res = resources(ProfileResource(**PROFILE), lake_res)

    def step(names, partition=None):
        r = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey(n) for n in names], partition_key=partition, instance=instance,
                           resources=res, raise_on_error=False)
        assert r.success and all(e.passed for e in r.get_asset_check_evaluations()), (names, partition)

    for names in STEPS:
        if names is None:
            for cap in CAPS:
                step(["environment_drafts", "repair_log", "validated_environments", "rejected_environments", "repair_telemetry"], cap)
        else:
            step(names)
    return lake_res.lake(), instance


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["lineage", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _assert_reaches_spec_and_repairs(tree, instance, lake: Lake, env_id: str | None = None):
    caps = [n for n in tree.find("capability") if not n.ref]
    assert caps, "the capability spec is reached"
    cap = caps[0]
    specs, v_specs = lake.read_promoted("capability_specs")
    assert cap.table == "capability_specs" and cap.version == v_specs
    assert cap.attrs["fingerprint"] == specs.filter(pl.col("capability_id") == cap.id)["fingerprint"][0]
    assert cap.attrs["fingerprint_matches_environment"] is True
    gens = tree.find("generator")
    assert gens and gens[0].attrs["backend"] == "embedded" and gens[0].attrs["version"] and "seed" in gens[0].attrs
    envs = [n for n in tree.find("environment") if not n.ref]
    if env_id is not None:
        assert env_id in {e.id for e in envs}
    attempts = [a for a in tree.find("attempt") if not a.ref]
    assert attempts, "the repair attempts are listed"
    repairs = tree.find("repair")
    for g in repairs:  # every round of the environment, in order, ending with the final attempt
        rounds = [a.attrs["round"] for a in g.children if not a.ref]
        assert rounds == sorted(rounds)
    log, _ = lake.read_promoted("repair_log")
    for a in attempts:
        row = log.filter(pl.col("attempt_id") == a.id).row(0, named=True)
        assert a.attrs["codes"] == list(row["codes"])
        assert a.attrs["diagnostics"] == [f"{d['code']}: {d['message']}" for d in json.loads(row["diagnostics_json"])]
        assert a.run_id == row["_run_id"] and a.table == "repair_log" and a.version is not None
    # every run id in the tree is a real Dagster run of the instance
    for run_id in tree.run_ids():
        assert instance.get_run_by_id(run_id) is not None, run_id
    return attempts


def test_trace_from_a_benchmark_score(run, capsys):
    lake, instance = run
    scores, v_scores = lake.read_promoted("benchmark_scores")
    row = scores.filter(pl.col("agent").str.starts_with("sft:")).sort("env_id").row(0, named=True)
    sid = score_id(row["run_id"], row["checkpoint_id"], row["env_id"], row["trial"])

    tree = trace(lake, sid)
    assert tree.kind == "score" and tree.id == sid and tree.version == v_scores and tree.run_id == row["run_id"]
    assert tree.upstream_versions == json.loads(row["_upstream_versions"])
    # what the student did in that trial: its calls in order (the full transcript is the row's messages_json)
    msgs = json.loads(row["messages_json"])
    assert tree.attrs["calls"] == [c["function"]["name"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert len(tree.attrs["calls"]) == row["n_tool_calls"]
    # checkpoint -> the demonstrations version it was trained on (time travel by data_versions_json)
    ckpt = tree.children[0]
    assert ckpt.kind == "checkpoint" and ckpt.id == row["checkpoint_id"] and ckpt.attrs["kind"] == "sft"
    ckpts, _ = lake.read_promoted("checkpoints")
    data_versions = json.loads(ckpts.filter(pl.col("checkpoint_id") == row["checkpoint_id"])["data_versions_json"][0])
    ds = next(c for c in ckpt.children if c.kind == "dataset")
    assert ds.id == f"demonstrations@{data_versions['demonstrations']}" and ds.version == data_versions["demonstrations"]
    demos = [d for d in ds.children if d.kind == "demonstration"]
    assert demos and all(d.children[0].kind == "trajectory" for d in demos)
    assert any(c.kind == "checkpoint" and c.id == ckpt.attrs["base_checkpoint_id"] for c in ckpt.children)
    # the evaluated (held-out) environment itself, and the training environments behind the checkpoint
    env = tree.children[1]
    assert env.kind == "environment" and env.id == row["env_id"] and env.attrs["split"] == row["split"]
    _assert_reaches_spec_and_repairs(tree, instance, lake, env_id=row["env_id"])
    # the same through the CLI: text tree, and JSON that parses to the same tree
    code, out, _ = _cli(capsys, sid, "--lake", lake.root)
    assert code == 0
    assert out.startswith(f"score {sid}") and "└── " in out and f"run {row['run_id']}" in out
    assert "capability invoice_reconcile" in out or "capability weekly_task_digest" in out
    assert "attempt " in out and "diagnostics" in out and "generator embedded/" in out
    code, out, _ = _cli(capsys, sid, "--lake", lake.root, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["resolved"] == {"kind": "score", "id": sid} and doc["tree"] == tree.to_dict()
    # short forms resolve to the same rows
    short = trace(lake, f"{row['env_id']}@{row['checkpoint_id']}")
    assert short.kind == "score" and short.attrs["env_id"] == row["env_id"]
    assert trace(lake, f"score:{row['checkpoint_id']}:{row['env_id']}:{row['trial']}").id == sid


def test_trace_from_a_demo_id_lists_repair_attempts_with_diagnostics(run, capsys):
    lake, instance = run
    demos, v_demos = lake.read_promoted("demonstrations")
    # prefer a demonstration whose environment needed a repair round (so diagnostics are non-empty)
    envs, _ = lake.read_promoted("validated_environments")
    repaired = set(envs.filter(pl.col("rounds") > 0)["env_id"])
    pick = demos.filter(pl.col("env_id").is_in(list(repaired))) if demos["env_id"].is_in(list(repaired)).any() else demos
    demo = pick.sort("demo_id").row(0, named=True)

    code, out, err = _cli(capsys, demo["demo_id"], "--lake", lake.root)
    assert code == 0, err
    tree = trace(lake, demo["demo_id"])
    assert tree.kind == "demonstration" and tree.version == v_demos and tree.run_id == demo["_run_id"]
    traj = tree.children[0]
    assert traj.kind == "trajectory" and traj.id == demo["traj_id"] and traj.attrs["spec_hash_matches_environment"] is True
    attempts = _assert_reaches_spec_and_repairs(tree, instance, lake, env_id=demo["env_id"])
    if demo["env_id"] in repaired:
        failed = [a for a in attempts if not a.attrs["certified"]]
        assert failed and all(a.attrs["diagnostics"] for a in failed)
        assert failed[0].attrs["diagnostics"][0] in out  # printed in full, one per line
    assert attempts[-1].attrs["final"] is True and attempts[-1].attrs["certified"] is True
    for a in attempts:
        assert f"attempt {a.id}" in out and f"run {a.run_id}" in out
    # JSON form parses and carries the full diagnostic dicts
    code, out, _ = _cli(capsys, f"demo:{demo['demo_id']}", "--lake", lake.root, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["tree"]["kind"] == "demonstration"
    assert "diagnostics_detail" in json.dumps(doc)


def test_every_kind_of_id_resolves(run):
    lake, _ = run
    log, _ = lake.read_promoted("repair_log")
    attempt = log.sort("round", descending=True).row(0, named=True)
    node = trace(lake, attempt["attempt_id"])
    assert node.kind == "attempt" and node.attrs["round"] == attempt["round"]
    assert node.children[0].kind == "environment" and node.children[0].id == attempt["env_id"]
    assert trace(lake, f"env:{attempt['env_id']}").kind == "environment"
    trajs, _ = lake.read_promoted("teacher_trajectories")
    assert trace(lake, trajs["traj_id"][0]).kind == "trajectory"
    ckpts, _ = lake.read_promoted("checkpoints")
    base = ckpts.filter(pl.col("kind") == "base")["checkpoint_id"][0]
    assert trace(lake, f"ckpt:{base}").attrs["kind"] == "base"
    cap = trace(lake, "cap:weekly_task_digest")
    assert cap.kind == "capability" and cap.attrs["heldout"] is True
    assert trace(lake, "teacher-embedded").attrs["kind"] == "teacher"


def test_rollout_ids_trace_through_the_rl_tables(run, tmp_path):
    """rl_rollouts may not exist (the run above has none): a clear error; once written, rollouts resolve."""
    lake, _ = run
    with pytest.raises(LineageError, match="rl_rollouts"):
        trace(lake, "rollout:binary_traj:s0:invoice_reconcile-000000:0")
    # plant what the RL asset writes, with its lineage (in a copy of the lake: the other tests keep theirs)
    import shutil

    shutil.copytree(lake.root, tmp_path / "lake")
    lk = Lake(str(tmp_path / "lake"))
    ckpts, v_c = lk.read_promoted("checkpoints")
    sft = ckpts.filter(pl.col("kind") == "sft").row(0, named=True)
    envs, v_env = lk.read_promoted("validated_environments")
    env_id = envs.sort("env_id")["env_id"][0]
    up = {"checkpoints": v_c, "validated_environments": v_env}
    lin = Lineage("local-rl-run", "rl_rollouts", "1", up)
    rid = f"binary_traj:s0:{env_id}:0"
    v_r = lk.write("rl_rollouts", pl.DataFrame({"rollout_id": [rid], "config": ["binary_traj"], "step": [0], "env_id": [env_id],
                                                "group": [0], "reward": [1.0], "passed": [True]}), lineage=lin, key=["rollout_id"])
    lk.promote("rl_rollouts", v_r, run_id=lin.run_id)
    rl_id = f"rl-binary_traj-{sft['checkpoint_id']}-n1"
    rl_row = {**{k: v for k, v in sft.items() if not k.startswith("_")}, "checkpoint_id": rl_id, "kind": "rl",
              "base_checkpoint_id": sft["checkpoint_id"], "data_versions_json": json.dumps(up)}
    v_rc = lk.write("rl_checkpoints", pl.DataFrame([rl_row]), lineage=Lineage("local-rl-run", "rl_checkpoints", "1", up),
                    key=["checkpoint_id"])
    lk.promote("rl_checkpoints", v_rc, run_id=lin.run_id)
    node = trace(lk, rid)
    assert node.kind == "rollout" and node.attrs["trained_checkpoint"] == rl_id
    assert [c.kind for c in node.children] == ["checkpoint", "environment"]
    assert node.children[0].id == sft["checkpoint_id"]
    rl = trace(lk, rl_id)
    assert rl.attrs["kind"] == "rl"
    ds = next(c for c in rl.children if c.kind == "dataset" and c.table == "rl_rollouts")
    assert ds.attrs["rows"] == 1 and ds.children[0].id == rid


def test_unknown_id_is_a_clear_error_with_exit_code_2(run, capsys):
    lake, _ = run
    code, out, err = _cli(capsys, "no-such-thing", "--lake", lake.root)
    assert code == 2 and not out
    assert "unknown id 'no-such-thing'" in err and "checkpoints.checkpoint_id" in err and "Id forms" in err
    code, _, err = _cli(capsys, "score:nope:env-000000:0", "--lake", lake.root)
    assert code == 2 and "no benchmark score" in err
    # as a process: the exit status itself is 2, and a missing lake is reported the same way
    p = subprocess.run([sys.executable, "-m", "assets.cli", "lineage", "no-such-thing", "--lake", lake.root],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown id" in p.stderr
    code, _, err = _cli(capsys, "x", "--lake", str(Path(lake.root).parent / "nowhere"))
    assert code == 2 and "no lake" in err
