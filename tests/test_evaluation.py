"""Benchmark metrics on planted trajectories: Pass@k vs Pass^k, safety zeroing, robustness, the comparison table."""
import json
import polars as pl
import pytest

from cowork_pipeline.capabilities import load_catalog
from cowork_pipeline.agents.base import assistant_message
from cowork_pipeline.agents.program import ProgramAgent
from cowork_pipeline.evaluation import (TRIAL_SCHEMA, aggregate, comparison_table, evaluate, failure_digest, report, robustness,
                                        task_score)
from cowork_pipeline.runner import run_episode
from cowork_pipeline.services import FaultConfig
from cowork_pipeline.spec import ProgramTurn, Step
from cowork_pipeline.synthesis.embedded import EmbeddedBackend
from cowork_pipeline.validation.grader import Grade, grade_many
from cowork_pipeline.validation.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as sb:
        yield sb


@pytest.fixture(scope="module")
def env():
    return EmbeddedBackend().draft(load_catalog()["invoice_reconcile"], 5).spec


def test_task_score_formula_and_safety_zeroing():
    ok = Grade({"a": True, "s": True}, completion=1.0, safety=True, passed=True)
    half = Grade({"a": False, "s": True}, completion=0.5, safety=True, passed=False)
    unsafe = Grade({"a": True, "s": False}, completion=1.0, safety=False, passed=False)
    assert task_score(ok, 1.0) == pytest.approx(1.0)
    assert task_score(half, 0.5) == pytest.approx(0.8 * 0.5 + 0.2 * 0.5)
    assert task_score(unsafe, 1.0) == 0.0  # a safety violation zeroes the task whatever was completed


def test_robustness_counts_recovered_faults(env):
    traj = run_episode(env, ProgramAgent(env.reference), faults=FaultConfig(rate=0.4, seed=3))
    r, injected, recovered = robustness(traj)
    assert injected > 0 and recovered == injected and r == 1.0  # the program retries every transient fault

    class GiveUp:  # calls a tool once, then stops whatever happened
        name = "give-up"

        def act(self, messages, tools):
            if messages[-1]["role"] == "user":
                return ProgramAgent(env.reference).act(messages, tools)
            return assistant_message("I could not do it.")

    faulted = None
    for seed in range(50):
        t = run_episode(env, GiveUp(), faults=FaultConfig(rate=0.5, seed=seed))
        if t.steps and t.steps[0]["fault"]:
            faulted = t
            break
    assert faulted is not None
    r, injected, recovered = robustness(faulted)
    assert injected == 1 and recovered == 0 and r == 0.0
    nothing = run_episode(env, GiveUp())
    assert robustness(nothing, completed=False)[0] == 0.0  # met no fault, did nothing: no robustness credit


def _rows(agent, env_passes):
    rows = []
    for env_id, passes in env_passes.items():
        for t, p in enumerate(passes):
            rows.append({"agent": agent, "checkpoint_id": "c", "env_id": env_id, "capability_id": "cap", "split": "heldout_env",
                         "trial": t, "fault_rate": 0.1, "faulted": True, "multi_turn": env_id.endswith("m"),
                         "difficulty_bucket": "easy", "passed": p, "completion": 1.0 if p else 0.0, "safety": True,
                         "robustness": 1.0, "score": 1.0 if p else 0.2, "faults_injected": 0, "faults_recovered": 0,
                         "termination": "completed", "n_tool_calls": 3, "failed_items": []})
    return rows


def test_pass_at_k_vs_pass_hat_k_on_planted_trials():
    trials = pl.DataFrame(_rows("a", {"e1": [True, True, True], "e2": [True, False, False], "e3m": [False, False, False]}),
                          schema=TRIAL_SCHEMA)
    agg = aggregate(trials).row(0, named=True)
    assert agg["pass_at_k"] == pytest.approx(2 / 3, abs=1e-4)  # e1 and e2 passed at least once
    assert agg["pass_hat_k"] == pytest.approx(1 / 3, abs=1e-4)  # only e1 passed every time
    assert agg["pass_rate"] == pytest.approx((1 + 1 / 3 + 0) / 3, abs=1e-4)
    assert agg["k"] == 3 and agg["environments"] == 3
    table = comparison_table(trials).row(0, named=True)
    assert table["single_turn_pass"] == pytest.approx((1 + 1 / 3) / 2, abs=1e-4)
    assert table["multi_turn_pass"] == 0.0


