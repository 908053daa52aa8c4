"""Policy optimisation from the environments' checker rewards (one owned GRPO/RLOO-family loop).

Every RL configuration we compare runs through this one loop, so configurations differ only in the three
choices below (TRL's GRPO trainer gives one advantage per trajectory and hides the rest, hence our own loop):

* ``reward``: ``"binary"`` - 1.0 if every rubric item holds (``Grade.passed``) else 0.0; ``"partial"`` - rubric
  credit ``Grade.completion * Grade.safety`` (weighted share of completion items, zeroed by any safety
  violation). This is the Claw-Eval task score without its robustness term: rollouts here are fault-free by
  default, where robustness is 1.0 for every episode (it would add a constant 0.2 to every reward, including
  do-nothing episodes, and a constant shift changes no group-relative advantage anyway).
* ``normalize``: ``"group"`` - GRPO-style ``(x - mean) / (std + 1e-4)`` within the group (``std`` is the unbiased
  sample standard deviation, as in TRL); ``"none"`` - ``x - mean`` only (Dr. GRPO style, no std scaling).
* ``credit``: ``"trajectory"`` - one advantage for every assistant message of a rollout, from its episode reward;
  ``"turn"`` - each assistant message gets the advantage of its user turn's own reward; ``"return_to_go"`` - the
  advantage of the discounted return from its turn on, ``G_t = sum_{k>=t} gamma^(k-t) r_k``.

Per-turn rewards. A rollout of an environment with ``T`` scripted user turns is graded ``T`` times with
``grade_many(..., turn=t)`` (the episode as it stood at the end of turn ``t``, with only the rubric items due by
then, safety items always) and once as a whole. The turn-``t`` score (``turn_score``) is on the episode reward's
scale: the weight of the completion items due by turn ``t`` that hold, over the weight of *all* completion items,
times safety (binary: the due weight if every item due so far holds, else 0). The reward of turn ``t`` is the
increment of the turn-``t`` score over the turn ``t-1`` score; the last turn's increment is taken against the whole-episode score, so the turn rewards
always sum to the episode reward (an increment can be negative: breaking at turn 1 what held at turn 0). Turns the
episode never reached (it terminated early) are still graded - on the final state - so every rollout of one
environment has exactly ``T`` turn rewards.

Per-turn baselines and their bias. For ``turn`` and ``return_to_go`` credit the group baseline (and std) is taken
per turn index: ``A_{j,t} = norm_j(x_{j,t})`` over the rollouts ``j`` of the group. That is only unbiased when the
number of turns does not depend on the policy; if the policy chose how many turns to take, the set of rollouts
contributing at index ``t`` would be selected by the policy's own actions. Here user turns are scripted by the
environment (``ScriptedUser``), so every rollout of a group has the same ``T`` and per-index normalisation is
valid. If turn counts ever differ inside a group (a non-scripted user simulator), ``compute_advantages`` falls back
to one baseline pooled over all (rollout, turn) values of the group, and says so in the rollout's ``notes``.

Zero advantages are expected, not a bug: with binary rewards and a small group, all rollouts often pass (or all
fail); the group then carries no learning signal and contributes nothing (``zero_adv_groups`` in the curve).

The update (``policy_update``) is PPO-clipped, token level: for every completion token of every assistant message,
``ratio = exp(logp_new - logp_old)``, loss ``-min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)`` (+ ``kl_coef``
times the k3 estimate of KL to the initial policy), averaged over all completion tokens of the batch (DAPO-style
token mean; one optimizer step per inner epoch). ``logp_old`` are the log-probs stored at sampling time, under the
distribution actually sampled from (temperature applied, vocabulary padding rows masked, as ``HFAgent`` samples):
that temperature-``T`` policy is the one being optimised, as in TRL. New log-probs are recomputed by one batched
forward pass over prompt + completion per micro-batch (left-padded, ``logits_to_keep`` so only completion positions
are projected onto the vocabulary), so no per-token state is kept between sampling and the update. Dropout stays off
(model in eval mode) so the first inner epoch's ratios are exactly 1 up to float error.

Optimiser: AdamW (betas 0.9/0.99), grad-norm clip 1.0, fresh per run. Adam moves every parameter by about ``lr`` per
step whatever the gradient's scale, so (a) a global rescaling of the advantages changes almost nothing - with one
group per step GRPO's std normalisation and Dr. GRPO's plain centring give near-identical updates; they differ only
when several groups of different spreads share a step - and (b) the learning rate must be small relative to the
weights: the tiny random-init student collapses in one step at 3e-3, drifts at 1e-3, and learns at 3e-4-5e-4.

CPU note: for tiny students use ``torch.set_num_threads(1)``; on an oversubscribed 2-core machine the default two
intra-op threads cost ~20x more CPU time in generation (OpenMP spin-waits), measured here.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from cowork_pipeline.runner import Limits, Trajectory, run_episodes
from cowork_pipeline.services import FaultConfig
from cowork_pipeline.spec import EnvironmentSpec
from cowork_pipeline.synthesis.embedded import sub_seed
from cowork_pipeline.validation.grader import Grade, grade_many

STD_EPS = 1e-4


@dataclass(frozen=True)
class RLConfig:
    name: str
    reward: Literal["binary", "partial"] = "partial"
    normalize: Literal["group", "none"] = "group"
    credit: Literal["trajectory", "turn", "return_to_go"] = "trajectory"
    gamma: float = 0.9
    group_size: int = 4  # rollouts per environment per step
    lr: float = 1e-4
    kl_coef: float = 0.0  # k3 KL to the reference (initial) policy, on the sampled tokens
    clip: float = 0.2
    inner_epochs: int = 1
    temperature: float = 1.0
    max_new_tokens: int = 256  # per turn; a turn cut short is a malformed call
    seed: int = 0
    # Loop knobs shared by every configuration (not part of the comparison).
    top_p: float = 1.0  # must stay 1.0 (validated): ratios assume the untruncated temperature-T distribution
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    envs_per_step: int = 0  # 0 = every environment every step; else a rotating subset of this size
    max_steps_per_turn: int = 8  # assistant messages per user turn in a rollout
    fault_rate: float = 0.0  # injected tool faults in rollouts (seeded per rollout)
    micro_batch_tokens: int = 16384  # padded tokens per forward/backward in the update
    gen_batch_size: int = 16
    # None: LoRA adapters for a pretrained checkpoint, the whole model for the embedded student (as SFT chooses).
    # LoRA keeps the base frozen (bf16 on a GPU) and the reference policy is the base with the adapters off: an 8B
    # model's weights take 16 GB, where training it whole takes ~160 (fp32 weights, gradients, Adam moments and a
    # reference copy), more than one GPU holds.
    lora: bool | None = None
    lora_r: int = 16
    lora_alpha: int = 32
    # None: on for LoRA. The update keeps each layer's input only and recomputes the rest in the backward pass: a
    # micro-batch of 16k tokens through an 8B model would otherwise hold ~90 GB of activations, and LoRA's
    # activations are more than the whole model's (bench_rl_memory.py).
    gradient_checkpointing: bool | None = None

    def __post_init__(self) -> None:
        if self.reward not in ("binary", "partial"):
            raise ValueError(f"reward must be 'binary' or 'partial', not {self.reward!r}")
        if self.normalize not in ("group", "none"):
            raise ValueError(f"normalize must be 'group' or 'none', not {self.normalize!r}")
        if self.credit not in ("trajectory", "turn", "return_to_go"):
            raise ValueError(f"credit must be 'trajectory', 'turn' or 'return_to_go', not {self.credit!r}")
        if self.temperature <= 0:
            raise ValueError("RL needs sampling: temperature must be > 0")
        if self.top_p != 1.0:
            # The update recomputes log-probs of the temperature-scaled distribution; a top-p truncated behaviour
            # policy would make first-epoch ratios != 1 and the clipping meaningless.
            raise ValueError("top_p must be 1.0: the update does not model top-p truncation")
        if self.group_size < 1 or self.inner_epochs < 1:
            raise ValueError("group_size and inner_epochs must be >= 1")


DEFAULT_CONFIGS: list[RLConfig] = [
    RLConfig("binary_traj", reward="binary", normalize="group", credit="trajectory"),
    RLConfig("partial_group", reward="partial", normalize="group", credit="trajectory"),
    RLConfig("partial_drgrpo", reward="partial", normalize="none", credit="trajectory"),
    RLConfig("partial_turn", reward="partial", normalize="group", credit="turn"),
    RLConfig("partial_rtg", reward="partial", normalize="group", credit="return_to_go", gamma=0.9),
]


@dataclass
class Rollout:
    rollout_id: str
    env_id: str
    group: int  # group index within the step (one group = group_size rollouts of one environment)
    step: int
    config: str
    reward: float
    turn_rewards: list[float]
    steps: list[dict[str, Any]]  # per assistant message: turn, prompt_ids, completion_ids, logprobs, advantage (+ref_logprobs)
    passed: bool = False
    completion: float = 0.0
    safety: bool = True
    termination: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn_advantages: list[float] = field(default_factory=list)  # filled by compute_advantages
    notes: list[str] = field(default_factory=list)

    @property
    def advantages(self) -> list[float]:
        """Advantage of each assistant message, in order."""
        return [float(s.get("advantage", 0.0)) for s in self.steps]

    @property
    def n_tokens(self) -> int:
        return sum(len(s["completion_ids"]) for s in self.steps)


@dataclass
class RLResult:
    checkpoint: Path
    curve: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]  # rollout_rows of every step
    config: RLConfig | None = None  # as run: ``lora`` and ``gradient_checkpointing`` resolved
    seconds: float = 0.0


# --- rewards ------------------------------------------------------------------------------------------------
def reward_of(grade: Grade, kind: str) -> float:
    """Episode reward: ``passed`` (binary) or ``completion * safety`` (partial)."""
    if kind == "binary":
        return 1.0 if grade.passed else 0.0
    return float(grade.completion) * (1.0 if grade.safety else 0.0)


def turn_score(env: EnvironmentSpec, grade: Grade, kind: str) -> float:
    """Score of the episode as it stood at the end of a turn (``grade`` from ``grade_many(..., turn=t)``), on the
    scale of the whole episode's reward: credit of the completion items due by then over the weight of *all*
    completion items (the grader's ``completion`` is over the items due so far, which would make a perfect later
    turn worth nothing). Partial: held weight x safety; binary: due weight if every item due so far holds, else 0."""
    comp = [i for i in env.rubric if i.kind == "completion"]
    total = sum(i.weight for i in comp) or 1.0
    due = [i for i in comp if i.id in grade.items]
    if kind == "binary":
        return sum(i.weight for i in due) / total if grade.passed else 0.0
    return sum(i.weight for i in due if grade.items.get(i.id)) / total * (1.0 if grade.safety else 0.0)


def turn_rewards_from_scores(turn_scores: Sequence[float], final: float) -> list[float]:
    """Increments of the per-turn scores; the last one is taken against ``final`` so they sum to it."""
    out: list[float] = []
    prev = 0.0
    for t, s in enumerate(turn_scores):
        cur = final if t == len(turn_scores) - 1 else float(s)
        out.append(cur - prev)
        prev = cur
    return out or [final]


# --- rollouts -----------------------------------------------------------------------------------------------
class _RecordingAgent:
    """Samples with the policy and records, per episode, every assistant message's token-level record.

    Episodes are told apart by the identity of their message list: each episode generator yields its own list
    (kept alive in its ``Trajectory``), so the record can be matched to the trajectory afterwards. Each episode
    samples from its own seed (its n-th turn from a stream seeded by that seed and n), so a rollout does not depend
    on what it is batched with, and decoding turns continuously (``turns``) gives the rollouts lockstep rounds
    (``act_batch``) give."""

    per_episode_seeds = True

    def __init__(self, policy: Any, config: RLConfig, seed: int) -> None:
        self.policy = policy
        self.config = config
        self.seed = seed
        self.calls = 0
        self.asked: dict[int, int] = {}  # turns each episode has asked for, by its message list
        self.records: dict[int, list[dict[str, Any]]] = {}
        self.name = f"rl:{getattr(policy, 'name', type(policy).__name__)}"

    def act(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return self.act_batch([(messages, tools)])[0]

    def act_batch(self, conversations: Sequence[tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]],
                  seeds: Sequence[int] | None = None) -> list[dict[str, Any]]:
        cfg = self.config
        if seeds is None:  # (not driven by run_episodes: one stream per call)
            seeds = [sub_seed("rl-sample", self.seed, self.calls, j) for j in range(len(conversations))]
        self.calls += 1
        turn_seeds = []
        for (messages, _tools), seed in zip(conversations, seeds):
            n = self.asked.get(id(messages), 0)
            self.asked[id(messages)] = n + 1
            turn_seeds.append(sub_seed(seed, n))  # (as run_episodes seeds a continuous agent's turns)
        gens = self.policy.generate(conversations, temperature=cfg.temperature, top_p=cfg.top_p,
                                    max_new_tokens=cfg.max_new_tokens, seeds=turn_seeds)
        return [self.record(messages, g) for (messages, _tools), g in zip(conversations, gens)]

    def turns(self) -> _RecordingTurns:
        cfg = self.config
        return _RecordingTurns(self, self.policy.turns(temperature=cfg.temperature, top_p=cfg.top_p,
                                                       max_new_tokens=cfg.max_new_tokens, generations=True))

    def record(self, messages: Sequence[dict[str, Any]], g: Any) -> dict[str, Any]:
        """Keep a generated turn's record under its episode; its assistant message."""
        turn = sum(1 for m in messages if m.get("role") == "user") - 1
        if g.completion_ids:
            # sampling_logprobs: log-prob under the distribution actually sampled from (the behaviour policy).
            self.records.setdefault(id(messages), []).append({
                "turn": max(turn, 0), "prompt_ids": list(g.prompt_ids), "completion_ids": list(g.completion_ids),
                "logprobs": [float(x) for x in g.sampling_logprobs], "finish_reason": g.finish_reason,
                "advantage": 0.0,
            })
        return g.message


