"""Dagster resources: thin, configurable wrappers over the domain core."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

import dagster as dg
from pydantic import Field

from cowork_pipeline.lake import Lake


def default_lake_root() -> str:
    return os.environ.get("COWORK_LAKE", os.path.abspath(os.path.join(os.environ.get("COWORK_HOME", ".cowork"), "lake")))


class LakeResource(dg.ConfigurableResource):
    """Where every artifact lives: a local folder or any deltalake URI (s3://, gs://, az://)."""

    root: str = Field(default_factory=default_lake_root)
    storage_options: dict[str, str] = Field(default_factory=dict)
    # how long a write or publication keeps retrying while other runs commit first (a backfill's runs at once)
    commit_timeout_s: float = Field(default=300.0, gt=0)

    def lake(self) -> Lake:
        return Lake(self.root, self.storage_options or None, commit_timeout_s=self.commit_timeout_s)


class ComputeResource(dg.ConfigurableResource):
    """Which device training and student inference use: auto = CUDA when present, else CPU."""

    device: str = "auto"

    def resolve(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


# How `cowork ui` hands its generator flags to the code location it starts (a separate process): these
# variables, read by ``GeneratorResource.from_env`` when the definitions are built.
_GENERATOR_ENV = (("backend", "COWORK_GENERATOR"), ("base_url", "COWORK_LLM_BASE_URL"), ("model", "COWORK_LLM_MODEL"),
                  ("api_key_env", "COWORK_LLM_API_KEY_ENV"), ("concurrency", "COWORK_LLM_CONCURRENCY"),
                  ("response_cache", "COWORK_LLM_CACHE"))


class GeneratorResource(dg.ConfigurableResource):
    """The environment generator backend: the embedded one (offline) or any OpenAI-compatible endpoint."""

    backend: str = "embedded"  # embedded | llm
    base_url: str = ""  # e.g. http://127.0.0.1:8000/v1
    model: str = ""
    # The key itself is better left out of run config (Dagster shows and stores config): name the
    # environment variable that holds it instead. An empty key sends no Authorization header.
    api_key: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8  # requests in flight at once while a partition drafts or revises
    temperature: float = 0.2
    timeout_s: float = 120.0
    max_retries: int = 2  # per request, on timeouts, 429 and 5xx
    max_tokens: int = 0  # 0: the endpoint's default
    json_mode: bool = True  # send response_format={"type": "json_object"} (turn off for servers that reject it)
    prompt_version: str = "v26"
    # Answers kept on disk by request (same prompt, model, sampling, seed -> the same answer, not paid again).
    response_cache: bool = True
    cache_dir: str = ""  # empty: <COWORK_HOME>/llm-cache

    def to_env(self) -> dict[str, str]:
        return {var: str(int(v) if isinstance(v, bool) else v) for name, var in _GENERATOR_ENV for v in [getattr(self, name)]}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "GeneratorResource":
        """The default generator, with any ``COWORK_GENERATOR`` / ``COWORK_LLM_*`` variable applied."""
        env = os.environ if environ is None else environ
        given = {name: env[var] for name, var in _GENERATOR_ENV if env.get(var, "") != ""}
        if "response_cache" in given:
            given["response_cache"] = given["response_cache"] not in ("0", "false", "no")
        try:
            return cls(**given)
        except Exception as e:  # noqa: BLE001 - pydantic's message, with the variables it came from
            raise ValueError(f"invalid generator settings from {', '.join(v for n, v in _GENERATOR_ENV if n in given)}: {e}") from None

    def code_version(self) -> str:
        """What the synthesis assets record as their code version: the generator (for a model: its name and
        prompt version, since another one drafts other environments) and the validator. The catalog sensor
        and the nightly schedule regenerate partitions recorded with another one."""
        from cowork_pipeline.validation.certify import VALIDATOR_VERSION

        if self.backend == "llm":
            from cowork_pipeline.synthesis.llm import BACKEND_VERSION

            return f"{BACKEND_VERSION}/{self.model}/{self.prompt_version}+{VALIDATOR_VERSION}"
        from cowork_pipeline.synthesis.embedded import GENERATOR_VERSION

        return f"{GENERATOR_VERSION}+{VALIDATOR_VERSION}"

    def build(self) -> Any:
        if self.backend == "embedded":
            from cowork_pipeline.synthesis.embedded import EmbeddedBackend

            return EmbeddedBackend()
        if self.backend == "llm":
            from cowork_pipeline.synthesis.llm import LLMBackend

            if not self.base_url or not self.model:
                raise ValueError("generator backend 'llm' needs base_url and model")
            key = self.api_key or (os.environ.get(self.api_key_env, "") if self.api_key_env else "")
            return LLMBackend(self.base_url, self.model, api_key=key or None, temperature=self.temperature, timeout_s=self.timeout_s,
                              max_retries=self.max_retries, prompt_version=self.prompt_version, max_tokens=self.max_tokens or None,
                              json_mode=self.json_mode, concurrency=self.concurrency,
                              cache_dir=(self.cache_dir or os.path.join(os.environ.get("COWORK_HOME", ".cowork"), "llm-cache"))
                              if self.response_cache else None)
        raise ValueError(f"unknown generator backend {self.backend!r} (embedded | llm)")


class EndpointConfig(dg.Config):
    """A model behind an OpenAI-compatible chat-completions endpoint that the benchmark scores beside the students."""

    base_url: str  # e.g. http://127.0.0.1:8000/v1 (vLLM, SGLang, `cowork serve`, a hosted API)
    model: str  # the name the endpoint serves
    name: str = ""  # label in the scores (agent endpoint:<name>); empty: the model's name
    api_key_env: str = "OPENAI_API_KEY"  # the variable holding the key (never the key itself: config is stored)
    temperature: float = 0.0
    max_tokens: int = 0  # per turn; 0: the endpoint's default
    concurrency: int = 8  # requests in flight at once
    timeout_s: float = 120.0
    max_retries: int = 2  # per request, on timeouts, 429 and 5xx

    def label(self) -> str:
        """The endpoint's id in the lake (checkpoint_id endpoint-<label>): no ':' (score ids are ':'-separated)."""
        return endpoint_label(self.name or self.model)


def endpoint_label(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


_AGENTS_ENV = "COWORK_AGENTS"  # how `cowork ui` hands its endpoint and teacher flags to the code location (JSON)


class AgentsResource(dg.ConfigurableResource):
    """Models behind OpenAI-compatible endpoints: ``endpoints`` the benchmark scores beside the students, and an
    optional ``teacher`` that demonstrates the training environments instead of the embedded one (its trajectories
    are graded by the certified checkers; only passing ones become demonstrations)."""

    endpoints: list[EndpointConfig] = Field(default_factory=list)
    teacher: Optional[EndpointConfig] = None
    response_cache: bool = True  # answers kept by request under cache_dir: a re-run replays them instead of paying again
    cache_dir: str = ""  # empty: <COWORK_HOME>/agent-cache
    # benchmark_scores keeps an agent's earlier trials while they would come out the same (same environments,
    # settings, code and checkpoint): rescore scores every agent again; endpoints are scored whenever configured,
    # and those scored by earlier runs stay in the comparison unless keep_earlier_endpoints is off
    rescore: bool = False
    keep_earlier_endpoints: bool = True
    forget_endpoints: list[str] = Field(default_factory=list)  # labels (or names) of earlier endpoints to leave out

    def keeps_earlier(self, agent: str) -> bool:
        """Whether an endpoint scored by an earlier run, and not configured now, stays in benchmark_scores."""
        forgotten = {f"endpoint:{endpoint_label(n.removeprefix('endpoint:'))}" for n in self.forget_endpoints}
        return self.keep_earlier_endpoints and agent.startswith("endpoint:") and agent not in forgotten

    def build(self) -> list[tuple[str, Any]]:
        """(checkpoint id, agent) per endpoint; a bad URL or setting raises ValueError."""
        labels = [e.label() for e in self.endpoints]
        if len(set(labels)) != len(labels):
            raise ValueError(f"two endpoints share a label ({', '.join(labels)}): give them distinct names")
        return [(f"endpoint-{label}", self._agent(e, label)) for e, label in zip(self.endpoints, labels)]

    def build_teacher(self) -> Any | None:
        """The endpoint teacher's agent (None: the embedded teacher); a bad URL or setting raises ValueError."""
        return self._agent(self.teacher, self.teacher.label()) if self.teacher is not None else None

    def teacher_version(self) -> str:
        """The teacher, as named in a code version: another teacher demonstrates other trajectories."""
        return f"endpoint:{self.teacher.model}@{self.teacher.base_url}" if self.teacher is not None else "embedded"

    def teacher_code_version(self) -> str:
        """teacher_trajectories' code version: "1" with the embedded teacher (as before endpoint teachers existed,
        so an upgrade re-demonstrates nothing), "1+<teacher>" with an endpoint."""
        return "1" if self.teacher is None else f"1+{self.teacher_version()}"

    def _agent(self, e: EndpointConfig, label: str) -> Any:
        from cowork_pipeline.agents.openai_agent import OpenAIAgent

        cache = (self.cache_dir or os.path.join(os.environ.get("COWORK_HOME", ".cowork"), "agent-cache")) if self.response_cache else None
        key = os.environ.get(e.api_key_env, "") if e.api_key_env else ""
        return OpenAIAgent(e.base_url, e.model, api_key=key or None, name=f"endpoint:{label}", temperature=e.temperature,
                           max_tokens=e.max_tokens or None, concurrency=e.concurrency, timeout_s=e.timeout_s,
                           max_retries=e.max_retries, cache_dir=cache)

    def to_env(self) -> dict[str, str]:
        if not self.endpoints and self.teacher is None and not self.rescore and self.keep_earlier_endpoints and not self.forget_endpoints:
            return {}
        return {_AGENTS_ENV: json.dumps({"endpoints": [e.model_dump() for e in self.endpoints],
                                         "teacher": self.teacher.model_dump() if self.teacher is not None else None,
                                         "response_cache": self.response_cache, "rescore": self.rescore,
                                         "keep_earlier_endpoints": self.keep_earlier_endpoints,
                                         "forget_endpoints": self.forget_endpoints})}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "AgentsResource":
        env = os.environ if environ is None else environ
        raw = env.get(_AGENTS_ENV, "")
        try:
            given = json.loads(raw) if raw else {}
            return cls(endpoints=[EndpointConfig(**e) for e in given.get("endpoints") or []],
                       teacher=EndpointConfig(**given["teacher"]) if given.get("teacher") else None,
                       response_cache=bool(given.get("response_cache", True)), rescore=bool(given.get("rescore", False)),
                       keep_earlier_endpoints=bool(given.get("keep_earlier_endpoints", True)),
                       forget_endpoints=list(given.get("forget_endpoints") or []))
        except Exception as e:  # noqa: BLE001 - pydantic's or json's message, with the variable it came from
            raise ValueError(f"invalid agents in {_AGENTS_ENV}: {e}") from None


_PROFILE_ENV = (("catalog_dir", "COWORK_CATALOG"), ("injections", "COWORK_INJECTIONS"))


class ProfileResource(dg.ConfigurableResource):
    """Sizes of one pipeline run. ``default`` is the README's run; tests use a smaller one."""

    name: str = "default"
    catalog_dir: str = ""  # empty: the catalog shipped with the package
    envs_per_capability: int = 0  # seeds drafted per capability; 0: each capability's own `environments` (default 64)
    # Planted instructions (prompt injection) for every capability where one fits, over each file's own
    # difficulty.injections: "" keeps the files' (the shipped catalog: none), "off" none, "some" about half the
    # seeds, "all" every seed. Off by default: measured, it costs the tiny default student (docs/capabilities.md).
    injections: str = ""
    max_repair_rounds: int = 3
    validation_fault_rate: float = 0.25
    sandbox_workers: int = 1
    heldout_env_fraction: float = 0.15
    split_seed: int = 0
    teacher_fault_rate: float = 0.1
    demos_per_capability: int = 0  # training environments per capability the teacher demonstrates (0 = all)
    max_demo_chars: int = 12000
    eval_trials: int = 2
    eval_fault_rate: float = 0.1
    eval_envs_per_capability: int = 3
    # Tokens one agent turn may take, in RL rollouts and the benchmark alike. The embedded student's longest
    # demonstrated turn is ~150 tokens (a schedule_meeting invitation); RL's former 128 cut every such turn.
    max_new_tokens: int = 256
    sft_epochs: float = 3.0
    # Measured on 2 cores (2026-12-02): a 128-wide student with a 2,048-token vocabulary trains ~4x faster per
    # demonstration than 256/4,096, and more steps on more distinct demonstrations beat more epochs on fewer.
    # The student underfits (teacher-forced, it gets as many calls right on its training environments as on
    # held-out ones), so optimizer steps are what count: 1,000 steps of 2 demonstrations instead of 500 of 4 (the
    # same tokens and time) took held-out pass from 0.108 to 0.412 in the lab (2026-12-03).
    # 1,300 steps for the ~970 demonstrations of 18 training capabilities (1,000 were set for 759): on the same data
    # 1,300 passed 61 of 162 held-out-environment trials against 53 for 1,000 (2026-12-04; ~13 min on 2 cores).
    # 1,600 (2026-12-06): at 1,300 the result swung by ten points with two more demonstrations (972: 36 of 108
    # faulted held-out trials, against 47 on 970); 1,600 steps on the same 972 passed 56 (~12 min on 2 cores), and
    # 56 and 37 with the student's seed 1 and 2: more steps lift the mean, the seed still swings it.
    sft_max_steps: int = 1600  # > 0 overrides sft_epochs
    sft_lr: float = 3e-3
    sft_batch_size: int = 2
    # Assistant tokens weigh this much more than the rest in the student's every-token loss (measured: 4 beats 1).
    sft_assistant_weight: float = 4.0
    # Argument names in tool calls learned through the vocabulary head, not copied by the pointer (SFTSettings).
    sft_keys_from_vocab: bool = True
    student_hidden: int = 128
    student_layers: int = 4
    student_vocab: int = 2048
    # Pointer-sentinel copy head of the embedded student (training/pointer.py); 0 = a plain Qwen3.
    student_pointer_dim: int = 64
    base_checkpoint: str = ""  # a checkpoint folder (or its object-store URI) to fine-tune instead of the embedded student
    rl_configs: str = "binary_traj,partial_group,partial_turn"  # comma-separated RL configurations to train
    # 2 steps on 4 environments: the stronger SFT student's rollouts are longer (3 steps on 8 environments took
    # 265 s and the run 21.1 min; 2 on 6, 165 s and 20.1 min), and the default run stays near 20 min of work (about 24 min with 21 capabilities and 1,300 SFT steps).
    rl_steps: int = 2
    rl_group_size: int = 4
    rl_envs: int = 4
    seed: int = 0  # the teacher's and the benchmark's fault draws and sampling
    # The student's own seed: its initialization, its SFT batch order, its RL sampling. Environments, splits,
    # demonstrations and the benchmark's draws stay the same, so students of several seeds are scored on one
    # benchmark. A non-zero seed's checkpoints are registered beside seed 0's (ids ending in -seed<N>), so they
    # never overwrite the weights that earlier scores trace back to.
    student_seed: int = 0

    def to_env(self) -> dict[str, str]:
        """What `cowork ui` hands the code location (another process) of this profile: its catalog and injections."""
        return {var: str(getattr(self, name)) for name, var in _PROFILE_ENV}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "ProfileResource":
        """The default profile with the catalog and injections `cowork ui` was given (a bad setting raises here,
        before the code location serves anything)."""
        env = os.environ if environ is None else environ
        profile = cls(**{name: env[var] for name, var in _PROFILE_ENV if env.get(var, "") != ""})
        profile.injections_range()
        return profile

    def injections_range(self) -> tuple[int, int] | None:
        """The (min, max) the ``injections`` setting gives every capability; None to keep each file's own."""
        if not self.injections:
            return None
        if self.injections not in INJECTIONS:
            raise ValueError(f"unknown injections setting {self.injections!r} (one of: {', '.join(INJECTIONS)}, or empty for each file's own)")
        return INJECTIONS[self.injections]

    def capability(self, capability: Any, text: str) -> tuple[Any, str]:
        """A catalog file's capability (and its YAML ``text``) as this profile drafts it: with ``injections`` set,
        its ``difficulty.injections`` is the setting's, and the text says so beside the knob."""
        from cowork_pipeline.capabilities import Range, with_knob

        value = self.injections_range()
        if value is None:
            return capability, text
        return with_knob(text, capability, "injections", Range(min=value[0], max=value[1]),
                         f"set by the profile '{self.name}': injections={self.injections}")

    def seeds_for(self, capability: Any) -> range:
        """The seeds drafted for ``capability``: the profile's count when it sets one, else the capability's."""
        return range(self.envs_per_capability or capability.environments)


# the profile's injections settings, as difficulty.injections ranges (min, max)
INJECTIONS = {"off": (0, 0), "some": (0, 1), "all": (1, 1)}

SMOKE_PROFILE = dict(name="smoke", envs_per_capability=4, demos_per_capability=2, eval_envs_per_capability=2, eval_trials=2, sft_epochs=1.0,
                     sft_max_steps=4, student_hidden=64, student_layers=2, student_vocab=1024, rl_steps=1, rl_group_size=2,
                     rl_configs="binary_traj,partial_turn",
                     rl_envs=2)
