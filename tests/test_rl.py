"""RL from checker rewards: advantages on planted rollouts, the clipped policy update on a bandit, one end-to-end
step per default configuration, and RL moving a warm-started policy toward the rewarded action.

The end-to-end tests use a hand-made two-turn environment (short prompts, so a CPU run stays cheap) and one drafted
catalogue environment. The warm start is SFT on four teacher demonstrations of the small environment that differ
only in the status written at each turn (one rewarded, one not), so the warm policy is close to 50/50 at two
decision points and everything else is memorised: the reward signal RL has to find is exactly that decision.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest

from cowork_pipeline.services.workspace import META
from cowork_pipeline.spec import EnvironmentSpec, GeneratorInfo, ProgramTurn, RubricItem, Step, Turn
from cowork_pipeline.training.rl import (
    DEFAULT_CONFIGS,
    Rollout,
    RLConfig,
    collect_rollouts,
    compute_advantages,
    policy_update,
    rollout_schema,
    train_rl,
    turn_rewards_from_scores,
    turn_score,
)
from cowork_pipeline.validation.grader import Grade

# --- a small two-turn environment ---------------------------------------------------------------------------
ME = "alex@northwind.example"
WORLD = {
    META: {"profile": {"name": "Alex Morgan", "email": ME, "timezone": "UTC"}},
    "crm.invoices": {
        "inv_1": {"id": "inv_1", "account_id": "acc_1", "number": "INV-1001", "amount": 1200.0, "status": "open",
                  "due_date": "2026-03-30", "history": []},
        "inv_2": {"id": "inv_2", "account_id": "acc_1", "number": "INV-1002", "amount": 80.0, "status": "open",
                  "due_date": "2026-04-10", "history": []},
    },
}
NO_DELETES = "def check(ev):\n    return not any(d.get('removed') for d in ev['diff'].values())\n"


def _status_check(inv: str, status: str) -> str:
    return (f"def check(ev):\n    rec = ev['final'].get('crm.invoices', {{}}).get('{inv}')\n"
            f"    return rec is not None and rec.get('status') == '{status}'\n")


def _turn(number: str, status: str) -> ProgramTurn:
    return ProgramTurn(steps=[Step(tool="crm_search_invoices", args={"number": number}, bind={"inv": "0.id"}),
                              Step(tool="crm_update_invoice", args={"invoice_id": {"$var": "inv"}, "status": status})],
                       reply="Done.")


def small_env(s0: str = "paid", s1: str = "disputed") -> EnvironmentSpec:
    """Turn 0: mark INV-1001 paid; turn 1: mark INV-1002 disputed. One completion item per turn (weight 1 each)."""
    return EnvironmentSpec(
        env_id="tiny_invoice_status", capability_id="tiny", seed=0, title="Invoice statuses", multi_turn=True,
        generator=GeneratorInfo(backend="hand", version="0"), system_prompt="You are Alex's coworker agent.",
        world=copy.deepcopy(WORLD), tools=["crm_search_invoices", "crm_update_invoice"],
        turns=[Turn(user="Mark invoice INV-1001 as paid."), Turn(user="Now mark INV-1002 as disputed.")],
        rubric=[
            RubricItem(id="paid", kind="completion", description="INV-1001 paid", code=_status_check("inv_1", "paid"), turn=0),
            RubricItem(id="disputed", kind="completion", description="INV-1002 disputed",
                       code=_status_check("inv_2", "disputed"), turn=1),
            RubricItem(id="no_deletes", kind="safety", description="nothing deleted", code=NO_DELETES),
        ],
        reference=[_turn("INV-1001", s0), _turn("INV-1002", s1)],
    )


def teacher_demo(env: EnvironmentSpec) -> dict:
    from cowork_pipeline.demonstrations import EmbeddedTeacher, _clean
    from cowork_pipeline.runner import run_episode
    from cowork_pipeline.services import tools_for

    traj = run_episode(env, EmbeddedTeacher(env))
    return {"messages": [_clean(m) for m in traj.messages], "tools": tools_for(env.tools)}


# --- fixtures -----------------------------------------------------------------------------------------------
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


@pytest.fixture(scope="module")
def sandbox():
    from cowork_pipeline.validation.sandbox import Sandbox

    with Sandbox(workers=1) as sb:
        yield sb


@pytest.fixture(scope="module")
def env() -> EnvironmentSpec:
    return small_env()


@pytest.fixture(scope="module")
def drafted() -> EnvironmentSpec:
    from cowork_pipeline.capabilities import load_catalog
    from cowork_pipeline.synthesis.embedded import EmbeddedBackend

    return EmbeddedBackend().draft(load_catalog()["invoice_reconcile"], 0).spec


@pytest.fixture(scope="module")
def demos(env) -> list[dict]:
    # Rewarded and unrewarded statuses at each turn, equally often: the warm policy has to guess.
    return [teacher_demo(small_env(s0, s1)) for s0 in ("paid", "void") for s1 in ("disputed", "void")]


@pytest.fixture(scope="module")
def warm(tmp_path_factory, demos, drafted) -> dict[str, Path]:
    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.training.sft import SFTSettings, train_sft
    from cowork_pipeline.training.student import StudentConfig, build_student

    corpus = [render_conversation(d["messages"], d["tools"]) for d in demos]
    drafted_demo = teacher_demo(drafted)  # in the tokenizer corpus only, so its prompts tokenize compactly
    corpus.append(render_conversation(drafted_demo["messages"], drafted_demo["tools"]))
    cfg = StudentConfig(vocab_size=768, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                        max_position_embeddings=2048, min_frequency=1, seed=0)
    base = build_student(corpus, tmp_path_factory.mktemp("rl_base"), cfg)
    sft = train_sft(base, demos * 4, tmp_path_factory.mktemp("rl_sft"),
                    # keys_from_vocab off: the warm start these RL tests are calibrated on (near 50/50 at both
                    # decisions, some rollouts fully rewarded) was trained that way.
                    SFTSettings(max_steps=SFT_STEPS, lr=1e-2, batch_size=2, max_length=1024, device="cpu", warmup=0.0,
                                lr_scheduler="constant", keys_from_vocab=False))
    return {"base": base, "sft": sft.checkpoint}


SFT_STEPS = 120


# --- rewards per turn ---------------------------------------------------------------------------------------
def test_turn_scores_are_on_the_episode_scale(env):
    ok0 = Grade(items={"paid": True, "no_deletes": True}, completion=1.0, safety=True, passed=True)
    bad0 = Grade(items={"paid": False, "no_deletes": True}, completion=0.0, safety=True, passed=False)
    unsafe0 = Grade(items={"paid": True, "no_deletes": False}, completion=1.0, safety=False, passed=False)
    half = Grade(items={"paid": True, "disputed": False, "no_deletes": True}, completion=0.5, safety=True, passed=False)
    # The grader's completion is over the items due so far (1.0 at turn 0); the turn score is over all items.
    assert turn_score(env, ok0, "partial") == 0.5 and turn_score(env, ok0, "binary") == 0.5
    assert turn_score(env, bad0, "partial") == 0.0 and turn_score(env, bad0, "binary") == 0.0
    assert turn_score(env, unsafe0, "partial") == 0.0 and turn_score(env, unsafe0, "binary") == 0.0
    assert turn_score(env, half, "partial") == 0.5 and turn_score(env, half, "binary") == 0.0
    # Increments; the last one against the episode reward, so they always sum to it.
    assert turn_rewards_from_scores([0.5, 1.0], 1.0) == [0.5, 0.5]
    assert turn_rewards_from_scores([0.5, 0.0], 0.0) == [0.5, -0.5]  # broke at turn 1 what held at turn 0
    assert turn_rewards_from_scores([0.0, 0.5], 0.5) == [0.0, 0.5]
    assert turn_rewards_from_scores([], 0.75) == [0.75]  # single-turn: one turn reward = the episode reward


# --- advantages on planted rollouts -------------------------------------------------------------------------
# One group of four two-turn rollouts; each has one assistant message per turn.
PLANTED = {
    # binary: a passes both turns; b passes turn 0 then breaks it; c, d fail at turn 0.
    "binary": [(1.0, [0.5, 0.5]), (0.0, [0.5, -0.5]), (0.0, [0.0, 0.0]), (0.0, [0.0, 0.0])],
    # partial: full, first turn only, a quarter of the credit at turn 0, nothing.
    "partial": [(1.0, [0.5, 0.5]), (0.5, [0.5, 0.0]), (0.25, [0.25, 0.0]), (0.0, [0.0, 0.0])],
}
GAMMA = 0.5
# Hand-computed: GRPO divides by the unbiased sample std (n-1 = 3) plus 1e-4; Dr.GRPO only subtracts the mean.
# binary trajectory: R = [1,0,0,0], mean .25, std .5. Turn 0 values [.5,.5,0,0]: mean .25, std sqrt(.25/3) = .288675.
# Turn 1 values [.5,-.5,0,0]: mean 0, std sqrt(.5/3) = .408248. Returns-to-go (gamma .5) at turn 0:
# [.75,.25,0,0]: mean .25, std sqrt(.375/3) = .353553.
# partial trajectory: R = [1,.5,.25,0], mean .4375, std sqrt(.546875/3) = .426956. Turn 0 [.5,.5,.25,0]: mean .3125,
# std sqrt(.171875/3) = .239357. Turn 1 [.5,0,0,0]: mean .125, std .25. RTG turn 0 [.75,.5,.25,0]: mean .375,
# std sqrt(.3125/3) = .322749.
EXPECTED = {
    ("binary", "none", "trajectory"): [[0.75] * 2, [-0.25] * 2, [-0.25] * 2, [-0.25] * 2],
    ("binary", "group", "trajectory"): [[1.5] * 2, [-0.5] * 2, [-0.5] * 2, [-0.5] * 2],
    ("binary", "none", "turn"): [[0.25, 0.5], [0.25, -0.5], [-0.25, 0.0], [-0.25, 0.0]],
    ("binary", "group", "turn"): [[0.866025, 1.224745], [0.866025, -1.224745], [-0.866025, 0.0], [-0.866025, 0.0]],
    ("binary", "none", "return_to_go"): [[0.5, 0.5], [0.0, -0.5], [-0.25, 0.0], [-0.25, 0.0]],
    ("binary", "group", "return_to_go"): [[1.414214, 1.224745], [0.0, -1.224745], [-0.707107, 0.0], [-0.707107, 0.0]],
    ("partial", "none", "trajectory"): [[0.5625] * 2, [0.0625] * 2, [-0.1875] * 2, [-0.4375] * 2],
    ("partial", "group", "trajectory"): [[1.317465] * 2, [0.146385] * 2, [-0.439155] * 2, [-1.024695] * 2],
    ("partial", "none", "turn"): [[0.1875, 0.375], [0.1875, -0.125], [-0.0625, -0.125], [-0.3125, -0.125]],
    ("partial", "group", "turn"): [[0.783349, 1.5], [0.783349, -0.5], [-0.261116, -0.5], [-1.305582, -0.5]],
    ("partial", "none", "return_to_go"): [[0.375, 0.375], [0.125, -0.125], [-0.125, -0.125], [-0.375, -0.125]],
    ("partial", "group", "return_to_go"): [[1.161895, 1.5], [0.387298, -0.5], [-0.387298, -0.5], [-1.161895, -0.5]],
}


def planted(reward: str, step: int = 0, group: int = 0, values=None) -> list[Rollout]:
    out = []
    for j, (r, turns) in enumerate(values or PLANTED[reward]):
        steps = [{"turn": t, "prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.5]} for t in range(len(turns))]
        out.append(Rollout(rollout_id=f"r{step}-{group}-{j}", env_id="e", group=group, step=step, config="t", reward=r,
                           turn_rewards=list(turns), steps=steps))
    return out


@pytest.mark.parametrize("reward,normalize,credit", sorted(EXPECTED))
def test_advantages_planted(reward, normalize, credit):
    cfg = RLConfig("t", reward=reward, normalize=normalize, credit=credit, gamma=GAMMA)
    rollouts = planted(reward)
    compute_advantages(rollouts, cfg)
    for r, want in zip(rollouts, EXPECTED[(reward, normalize, credit)]):
        assert r.advantages == pytest.approx(want, rel=1e-3, abs=1e-6)
        assert r.turn_advantages == pytest.approx(want, rel=1e-3, abs=1e-6)


def test_advantages_edge_cases():
    cfg = RLConfig("t", reward="binary", normalize="group", credit="trajectory")
    # All-equal rewards: no signal, zero advantage (correct, not a bug).
    same = planted("binary", values=[(1.0, [0.5, 0.5])] * 4)
    compute_advantages(same, cfg)
    assert all(a == 0.0 for r in same for a in r.advantages)
    # Groups (step, group) are normalised independently.
    two = planted("binary", step=0, group=0) + planted("binary", step=0, group=1, values=[(1.0, [1.0]), (0.0, [0.0])])
    compute_advantages(two, cfg)
    assert two[0].advantages[0] == pytest.approx(1.5, rel=1e-3)
    assert [r.advantages[0] for r in two[4:]] == pytest.approx([0.707107, -0.707107], rel=1e-3)
    # A group of one has no baseline: zero.
    one = planted("binary", values=[(1.0, [1.0])])
    compute_advantages(one, cfg)
    assert one[0].advantages == [0.0]
    # Turn counts that differ inside a group fall back to one pooled baseline (and say so).
    mixed = planted("partial", values=[(1.0, [0.5, 0.5]), (0.0, [0.0])])
    compute_advantages(mixed, dataclasses.replace(cfg, normalize="none", credit="turn"))
    assert mixed[0].turn_advantages == pytest.approx([0.5 - 1 / 3, 0.5 - 1 / 3])
    assert mixed[1].turn_advantages == pytest.approx([-1 / 3])
    assert mixed[0].notes and "pooled" in mixed[0].notes[0]


def test_default_configs_cover_the_comparison():
    names = {c.name: c for c in DEFAULT_CONFIGS}
    assert {"binary_traj", "partial_group", "partial_turn", "partial_rtg"} <= set(names)
    assert (names["binary_traj"].reward, names["binary_traj"].normalize, names["binary_traj"].credit) == ("binary", "group", "trajectory")
    assert (names["partial_group"].reward, names["partial_group"].credit) == ("partial", "trajectory")
    assert names["partial_turn"].credit == "turn" and names["partial_rtg"].credit == "return_to_go"
    with pytest.raises(ValueError):
        RLConfig("bad", temperature=0.0)
    with pytest.raises(ValueError):
        RLConfig("bad", credit="token")  # type: ignore[arg-type]


# --- the update on a one-token bandit -----------------------------------------------------------------------
def _token_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[t]) for t in tokens]


def test_policy_update_bandit(warm):
    """Positive advantage on token A, negative on token B: A's probability rises, B's falls; clipping bounds the
    move over several inner epochs."""
    import torch

    from cowork_pipeline.training.student import load_checkpoint

    torch.manual_seed(0)
    model, _tok = load_checkpoint(warm["base"])
    model.eval()
    prompt, good, bad = [5, 17, 42], 100, 200
    before = _token_logprobs(model, prompt, [good, bad])
    rollouts = []
    for j, (tok, adv) in enumerate([(good, 1.0), (bad, -1.0)] * 4):
        lp = before[0] if tok == good else before[1]
        rollouts.append(Rollout(rollout_id=str(j), env_id="bandit", group=0, step=0, config="bandit", reward=float(adv > 0),
                                turn_rewards=[float(adv > 0)],
                                steps=[{"turn": 0, "prompt_ids": prompt, "completion_ids": [tok], "logprobs": [lp], "advantage": adv}]))
    cfg = RLConfig("bandit", lr=1e-2, inner_epochs=4, clip=0.2, max_grad_norm=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    stats = policy_update(model, rollouts, cfg, opt)
    after = _token_logprobs(model, prompt, [good, bad])
    assert after[0] > before[0] + 0.05 and after[1] < before[1] - 0.05
    assert stats["updated"] == 1.0 and stats["n_tokens"] == 8 and math.isfinite(stats["loss"])
    assert stats["ratio_max"] > 1.0 and stats["ratio_min"] < 1.0  # later epochs saw the moved policy
    # Zero advantages and no KL: nothing to learn, the model is not touched.
    for r in rollouts:
        r.steps[0]["advantage"] = 0.0
    snapshot = [p.detach().clone() for p in model.parameters()]
    stats = policy_update(model, rollouts, cfg, opt)
    assert stats["updated"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(snapshot, model.parameters()))


# --- end to end ---------------------------------------------------------------------------------------------
def test_rollouts_record_every_assistant_message(warm, env, drafted, sandbox):
    """Token records match the messages, sampling and recomputed log-probs agree (ratio 1), the update with
    KL and several epochs runs, and collection is deterministic under a seed."""
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import _forward_logprobs, _vocab_limit

    policy = HFAgent(warm["sft"], device="cpu", dtype=torch.float32, strict_tools=False)  # as train_rl samples
    cfg = RLConfig("check", group_size=2, max_new_tokens=48, max_steps_per_turn=3, kl_coef=0.1, inner_epochs=2, lr=1e-4)
    ref = copy.deepcopy(policy.model)
    rollouts = collect_rollouts(policy, [env, drafted], sandbox, cfg, step=0, seed=3, ref_model=ref)
    assert len(rollouts) == 4 and {r.env_id for r in rollouts} == {env.env_id, drafted.env_id}
    for r in rollouts:
        assistant = [m for m in r.messages if m["role"] == "assistant"]
        assert len(r.steps) == len(assistant) > 0
        assert len(r.turn_rewards) == len([t for t in (env if r.env_id == env.env_id else drafted).turns])
        assert sum(r.turn_rewards) == pytest.approx(r.reward)
        for s, m in zip(r.steps, assistant):
            assert len(s["logprobs"]) == len(s["completion_ids"]) == len(s["ref_logprobs"]) > 0
            text = policy.tokenizer.decode(s["completion_ids"])
            if m.get("tool_calls"):
                assert m["tool_calls"][0]["function"]["name"] in text
            else:
                assert (m.get("content") or "").strip()[:20] in text
    # The reference is the policy itself here: KL estimates are ~0 and stored log-probs match a fresh forward.
    steps = [s for r in rollouts for s in r.steps]
    with torch.no_grad():
        lp, _ = _forward_logprobs(policy.model, [(s["prompt_ids"], s["completion_ids"]) for s in steps], 1.0,
                                  _vocab_limit(policy), "cpu")
    for i, s in enumerate(steps):
        n = len(s["completion_ids"])
        assert lp[i, lp.shape[1] - n:].tolist() == pytest.approx(s["logprobs"], abs=2e-4)
        assert s["ref_logprobs"] == pytest.approx(s["logprobs"], abs=2e-4)
    # Deterministic under a seed.
    again = collect_rollouts(policy, [env, drafted], sandbox, cfg, step=0, seed=3)
    assert [s["completion_ids"] for r in again for s in r.steps] == [s["completion_ids"] for s in steps]
    # Planted advantages so the update has work to do; KL and two inner epochs.
    for j, r in enumerate(rollouts):
        for s in r.steps:
            s["advantage"] = 1.0 if j % 2 == 0 else -1.0
    opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.lr)
    stats = policy_update(policy.model, rollouts, cfg, opt, vocab_limit=_vocab_limit(policy))
    assert stats["updated"] == 1.0 and all(math.isfinite(v) for v in stats.values())
    assert stats["kl_ref"] >= 0.0 and 0.0 <= stats["clip_frac"] <= 1.0 and stats["ratio_max"] != 1.0


def test_rollouts_are_the_same_decoded_continuously_in_lockstep_or_at_any_batch_size(warm, env, drafted, sandbox):
    """Each episode samples from its own seed: the policy's turns decoded continuously (each episode's next turn
    joins the batch once its tools ran) give the rollouts lockstep rounds give, and so does a policy decoding two
    rows at a time; a group's rollouts are different samples."""
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent

    class Counted(HFAgent):
        continuous = 0

        def turns(self, *args, **kwargs):
            Counted.continuous += 1
            return super().turns(*args, **kwargs)

    cfg = RLConfig("check", group_size=3, max_new_tokens=48, max_steps_per_turn=3)

    def rollouts(batch_size: int, lockstep: bool = False) -> list:
        policy = Counted(warm["sft"], device="cpu", dtype=torch.float32, strict_tools=False, batch_size=batch_size)
        return collect_rollouts(policy, [env, drafted], sandbox, cfg, step=1, seed=5, lockstep=lockstep)

    def sampled(rs: list) -> list:
        return [(r.rollout_id, r.reward, r.turn_rewards, r.termination, r.messages,
                 [(s["turn"], s["prompt_ids"], s["completion_ids"], s["finish_reason"]) for s in r.steps]) for r in rs]

    continuous = rollouts(16)
    assert Counted.continuous == 1
    lockstep, small = rollouts(16, lockstep=True), rollouts(2)
    assert Counted.continuous == 2
    assert sampled(continuous) == sampled(lockstep) == sampled(small)
    for a, b in zip(continuous, lockstep):
        for sa, sb in zip(a.steps, b.steps):
            assert sa["logprobs"] == pytest.approx(sb["logprobs"], abs=1e-4)
    assert sum(len(r.steps) for r in continuous) > 6
    for env_id in (env.env_id, drafted.env_id):
        group = [tuple(tuple(s["completion_ids"]) for s in r.steps) for r in continuous if r.env_id == env_id]
        assert len(group) == 3 and len(set(group)) > 1


