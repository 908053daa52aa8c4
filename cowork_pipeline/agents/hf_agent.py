"""Local Hugging Face model backend (the student, or any causal-LM checkpoint directory).

Generation is a custom batched decode loop (``agents/decoding.py``, which rows may join while it runs: ``cowork
serve``'s requests, and the turns of episodes ``runner.run_episodes`` drives through ``turns()``): prompts are
left-padded into one batch, prefilled once, then decoded one token per step for the whole batch against a shared
``DynamicCache`` (KV-cached). The prompt prefix common to the whole batch (in rollouts: the system block with the
tools list, most of every prompt) is prefilled once and its KV copied to every row instead of being recomputed per
row. Finished rows are dropped from the batch (and the cache) as soon as half of them are done, so a long straggler
does not keep paying for the rest. Each sequence stops at ``<|im_end|>`` (or ``<|endoftext|>`` / the checkpoint's eos ids).

KV reuse (``prefix_cache_mb``, ``agents/prefix_cache.py``): the KV of every finished generation is kept, and the
next step of the same conversation (its prompt extends the previous prompt) prefills only its new tokens. Decode
steps write into a preallocated cache instead of concatenating it again per token.

Context policy (``max_context_tokens``, default the model's ``max_position_embeddings``): a prompt must leave room
for ``max_new_tokens``. If it does not, history is truncated from the left in whole units (a message plus the tool
results that answer it, so no orphan tool results), oldest first, always keeping the first system message (it
carries the tools block) and, if at all possible, the first user message (the task). The latest unit is always
kept. If even system block + latest unit does not fit, nothing is generated and the step fails: the message
carries ``parse_error = "context_overflow: ..."`` (the runner turns it into a failed step).

Prompts are rendered with ``chat_format.render_prompt`` (always ``CHAT_TEMPLATE``), exactly as SFT data is.
``complete`` continues prompts given as token ids instead (token in, token out), through the same decode loop.
A ``GenerationListener`` sees prompts and tokens as they are generated (streaming), and may end a turn early.

Strict tool calls (``strict_tools=True``, the default): when tools are offered, each row's next-token logits are
masked by a grammar of the offered tools' schemas (``agents/constrained.py``), so every ``<tool_call>`` the model
opens names an offered tool with arguments valid for it. ``Generation.logprobs`` stay the raw model's;
``sampling_logprobs`` are those of the masked distribution actually sampled from.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, Sequence

from cowork_pipeline.agents.base import Message, ToolSchema
from cowork_pipeline.agents.chat_format import END_OF_TEXT, IM_END, parse_assistant_output, render_prompt
from cowork_pipeline.agents.decoding import Decoding
from cowork_pipeline.agents.prefix_cache import PrefixCache

Conversation = tuple[Sequence[Message], Sequence[ToolSchema]]


@dataclass
class Generation:
    """One generated assistant turn with its token-level record."""

    message: Message
    text: str
    prompt_ids: list[int]
    completion_ids: list[int]  # includes the stop token when one was produced
    finish_reason: str  # "stop" | "length" | "context_overflow"
    logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    # Per completion token, the k likeliest tokens under the raw distribution as (id, logprob), likeliest first
    # (``generate(top_logprobs=k)``; empty otherwise).
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


class GenerationListener(Protocol):
    """Sees a ``generate`` call as it goes (``cowork serve`` streams from it): each conversation's prompt ids once
    encoded, then each token as it is drawn, with its raw log-probability and, where asked for, the k likeliest
    tokens. ``index`` is the conversation's position in the call's input. Called from the generating thread.
    ``token`` returning True ends that conversation's turn there (a stop sequence said, a client gone): its text so
    far is its answer, finish reason "stop"."""

    def prompt(self, index: int, prompt_ids: list[int]) -> None: ...

    def token(self, index: int, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> bool | None: ...


@dataclass
class Sample:
    """A sampled turn for RL.

    ``logprobs[i]`` is log p(completion_ids[i]) under the model's *raw* distribution (temperature 1, no top-p, over
    the tokenizer's tokens: embedding rows of size padding excluded):
    the quantity a policy-gradient trainer recomputes for the current policy, so ratios are consistent.
    ``sampling_logprobs[i]`` is the same token's log-prob under the distribution actually sampled from
    (temperature / top-p applied), for off-policy corrections when sampling with temperature != 1; with
    temperature 0 (greedy) it is 0.0 for every token. A stop token that ended the turn is included, with its
    log-probs, as the last completion id.
    """

    message: Message
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    sampling_logprobs: list[float]
    finish_reason: str


def _blocks(messages: Sequence[Message]) -> list[list[Message]]:
    """Split history into droppable units: a non-tool message plus the tool results that follow it, so that
    truncation never keeps a tool result without the assistant call that produced it."""
    blocks: list[list[Message]] = []
    for m in messages:
        if m.get("role") == "tool" and blocks:
            blocks[-1].append(m)
        else:
            blocks.append([m])
    return blocks


def _common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(x) for x in seqs)
    for i in range(n):
        t = first[i]
        if any(x[i] != t for x in seqs):
            return i
    return n


def resolve_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _count_tool_calls(messages: Sequence[Message]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


class HFAgent:
    """``Agent`` / ``BatchAgent`` / ``ContinuousAgent`` backed by a local checkpoint directory."""

    def __init__(
        self,
        checkpoint: str | Path,
        device: str = "auto",
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_context_tokens: int | None = None,
        batch_size: int = 16,
        dtype: Any = None,
        strict_tools: bool = True,
        prefix_cache_mb: int = 2048,
    ) -> None:
        import torch

        from cowork_pipeline.training.student import load_checkpoint

        self.checkpoint = Path(checkpoint)
        self.device = resolve_device(device)
        if dtype is None:
            # bf16 halves memory traffic on GPUs; CPU bf16 matmuls are slow, so fp32 there.
            dtype = torch.bfloat16 if self.device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
        self.model, self.tokenizer = load_checkpoint(self.checkpoint, device=self.device, dtype=dtype)
        self.model.eval()
        self.name = f"hf:{self.checkpoint.name}"
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.batch_size = max(1, batch_size)
        # Below this many shared prompt tokens, a separate prefix prefill is not worth its extra forward call.
        self.min_shared_prefix = 32
        cfg = self.model.config.get_text_config()
        self.max_context_tokens = int(max_context_tokens or getattr(cfg, "max_position_embeddings", 4096))

        vocab = self.tokenizer.get_vocab()
        if IM_END not in vocab:
            raise ValueError(
                f"checkpoint {str(self.checkpoint)!r}: tokenizer has no {IM_END} token; it was not prepared for our "
                "chat format (train it with training.sft.train_sft, which adds the chat tokens)"
            )
        stops = {vocab[IM_END]}
        if END_OF_TEXT in vocab:
            stops.add(vocab[END_OF_TEXT])
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        for eos in [gen_eos] if isinstance(gen_eos, int) else (gen_eos or []):
            stops.add(int(eos))
        self.stop_ids = sorted(stops)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else vocab.get(END_OF_TEXT, self.stop_ids[0]))
        # transformers 5 renamed past_key_values -> cache; support both so any checkpoint class works.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._n_real_tokens = len(self.tokenizer)
        # KV reuse across the steps of a conversation (agents/prefix_cache.py); 0 turns it off.
        self._prefix_cache = PrefixCache(prefix_cache_mb * 2**20) if prefix_cache_mb > 0 else None
        self._cached_weights = self._weights_version()
        # Strict tool calls (agents/constrained.py): tool calls must match the offered tools' schemas.
        self.constraint = None
        if strict_tools:
            from cowork_pipeline.agents.constrained import ToolCallConstraint

            vocab_rows = int(self.model.get_output_embeddings().weight.shape[0])
            self.constraint = ToolCallConstraint(self.tokenizer, vocab_rows, self.stop_ids)

    # --- Agent protocol -------------------------------------------------------------------------------------
    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> Message:
        return self.act_batch([(messages, tools)])[0]

    def act_batch(self, conversations: Sequence[Conversation]) -> list[Message]:
        return [g.message for g in self.generate(conversations)]

    def sample_with_logprobs(
        self, conversations: Sequence[Conversation], temperature: float = 1.0, seed: int = 0, top_p: float = 1.0
    ) -> list[Sample]:
        gens = self.generate(conversations, temperature=temperature, top_p=top_p, seed=seed)
        return [
            Sample(g.message, g.prompt_ids, g.completion_ids, g.logprobs, g.sampling_logprobs, g.finish_reason)
            for g in gens
        ]

    # --- Generation -----------------------------------------------------------------------------------------
    def encode_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSchema],
                      max_new_tokens: int | None = None) -> list[int] | None:
        """Prompt token ids after the context policy, or None when even the minimal prompt cannot fit."""
        budget = self.max_context_tokens - (self.max_new_tokens if max_new_tokens is None else max_new_tokens)
        msgs = list(messages)
        ids = self._tokenize(msgs, tools)
        if len(ids) <= budget:
            return ids
        system = msgs[:1] if msgs and msgs[0].get("role") == "system" else []
        task = msgs[len(system):len(system) + 1]
        task = task if task and task[0].get("role") == "user" else []
        # Prefer keeping the task statement (first user message) pinned next to the system block; give it up
        # only if the system block + task + last block cannot fit.
        for pinned in ([*system, *task], system) if task else (system,):
            blocks = _blocks(msgs[len(pinned):])
            if not blocks:
                continue

            def fitted(k: int) -> list[int] | None:
                out = self._tokenize(pinned + [m for b in blocks[k:] for m in b], tools)
                return out if len(out) <= budget else None

            # Dropping more blocks never lengthens the prompt, so binary-search the fewest blocks to drop
            # (always keeping the last block: the latest message and its tool results).
            lo, hi = 1, len(blocks) - 1
            if hi < lo or fitted(hi) is None:
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                if fitted(mid) is not None:
                    hi = mid
                else:
                    lo = mid + 1
            return fitted(lo)
        return None

    def _tokenize(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> list[int]:
        text = render_prompt(self.tokenizer, messages, tools, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(
        self,
        conversations: Sequence[Conversation],
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        require_tool_call: bool = False,
        json_schema: dict[str, Any] | None = None,
        top_logprobs: int = 0,
        single_tool_call: bool = False,
        seeds: Sequence[int] | None = None,
        listener: GenerationListener | None = None,
    ) -> list[Generation]:
        """Batched generation for many conversations; results are in input order and never raise on bad output.
        ``require_tool_call``: each turn offered tools opens with a call; ``json_schema``: each turn is one JSON
        value valid for the schema (no calls). Both are the strict grammar's (ValueError without strict tool calls,
        which alone can force them), as is ``single_tool_call``: each turn ends after its first call.
        ``top_logprobs``: record each step's k likeliest tokens too. ``seeds`` (one per conversation, in place of
        ``seed``): each conversation samples from its own random stream, so its sample does not depend on what it is
        batched with (with one ``seed`` the batch shares one stream). ``listener`` sees each prompt and token as it
        is generated (what is generated does not depend on it)."""
        if (require_tool_call or single_tool_call or json_schema is not None) and self.constraint is None:
            raise ValueError("a required or single tool call, or a JSON answer, needs strict tool calls "
                             "(HFAgent(strict_tools=True))")

        if seeds is not None and len(seeds) != len(conversations):
            raise ValueError(f"{len(seeds)} seeds for {len(conversations)} conversations")
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        results: list[Generation | None] = [None] * len(conversations)
        prompts: list[tuple[int, list[int]]] = []
        for i, (messages, tools) in enumerate(conversations):
            ids = self.chat_prompt(messages, tools, max_new)
            if isinstance(ids, Generation):
                results[i] = ids
            else:
                prompts.append((i, ids))
                if listener is not None:
                    listener.prompt(i, ids)
        for i, ids, out in self._decoded(
                prompts, temperature, top_p, max_new, seed, seeds, listener, top_logprobs,
                [conversations[i][1] for i in range(len(conversations))], require_tool_call, json_schema,
                single_tool_call):
            results[i] = self.generation(("chat", *conversations[i]), ids, out)
        return [r for r in results if r is not None]

    def chat_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSchema], max_new: int) -> list[int] | Generation:
        """A conversation's prompt ids, or the failed turn (``context_overflow``) when it cannot fit."""
        ids = self.encode_prompt(messages, tools, max_new)
        if ids is None:
            why = (f"context_overflow: system block + last message exceed {self.max_context_tokens} tokens "
                   f"minus max_new_tokens={max_new}")
            return Generation({"role": "assistant", "content": "", "parse_error": why}, "", [], [], "context_overflow")
        return ids

    def generation(self, prompt: tuple, ids: list[int], out: tuple) -> Generation:
        """What a decoded row is (``out``: its result as ``Decoding.step`` gives it): for ``("chat", messages,
        tools)`` the assistant's turn parsed, for ``("text", ids)`` the completion's text."""
        comp, lps, slps, finished, tops, ended = out
        if prompt[0] == "text":
            return Generation({}, self._text(comp, finished, ended), ids, comp, "stop" if finished else "length",
                              lps, slps, tops)
        gen = self._finish(ids, comp, lps, slps, finished, _count_tool_calls(prompt[1]), ended)
        gen.top_logprobs = tops
        return gen

    def complete(
        self,
        prompts: Sequence[Sequence[int]],
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
        top_logprobs: int = 0,
        seeds: Sequence[int] | None = None,
        listener: GenerationListener | None = None,
    ) -> list[Generation]:
        """Token in, token out: each prompt's token ids continued as given (no chat template, no context policy),
        as an RL framework that renders its own prompts, and trains on the ids it sampled, asks. Options as for
        :meth:`generate`; each turn ends at a stop token or after ``max_new_tokens``. ``Generation.message`` is
        empty and ``text`` is the completion's text, the stop token that ended it left out. ValueError for a prompt
        that is empty, holds an id outside the tokenizer's vocabulary, or leaves no room for ``max_new_tokens``."""
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        rows: list[tuple[int, list[int]]] = []
        for i, ids in enumerate(prompts):
            ids = [int(t) for t in ids]
            if (why := self.prompt_problem(ids, max_new)) is not None:
                raise ValueError(f"prompt {i}: {why}")
            rows.append((i, ids))
            if listener is not None:
                listener.prompt(i, ids)
        results: list[Generation | None] = [None] * len(prompts)
        for i, ids, out in self._decoded(rows, temperature, top_p, max_new, seed, seeds, listener, top_logprobs):
            results[i] = self.generation(("text", ids), ids, out)
        return [r for r in results if r is not None]

    def prompt_problem(self, ids: Sequence[int], max_new_tokens: int | None = None) -> str | None:
        """Why :meth:`complete` would refuse the prompt ``ids`` (None: it would not)."""
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if not ids:
            return "it is empty"
        if (bad := next((t for t in ids if not 0 <= t < self._n_real_tokens), None)) is not None:
            return f"token id {bad} is not in the vocabulary (0 to {self._n_real_tokens - 1})"
        if len(ids) + max_new > self.max_context_tokens:
            return (f"its {len(ids)} tokens and max_tokens={max_new} exceed the model's context of "
                    f"{self.max_context_tokens} tokens")
        return None

    def _decoded(self, prompts: list[tuple[int, list[int]]], temperature: float | None, top_p: float | None,
                 max_new: int, seed: int | None, seeds: Sequence[int] | None, listener: GenerationListener | None,
                 top_logprobs: int, tools: Sequence[Sequence[ToolSchema]] | None = None,
                 require_tool_call: bool = False, json_schema: dict[str, Any] | None = None,
                 single_tool_call: bool = False) -> Any:
        """(input position, prompt ids, what :meth:`_decode` made of it) for each ``(position, ids)`` prompt,
        decoded in batches of similar lengths; ``tools`` by input position (None: no tools, no grammar)."""
        import torch

        temperature = self.temperature if temperature is None else float(temperature)
        top_p = self.top_p if top_p is None else float(top_p)
        seed = self.seed if seed is None else int(seed)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        # Sorting by length groups similar prompts, which minimises left padding inside each batch.
        prompts = sorted(prompts, key=lambda p: len(p[1]))
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            if seeds is not None:
                generator = [torch.Generator(device=self.device).manual_seed(int(seeds[i])) for i, _ in chunk]
            # (the decode loop numbers the chunk's rows; the listener knows conversations by their input position)
            on_token = None if listener is None else partial(_relay, listener, [i for i, _ in chunk])
            outs = self._decode([ids for _, ids in chunk], temperature, top_p, max_new, generator,
                                [tools[i] for i, _ in chunk] if tools is not None else None, require_tool_call,
                                json_schema, top_logprobs, single_tool_call, on_token)
            for (i, ids), out in zip(chunk, outs):
                yield i, ids, out

    def _text(self, comp: list[int], stopped: bool, ended: bool) -> str:
        """A completion's text: its tokens but the stop token that ended it (a turn the listener ended has none)."""
        body = comp[:-1] if stopped and not ended else comp
        return self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _finish(self, prompt_ids: list[int], comp: list[int], lps: list[float], slps: list[float], stopped: bool,
                id_offset: int, ended: bool = False) -> Generation:
        text = self._text(comp, stopped, ended)
        message = parse_assistant_output(text, truncated=not stopped, id_offset=id_offset)
        return Generation(message, text, prompt_ids, comp, "stop" if stopped else "length", lps, slps)

    def _decode(
        self, prompts: list[list[int]], temperature: float, top_p: float, max_new: int, generator: Any,
        tools: Sequence[Sequence[ToolSchema] | None] | None = None, require_tool_call: bool = False,
        json_schema: dict[str, Any] | None = None, top_logprobs: int = 0, single_tool_call: bool = False,
        on_token: Any = None,
    ) -> list[tuple[list[int], list[float], list[float], bool, list[list[tuple[int, float]]], bool]]:
        """One batch decoded to its end (see ``agents/decoding.py``); ``generator`` is one random stream for the
        batch, or a list of one per row."""
        decoding = self.decoding(temperature, top_p, max_new, top_logprobs,
                                 generator=None if isinstance(generator, list) else generator, on_token=on_token)
        # (queued: a batch whose prefill runs out of memory is prefilled in halves; see Decoding.enqueue)
        decoding.enqueue([(r, ids, self.matcher(tools[r] if tools else None, require_tool_call, json_schema,
                                              single_tool_call),
                         generator[r] if isinstance(generator, list) else None) for r, ids in enumerate(prompts)])
        outs: dict[int, tuple] = {}
        while decoding.live:
            for r, _ids, out in decoding.step():
                if isinstance(out, Exception):  # (a row that failed even alone, after a failed step)
                    raise out
                outs[r] = out
        return [outs[r] for r in range(len(prompts))]

    def decoding(self, temperature: float | None = None, top_p: float | None = None, max_new: int | None = None,
                 top_logprobs: int = 0, generator: Any = None, on_token: Any = None) -> Decoding:
        """A batch to admit prompts to and step (``agents/decoding.py``), with the agent's defaults."""
        if self._prefix_cache is not None:
            version = self._weights_version()
            if version != self._cached_weights:
                self._prefix_cache.clear()
            self._cached_weights = version
        return Decoding(self, self.temperature if temperature is None else float(temperature),
                        self.top_p if top_p is None else float(top_p),
                        self.max_new_tokens if max_new is None else int(max_new), top_logprobs, generator, on_token)

    def turns(self, join_every: int = 4, *, temperature: float | None = None, top_p: float | None = None,
              max_new_tokens: int | None = None, generations: bool = False) -> Any:
        """Conversations' turns decoded continuously (``agents/decoding.py``'s ``Turns``), as ``run_episodes``
        drives many episodes; sampled as the agent samples unless told otherwise."""
        from cowork_pipeline.agents.decoding import Turns

        return Turns(self, join_every, temperature=temperature, top_p=top_p, max_new=max_new_tokens,
                     generations=generations)

    def matcher(self, tools: Sequence[ToolSchema] | None, require_tool_call: bool = False,
                json_schema: dict[str, Any] | None = None, single_tool_call: bool = False) -> Any:
        """A turn's strict-grammar matcher (None: nothing to constrain, or no strict tool calls)."""
        if self.constraint is None:
            return None
        return self.constraint.matcher(tools, require_tool_call, json_schema, single_tool_call)

    # --- KV reuse across steps (prefix_cache.py) -------------------------------------------------------------
    def _reuse_enabled(self, cache: Any) -> bool:
        from transformers.cache_utils import DynamicLayer

        # Sliding-window layers keep only a window of keys: what they hold cannot be sliced per row.
        return self._prefix_cache is not None and all(isinstance(layer, DynamicLayer) and not layer.is_sliding
                                                      for layer in cache.layers)

    def _fill_cache(self, cache: Any, reused: Sequence[tuple[int, list[tuple[Any, Any]]] | None], region: int) -> None:
        """Write each row's reused KV right-aligned into a (rows, heads, region, dim) block per cache layer."""
        from transformers.cache_utils import DynamicLayer

        template = next(r[1] for r in reused if r is not None)
        for li, (k0, v0) in enumerate(template):
            keys = k0.new_zeros((len(reused), k0.shape[0], region, k0.shape[-1]))
            values = v0.new_zeros((len(reused), v0.shape[0], region, v0.shape[-1]))
            for r, hit in enumerate(reused):
                if hit is not None:
                    n, layers = hit
                    keys[r, :, region - n:] = layers[li][0]
                    values[r, :, region - n:] = layers[li][1]
            while len(cache.layers) <= li:  # extra layers a model keeps after the backbone's (the pointer memory)
                cache.layers.append(DynamicLayer())
            cache.layers[li].update(keys, values)

    def clear_prefix_cache(self) -> None:
        if self._prefix_cache is not None:
            self._prefix_cache.clear()

    def _weights_version(self) -> tuple[int, ...]:
        # In-place updates (optimizer steps) bump a tensor's version counter: KV from older weights is stale.
        return tuple(p._version for p in self.model.parameters())


def _relay(listener: GenerationListener, rows: list[int], r: int, *drawn: Any) -> bool | None:
    return listener.token(rows[r], *drawn)


def _top_p_filter(logp: Any, top_p: float) -> Any:
    """Renormalised log-probs restricted to the smallest set of tokens with cumulative probability >= top_p."""
    import torch

    sorted_lp, idx = torch.sort(logp, descending=True, dim=-1)
    cum = sorted_lp.exp().cumsum(-1)
    drop = cum - sorted_lp.exp() >= top_p  # keep the token that crosses the threshold
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(logp, float("-inf")).scatter(-1, idx, sorted_lp)
    return torch.log_softmax(filtered, dim=-1)