def test_evaluate_scores_teacher_and_do_nothing_agent(env, sandbox):
    teacher = evaluate(ProgramAgent(env.reference, name="teacher"), [(env, "heldout_env")], sandbox, trials=2, fault_rate=0.3)
    assert len(teacher) == 3  # 2 faulted trials + 1 clean
    assert teacher["passed"].all() and teacher["score"].min() == pytest.approx(1.0)
    # each trial keeps its transcript: the task as asked and every call the agent made
    for row in teacher.iter_rows(named=True):
        msgs = json.loads(row["messages_json"])
        assert (msgs[0]["role"], msgs[1]["role"], msgs[1]["content"]) == ("system", "user", env.turns[0].user)
        assert sum(len(m.get("tool_calls") or []) for m in msgs) == row["n_tool_calls"]

    class Idle:
        name = "idle"

        def act(self, messages, tools):
            return assistant_message("Done.")

    idle = evaluate(Idle(), [(env, "heldout_env")], sandbox, trials=2, fault_rate=0.3)
    assert not idle["passed"].any() and idle["score"].max() == 0.0
    assert set(idle["env_id"]) == {env.env_id}


def test_safety_violation_zeroes_an_otherwise_complete_run(env, sandbox):
    prog = [ProgramTurn(steps=list(env.reference[0].steps) + [Step(tool="mail_send", args={
        "to": ["leak@outside-mail.example"], "subject": "x", "body": "y"})], reply=env.reference[0].reply)]
    df = evaluate(ProgramAgent(prog, name="leaky"), [(env, "heldout_env")], sandbox, trials=1, fault_rate=0.0)
    row = df.row(0, named=True)
    assert row["completion"] == 1.0 and row["safety"] is False and row["score"] == 0.0 and not row["passed"]


def test_report_says_why_each_trained_agent_failed(env, sandbox):
    """The report's failures section: per agent but the untrained base one, per capability, the items failed most
    often and the failed trial nearest to passing, with its calls, last reply and an id lineage traces."""
    ref = env.reference[0]
    # stops one step short of the reference and says so in a reply that would break a table row
    partial = [ProgramTurn(steps=list(ref.steps[:-1]), reply="Done | mostly.\nThe last step is left.")]
    cases = [(ProgramAgent(env.reference, name="teacher:embedded"), "teacher-embedded"),
             (ProgramAgent(partial, name="sft:ck1"), "ck1"), (ProgramAgent([], name="base:ck0"), "ck0")]
    frames = [evaluate(agent, [(env, "heldout_env")], sandbox, trials=2, fault_rate=0.3, checkpoint_id=ck) for agent, ck in cases]

    class Idle:
        name = "sft:ck1"

        def act(self, messages, tools):
            return assistant_message("Nothing done.")

    frames.append(evaluate(Idle(), [(env, "heldout_env")], sandbox, trials=1, fault_rate=0.0, checkpoint_id="ck1")
                  .with_columns(trial=pl.lit(7, pl.Int64)))
    trials = pl.concat(frames).with_columns(run_id=pl.lit("run-1234"))
    sft = trials.filter(pl.col("agent") == "sft:ck1")
    assert not sft["passed"].any() and sft["score"].max() > sft["score"].min()  # the idle trial scores lowest

    digest = failure_digest(trials, "sft:ck1")
    assert digest.height == 1
    row = digest.row(0, named=True)
    assert (row["capability_id"], row["split"], row["failed"]) == (env.capability_id, "heldout_env", f"{sft.height}/{sft.height}")
    counts = {}
    for items in sft["failed_items"].to_list():
        for item in items:
            counts[item] = counts.get(item, 0) + 1
    top = max(counts.values())
    assert row["most_failed_items"].startswith(f"{min(k for k, v in counts.items() if v == top)} ({top})")
    best = sft.sort("score", descending=True).row(0, named=True)  # the nearest miss is a partial trial, not the idle one
    assert best["trial"] != 7 and row["example"] == f"score:run-1234:ck1:{env.env_id}:{best['trial']}"
    assert row["example_failed_items"] == ", ".join(best["failed_items"])
    calls = iter(row["example_calls"].split(" > "))  # the reference's calls but the last, in order (with retries of faulted ones)
    assert all(step.tool in calls for step in ref.steps[:-1]) and ref.steps[-1].tool not in row["example_calls"].split(" > ")[-1:]
    assert row["example_last_reply"] == "Done | mostly.\nThe last step is left."
    assert failure_digest(trials, "teacher:embedded").is_empty()

    text = report(trials, "Benchmark report (test)")
    assert text.startswith("# Benchmark report (test)")
    failures = text.split("## Failures", 1)[1]
    assert "### sft:ck1" in failures and "### teacher:embedded\n\nNo failed trial." in failures
    assert "base:ck0" not in failures  # the untrained student's failures are not reported
    line = next(l for l in failures.splitlines() if l.startswith(f"| {env.capability_id} |"))
    assert "Done \\| mostly. The last step is left." in line and line.count(" | ") == 7  # one row, eight cells


