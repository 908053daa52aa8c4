"""Local Hugging Face model backend (the student, or any causal-LM checkpoint directory).

Generation is a custom batched decode loop: prompts are left-padded into one batch, prefilled once, then decoded
one token per step for the whole batch against a shared ``DynamicCache`` (KV-cached). Finished rows are dropped
from the batch (and the cache) as soon as half of them are done, so a long straggler does not keep paying for the
rest. Each sequence stops at ``<|im_end|>`` (or ``<|endoftext|>`` / the checkpoint's eos ids).

Context policy (``max_context_tokens``, default the model's ``max_position_embeddings``): a prompt must leave room
for ``max_new_tokens``. If it does not, whole messages are dropped from the left, oldest first, always keeping the
first system message (it carries the tools block) and never starting the kept history on an orphan tool result.
If even the system block plus the last message does not fit, no generation happens and the step fails: the
message carries ``parse_error = "context_overflow: ..."`` (the runner turns it into a failed step).

Prompts are rendered with ``chat_format.render_prompt`` (always ``CHAT_TEMPLATE``), exactly as SFT data is.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from cowork_pipeline.agents.base import Message, ToolSchema
from cowork_pipeline.agents.chat_format import END_OF_TEXT, IM_END, parse_assistant_output, render_prompt

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


@dataclass
class Sample:
    """A sampled turn for RL.

    ``logprobs[i]`` is log p(completion_ids[i]) under the model's *raw* distribution (temperature 1, no top-p):
    the quantity a policy-gradient trainer recomputes for the current policy, so ratios are consistent.
    ``sampling_logprobs[i]`` is the same token's log-prob under the distribution actually sampled from
    (temperature / top-p applied), for off-policy corrections when sampling with temperature != 1.
    """

    message: Message
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    sampling_logprobs: list[float]
    finish_reason: str


def resolve_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _count_tool_calls(messages: Sequence[Message]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


class HFAgent:
    """``Agent`` / ``BatchAgent`` backed by a local checkpoint directory."""

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
    def encode_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSchema]) -> list[int] | None:
        """Prompt token ids after the context policy, or None when even the minimal prompt cannot fit."""
        budget = self.max_context_tokens - self.max_new_tokens
        msgs = list(messages)
        ids = self._tokenize(msgs, tools)
        if len(ids) <= budget:
            return ids
        head = msgs[:1] if msgs and msgs[0].get("role") == "system" else []
        rest = msgs[len(head):]
        while len(rest) > 1:
            rest = rest[1:]
            while len(rest) > 1 and rest[0].get("role") == "tool":  # never keep a result without its call
                rest = rest[1:]
            ids = self._tokenize(head + rest, tools)
            if len(ids) <= budget:
                return ids
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
    ) -> list[Generation]:
        """Batched generation for many conversations; results are in input order and never raise on bad output."""
        import torch

        temperature = self.temperature if temperature is None else float(temperature)
        top_p = self.top_p if top_p is None else float(top_p)
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        seed = self.seed if seed is None else int(seed)
        generator = torch.Generator(device=self.device).manual_seed(seed)

        results: list[Generation | None] = [None] * len(conversations)
        prompts: list[tuple[int, list[int]]] = []
        saved_max_new = self.max_new_tokens
        self.max_new_tokens = max_new  # the context budget depends on the requested completion length
        try:
            for i, (messages, tools) in enumerate(conversations):
                ids = self.encode_prompt(messages, tools)
                if ids is None:
                    why = (f"context_overflow: system block + last message exceed {self.max_context_tokens} tokens "
                           f"minus max_new_tokens={max_new}")
                    msg = {"role": "assistant", "content": "", "parse_error": why}
                    results[i] = Generation(msg, "", [], [], "context_overflow")
                else:
                    prompts.append((i, ids))
        finally:
            self.max_new_tokens = saved_max_new

        # Sorting by length groups similar prompts, which minimises left padding inside each batch.
        prompts.sort(key=lambda p: len(p[1]))
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            outs = self._decode([ids for _, ids in chunk], temperature, top_p, max_new, generator)
            for (i, ids), (comp, lps, slps, finished) in zip(chunk, outs):
                messages = conversations[i][0]
                results[i] = self._finish(ids, comp, lps, slps, finished, _count_tool_calls(messages))
        return [r for r in results if r is not None]

    def _finish(self, prompt_ids: list[int], comp: list[int], lps: list[float], slps: list[float], stopped: bool,
                id_offset: int) -> Generation:
        body = comp[:-1] if stopped else comp
        text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        message = parse_assistant_output(text, truncated=not stopped, id_offset=id_offset)
        return Generation(message, text, prompt_ids, comp, "stop" if stopped else "length", lps, slps)

    def _decode(
        self, prompts: list[list[int]], temperature: float, top_p: float, max_new: int, generator: Any
    ) -> list[tuple[list[int], list[float], list[float], bool]]:
        import torch
        from transformers import DynamicCache

        dev = self.device
        n = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        # The mask is allocated once for prompt + all new tokens and sliced per step (no per-step concatenation).
        full_attn = torch.zeros((n, width + max_new), dtype=torch.long)
        for r, p in enumerate(prompts):
            input_ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
            full_attn[r, width - len(p):] = 1  # future columns are 1 too; only the [:, :cur] slice is ever read
        input_ids, full_attn = input_ids.to(dev), full_attn.to(dev)
        attn = full_attn[:, :width]
        # Left padding: positions count real tokens only, so a padded row sees the same RoPE phases as unpadded.
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        stop = torch.tensor(self.stop_ids, device=dev)

        comps: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[float]] = [[] for _ in range(n)]
        slps: list[list[float]] = [[] for _ in range(n)]
        stopped = [False] * n
        rows = torch.arange(n, device=dev)  # original index of each live batch row
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                             logits_to_keep=1, **{self._cache_kw: cache})
            logits = out.logits[:, -1, :].float()
            next_pos = pos[:, -1] + 1
            for step in range(max_new):
                raw_logp = torch.log_softmax(logits, dim=-1)
                if self._n_real_tokens < logits.shape[-1]:
                    # Embedding rows past the tokenizer's vocab (size padding) are never chosen.
                    logits[:, self._n_real_tokens:] = float("-inf")
                if temperature <= 0.0:
                    tok = logits.argmax(dim=-1)
                    samp_logp = torch.zeros_like(tok, dtype=torch.float)  # greedy: the chosen token has prob 1
                else:
                    samp = torch.log_softmax(logits / temperature, dim=-1)
                    if top_p < 1.0:
                        samp = _top_p_filter(samp, top_p)
                    tok = torch.multinomial(samp.exp(), 1, generator=generator).squeeze(-1)
                    samp_logp = samp.gather(-1, tok[:, None]).squeeze(-1)
                tok_lp = raw_logp.gather(-1, tok[:, None]).squeeze(-1)
                done_l = torch.isin(tok, stop).tolist()
                tok_l, lp_l, slp_l, rows_l = tok.tolist(), tok_lp.tolist(), samp_logp.tolist(), rows.tolist()
                for j, r in enumerate(rows_l):
                    if stopped[r]:
                        continue  # finished earlier; only kept in the batch because compaction was not worth it
                    comps[r].append(tok_l[j])
                    lps[r].append(lp_l[j])
                    slps[r].append(slp_l[j])
                    stopped[r] = bool(done_l[j])
                live_l = [not stopped[r] for r in rows_l]
                n_live = sum(live_l)
                if step == max_new - 1 or n_live == 0:
                    break
                live = torch.tensor(live_l, device=dev)
                if n_live * 2 <= len(rows_l):
                    # Compact: drop finished rows from the batch and from the KV cache.
                    keep = live.nonzero().squeeze(-1)
                    cache.batch_select_indices(keep)
                    rows, tok, full_attn, next_pos = rows[keep], tok[keep], full_attn[keep], next_pos[keep]
                else:
                    tok = torch.where(live, tok, torch.full_like(tok, self.pad_id))
                attn = full_attn[:, : width + step + 1]
                out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                                 use_cache=True, **{self._cache_kw: cache})
                logits = out.logits[:, -1, :].float()
                next_pos = next_pos + 1
        return [(comps[r], lps[r], slps[r], stopped[r]) for r in range(n)]


def _top_p_filter(logp: Any, top_p: float) -> Any:
    """Renormalised log-probs restricted to the smallest set of tokens with cumulative probability >= top_p."""
    import torch

    sorted_lp, idx = torch.sort(logp, descending=True, dim=-1)
    cum = sorted_lp.exp().cumsum(-1)
    drop = cum - sorted_lp.exp() >= top_p  # keep the token that crosses the threshold
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(logp, float("-inf")).scatter(-1, idx, sorted_lp)
    return torch.log_softmax(filtered, dim=-1)
