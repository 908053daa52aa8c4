"""A copy mechanism for the embedded student: Qwen3 plus a pointer-sentinel output head.

Why: coworker tasks are mostly copying. A correct tool call repeats values the agent has read (a name from the
request, ``msg_3907e`` from a search result, an amount from an email). A transformer learns to copy through
induction heads, which a tiny model trained from scratch for minutes on two CPU cores does not form: measured, our
128-wide student got the protocol and the plan of a task right but wrote plausible values from its training
distribution instead of the ones in front of it, and passed nothing. A pointer head gives it copying as a primitive
(Merity et al. 2016, "Pointer Sentinel Mixture Models"; See et al. 2017, pointer-generator networks).

The next-token distribution at position ``t`` mixes the vocabulary softmax with pointing at earlier tokens::

    p(w) = a_sentinel * softmax(lm_head(h_t))[w] + sum_{p <= t, x[p] = w} a_p
    a    = softmax([q_t . s + b] ++ [q_t . k_p / sqrt(d) + match_p for p <= t])   # one softmax: gate and pointer
    k_p  = W_prev h_{p-1} + W_src h_p

Source ``p`` proposes its own token ``x[p]``. Its key sees both the token before (``h_{p-1}``: continue a value
being copied, what induction heads do) and the token itself (``h_p``: pick *which* value, e.g. the message id in
the search result rather than the thread id). ``match_p`` adds learned, query-dependent bonuses when the last 1, 2
or 3 tokens before ``p`` equal the last tokens up to ``t`` (an exact n-gram induction head), only for sources in
an earlier chat turn than the query: the model copies from what it has read, not from what it is writing (which
would loop). "Before" always means the previous real token, so padding inside a batch row changes nothing. The
sentinel slot is the probability of generating from the vocabulary instead. All of it is trained by the ordinary
next-token loss.

It is still a ``Qwen3ForCausalLM`` (same backbone, weights, tokenizer and chat template) with three small extra
matrices and a few scalars; ``logits`` are the log of the mixed distribution, so sampling, greedy decoding, log-prob gathering for RL
and ``log_softmax`` all work unchanged. The pointer memory (per-position keys and token ids) lives in the KV cache
as one extra layer, so incremental decoding, batch compaction and prefix sharing treat it like any other layer.
Loading needs this module imported (``training.student.load_checkpoint`` does), since the class is ours.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

POINTER_MODEL_TYPE = "cowork_pointer_qwen3"
_NEG = -1e9  # masked scores: finite, so a row with nothing to point at stays NaN-free (the sentinel is always there)
_TINY = 1e-30
_MATCH_ORDERS = 3  # n-gram orders of the exact-match bonus


class PointerQwen3Config(Qwen3Config):
    model_type = POINTER_MODEL_TYPE

    def __init__(self, pointer_dim: int = 64, sentinel_bias: float = 6.0, turn_token_id: int | None = None,
                 own_role_ids: list[int] | None = None, **kwargs: Any) -> None:
        self.pointer_dim = pointer_dim
        # The token opening each chat turn (<|im_start|>) and the role tokens after it that mark the model's own
        # turns ("assistant"). With role tokens the pointer copies only from what the model has read (system, user,
        # tool results), never from what it wrote; without them (the student's default: measured slightly worse)
        # only the n-gram bonus skips the query's own turn, where copying would loop.
        self.turn_token_id = turn_token_id
        self.own_role_ids = list(own_role_ids) if own_role_ids else None
        # Initial sentinel score: with untrained (near-zero) pointer scores the sentinel holds e^6 / (e^6 + T)
        # of the mass (~0.3 at T = 1,000 tokens); training then sets the gate per query.
        self.sentinel_bias = sentinel_bias
        super().__init__(**kwargs)


class PointerQwen3ForCausalLM(Qwen3ForCausalLM):
    config_class = PointerQwen3Config

    def __init__(self, config: PointerQwen3Config) -> None:
        super().__init__(config)
        h, d = config.hidden_size, config.pointer_dim
        self.pointer_query = nn.Linear(h, d, bias=False)
        self.pointer_key_prev = nn.Linear(h, d, bias=False)
        self.pointer_key_src = nn.Linear(h, d, bias=False)
        self.pointer_sentinel = nn.Parameter(torch.zeros(d))
        self.pointer_sentinel_bias = nn.Parameter(torch.full((1,), float(config.sentinel_bias)))
        # Query-dependent bonuses for sources whose last 1, 2, 3 tokens equal the query's (n-gram induction).
        self.pointer_match = nn.Linear(h, _MATCH_ORDERS)
        std = config.initializer_range
        for lin in (self.pointer_query, self.pointer_key_prev, self.pointer_key_src, self.pointer_match):
            nn.init.normal_(lin.weight, std=std)
        with torch.no_grad():
            self.pointer_match.bias.fill_(1.0)

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if module is self:  # parameters owned directly by this class (missing from an older checkpoint)
            with torch.no_grad():
                self.pointer_sentinel.zero_()
                self.pointer_sentinel_bias.fill_(float(self.config.sentinel_bias))
        elif module is getattr(self, "pointer_match", None):
            with torch.no_grad():
                module.bias.fill_(1.0)

    # --- the pointer memory --------------------------------------------------------------------------------
    def _memory(self, hidden: torch.Tensor, input_ids: torch.Tensor, cache: Any,
                prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(source keys, ids) for every position so far, the new ones appended to the cached ones; ``prev`` is
        :func:`_prev_index` of every position so far.

        The cache layer holds each position's ``W_prev h`` beside its finished key: a position's key never changes
        once written (the token before it is already there), so a decode step computes its own key only, instead of
        gathering every position's again (a tenth of the student's decoding time)."""
        kp, ks = self.pointer_key_prev(hidden), self.pointer_key_src(hidden)
        d = kp.shape[-1]
        if cache is None:
            return kp.gather(1, prev.clamp(min=0)[..., None].expand(-1, -1, d)) + ks, input_ids
        n_layers = self.config.num_hidden_layers
        while len(cache.layers) <= n_layers:  # our extra layer sits after the backbone's
            cache.layers.append(DynamicLayer())
        t = input_ids.shape[1]
        # Appended with room for the keys, which are then written in place: the token before a new position may
        # be one of the new ones.
        stored, ids = cache.layers[n_layers].update(torch.cat([kp, torch.zeros_like(ks)], -1)[:, None],
                                                    input_ids[:, None, :, None].to(hidden.dtype))
        mem = stored[:, 0]  # (B, T, 2d): W_prev h, then the key
        before = prev[:, -t:].clamp(min=0)[..., None].expand(-1, -1, d)
        mem[:, -t:, d:] = mem[..., :d].gather(1, before) + ks
        return mem[..., d:], ids[:, 0, :, 0].round().long()

    def _pointer_scores(self, query_hidden: torch.Tensor, q_pos: torch.Tensor, keys: torch.Tensor, ids: torch.Tensor,
                        valid: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sentinel score (B, Q), source scores (B, Q, T), allowed (B, Q, T)) for each query.

        Source ``p`` proposes ``ids[p]``; "the token before" is the previous *real* token (padding skipped), so a
        left-padded or prefix-shared batch row scores exactly like the same sequence alone."""
        d = keys.shape[-1]
        q = self.pointer_query(query_hidden)  # (B, Q, d)
        scores = torch.einsum("bqd,bkd->bqk", q, keys).float() / math.sqrt(d)
        # Exact n-gram match of the tokens ending at the query with those before source p: continuing a value
        # being copied (after "con_b5" comes "8" of con_b586f, not of msg_b5...) without learning induction heads.
        bonus = self.pointer_match(query_hidden).float()  # (B, Q, orders)
        run = None
        if self.config.turn_token_id is not None:
            turn = (ids == self.config.turn_token_id).cumsum(-1)
            run = turn.gather(1, q_pos)[:, :, None] != turn[:, None, :]
        q_idx, s_idx = q_pos, prev
        for k in range(_MATCH_ORDERS):
            q_tok = _tokens_at(ids, q_idx, -2)  # (B, Q)
            s_tok = _tokens_at(ids, s_idx, -1)  # (B, T)
            eq = q_tok[:, :, None] == s_tok[:, None, :]
            run = eq if run is None else run & eq
            scores = scores + bonus[..., k:k + 1] * run
            q_idx, s_idx = _follow(prev, q_idx), _follow(prev, s_idx)
        src = torch.arange(ids.shape[1], device=q.device)
        # A query at absolute position t may point at proposed tokens at or before t, outside the model's turns.
        readable = valid & (prev >= 0)
        if self.config.turn_token_id is not None and self.config.own_role_ids:
            readable = readable & ~_own_turns(ids, self.config.turn_token_id, self.config.own_role_ids)
        allowed = (src[None, None, :] <= q_pos[:, :, None]) & readable[:, None, :]
        sentinel = (q @ self.pointer_sentinel).float() + self.pointer_sentinel_bias.float()
        return sentinel, scores, allowed

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        if input_ids is None:
            raise ValueError("the pointer student needs input_ids (it copies tokens, not embeddings)")
        if cache is None and "past_key_values" in kwargs:
            cache = kwargs.pop("past_key_values")
        num_items = kwargs.pop("num_items_in_batch", None)
        label_weights = kwargs.pop("label_weights", None)
        pointer_mask = kwargs.pop("pointer_mask", None)
        vocab_path_mask = kwargs.pop("vocab_path_mask", None)
        kwargs.pop("shift_labels", None)
        # transformers 5 renamed the backbone's past_key_values argument to cache.
        cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=use_cache, **{cache_kw: cache}, **kwargs)
        hidden = out.last_hidden_state
        b, t = input_ids.shape
        memory = cache if use_cache else None
        n_layers = self.config.num_hidden_layers
        past = cache.layers[n_layers].get_seq_length() if memory is not None and len(cache.layers) > n_layers else 0
        total = past + t
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] == total:
            valid = attention_mask.bool()
        else:
            valid = torch.ones((b, total), dtype=torch.bool, device=input_ids.device)
        prev = _prev_index(valid)  # (B, T)
        keys, ids = self._memory(hidden, input_ids, memory, prev)
        offset = total - t

        if labels is not None:
            loss = self._loss(hidden, ids, keys, valid, prev, offset, labels, num_items, label_weights, pointer_mask,
                              vocab_path_mask)
            return _output(loss, None, _cache_of(out) if use_cache else None)

        keep = t if (isinstance(logits_to_keep, int) and logits_to_keep == 0) else int(logits_to_keep)
        keep = min(keep, t)
        qh = hidden[:, t - keep:]
        q_pos = (offset + torch.arange(t - keep, t, device=ids.device))[None, :].expand(b, -1)
        sentinel, scores, allowed = self._pointer_scores(qh, q_pos, keys, ids, valid, prev)
        log_a = torch.log_softmax(torch.cat([sentinel[..., None], scores.masked_fill(~allowed, _NEG)], -1), -1)
        p_vocab = torch.softmax(self.lm_head(qh).float(), -1)
        mixed = log_a[..., :1].exp() * p_vocab
        src_tokens = ids[:, None, :].expand(b, keep, total)
        mixed = mixed.scatter_add(-1, src_tokens, log_a[..., 1:].exp())
        return _output(None, torch.log(mixed + _TINY), _cache_of(out) if use_cache else None)

    def _loss(self, hidden: torch.Tensor, ids: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, prev: torch.Tensor,
              offset: int, labels: torch.Tensor, num_items: Any, weights: torch.Tensor | None = None,
              pointer_mask: torch.Tensor | None = None, vocab_path_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean -log p(label), computed for the label only (no (B, T, V) copy scatter).

        ``weights`` (same shape as ``labels``) makes it a weighted mean over the labelled positions.
        ``pointer_mask`` (same shape) marks the labels predicted through the mixture (the agent's own turns); the
        others are trained on the vocabulary head alone. The pointer then learns where the agent writes, and
        its (B, Q, T) scores are only computed for those Q positions (~1/8 of a demonstration).
        ``vocab_path_mask`` (same shape, within ``pointer_mask``) marks labels that must come from the vocabulary
        through the gate, -log(a_sentinel * p_vocab(label)): there the model learns not to point (the names of
        JSON keys, which an earlier call's keys would otherwise hijack)."""
        b, t = labels.shape
        target = labels[:, 1:]
        mask = target != -100
        tgt = target.clamp(min=0)
        log_p = torch.log_softmax(self.lm_head(hidden[:, :-1]).float(), -1).gather(-1, tgt[..., None]).squeeze(-1)
        point = mask if pointer_mask is None else mask & pointer_mask[:, 1:].bool()
        counts = point.sum(1)
        n_q = int(counts.max()) if counts.numel() else 0
        if n_q:
            # Each row's pointer positions first, in order (stable sort), then padding slots.
            idx = torch.sort((~point).to(torch.int8), dim=1, stable=True).indices[:, :n_q]  # (B, Q)
            real_q = torch.arange(n_q, device=ids.device)[None, :] < counts[:, None]
            qh = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
            sentinel, scores, allowed = self._pointer_scores(qh, offset + idx, keys, ids, valid, prev)
            tgt_q = tgt.gather(1, idx)
            # Normaliser and label mass straight from the scores: no (B, Q, T) log-softmax or concatenation.
            log_norm = torch.logaddexp(sentinel, torch.logsumexp(scores.masked_fill(~allowed, _NEG), -1))
            hit = allowed & (ids[:, None, :] == tgt_q[:, :, None])  # source p proposes the label
            log_copy = torch.logsumexp(scores.masked_fill(~hit, _NEG), -1)
            vocab_q = log_p.gather(1, idx)
            mixed = torch.logaddexp(sentinel + vocab_q, log_copy) - log_norm
            if vocab_path_mask is not None:
                through_vocab = vocab_path_mask[:, 1:].bool().gather(1, idx)
                mixed = torch.where(through_vocab, sentinel + vocab_q - log_norm, mixed)
            log_p = log_p.scatter(1, idx, torch.where(real_q, mixed, vocab_q))
        if weights is not None:
            w = weights[:, 1:].to(log_p.dtype) * mask
            return -(log_p * w).sum() / w.sum().clamp(min=1e-6)
        total = mask.sum().clamp(min=1) if num_items is None else num_items
        return -(log_p * mask).sum() / total