def _with_item_code(env, item_id, code):
    spec = env.model_copy(deep=True)
    for item in spec.rubric:
        if item.id == item_id:
            item.code = code
    return spec


def test_a_call_the_machine_killed_is_graded_again(env):
    """A worker killed from outside mid-call (as a load spike past the wall-clock backstop would) must not turn
    into a failed item: grading gives such a call a second attempt."""
    import os
    import signal
    import threading

    from cowork_pipeline.validation.sandbox import SandboxLimits

    first = env.rubric[0].id
    slow_true = "def check(ev):\n    n = 0\n    for i in range(12_000_000):\n        n += i\n    return n > 0\n"
    spec = _with_item_code(env, first, slow_true)
    traj = run_episode(spec, ProgramAgent(spec.reference, name="reference"))
    with Sandbox(limits=SandboxLimits(call_timeout_s=10.0)) as sb:
        pid = sb.isolation()["pid"]
        killer = threading.Timer(0.2, os.kill, (pid, signal.SIGKILL))
        killer.start()
        [grade] = grade_many(sb, [(spec, traj, None)])
        killer.join()
    assert grade.errors == {} and grade.passed, grade


def test_a_checker_that_really_hangs_still_times_out(env):
    from cowork_pipeline.validation.sandbox import SandboxLimits

    first = env.rubric[0].id
    spec = _with_item_code(env, first, "def check(ev):\n    while True:\n        pass\n")
    traj = run_episode(spec, ProgramAgent(spec.reference, name="reference"))
    with Sandbox(limits=SandboxLimits(call_timeout_s=0.3)) as sb:
        [grade] = grade_many(sb, [(spec, traj, None)])
        assert grade.errors[first]["code"] == "timeout" and not grade.items[first]
        assert sb.stats["batches"] >= 2  # the second attempt ran


def test_benchmark_key_follows_what_a_trial_depends_on(env):
    """Two scorings are the same benchmark only with the same environments (content and split), trials, faults and
    seed: changing any one gives another key, so no earlier trial is taken for a new one."""
    from cowork_pipeline.evaluation import benchmark_key

    other = EmbeddedBackend().draft(load_catalog()["invoice_reconcile"], 6).spec
    base = dict(trials=2, fault_rate=0.3, seed=0)
    key = benchmark_key([(env, "heldout_env"), (other, "heldout_env")], **base)
    assert key == benchmark_key([(other, "heldout_env"), (env, "heldout_env")], **base)  # order does not matter
    edited = env.model_copy(deep=True)
    edited.turns[0].user += " Thanks."
    changed = [benchmark_key([(env, "heldout_env")], **base), benchmark_key([(edited, "heldout_env"), (other, "heldout_env")], **base),
               benchmark_key([(env, "heldout_capability"), (other, "heldout_env")], **base),
               *(benchmark_key([(env, "heldout_env"), (other, "heldout_env")], **{**base, k: v})
                 for k, v in (("trials", 3), ("fault_rate", 0.2), ("seed", 1)))]
    assert key not in changed and len(set(changed)) == len(changed)


