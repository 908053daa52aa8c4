"""Teacher trajectories through the real runner, and curation on planted cases."""
import json

import polars as pl
import pytest

from cowork_pipeline.capabilities import load_catalog
from cowork_pipeline.demonstrations import TRAJ_SCHEMA, collect_teacher_trajectories, contamination_audit, curate, sft_records
from cowork_pipeline.synthesis.embedded import EmbeddedBackend
from cowork_pipeline.validation.sandbox import Sandbox


@pytest.fixture(scope="module")
def trajectories():
    caps = load_catalog()
    be = EmbeddedBackend()
    envs = [(be.draft(caps[c], s).spec, "train") for c in ("invoice_reconcile", "ticket_triage_followup") for s in (11, 12)]
    with Sandbox(workers=1) as sb:
        return collect_teacher_trajectories(envs, sb, fault_rate=0.3, seed=0), envs


def test_teacher_passes_its_environments_through_the_real_runner(trajectories):
    df, envs = trajectories
    assert len(df) == len(envs)
    assert df["passed"].all(), df.select("env_id", "failed_items", "termination")
    assert df["faults_injected"].sum() > 0  # the demonstrations show retries after injected faults
    msgs = json.loads(df.filter(pl.col("multi_turn"))["messages_json"][0])
    roles = [m["role"] for m in msgs]
    assert roles.count("user") == 2 and "tool" in roles  # multi-turn, observation-dependent
    # every assistant turn ends with a reply to the user
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["content"]


def _splits(df, split_of):
    return pl.DataFrame([{"env_id": e, "capability_id": c, "split": split_of.get(e, "train")}
                         for e, c in df.select("env_id", "capability_id").iter_rows()])


def test_curation_drops_failing_contaminated_duplicate_and_long_trajectories(trajectories):
    df, _ = trajectories
    good = df.row(0, named=True)
    planted = [
        {**good, "traj_id": "failing", "passed": False},
        {**good, "traj_id": "zz-dup"},  # identical conversation to row 0 (sorts after it: the first is kept)
        {**good, "traj_id": "long", "env_id": "long-env", "messages_json": good["messages_json"][:-1] + "," + json.dumps(
            {"role": "assistant", "content": "x" * 20000}) + "]"},
        {**good, "traj_id": "heldout-env", "env_id": "held-env"},
        {**good, "traj_id": "heldout-cap", "env_id": "cap-env", "capability_id": "weekly_task_digest"},
    ]
    all_rows = pl.concat([df, pl.DataFrame(planted, schema=TRAJ_SCHEMA)])
    # a stale or forged split column on the trajectory row is ignored: splits come from the promoted table
    all_rows = all_rows.with_columns(split=pl.lit("train"))
    splits = pl.concat([_splits(df, {}), pl.DataFrame([
        {"env_id": "long-env", "capability_id": good["capability_id"], "split": "train"},
        {"env_id": "held-env", "capability_id": good["capability_id"], "split": "heldout_env"},
        {"env_id": "cap-env", "capability_id": "weekly_task_digest", "split": "heldout_capability"}])])
    demos, dropped = curate(all_rows, splits, max_chars=12000)
    assert dropped == {"failed": 1, "not_train": 1, "heldout_lineage": 1, "duplicate": 1, "too_long": 1}
    assert set(demos["traj_id"]) == set(df["traj_id"])
    audit = contamination_audit(demos, splits)
    assert not audit["heldout_env"].any() and not audit["heldout_capability"].any()
    recs = sft_records(demos)
    assert recs and {"messages", "tools"} <= set(recs[0])


def test_a_model_behind_an_endpoint_teaches_and_only_its_passing_trajectories_become_demonstrations(trajectories):
    """The teacher may be a model behind an OpenAI-compatible endpoint (`cowork run --teacher-endpoint`): its
    episodes run through the same runner with the same faults and are graded by the same checkers, and curation
    keeps the ones that pass. Here the endpoint answers one environment with its reference (a right trajectory,
    the same calls as the embedded teacher's) and another one wrongly (it stops before doing anything)."""
    from _servers import running
    from cowork_pipeline.agents.base import assistant_message
    from cowork_pipeline.agents.openai_agent import OpenAIAgent
    from cowork_pipeline.agents.program import ProgramAgent
    from cowork_pipeline.serving.server import make_app

    embedded, envs = trajectories
    right, wrong = envs[0][0], envs[1][0]

    class Model:
        name = "model"

        def act(self, messages, tools):
            if messages[1]["content"] == right.turns[0].user:
                return ProgramAgent(right.reference).act(messages, tools)
            return assistant_message("Sorry, I cannot help with that.")

    with Sandbox(workers=1) as sb, running(make_app(Model(), model_name="big-model")) as base:
        teacher = OpenAIAgent(base + "/v1", "big-model", name="endpoint:big-model", concurrency=2)
        df = collect_teacher_trajectories([envs[0], envs[1]], sb, fault_rate=0.3, seed=0, teacher=teacher)
    assert df["teacher"].to_list() == ["endpoint:big-model"] * 2 and df["passed"].to_list() == [True, False]
    same = embedded.filter(pl.col("env_id") == right.env_id).row(0, named=True)
    mine = df.row(0, named=True)
    # the same faults met, the same calls made as the embedded teacher (ids and texts may differ)
    calls = lambda r: [c["function"]["name"] for m in json.loads(r["messages_json"]) for c in m.get("tool_calls") or []]  # noqa: E731
    assert (mine["faults_injected"], calls(mine)) == (same["faults_injected"], calls(same))
    demos, dropped = curate(df, _splits(df, {}))
    assert demos["env_id"].to_list() == [right.env_id] and dropped["failed"] == 1