class _RecordingTurns:
    """The policy's continuous turns (``HFAgent.turns``), each ended turn recorded as ``act_batch`` records it."""

    def __init__(self, agent: _RecordingAgent, turns: Any) -> None:
        self.agent, self.turns = agent, turns
        self.messages: dict[Any, Sequence[dict[str, Any]]] = {}

    @property
    def busy(self) -> bool:
        return self.turns.busy

    def submit(self, key: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
               seed: int | None = None) -> None:
        self.messages[key] = messages
        self.turns.submit(key, messages, tools, seed)

    def step(self) -> list[tuple[Any, Any]]:
        return [(key, out if isinstance(out, Exception) else self.agent.record(self.messages.pop(key), out))
                for key, out in self.turns.step()]


def _env_list(envs: Sequence[Any]) -> list[EnvironmentSpec]:
    return [e[0] if isinstance(e, tuple) else e for e in envs]


def collect_rollouts(policy: Any, envs: Sequence[Any], sandbox: Any, config: RLConfig, step: int, seed: int | None = None,
                     *, ref_model: Any = None, lockstep: bool = False) -> list[Rollout]:
    """``group_size`` sampled episodes per environment, graded per episode and per turn. ``policy`` is an
    ``HFAgent`` (anything with its ``generate``): its turns are decoded continuously (``turns``; each episode's
    next turn joins the batch as soon as its tools have run), or in lockstep rounds of batched generation
    (``lockstep``, or a policy without ``turns``); each episode samples from its own seed, so both give the same
    rollouts. With ``ref_model``, each assistant message also gets ``ref_logprobs`` (the reference policy's
    log-probs of the sampled tokens, same temperature)."""
    seed = config.seed if seed is None else seed
    env_list = _env_list(envs)
    cases: list[tuple[EnvironmentSpec, FaultConfig | None]] = []
    meta: list[tuple[int, int]] = []
    for gi, env in enumerate(env_list):
        for k in range(config.group_size):
            faults = (FaultConfig(rate=config.fault_rate, seed=sub_seed("rl-fault", seed, step, env.env_id, k) % (2**63))
                      if config.fault_rate > 0 else None)
            cases.append((env, faults))
            meta.append((gi, k))
    agent = _RecordingAgent(policy, config, sub_seed(seed, step))
    trajs = run_episodes(cases, agent, limits=Limits(max_steps_per_turn=config.max_steps_per_turn),
                         seeds=[sub_seed("rl-sample", seed, step, gi, env_list[gi].env_id, k) for gi, k in meta],
                         lockstep=lockstep or not callable(getattr(policy, "turns", None)))

    # One sandbox batch: every rollout as a whole, plus per turn for multi-turn environments.
    grade_cases: list[tuple[EnvironmentSpec, Trajectory, int | None]] = []
    for (env, _f), tr in zip(cases, trajs):
        grade_cases.append((env, tr, None))
        if len(env.turns) > 1:
            grade_cases.extend((env, tr, t) for t in range(len(env.turns)))
    grades = iter(grade_many(sandbox, grade_cases))

    rollouts: list[Rollout] = []
    for (env, _f), (gi, k), tr in zip(cases, meta, trajs):
        final = next(grades)
        per_turn = [next(grades) for _ in range(len(env.turns))] if len(env.turns) > 1 else []
        reward = reward_of(final, config.reward)
        turn_rewards = turn_rewards_from_scores([turn_score(env, g, config.reward) for g in per_turn], reward)
        rollouts.append(Rollout(
            rollout_id=f"{config.name}:s{step}:{env.env_id}:{k}", env_id=env.env_id, group=gi, step=step, config=config.name,
            reward=reward, turn_rewards=turn_rewards, steps=agent.records.get(id(tr.messages), []), passed=final.passed,
            completion=float(final.completion), safety=bool(final.safety), termination=tr.termination,
            messages=tr.messages,
        ))
    if ref_model is not None:
        _attach_ref_logprobs(ref_model, rollouts, config, _vocab_limit(policy))
    return rollouts