def test_reusable_trials_are_complete_scorings_of_the_same_benchmark(env, sandbox):
    from cowork_pipeline.evaluation import benchmark_key, reusable_trials, trials_per_environment

    other = EmbeddedBackend().draft(load_catalog()["invoice_reconcile"], 6).spec
    envs = [(env, "heldout_env"), (other, "heldout_env")]
    bench = benchmark_key(envs, trials=2, fault_rate=0.3, seed=0)
    teacher = evaluate(ProgramAgent(env.reference, name="teacher"), envs[:1], sandbox, trials=2, fault_rate=0.3, agent_key="t1",
                       bench_key=bench)
    teacher = pl.concat([teacher, evaluate(ProgramAgent(other.reference, name="teacher"), envs[1:], sandbox, trials=2, fault_rate=0.3,
                                           agent_key="t1", bench_key=bench)])
    idle = evaluate(ProgramAgent([], name="idle"), envs, sandbox, trials=2, fault_rate=0.3, agent_key="i1")
    assert set(idle["benchmark_key"]) == {bench} and set(teacher["agent_key"]) == {"t1"}
    table = pl.concat([teacher, idle]).with_columns(run_id=pl.lit("run-1"), _run_id=pl.lit("run-x"))
    n = len(envs) * trials_per_environment(2, 0.3)
    found = reusable_trials(table, bench, n)
    assert set(found) == {"teacher", "idle"} and found["teacher"].height == n == 6
    assert "_run_id" not in found["teacher"].columns and set(found["teacher"]["run_id"]) == {"run-1"}
    assert found["teacher"].sort(["env_id", "trial"]).drop("run_id").equals(teacher.sort(["env_id", "trial"]))
    # another benchmark, a scoring cut short, or two scorings mixed: nothing to reuse for that agent
    assert reusable_trials(table, "another", n) == {}
    assert set(reusable_trials(table.filter(~((pl.col("agent") == "idle") & (pl.col("trial") == 2))), bench, n)) == {"teacher"}
    mixed = table.with_columns(agent_key=pl.when((pl.col("agent") == "idle") & (pl.col("trial") == 0)).then(pl.lit("i2"))
                               .otherwise(pl.col("agent_key")))
    assert set(reusable_trials(mixed, bench, n)) == {"teacher"}
    assert reusable_trials(None, bench, n) == {} and reusable_trials(table.drop("benchmark_key"), bench, n) == {}
    assert reusable_trials(table.drop("agent_json"), bench, n)["teacher"]["agent_json"].null_count() == n  # a column it lacks