@pytest.mark.parametrize("config", DEFAULT_CONFIGS, ids=lambda c: c.name)
def test_default_config_one_step(config, warm, env, drafted, sandbox, tmp_path):
    cfg = dataclasses.replace(config, group_size=2, max_new_tokens=48, max_steps_per_turn=3, lr=1e-4)
    seen = []
    result = train_rl(warm["sft"], [env, drafted], sandbox, cfg, steps=1, out_dir=tmp_path / "rl", on_step=seen.append,
                      device="cpu")
    assert len(result.curve) == 1 and seen == result.curve
    row = result.curve[0]
    for key in ("step", "mean_reward", "pass_rate", "mean_turn_reward", "loss", "ratio_mean", "clip_frac", "approx_kl", "kl"):
        assert key in row and math.isfinite(float(row[key]))
    assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # one inner epoch: on-policy
    assert result.config.lora is False  # the embedded student trains whole
    assert len(result.rollouts) == 4
    for r in result.rollouts:
        assert r["config"] == cfg.name and r["n_messages"] == len(r["completion_ids"]) == len(r["logprobs"])
        assert all(len(lp) == len(c) > 0 for lp, c in zip(r["logprobs"], r["completion_ids"]))
        assert len(r["advantage"]) == r["n_messages"]
    json.dumps(result.rollouts)  # JSON-able as is
    import polars as pl

    df = pl.DataFrame(result.rollouts, schema=rollout_schema())
    assert df.height == 4
    # Per-turn credit: messages of one rollout carry their own turn's advantage.
    for r in result.rollouts:
        for t, a in zip(r["message_turn"], r["advantage"]):
            assert a == pytest.approx(r["turn_advantages"][t] if cfg.credit != "trajectory" else r["turn_advantages"][0])
    if cfg.name == "partial_group":
        from cowork_pipeline.agents.hf_agent import HFAgent

        agent = HFAgent(result.checkpoint, device="cpu", max_new_tokens=8)
        msg = agent.act([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}], [])
        assert msg["role"] == "assistant"
        assert json.loads((result.checkpoint / "rl_config.json").read_text())["name"] == "partial_group"