def _vocab_limit(policy: Any) -> int | None:
    n = getattr(policy, "_n_real_tokens", None)
    if n is None and getattr(policy, "tokenizer", None) is not None:
        n = len(policy.tokenizer)
    return int(n) if n else None


# --- advantages ---------------------------------------------------------------------------------------------
def _normalize(values: Sequence[float], how: str) -> list[float]:
    n = len(values)
    if n == 0:
        return []
    mean = sum(values) / n
    centred = [v - mean for v in values]
    if how == "none" or n < 2:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (n - 1))
    return [c / (std + STD_EPS) for c in centred]


def _returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    out, acc = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out


def compute_advantages(rollouts: Sequence[Rollout], config: RLConfig) -> None:
    """Fill ``turn_advantages`` and every step's ``advantage``; groups are (step, group) pairs.

    The reward kind (binary/partial) is already in ``reward`` / ``turn_rewards`` (set at collection)."""
    groups: dict[tuple[int, int], list[Rollout]] = {}
    for r in rollouts:
        groups.setdefault((r.step, r.group), []).append(r)
    for members in groups.values():
        if config.credit == "trajectory":
            adv = _normalize([r.reward for r in members], config.normalize)
            per_turn = [[a] * max(1, len(r.turn_rewards)) for r, a in zip(members, adv)]
        else:
            xs = [list(r.turn_rewards) if config.credit == "turn" else _returns_to_go(r.turn_rewards, config.gamma)
                  for r in members]
            lengths = {len(x) for x in xs}
            if len(lengths) == 1:
                # Turn counts are fixed by the scripted user: a per-turn-index baseline is unbiased.
                n_turns = lengths.pop()
                cols = [_normalize([x[t] for x in xs], config.normalize) for t in range(n_turns)]
                per_turn = [[cols[t][j] for t in range(n_turns)] for j in range(len(members))]
            else:
                # Turn counts differ (policy-dependent): pool one baseline over all (rollout, turn) values.
                flat = _normalize([v for x in xs for v in x], config.normalize)
                per_turn, i = [], 0
                for x in xs:
                    per_turn.append(flat[i:i + len(x)])
                    i += len(x)
                for r in members:
                    r.notes.append("turn counts differ within the group: pooled baseline instead of per-turn-index")
        for r, adv_t in zip(members, per_turn):
            r.turn_advantages = [float(a) for a in adv_t]
            for s in r.steps:
                t = min(int(s.get("turn", 0)), len(adv_t) - 1)
                s["advantage"] = float(adv_t[t])