_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def _output(loss: Any, logits: Any, cache: Any) -> CausalLMOutputWithPast:
    return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})


def _cache_of(out: Any) -> Any:
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else getattr(out, "past_key_values", None)


def _own_turns(ids: torch.Tensor, turn_token: int, role: list[int]) -> torch.Tensor:
    """Positions inside turns whose opening ``turn_token`` is followed by the ``role`` tokens."""
    n = ids.shape[1]
    pos = torch.arange(n, device=ids.device).expand_as(ids)
    start = torch.where(ids == turn_token, pos, torch.full_like(pos, -1)).cummax(-1).values
    own = start >= 0
    for k, r in enumerate(role):
        at = start + 1 + k
        own = own & (at < n) & (ids.gather(1, at.clamp(min=0, max=n - 1)) == r)
    return own


def _prev_index(valid: torch.Tensor) -> torch.Tensor:
    """For each position, the previous valid (non-padding) position; -1 if none."""
    pos = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    last = torch.where(valid, pos, torch.full_like(pos, -1)).cummax(-1).values  # last valid at or before p
    return torch.cat([torch.full_like(last[:, :1], -1), last[:, :-1]], 1)


def _follow(prev: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """One step back along ``prev`` from positions ``idx`` (-1 stays -1)."""
    return torch.where(idx >= 0, prev.gather(1, idx.clamp(min=0)), idx)


def _tokens_at(ids: torch.Tensor, idx: torch.Tensor, fill: int) -> torch.Tensor:
    return torch.where(idx >= 0, ids.gather(1, idx.clamp(min=0)), torch.full_like(idx, fill))


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModelForCausalLM`` know the pointer student (idempotent)."""
    try:
        AutoConfig.register(POINTER_MODEL_TYPE, PointerQwen3Config)
    except ValueError:
        pass  # already registered
    try:
        AutoModelForCausalLM.register(PointerQwen3Config, PointerQwen3ForCausalLM)
    except ValueError:
        pass


register()