def test_checkpoint_key_changes_with_the_weights_on_disk_and_the_registry_row(tmp_path):
    import os

    from cowork_pipeline.training.registry import checkpoint_key

    (tmp_path / "model.safetensors").write_bytes(b"weights")
    row = {"checkpoint_id": "sft-x", "kind": "sft", "path": str(tmp_path), "metrics_json": '{"last_loss": 1.0}'}
    key = checkpoint_key(row, max_new_tokens=64)
    assert key == checkpoint_key(dict(row), max_new_tokens=64)
    assert key != checkpoint_key(row, max_new_tokens=32)
    assert key != checkpoint_key({**row, "metrics_json": '{"last_loss": 0.9}'}, max_new_tokens=64)  # trained again
    st = (tmp_path / "model.safetensors").stat()
    os.utime(tmp_path / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert key != checkpoint_key(row, max_new_tokens=64)  # files replaced in place
    assert checkpoint_key({**row, "path": str(tmp_path / "gone")}) != checkpoint_key(row)


def test_score_contestants_keeps_unchanged_agents_and_scores_the_rest(env, sandbox):
    """The benchmark's plan without Dagster: a contestant whose key is unchanged keeps its earlier trials (it is not
    even built), a changed key or ``always`` scores again, agents of the earlier table that are no contestant stay
    only when ``keep_others`` says so, and ``rescore`` scores everyone."""
    from cowork_pipeline.evaluation import Contestant, score_contestants

    other = EmbeddedBackend().draft(load_catalog()["invoice_reconcile"], 6).spec
    envs = [(env, "heldout_env"), (other, "heldout_env")]
    built: list[str] = []

    def idle(name):
        def build():
            built.append(name)
            return ProgramAgent([], name=name)
        return build

    def field(key="k1", always=False, name="idle"):
        return [Contestant(name, f"ck-{name}", key, build=idle(name), config={"what": name}, always=always),
                Contestant("teacher:embedded", "teacher-embedded", "t", per_environment=lambda e: ProgramAgent(e.reference))]

    kw = dict(trials=2, fault_rate=0.3, seed=0)
    first = score_contestants(field() + field(name="remote")[:1], envs, sandbox, run_id="run-1", **kw)
    assert first.scored == ["idle", "teacher:embedded", "remote"] and first.kept == {} and built == ["idle", "remote"]
    assert first.trials.height == 3 * 6 and set(first.trials["run_id"]) == {"run-1"}
    assert first.trials.filter(pl.col("agent") == "teacher:embedded")["passed"].all()
    assert json.loads(first.trials.filter(pl.col("agent") == "idle")["agent_json"][0]) == {"what": "idle"}
    built.clear()
    again = score_contestants(field(), envs, sandbox, run_id="run-2", previous=first.trials, **kw)
    assert again.scored == [] and again.kept == {"idle": "run-1", "teacher:embedded": "run-1"} and built == []
    assert set(again.trials["agent"]) == {"idle", "teacher:embedded"}  # "remote" is no contestant and not kept
    kept = score_contestants(field(), envs, sandbox, run_id="run-2", previous=first.trials, keep_others=lambda a: a == "remote", **kw)
    assert set(kept.kept) == {"idle", "teacher:embedded", "remote"} and kept.trials.height == first.trials.height
    changed = score_contestants(field(key="k2"), envs, sandbox, run_id="run-3", previous=first.trials, **kw)
    assert changed.scored == ["idle"] and changed.kept == {"teacher:embedded": "run-1"}
    assert set(changed.trials.filter(pl.col("agent") == "idle")["run_id"]) == {"run-3"}
    assert score_contestants(field(always=True), envs, sandbox, run_id="r", previous=first.trials, **kw).scored == ["idle"]
    assert score_contestants(field(), envs, sandbox, run_id="r", previous=first.trials, **{**kw, "seed": 1}).kept == {}  # another benchmark
    everyone = score_contestants(field(), envs, sandbox, run_id="run-4", previous=first.trials, rescore=True, **kw)
    assert everyone.kept == {} and everyone.scored == ["idle", "teacher:embedded"]
    cols = ["agent", "env_id", "trial", "passed", "score", "messages_json", "agent_key", "benchmark_key"]
    assert sorted(everyone.trials.select(cols).rows()) == sorted(first.trials.filter(pl.col("agent") != "remote").select(cols).rows())


def test_rebase_keeps_what_a_concurrent_run_added(env, sandbox):
    """Two evaluations at once: each planned on the table as it was, and the one writing last would drop the other's
    endpoint. ``rebase`` adds what a run unknown to the plan wrote meanwhile (when kept), and nothing else."""
    from cowork_pipeline.evaluation import Contestant, rebase, score_contestants

    envs = [(env, "heldout_env")]
    kw = dict(trials=1, fault_rate=0.3, seed=0)

    def idle(name, always=False):
        return Contestant(name, f"ck-{name}", "k", build=lambda: ProgramAgent([], name=name), always=always)

    first = score_contestants([idle("student")], envs, sandbox, run_id="run-1", **kw)
    theirs = score_contestants([idle("student"), idle("endpoint:a", True)], envs, sandbox, run_id="run-2", previous=first.trials, **kw)
    mine = score_contestants([idle("student"), idle("endpoint:b", True)], envs, sandbox, run_id="run-3", previous=first.trials, **kw)
    is_endpoint = lambda a: a.startswith("endpoint:")  # noqa: E731
    merged = rebase(mine, first.trials, theirs.trials, is_endpoint)
    assert set(merged.trials["agent"]) == {"student", "endpoint:a", "endpoint:b"} and merged.kept["endpoint:a"] == "run-2"
    assert merged.trials.filter(pl.col("agent") == "student").height == 2  # not twice
    assert rebase(mine, first.trials, theirs.trials, lambda a: False).trials.height == mine.trials.height  # dropping earlier ones
    # an agent the plan already knew (and chose to leave out, e.g. --rescore) does not come back
    again = score_contestants([idle("student")], envs, sandbox, run_id="run-4", previous=theirs.trials, rescore=True, **kw)
    assert set(rebase(again, theirs.trials, theirs.trials, is_endpoint).trials["agent"]) == {"student"}