# --- the update ---------------------------------------------------------------------------------------------
def _forward_logprobs(model: Any, batch: Sequence[tuple[list[int], list[int]]], temperature: float,
                      vocab_limit: int | None, device: str) -> tuple[Any, Any]:
    """Log-probs of each completion token given its prompt, for a left-padded batch.

    Returns ``(logp [n, K], mask [n, K])`` with completions right-aligned in ``K = max completion length``."""
    import torch

    n = len(batch)
    lens = [len(p) + len(c) for p, c in batch]
    width = max(lens)
    k = max(len(c) for _, c in batch)
    pad = int(getattr(model.config, "pad_token_id", None) or 0)
    ids = torch.full((n, width), pad, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    targets = torch.full((n, k), pad, dtype=torch.long)
    mask = torch.zeros((n, k), dtype=torch.bool)
    for r, (p, c) in enumerate(batch):
        seq = list(p) + list(c)
        ids[r, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        attn[r, width - len(seq):] = 1
        targets[r, k - len(c):] = torch.tensor(c, dtype=torch.long)
        mask[r, k - len(c):] = True
    ids, attn, targets, mask = ids.to(device), attn.to(device), targets.to(device), mask.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    # Keep the K+1 last positions; position W-1-K+j predicts completion token j (right-aligned), the last predicts
    # nothing we need.
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, logits_to_keep=k + 1)
    logits = out.logits[:, :-1, :].float()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits = logits.clone()
        logits[..., vocab_limit:] = float("-inf")  # as sampled: size-padding rows are never produced
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    return logp, mask


def _micro_batches(items: list[Any], budget: int) -> list[list[Any]]:
    """Items sorted by length, cut so that (rows x longest row) stays within ``budget`` padded tokens."""
    order = sorted(items, key=lambda it: len(it["prompt_ids"]) + len(it["completion_ids"]))
    out: list[list[Any]] = []
    cur: list[Any] = []
    for it in order:
        length = len(it["prompt_ids"]) + len(it["completion_ids"])
        if cur and (len(cur) + 1) * length > budget:
            out.append(cur)
            cur = []
        cur.append(it)
    if cur:
        out.append(cur)
    return out


def _model_device(model: Any) -> str:
    return str(next(model.parameters()).device)


def _checkpoint_layers(model: Any) -> None:
    """Gradient checkpointing, with dropout off everywhere (its dropout layers, and attention that drops by a rate
    it keeps), since :func:`policy_update` runs a checkpointed model in train mode, where checkpointing applies."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    enable = getattr(model, "activation_checkpointing_enable", None)  # (transformers 5's name; the old one warns)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class _AdaptersOff:
    """The reference policy of a LoRA run: the model being trained with its adapters off (the base it started
    from), instead of a second copy of it."""

    def __init__(self, model: Any, adapters: Any) -> None:
        self.model, self.adapters = model, adapters
        self.config = model.config

    def parameters(self) -> Any:
        return self.model.parameters()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.adapters.disable_adapter():
            return self.model(*args, **kwargs)


def _attach_ref_logprobs(ref_model: Any, rollouts: Sequence[Rollout], config: RLConfig, vocab_limit: int | None) -> None:
    import torch

    items = [s for r in rollouts for s in r.steps if s["completion_ids"]]
    device = _model_device(ref_model)
    with torch.inference_mode():
        for mb in _micro_batches(items, config.micro_batch_tokens):
            logp, mask = _forward_logprobs(ref_model, [(s["prompt_ids"], s["completion_ids"]) for s in mb],
                                           config.temperature, vocab_limit, device)
            for row, s in enumerate(mb):
                n = len(s["completion_ids"])
                s["ref_logprobs"] = logp[row, logp.shape[1] - n:].tolist()


def policy_update(model: Any, rollouts: Sequence[Rollout], config: RLConfig, optimizer: Any, *,
                  vocab_limit: int | None = None) -> dict[str, float]:
    """``inner_epochs`` clipped policy-gradient steps on the rollouts' assistant messages (see the module doc).

    Messages with zero advantage contribute no gradient unless ``kl_coef > 0``; they are skipped in the forward
    pass but still count in the token-mean denominator, so skipping changes nothing but the cost. A model with
    gradient checkpointing (``config.gradient_checkpointing``, as ``train_rl`` sets it up: dropout off) runs in
    train mode, the only mode in which it recomputes its layers."""
    import torch

    items = [s for r in rollouts for s in r.steps if s["completion_ids"]]
    total_tokens = sum(len(s["completion_ids"]) for s in items)
    active = [s for s in items if config.kl_coef > 0 or s.get("advantage", 0.0) != 0.0]
    stats: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0,
                               "clip_frac": 0.0, "approx_kl": 0.0, "kl_ref": 0.0, "grad_norm": 0.0,
                               "n_tokens": float(total_tokens), "active_tokens": 0.0, "updated": 0.0}
    if not active or total_tokens == 0:
        return stats
    if config.kl_coef > 0 and any("ref_logprobs" not in s for s in active):
        raise ValueError("kl_coef > 0 needs ref_logprobs on every step (collect_rollouts(..., ref_model=...))")
    device = _model_device(model)
    params = [p for p in model.parameters() if p.requires_grad]
    batches = _micro_batches(active, config.micro_batch_tokens)
    was_training = model.training
    # No dropout: the first epoch's ratios are exactly 1 (a checkpointed model's dropout is off in train mode).
    model.train(bool(config.gradient_checkpointing))
    sums = {"loss": 0.0, "pg": 0.0, "ratio": 0.0, "clip": 0.0, "akl": 0.0, "kl_ref": 0.0, "tok": 0.0, "gn": 0.0}
    rmin, rmax = math.inf, -math.inf
    for _epoch in range(config.inner_epochs):
        optimizer.zero_grad(set_to_none=True)
        for mb in batches:
            logp, mask = _forward_logprobs(model, [(s["prompt_ids"], s["completion_ids"]) for s in mb],
                                           config.temperature, vocab_limit, device)
            k = logp.shape[1]
            old = torch.zeros_like(logp)
            adv = torch.zeros_like(logp)
            ref = torch.zeros_like(logp) if config.kl_coef > 0 else None
            for row, s in enumerate(mb):
                n = len(s["completion_ids"])
                old[row, k - n:] = torch.tensor(s["logprobs"], dtype=logp.dtype)
                adv[row, k - n:] = float(s.get("advantage", 0.0))
                if ref is not None:
                    ref[row, k - n:] = torch.tensor(s["ref_logprobs"], dtype=logp.dtype)
            m = mask.float()
            log_ratio = (logp - old).masked_fill(~mask, 0.0)
            ratio = log_ratio.exp()
            clipped = ratio.clamp(1.0 - config.clip, 1.0 + config.clip)
            pg = -torch.minimum(ratio * adv, clipped * adv)
            per_tok = pg
            if ref is not None:
                d = (ref - logp).masked_fill(~mask, 0.0)
                k3 = d.exp() - d - 1.0
                per_tok = per_tok + config.kl_coef * k3
                sums["kl_ref"] += float((k3.detach() * m).sum())
            loss = (per_tok * m).sum() / total_tokens
            loss.backward()
            with torch.no_grad():
                sums["loss"] += float(loss)
                sums["pg"] += float((pg * m).sum()) / total_tokens
                sums["ratio"] += float((ratio * m).sum())
                is_clipped = ((ratio < 1.0 - config.clip) & (adv < 0)) | ((ratio > 1.0 + config.clip) & (adv > 0))
                sums["clip"] += float((is_clipped & mask).sum())
                sums["akl"] += float((((ratio - 1.0) - log_ratio) * m).sum())
                sums["tok"] += float(m.sum())
                rmin = min(rmin, float(ratio[mask].min()))
                rmax = max(rmax, float(ratio[mask].max()))
        gn = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm) if config.max_grad_norm > 0 else \
            torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None))
        sums["gn"] += float(gn)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    e, tok = config.inner_epochs, max(sums["tok"], 1.0)
    stats.update(loss=sums["loss"] / e, pg_loss=sums["pg"] / e, ratio_mean=sums["ratio"] / tok, ratio_min=rmin,
                 ratio_max=rmax, clip_frac=sums["clip"] / tok, approx_kl=sums["akl"] / tok,
                 kl_ref=sums["kl_ref"] / tok, grad_norm=sums["gn"] / e, active_tokens=sums["tok"] / e, updated=1.0)
    return stats


# --- rows ---------------------------------------------------------------------------------------------------
def rollout_rows(rollouts: Sequence[Rollout]) -> list[dict[str, Any]]:
    """One JSON-able row per rollout; per-message token records as parallel list columns."""
    rows = []
    for r in rollouts:
        rows.append({
            "rollout_id": r.rollout_id, "config": r.config, "step": r.step, "env_id": r.env_id, "group": r.group,
            "reward": float(r.reward), "passed": bool(r.passed), "completion": float(r.completion), "safety": bool(r.safety),
            "termination": r.termination, "turn_rewards": [float(x) for x in r.turn_rewards],
            "turn_advantages": [float(x) for x in r.turn_advantages], "n_messages": len(r.steps),
            "message_turn": [int(s["turn"]) for s in r.steps],
            "advantage": [float(s.get("advantage", 0.0)) for s in r.steps],
            "prompt_ids": [list(map(int, s["prompt_ids"])) for s in r.steps],
            "completion_ids": [list(map(int, s["completion_ids"])) for s in r.steps],
            "logprobs": [[float(x) for x in s["logprobs"]] for s in r.steps],
            "finish_reason": [str(s.get("finish_reason", "")) for s in r.steps],
            "messages_json": json.dumps(r.messages, ensure_ascii=False, default=str),
        })
    return rows


def rollout_schema() -> dict[str, Any]:
    """Polars schema of ``rollout_rows`` (fixed types for a Delta table)."""
    import polars as pl

    return {"rollout_id": pl.String, "config": pl.String, "step": pl.Int64, "env_id": pl.String, "group": pl.Int64,
            "reward": pl.Float64, "passed": pl.Boolean, "completion": pl.Float64, "safety": pl.Boolean,
            "termination": pl.String, "turn_rewards": pl.List(pl.Float64), "turn_advantages": pl.List(pl.Float64),
            "n_messages": pl.Int64, "message_turn": pl.List(pl.Int64), "advantage": pl.List(pl.Float64),
            "prompt_ids": pl.List(pl.List(pl.Int64)), "completion_ids": pl.List(pl.List(pl.Int64)),
            "logprobs": pl.List(pl.List(pl.Float64)), "finish_reason": pl.List(pl.String), "messages_json": pl.String}


def _curve_row(step: int, rollouts: Sequence[Rollout], stats: dict[str, float], collect_s: float, update_s: float) -> dict[str, Any]:
    n = max(len(rollouts), 1)
    groups: dict[int, list[float]] = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r.reward)
    turn_means = [sum(r.turn_rewards) / len(r.turn_rewards) for r in rollouts if r.turn_rewards]
    rewards = [r.reward for r in rollouts]
    mean = sum(rewards) / n
    return {
        "step": step, "mean_reward": mean,
        "reward_std": math.sqrt(sum((x - mean) ** 2 for x in rewards) / n),
        "pass_rate": sum(r.passed for r in rollouts) / n,
        "mean_completion": sum(r.completion for r in rollouts) / n,
        "mean_turn_reward": sum(turn_means) / max(len(turn_means), 1),
        "zero_adv_groups": sum(1 for g in groups.values() if max(g) == min(g)) / max(len(groups), 1),
        "n_rollouts": len(rollouts), "n_messages": sum(len(r.steps) for r in rollouts),
        "mean_completion_tokens": sum(r.n_tokens for r in rollouts) / max(sum(len(r.steps) for r in rollouts), 1),
        "loss": stats["loss"], "pg_loss": stats["pg_loss"], "ratio_mean": stats["ratio_mean"],
        "ratio_min": stats["ratio_min"], "ratio_max": stats["ratio_max"], "clip_frac": stats["clip_frac"],
        "approx_kl": stats["approx_kl"], "kl": stats["kl_ref"], "grad_norm": stats["grad_norm"],
        "n_tokens": stats["n_tokens"], "active_tokens": stats["active_tokens"], "updated": bool(stats["updated"]),
        "collect_s": round(collect_s, 3), "update_s": round(update_s, 3),
    }


def _mean_ref_kl(rollouts: Sequence[Rollout]) -> float:
    """Monte-Carlo KL(policy || reference) on the sampled tokens: mean of logp_old - logp_ref."""
    num = den = 0.0
    for r in rollouts:
        for s in r.steps:
            if "ref_logprobs" in s:
                num += sum(a - b for a, b in zip(s["logprobs"], s["ref_logprobs"]))
                den += len(s["logprobs"])
    return num / den if den else 0.0


# --- the loop -----------------------------------------------------------------------------------------------
def _select_envs(envs: list[EnvironmentSpec], config: RLConfig, step: int) -> list[EnvironmentSpec]:
    if config.envs_per_step <= 0 or config.envs_per_step >= len(envs):
        return envs
    start = (step * config.envs_per_step) % len(envs)
    return [envs[(start + i) % len(envs)] for i in range(config.envs_per_step)]


def save_checkpoint(model: Any, tokenizer: Any, out_dir: str | Path, base_checkpoint: str | Path | None = None,
                    *, keep_dtype: bool = False) -> Path:
    """A plain checkpoint (model + tokenizer + generation config) that ``HFAgent`` reloads; keeps the student marker.
    Saved in fp32 unless ``keep_dtype`` (a LoRA run's merged bf16 model stays bf16, as its base came)."""
    import torch

    from cowork_pipeline.training.student import STUDENT_MARKER

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not keep_dtype and next(model.parameters()).dtype != torch.float32:
        model = model.to(torch.float32)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if base_checkpoint is not None and (Path(base_checkpoint) / STUDENT_MARKER).is_file():
        shutil.copyfile(Path(base_checkpoint) / STUDENT_MARKER, out / STUDENT_MARKER)
    return out


def train_rl(base_checkpoint: str | Path, envs: Sequence[Any], sandbox: Any, config: RLConfig, steps: int,
             out_dir: str | Path, on_step: Callable[[dict[str, Any]], None] | None = None, device: str = "auto",
             *, track_ref_kl: bool = True) -> RLResult:
    """``steps`` iterations of collect -> advantages -> update from ``base_checkpoint``; saves the final policy to
    ``out_dir``. ``track_ref_kl`` keeps the initial policy to report KL to it (always kept when ``kl_coef > 0``): a
    frozen copy of the model, or, training LoRA adapters (``config.lora``), the model with its adapters off."""
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent, resolve_device
    from cowork_pipeline.training.student import check_checkpoint, is_student_checkpoint

    t0 = time.perf_counter()
    dev = resolve_device(device)
    base = check_checkpoint(base_checkpoint)
    config = replace(config, lora=not is_student_checkpoint(base) if config.lora is None else bool(config.lora))
    torch.manual_seed(config.seed)
    # fp32 master weights for the update (LoRA: the adapters'; a frozen base stays bf16 on a GPU); the same module
    # samples (no copy between sampling and training).
    # Sampling is unconstrained (strict_tools=False): the update recomputes the model's own distribution, and a
    # grammar-masked behaviour policy would make first-epoch ratios != 1 (as top-p would); invalid calls are
    # simply what the rewards teach the policy out of.
    dtype = None if config.lora else torch.float32  # (None: the agent's, bf16 on a GPU that has it, else fp32)
    policy = HFAgent(base, device=dev, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                     top_p=config.top_p, seed=config.seed, batch_size=config.gen_batch_size, dtype=dtype,
                     strict_tools=False)
    model = policy.model
    adapters = None
    ref_model: Any = None
    if config.lora:
        from peft import LoraConfig, get_peft_model

        # (the adapters go into the agent's own model, in place: it samples from the policy being trained; no
        # dropout, so the sampled log-probs are the ones the update recomputes)
        adapters = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                                    target_modules="all-linear", task_type="CAUSAL_LM"))
        if config.kl_coef > 0 or track_ref_kl:
            ref_model = _AdaptersOff(model, adapters)
    config = replace(config, gradient_checkpointing=bool(config.lora) if config.gradient_checkpointing is None
                     else bool(config.gradient_checkpointing))
    if config.gradient_checkpointing:
        _checkpoint_layers(model)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
        if config.kl_coef > 0 or track_ref_kl:
            ref_model = copy.deepcopy(model).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                  betas=(0.9, 0.99), weight_decay=config.weight_decay)
    env_list = _env_list(envs)
    vocab_limit = _vocab_limit(policy)
    curve: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for step in range(steps):
        c0 = time.perf_counter()
        model.eval()
        rollouts = collect_rollouts(policy, _select_envs(env_list, config, step), sandbox, config, step, config.seed,
                                    ref_model=ref_model)
        compute_advantages(rollouts, config)
        c1 = time.perf_counter()
        stats = policy_update(model, rollouts, config, optimizer, vocab_limit=vocab_limit)
        c2 = time.perf_counter()
        if ref_model is not None and config.kl_coef == 0:
            stats["kl_ref"] = _mean_ref_kl(rollouts)
        row = _curve_row(step, rollouts, stats, c1 - c0, c2 - c1)
        row["config"] = config.name
        curve.append(row)
        rows.extend(rollout_rows(rollouts))
        if on_step is not None:
            on_step(row)
    model.eval()
    if adapters is not None:
        model = adapters.merge_and_unload()  # a plain checkpoint for HFAgent, the server and vLLM
    out = save_checkpoint(model, policy.tokenizer, out_dir, base_checkpoint, keep_dtype=adapters is not None)
    (out / "rl_config.json").write_text(json.dumps({**asdict(config), "steps": steps, "base": str(base_checkpoint)},
                                                   indent=2, sort_keys=True))
    (out / "rl_curve.json").write_text(json.dumps(curve, indent=2))
    return RLResult(checkpoint=out, curve=curve, rollouts=rows, config=config, seconds=time.perf_counter() - t0)
