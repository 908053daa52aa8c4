"""KV reuse across the steps of a conversation, for ``HFAgent``.

An agent step's prompt is the previous step's prompt, the completion the model generated, and the new messages
(tool results, the next user turn). Without reuse every step prefills the whole conversation again: for the
tiny student half of evaluation time went there. ``PrefixCache`` keeps the per-row KV of each finished generation
(prompt + completion) and hands it back when a later prompt extends that prompt, so only the new tokens are
prefilled (what vLLM calls prefix caching, here per conversation).

Entries are keyed by the prompt they were generated from (its "anchor"): a new prompt matches an entry when it
starts with that prompt; of several matches (a group of sampled rollouts from one prompt) the longest common
prefix wins. Reuse covers the longest common prefix of the stored tokens and the new prompt, so a completion the
chat template re-renders differently (whitespace in sampled JSON) reuses what still matches. An entry is used
once (the conversation moves on) and the oldest entries are evicted beyond ``max_bytes``.

KV computed by different weights is wrong: ``HFAgent`` clears the cache whenever a parameter was modified in
place (an RL update), using the parameters' version counters.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# Below this many reusable tokens a hit is not worth a second layout (the prompt is simply prefilled).
MIN_REUSE_TOKENS = 16


@dataclass
class _Entry:
    tokens: np.ndarray  # int32: the tokens whose KV is stored (prompt + completion minus its last, unfed token)
    anchor: int  # length of the prompt the completion was generated from
    layers: list[tuple[Any, Any]]  # per cache layer: (keys, values), each (heads, len(tokens), dim)
    nbytes: int


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[tuple[int, int], list[int]] = {}  # (anchor length, hash of the anchor) -> entry ids
        self._anchor_lengths: dict[int, int] = {}  # anchor length -> number of entries with it
        self._next_id = 0
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self._anchor_lengths.clear()
        self.bytes = 0

    def put(self, tokens: Sequence[int], anchor: int, layers: list[tuple[Any, Any]]) -> None:
        toks = np.asarray(tokens, dtype=np.int32)
        nbytes = sum(k.element_size() * k.nelement() + v.element_size() * v.nelement() for k, v in layers)
        if nbytes > self.max_bytes or anchor <= 0 or len(toks) < anchor:
            return
        eid = self._next_id
        self._next_id += 1
        self._entries[eid] = _Entry(toks, anchor, layers, nbytes)
        self._index.setdefault((anchor, hash(toks[:anchor].tobytes())), []).append(eid)
        self._anchor_lengths[anchor] = self._anchor_lengths.get(anchor, 0) + 1
        self.bytes += nbytes
        while self.bytes > self.max_bytes and self._entries:
            self._remove(next(iter(self._entries)))

    def take(self, prompt: Sequence[int]) -> tuple[int, list[tuple[Any, Any]]] | None:
        """(tokens reused, per-layer KV of those tokens) for ``prompt``, removing the entry; None on a miss."""
        if not self._entries:
            return None
        p = np.asarray(prompt, dtype=np.int32)
        raw = p.tobytes()
        best: tuple[int, int] | None = None  # (reusable length, entry id)
        for length in self._anchor_lengths:
            if length >= len(p):
                continue
            for eid in self._index.get((length, hash(raw[: 4 * length])), ()):
                e = self._entries[eid]
                if not np.array_equal(e.tokens[:length], p[:length]):
                    continue  # hash collision
                m = min(len(e.tokens), len(p) - 1)  # keep >= 1 prompt token to prefill: its logits start decoding
                diff = np.flatnonzero(e.tokens[:m] != p[:m])
                n = int(diff[0]) if len(diff) else m
                if best is None or n > best[0]:
                    best = (n, eid)
        if best is None or best[0] < MIN_REUSE_TOKENS:
            return None
        n, eid = best
        entry = self._entries[eid]
        self._remove(eid)
        self.hits += 1
        self.reused_tokens += n
        return n, [(k[:, :n], v[:, :n]) for k, v in entry.layers]

    def _remove(self, eid: int) -> None:
        e = self._entries.pop(eid)
        key = (e.anchor, hash(e.tokens[: e.anchor].tobytes()))
        ids = self._index.get(key, [])
        if eid in ids:
            ids.remove(eid)
        if not ids:
            self._index.pop(key, None)
        left = self._anchor_lengths.get(e.anchor, 1) - 1
        if left:
            self._anchor_lengths[e.anchor] = left
        else:
            self._anchor_lengths.pop(e.anchor, None)
        self.bytes -= e.nbytes


def buffered(cache: Any, extra: int) -> None:
    """Give every plain ``DynamicLayer`` of ``cache`` room for ``extra`` more positions (see ``BufferedLayer``)."""
    from transformers.cache_utils import DynamicLayer

    layer_class = buffered_layer_class()
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.numel():
            cache.layers[i] = layer_class(layer.keys, layer.values, extra)


@functools.cache
def buffered_layer_class() -> Any:
    """The ``BufferedLayer`` class (defined on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class BufferedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values live in a buffer with room to grow: a decode step writes its
        position in place, where ``DynamicLayer`` concatenates the whole cache again (a full copy per step and
        layer, 15% of decode time for the tiny student)."""

        def __init__(self, keys: Any, values: Any, extra: int, filled: int | None = None) -> None:
            """``keys`` and ``values`` copied into a buffer with room for ``extra`` more positions; or, with
            ``filled``, they are that buffer already, their first ``filled`` positions written (no copy)."""
            super().__init__()
            if filled is not None:
                self._k, self._v, self._len = keys, values, filled
            else:
                n = keys.shape[-2]
                self._k = keys.new_empty((*keys.shape[:-2], n + extra, keys.shape[-1]))
                self._v = values.new_empty((*values.shape[:-2], n + extra, values.shape[-1]))
                self._k[..., :n, :] = keys
                self._v[..., :n, :] = values
                self._len = n
            self.device = keys.device
            self.is_initialized = True
            self._view()

        def _view(self) -> None:
            self.keys = self._k[..., : self._len, :]
            self.values = self._v[..., : self._len, :]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            import torch

            t = key_states.shape[-2]
            room = self._k.shape[-2]
            if self._len + t > room:  # more than planned: grow geometrically, like a list
                more = max(t, room)
                self._k = torch.cat([self._k, self._k.new_empty((*self._k.shape[:-2], more, self._k.shape[-1]))], -2)
                self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:-2], more, self._v.shape[-1]))], -2)
            self._k[..., self._len : self._len + t, :] = key_states
            self._v[..., self._len : self._len + t, :] = value_states
            self._len += t
            self._view()
            return self.keys, self.values

        def batch_select_indices(self, indices: Any) -> None:
            self._k, self._v = self._k[indices, ...], self._v[indices, ...]
            self._view()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._view()

        def reorder_cache(self, beam_idx: Any) -> None:
            self.batch_select_indices(beam_idx.to(self._k.device))

    return BufferedLayer