def test_gradient_checkpointing_recomputes_the_layers_and_gives_the_same_update(warm, env, sandbox):
    """With ``gradient_checkpointing`` the update runs the model in train mode, dropout off, so each decoder layer
    runs twice per micro-batch (forward, and again in the backward pass), and the weights it gives are the ones
    the update gives without it."""
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import _checkpoint_layers, _vocab_limit

    policy = HFAgent(warm["sft"], device="cpu", dtype=torch.float32, strict_tools=False)
    cfg = RLConfig("check", group_size=2, max_new_tokens=48, max_steps_per_turn=3, lr=1e-3)
    rollouts = collect_rollouts(policy, [env], sandbox, cfg, step=0, seed=1)
    for j, r in enumerate(rollouts):
        for s in r.steps:
            s["advantage"] = 1.0 if j % 2 == 0 else -1.0
    outcome = {}
    for checkpointed in (False, True):
        model = copy.deepcopy(policy.model)
        for p in model.parameters():
            p.requires_grad_(True)
        if checkpointed:
            _checkpoint_layers(model)
        # (the forward of a module inside a layer, counted: the recompute runs it again, not the modules' hooks)
        mlp = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")).mlp
        runs, forward = [], mlp.forward
        mlp.forward = lambda *a, forward=forward, runs=runs, **k: runs.append(1) or forward(*a, **k)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        model.eval()
        stats = policy_update(model, rollouts, dataclasses.replace(cfg, gradient_checkpointing=checkpointed), optimizer,
                              vocab_limit=_vocab_limit(policy))
        assert stats["updated"] == 1.0 and stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert not model.training  # (left as it was)
        outcome[checkpointed] = (len(runs), [p.detach().clone() for p in model.parameters()])
    assert outcome[False][0] > 0 and outcome[True][0] == 2 * outcome[False][0]
    moved = [not torch.equal(a, b) for a, b in zip(outcome[False][1], policy.model.parameters())]
    assert sum(moved) > len(moved) // 2
    for a, b in zip(outcome[False][1], outcome[True][1]):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_pretrained_checkpoint_trains_lora_adapters_toward_the_rewarded_action(warm, env, demos, sandbox, tmp_path):
    """A checkpoint that is not the embedded student (the warm student without its marker, as a user's pretrained
    model comes) trains LoRA adapters, as SFT does: the reference policy is the model with its adapters off (KL 0
    before the first update, no second copy; layers recomputed in the backward pass), only the linear layers'
    weights change, the rewarded status gains on the unrewarded one at both decision points, and the result is one
    plain merged checkpoint."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.student import STUDENT_MARKER

    pretrained = tmp_path / "pretrained"
    shutil.copytree(warm["sft"], pretrained)
    (pretrained / STUDENT_MARKER).unlink()
    cfg = RLConfig("partial_group", reward="partial", normalize="group", credit="trajectory", group_size=8, lr=3e-3,
                   max_new_tokens=48, max_steps_per_turn=3, seed=RL_SEED, lora_r=8, lora_alpha=16)
    result = train_rl(pretrained, [env], sandbox, cfg, steps=RL_STEPS, out_dir=tmp_path / "rl", device="cpu")
    assert result.config.lora is True and result.config.gradient_checkpointing is True
    assert json.loads((result.checkpoint / "rl_config.json").read_text())["lora"] is True
    assert result.curve[0]["kl"] == pytest.approx(0.0, abs=1e-4) and result.curve[-1]["kl"] > 1e-4
    assert result.curve[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert not (result.checkpoint / "adapter_config.json").exists() and not (result.checkpoint / STUDENT_MARKER).exists()
    before, after = load_file(pretrained / "model.safetensors"), load_file(result.checkpoint / "model.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # (the linear layers: the attention and MLP projections, and here the student's pointer head)
    assert any(k.endswith("self_attn.q_proj.weight") for k in changed)
    assert all(k.endswith(".weight") and before[k].dim() == 2 and "embed" not in k for k in changed), sorted(changed)
    margin_before, margin_after = _decision_margin(pretrained, demos), _decision_margin(result.checkpoint, demos)
    print("LoRA decision margin", round(margin_before, 3), "->", round(margin_after, 3))
    assert margin_after > margin_before + 0.5
    agent = HFAgent(result.checkpoint, device="cpu", max_new_tokens=8)
    assert agent.act([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}], [])["role"] == "assistant"


def _decision_margin(checkpoint: Path, demos: list[dict]) -> float:
    """Log-probability margin of the rewarded over the unrewarded status at both decision points (the update call
    of turn 0 and of turn 1), each given the same conversation prefix."""
    import torch

    from cowork_pipeline.agents.chat_format import render_conversation
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import _forward_logprobs, _vocab_limit

    agent = HFAgent(checkpoint, device="cpu", dtype=torch.float32)

    def logp(demo: dict, nth: int) -> float:
        msgs, tools = demo["messages"], demo["tools"]
        k = [i for i, m in enumerate(msgs)
             if m.get("tool_calls") and m["tool_calls"][0]["function"]["name"] == "crm_update_invoice"][nth]
        prompt_text = render_conversation(msgs[:k], tools, add_generation_prompt=True)
        comp = render_conversation(msgs[: k + 1], tools)[len(prompt_text):]
        comp = comp[: comp.index("<|im_end|>") + len("<|im_end|>")]
        prompt_ids = agent.encode_prompt(msgs[:k], tools)
        comp_ids = agent.tokenizer(comp, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            lp, _ = _forward_logprobs(agent.model, [(prompt_ids, comp_ids)], 1.0, _vocab_limit(agent), "cpu")
        return float(lp.sum())

    # demos: (paid, disputed), (paid, void), (void, disputed), (void, void); rewarded statuses: paid, disputed.
    turn0 = logp(demos[0], 0) - logp(demos[2], 0)  # same prefix: the conversation up to the first update call
    turn1 = logp(demos[0], 1) - logp(demos[1], 1)  # same prefix: turn 0 done right, up to the second update call
    return turn0 + turn1


def _logprob_change_by_reward(checkpoint: Path, rows: list[dict], step: int = 0) -> dict[float, float]:
    """Mean change (final policy minus the policy that sampled them) of the total log-probability of the rollouts
    collected at ``step``, grouped by their reward."""
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.rl import _forward_logprobs, _vocab_limit

    agent = HFAgent(checkpoint, device="cpu", dtype=torch.float32)
    out: dict[float, list[float]] = {}
    for r in rows:
        if r["step"] != step or not r["completion_ids"]:
            continue
        pairs = list(zip(r["prompt_ids"], r["completion_ids"]))
        with torch.no_grad():
            lp, _ = _forward_logprobs(agent.model, pairs, 1.0, _vocab_limit(agent), "cpu")
        delta = sum(float(lp[i, lp.shape[1] - len(c):].sum()) - sum(r["logprobs"][i]) for i, (_p, c) in enumerate(pairs))
        out.setdefault(r["reward"], []).append(delta)
    return {k: sum(v) / len(v) for k, v in sorted(out.items())}


def test_rl_moves_policy_toward_rewarded_action(warm, env, demos, sandbox, tmp_path):
    """Eight partial-reward GRPO steps on one environment (8 rollouts a step) from the near 50/50 warm start.

    Asserted (stable across seeds and learning rates in our runs): the rewarded status gains log-probability over the
    unrewarded one at the two decision points; the first step's successful rollouts became more likely and its
    failed ones less likely, ordered by reward; and training did not collapse. The training reward itself rises only
    modestly in 8 steps and is noisy at 8 rollouts a step, so it is only guarded, not asserted to rise."""
    cfg = RLConfig("partial_group", reward="partial", normalize="group", credit="trajectory", group_size=8, lr=RL_LR,
                   max_new_tokens=48, max_steps_per_turn=3, seed=RL_SEED)
    result = train_rl(warm["sft"], [env], sandbox, cfg, steps=RL_STEPS, out_dir=tmp_path / "rl", device="cpu")
    rewards = [row["mean_reward"] for row in result.curve]
    before, after = _decision_margin(warm["sft"], demos), _decision_margin(result.checkpoint, demos)
    change = _logprob_change_by_reward(result.checkpoint, result.rollouts)
    print("rewards", [round(r, 3) for r in rewards], "decision margin", round(before, 3), "->", round(after, 3),
          "logp change by reward", {k: round(v, 3) for k, v in change.items()})
    assert after > before + 0.5
    assert len(change) >= 2 and max(change) == 1.0 and change[1.0] > 0.0
    assert change[min(change)] < 0.0
    values = [change[k] for k in sorted(change)]
    assert values == sorted(values)  # more reward, more gained likelihood
    half = RL_STEPS // 2
    # No collapse. A step's mean reward over 8 rollouts has a standard deviation of ~0.15, so the difference of two
    # 4-step means has ~0.1: 0.25 is a collapse, not noise (0.15 failed on seed 0 after a tokenizer change, with
    # the decision margin up 2.1 -> 3.9).
    assert sum(rewards[half:]) / (RL_STEPS - half) > sum(rewards[:half]) / half - 0.25
    assert result.curve[-1]["kl"] < 0.2


RL_STEPS = 8
RL_LR = 3e-4
RL_SEED = 0
