"""``HFAgent``'s decode loop as an object, which rows may join while it runs (continuous batching).

``admit`` prefills rows and puts them into the batch; ``step`` draws one token for every row in it and says which
rows it finished. ``HFAgent.generate`` admits a batch once and steps it to its end. ``cowork serve`` also admits
requests between steps, as they arrive. A request then waits one step for the batch ahead of it, not for its
longest answer, and a short answer leaves as soon as it is done.

Layout per batch row: [left padding][its prompt (reused or shared KV first)][its fed tokens], its columns
right-aligned to the batch's current width. A joining group is prefilled alone, then both caches are padded on the
left to one width and stacked. Padding columns are masked; positions count real tokens only, and the pointer
memory skips padding, so a row decodes as it would alone. Columns no row attends any more (left by rows that
finished) are trimmed when a group joins.

A decode step that fails (the device out of memory, say) fails no row that can still be decoded: the batch's rows
are taken out of it, each with what it drew, and decoded on in a batch of half the size, prefilled again with
their prompts and tokens so far, so that each row ends as it would have (its grammar, random stream and limits
are its own; a row that samples from the batch's shared stream draws on from it, so its sample is another). Only a
row that fails alone fails, with the error. What was streamed stays streamed. Each failure is logged. Rows queued
(``enqueue``: ``generate``'s batch, episodes' turns) are prefilled the same way, in halves where their prefill fails.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

# (a row's key, the token drawn, its raw log-prob, the top alternatives or None) -> True ends the row's turn
OnToken = Callable[[Any, int, float, Any], Any]
log = logging.getLogger(__name__)  # (a failed step or prefill is said here: the batch goes on smaller)


class Prompt(NamedTuple):
    """A row to admit: its key (what ``step`` and the listener know it by), prompt ids, grammar matcher (None:
    unconstrained), random stream (None: the batch's), and its own settings (None: the batch's)."""

    key: Any
    ids: Sequence[int]
    matcher: Any = None
    generator: Any = None
    max_new: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None


@dataclass(eq=False)
class _Row:
    key: Any
    prompt: list[int]
    matcher: Any  # its turn's grammar (None: unconstrained)
    gen: Any  # its random stream (None: the batch's)
    limit: int  # the most tokens it may draw
    temperature: float
    top_p: float
    top_k: int  # how many likeliest tokens to record per step
    comps: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    slps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    stopped: bool = False
    ended: bool = False  # (stopped by the listener, not by a stop token)
    done: bool = False
    prompt_cols: Any = None  # cache columns holding its prompt
    gen0: int = 0  # cache column of its first fed completion token
    resumed: int = 0  # its tokens prefilled with its prompt (after a failed step took it out of the batch)

    def result(self) -> tuple[list[int], list[float], list[float], bool, list[list[tuple[int, float]]], bool]:
        return self.comps, self.lps, self.slps, self.stopped, self.tops, self.ended


class Decoding:
    """A batch being decoded (see the module's docstring). The settings given here are the defaults of rows
    admitted without their own; ``generator`` is a random stream rows without their own share; ``on_token`` sees
    each token drawn, by its row's key."""

    def __init__(self, agent: Any, temperature: float, top_p: float, max_new: int, top_logprobs: int = 0,
                 generator: Any = None, on_token: OnToken | None = None) -> None:
        import torch

        self.agent, self.dev = agent, agent.device
        self.temperature, self.top_p, self.max_new, self.top_logprobs = temperature, top_p, max_new, top_logprobs
        self.generator = generator  # one random stream the batch shares (rows admitted with their own use theirs)
        self.on_token = on_token
        self.stop = torch.tensor(agent.stop_ids, device=self.dev)
        self.batch: list[_Row] = []  # the row at each batch position
        self.cache: Any = None
        self.full_attn: Any = None  # (positions, capacity): [:, :cur] is read, later columns are 1
        self.cur = 0
        self.next_pos: Any = None
        self.logits: Any = None
        self.bitmask: Any = None
        # Rows to be prefilled into the batch at the next step, as many at a time as it may hold: queued
        # (:meth:`enqueue`), or taken out of it by a failed step. ``cap``: the most rows it holds once a step or a
        # prefill failed (halved at each failure).
        self.waiting: list[_Row] = []
        self.cap: int | None = None

    @property
    def size(self) -> int:
        """Rows in the batch (finished ones not yet dropped included)."""
        return len(self.batch)

    @property
    def live(self) -> int:
        """Rows not finished: in the batch, or waiting to be prefilled into it."""
        return sum(not row.done for row in self.batch) + len(self.waiting)

    def room(self, most: int) -> int:
        """How many rows may be admitted to a batch of at most ``most`` rows (fewer once a step failed)."""
        return max(0, min(most, self.cap or most) - self.live)

    def can_join(self) -> bool:
        """Whether rows may join a running batch (a sliding-window cache layer keeps only a window of columns)."""
        from transformers.cache_utils import DynamicLayer

        return self.cache is None or all(isinstance(layer, DynamicLayer) and not layer.is_sliding
                                         for layer in self.cache.layers)

    # --- admission -----------------------------------------------------------------------------------------
    def admit(self, entries: Sequence[Prompt | tuple]) -> None:
        """Prefill these rows (:class:`Prompt`, or the tuple of its fields) and put them into the batch (first: the
        batch is theirs; later: they join it). Rows in one batch may sample differently (greedy beside sampled,
        other temperatures, top_p and numbers of top log-probs). An admission that fails (its prefill out of
        memory, say) raises and leaves the batch as it was, to decode on without these rows."""
        if entries:
            self._admit_rows([self._row(entry) for entry in entries])

    def enqueue(self, entries: Sequence[Prompt | tuple]) -> None:
        """Queue these rows, to be prefilled into the batch at the next step, as many at a time as it may hold:
        where their prefill fails (out of memory, say), in groups of half the size, and a row whose prefill fails
        alone fails (:meth:`step` gives its exception). For rows of one kind (a batch of rollouts, episodes'
        turns), where a failure is the batch's size; :meth:`admit` is for rows whose failures are their own."""
        self.waiting += [self._row(entry) for entry in entries]

    def _row(self, entry: Prompt | tuple) -> _Row:
        p = Prompt(*entry)
        return _Row(p.key, list(p.ids), p.matcher, p.generator, self.max_new if p.max_new is None else int(p.max_new),
                    self.temperature if p.temperature is None else float(p.temperature),
                    self.top_p if p.top_p is None else float(p.top_p),
                    self.top_logprobs if p.top_logprobs is None else int(p.top_logprobs))

    def _admit_rows(self, new: list[_Row]) -> None:
        """:meth:`admit` these rows: new ones, or rows a failed step took out, prefilled with what they drew."""
        import torch

        if any(row.done for row in self.batch):
            # Rows that finished leave first: their KV goes to the prefix cache, where a joining row that
            # continues their conversation (the client's next step) finds it. (The batch sheds them as the
            # newcomers are stacked under it: one copy of the cache, not two.)
            with torch.inference_mode():
                self._save([j for j, row in enumerate(self.batch) if row.done])
        # (a row taken out by a failed step is prefilled with its tokens so far, the last one drawn not yet fed)
        cache, full_attn, width, next_pos, logits, cols = self._prefill(
            [row.prompt + row.comps for row in new], max(row.limit - len(row.comps) for row in new), not self.batch)
        for row, c in zip(new, cols):
            row.prompt_cols, row.gen0, row.resumed = c, width, len(row.comps)
        if not self.batch:
            self.cache, self.full_attn, self.cur = cache, full_attn, width
            self.batch, self.next_pos, self.logits = new, next_pos, logits
        else:
            with torch.inference_mode():
                self._join(cache, full_attn[:, :width], next_pos, logits, new)
        if any(row.matcher is not None for row in self.batch) and (self.bitmask is None or self.bitmask.shape[0] < self.size):
            self.bitmask = self.agent.constraint.bitmask(self.size)

    def _prefill(self, prompts: list[list[int]], max_new: int,
                 room: bool = True) -> tuple[Any, Any, int, Any, Any, list[Any]]:
        """(cache, attention mask with room for ``max_new`` more columns, width, next positions, last logits, each
        row's prompt columns) for ``prompts`` alone; ``room``: the cache too has room to decode in (a group that
        joins a batch is copied into the batch's cache instead)."""
        import torch
        from transformers import DynamicCache

        from cowork_pipeline.agents.hf_agent import _common_prefix_len
        from cowork_pipeline.agents.prefix_cache import buffered

        agent, dev, n = self.agent, self.dev, len(prompts)
        cache = DynamicCache(config=agent.model.config)
        kw = {agent._cache_kw: cache, "use_cache": True, "logits_to_keep": 1}
        # The cache region holds either KV reused from this conversation's previous step (prefix_cache.py) or the
        # prompt prefix common to the whole group (in rollouts: the system block with the tools list, most of
        # every prompt), prefilled once and copied to every row instead of being recomputed per row.
        reused = [agent._prefix_cache.take(p) for p in prompts] if agent._reuse_enabled(cache) else [None] * n
        if any(r is not None for r in reused):
            cached = [r[0] if r is not None else 0 for r in reused]
            region = max(cached)
            with torch.inference_mode():
                agent._fill_cache(cache, reused, region)
            shared = 0
        else:
            # Each row keeps at least one own token so that its last-position logits exist.
            shared = _common_prefix_len(prompts) if n > 1 else 0
            shared = min(shared, min(len(p) for p in prompts) - 1)
            if shared < agent.min_shared_prefix:
                shared = 0
            cached, region = [shared] * n, shared
        suffixes = [p[c:] for p, c in zip(prompts, cached)]
        sw = max(len(x) for x in suffixes)
        width = region + sw
        # The mask is allocated once for the prompt and all new tokens and sliced per step.
        full_attn = torch.ones((n, width + max_new), dtype=torch.long)
        suffix_ids = torch.full((n, sw), agent.pad_id, dtype=torch.long)
        for r, x in enumerate(suffixes):
            full_attn[r, : region - cached[r]] = 0
            full_attn[r, region : width - len(x)] = 0
            suffix_ids[r, sw - len(x):] = torch.tensor(x, dtype=torch.long)
        full_attn, suffix_ids = full_attn.to(dev), suffix_ids.to(dev)
        attn = full_attn[:, :width]
        # Positions count real tokens only, so a padded row sees the same RoPE phases as an unpadded one.
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            if shared:
                prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=dev)
                agent.model(input_ids=prefix, attention_mask=attn[:1, :shared], position_ids=pos[:1, :shared], **kw)
                cache.batch_repeat_interleave(n)
            out = agent.model(input_ids=suffix_ids, attention_mask=attn, position_ids=pos[:, region:], **kw)
            if room:
                buffered(cache, max_new)  # decode steps then write in place instead of re-concatenating the cache
        cols = [torch.cat([torch.arange(region - cached[r], region), torch.arange(width - len(suffixes[r]), width)])
                for r in range(n)]
        return cache, full_attn, width, pos[:, -1] + 1, out.logits[:, -1, :].float(), cols

    def _join(self, cache: Any, attn: Any, next_pos: Any, logits: Any, new: list[_Row]) -> None:
        """Stack a prefilled group under the running batch, both padded on the left to one width."""
        import torch

        from cowork_pipeline.agents.prefix_cache import buffered_layer_class

        if not self.can_join():
            raise ValueError("rows cannot join a batch whose cache has sliding-window layers")
        # Rows that finished (their KV already saved) are left out, and so are the leading columns no row left
        # attends.
        kept = [j for j, row in enumerate(self.batch) if not row.done]
        keep = torch.tensor(kept, dtype=torch.long, device=self.dev)
        old_attn = self.full_attn[keep, : self.cur]
        lead = int(old_attn.argmax(-1).min())
        old_w, new_w = self.cur - lead, attn.shape[1]
        width = max(old_w, new_w)
        shift_old, shift_new = width - old_w - lead, width - new_w
        b_old, b_new = len(kept), attn.shape[0]
        layer_class = buffered_layer_class()
        # (everything is built before any of it replaces the batch's: a join that fails, out of memory say,
        # leaves the running batch as it was)
        layers = []
        for mine, theirs in zip(self.cache.layers, cache.layers):
            kv = []
            for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                # One buffer with room for the steps to come, written once; padding is zeros (masked: it must be
                # finite), the room is written before it is read.
                both = a.new_empty((b_old + b_new, *a.shape[1:-2], width + self.max_new, a.shape[-1]))
                both[..., :width, :] = 0
                both[:b_old, ..., width - old_w : width, :] = a[keep][..., lead:, :]
                both[b_old:, ..., width - new_w : width, :] = b
                kv.append(both)
            layers.append(layer_class(kv[0], kv[1], self.max_new, filled=width))
        full = torch.ones((b_old + b_new, width + self.max_new), dtype=self.full_attn.dtype, device=self.dev)
        full[:, :width] = 0
        full[:b_old, width - old_w : width] = old_attn[:, lead:]
        full[b_old:, width - new_w : width] = attn
        next_pos, logits = torch.cat([self.next_pos[keep], next_pos]), torch.cat([self.logits[keep], logits])
        self.cache.layers[:] = layers
        self.full_attn, self.cur = full, width
        self.batch = [self.batch[j] for j in kept]
        for row in self.batch:
            row.prompt_cols, row.gen0 = row.prompt_cols + shift_old, row.gen0 + shift_old
        for row in new:
            row.prompt_cols, row.gen0 = row.prompt_cols + shift_new, row.gen0 + shift_new
        self.batch = self.batch + new
        self.next_pos, self.logits = next_pos, logits

    # --- decoding ------------------------------------------------------------------------------------------
    def step(self) -> list[tuple[Any, list[int], tuple]]:
        """Draw one token for every row in the batch; ``(key, prompt ids, result)`` for each row this finished (a
        stop token, the listener, or the row's most tokens), the result as ``(tokens, raw log-probs, sampling
        log-probs, ended by a stop token, top alternatives, ended by the listener)``, or for a row that failed
        alone after a failed step (:meth:`_take_out`) the exception. Once no row is left the batch is empty (its
        KV kept for reuse), and may be admitted to afresh."""
        import torch

        from cowork_pipeline.agents.hf_agent import _top_p_filter

        failed = self._resume() if self.waiting else []
        if not self.batch:
            return failed
        agent, logits, batch = self.agent, self.logits, self.batch
        temperature, top_p, top_k = batch[0].temperature, batch[0].top_p, max(row.top_k for row in batch)
        alike = all(row.temperature == temperature and row.top_p == top_p for row in batch)
        with torch.inference_mode():
            if agent._n_real_tokens < logits.shape[-1]:
                # Embedding rows past the tokenizer's vocab (size padding) are never chosen, nor counted in the
                # raw distribution (as the RL trainer recomputes it: ratios start at exactly 1).
                logits[:, agent._n_real_tokens:] = float("-inf")
            raw_logp = torch.log_softmax(logits, dim=-1)
            if self.bitmask is not None and any(row.matcher is not None for row in batch):
                agent.constraint.apply(logits, [row.matcher for row in batch], self.bitmask)
                # A row the grammar leaves no token for (cannot happen for a well-formed grammar) ends its turn.
                dead = torch.isinf(logits).all(-1)
                if bool(dead.any()):
                    logits[dead, agent.stop_ids[0]] = 0.0
            if not alike:
                tok, samp_logp = self._drawn_per_row(logits)
            elif temperature <= 0.0:
                tok = logits.argmax(dim=-1)
                samp_logp = torch.zeros_like(tok, dtype=torch.float)  # greedy: the chosen token has prob 1
            else:
                samp = torch.log_softmax(logits / temperature, dim=-1)
                if top_p < 1.0:
                    samp = _top_p_filter(samp, top_p)
                if self.generator is not None and all(row.gen is None for row in batch):
                    tok = torch.multinomial(samp.exp(), 1, generator=self.generator).squeeze(-1)
                else:  # a random stream per row (generate's seeds; the batch's for a row without one)
                    probs = samp.exp()
                    tok = torch.cat([torch.multinomial(probs[j], 1, generator=row.gen or self.generator)
                                     for j, row in enumerate(batch)])
                samp_logp = samp.gather(-1, tok[:, None]).squeeze(-1)
            tok_lp = raw_logp.gather(-1, tok[:, None]).squeeze(-1)
            if top_k:  # (of the raw distribution, as logprobs; size-padding rows are masked above)
                top_v, top_i = raw_logp.topk(top_k, dim=-1)
                top_l = [list(zip(i_, v_)) for i_, v_ in zip(top_i.tolist(), top_v.tolist())]
            done_l = torch.isin(tok, self.stop).tolist()
            tok_l, lp_l, slp_l = tok.tolist(), tok_lp.tolist(), samp_logp.tolist()
            finished = failed
            for j, row in enumerate(batch):
                if row.done:
                    continue  # finished earlier; only kept in the batch because compaction was not worth it
                row.comps.append(tok_l[j])
                row.lps.append(lp_l[j])
                row.slps.append(slp_l[j])
                if row.top_k:
                    row.tops.append(top_l[j][: row.top_k])
                row.stopped = bool(done_l[j])
                if row.matcher is not None and not row.matcher.is_terminated():
                    row.matcher.accept_token(tok_l[j])
                if self.on_token is not None and \
                        self.on_token(row.key, tok_l[j], lp_l[j], top_l[j][: row.top_k] if row.top_k else None) \
                        and not row.stopped:
                    row.stopped = row.ended = True
                if row.stopped or len(row.comps) >= row.limit:
                    row.done = True
                    finished.append((row.key, row.prompt, row.result()))
            live_l = [not row.done for row in batch]
            n_live = sum(live_l)
            if n_live == 0:
                self._save(list(range(len(batch))))
                self.batch, self.cache, self.full_attn, self.next_pos, self.logits, self.cur = [], None, None, None, None, 0
                return finished
            live = torch.tensor(live_l, device=self.dev)
            if n_live * 2 <= len(live_l):
                # Compact: drop finished rows from the batch and from the KV cache (keeping their KV for reuse).
                keep = live.nonzero().squeeze(-1)
                self._drop([j for j, ok in enumerate(live_l) if not ok], keep)
                tok = tok[keep]
            else:
                tok = torch.where(live, tok, torch.full_like(tok, agent.pad_id))
            self.cur += 1
            if self.cur > self.full_attn.shape[1]:  # (rows that joined later decode past the planned room)
                self.full_attn = torch.cat([self.full_attn, torch.ones_like(self.full_attn)], 1)
            try:
                out = agent.model(input_ids=tok[:, None], attention_mask=self.full_attn[:, : self.cur],
                                  position_ids=self.next_pos[:, None],
                                  **{agent._cache_kw: self.cache, "use_cache": True, "logits_to_keep": 1})
            except Exception as exc:  # noqa: BLE001 - the rows go on in a smaller batch; one that fails alone fails
                return finished + self._take_out(exc)
            self.logits = out.logits[:, -1, :].float()
            self.next_pos = self.next_pos + 1
        return finished

    # --- a failed step ---------------------------------------------------------------------------------------
    def _take_out(self, exc: Exception) -> list[tuple[Any, list[int], Any]]:
        """After a decode step failed: the batch is dropped (its cache may be half-written) and its unfinished
        rows wait to be prefilled again, in batches of at most half as many rows. A row that was alone fails:
        ``(key, prompt ids, the exception)``."""
        live = [row for row in self.batch if not row.done]
        self.batch, self.cache, self.full_attn, self.next_pos, self.logits, self.cur = [], None, None, None, None, 0
        _free_device_memory()
        if len(live) == 1:  # (alone: no smaller batch to try)
            log.warning("a decode step of one row failed, and fails its row: %s", exc)
            return [(live[0].key, live[0].prompt, exc)]
        self.cap = max(1, min(self.cap or len(live), len(live)) // 2)
        self.waiting = live + self.waiting
        log.warning("a decode step of %d rows failed (%s): they go on in batches of at most %d", len(live), exc, self.cap)
        return []

    def _resume(self) -> list[tuple[Any, list[int], Any]]:
        """Prefill waiting rows into the batch (queued ones, or those a failed step took out), as many at a time as
        it may hold (halving that where their prefill fails). A row whose prefill fails with no other row in the
        batch fails: ``(key, prompt ids, the exception)``."""
        failed: list[tuple[Any, list[int], Any]] = []
        while self.waiting and (not self.batch or self.can_join()):
            in_batch = sum(not row.done for row in self.batch)
            room = len(self.waiting) if self.cap is None else self.cap - in_batch  # (a caller's room, till a failure)
            if room <= 0:
                break
            group = self.waiting[:room]
            try:
                self._admit_rows(group)
            except Exception as exc:  # noqa: BLE001 - the batch is as it was (admission is atomic)
                _free_device_memory()
                if len(group) == 1 and not in_batch:
                    row = self.waiting.pop(0)
                    failed.append((row.key, row.prompt, exc))
                    log.warning("the prefill of one row failed, and fails its row: %s", exc)
                else:
                    self.cap = max(1, (in_batch + len(group)) // 2)
                    log.warning("the prefill of %d rows beside %d failed (%s): batches of at most %d now",
                                len(group), in_batch, exc, self.cap)
                continue
            del self.waiting[: len(group)]
        return failed

    def _drawn_per_row(self, logits: Any) -> tuple[Any, Any]:
        """(token, sampling log-prob) for a batch whose rows sample differently: each greedy row's likeliest
        token, each sampled row's draw at its own temperature and top_p."""
        import torch

        from cowork_pipeline.agents.hf_agent import _top_p_filter

        tok = logits.argmax(dim=-1)
        samp_logp = torch.zeros_like(tok, dtype=torch.float)
        for (temperature, top_p), rows in _groups(self.batch).items():
            if temperature <= 0.0:
                continue
            idx = torch.tensor(rows, device=self.dev)
            samp = torch.log_softmax(logits[idx] / temperature, dim=-1)
            if top_p < 1.0:
                samp = _top_p_filter(samp, top_p)
            probs = samp.exp()
            drawn = torch.cat([torch.multinomial(probs[i], 1, generator=self.batch[j].gen or self.generator)
                               for i, j in enumerate(rows)])
            tok[idx] = drawn
            samp_logp[idx] = samp.gather(-1, drawn[:, None]).squeeze(-1)
        return tok, samp_logp

    def _drop(self, positions: list[int], keep: Any) -> None:
        """Drop the rows at these batch positions (keeping their KV for reuse); ``keep``: the other positions."""
        self._save(positions)
        self.cache.batch_select_indices(keep)
        self.full_attn, self.next_pos = self.full_attn[keep], self.next_pos[keep]
        gone = set(positions)
        self.batch = [row for j, row in enumerate(self.batch) if j not in gone]

    def _save(self, positions: Sequence[int]) -> None:
        """Keep the KV (prompt and fed tokens) of the rows at these batch positions for the next step of their
        conversations."""
        import torch

        agent = self.agent
        if not agent._reuse_enabled(self.cache):
            return
        for b in positions:
            row = self.batch[b]
            # (all but the last completion token were fed; those before `resumed` with the prompt)
            fed = max(len(row.comps) - 1 - row.resumed, 0)
            cols = torch.cat([row.prompt_cols, torch.arange(row.gen0, row.gen0 + fed)]).to(self.dev)
            layers = [(layer.keys[b].index_select(1, cols), layer.values[b].index_select(1, cols))
                      for layer in self.cache.layers]
            agent._prefix_cache.put(row.prompt + row.comps[:-1], len(row.prompt), layers)


def _free_device_memory() -> None:
    """Give back the cached blocks a failed step's tensors held (an allocator out of memory may keep them)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _groups(batch: Sequence[_Row]) -> dict[tuple[float, float], list[int]]:
    """Batch positions by (temperature, top_p)."""
    out: dict[tuple[float, float], list[int]] = {}
    for j, row in enumerate(batch):
        out.setdefault((row.temperature, row.top_p), []).append(j)
    return out


class Turns:
    """Conversations' next turns decoded continuously, for a driver of many episodes (``runner.run_episodes``): a
    turn submitted joins the running batch within ``join_every`` decode steps, and its reply comes back as soon as
    it is done, so that its episode runs its tools and submits its next turn while the others decode. The batch
    stays full (up to the agent's ``batch_size`` rows), where a lockstep driver decodes each round's batches to
    their longest turn and then waits for the round's last episode. A row decodes as it would alone, so each reply
    is the one lockstep gives (greedy; a sampled turn with its own seed draws from its own stream).

    ``temperature``, ``top_p`` and ``max_new``: the turns' sampling, in place of the agent's own (RL rollouts sample
    as their configuration says). ``generations``: a turn's result is its whole :class:`Generation` (prompt and
    completion ids, log-probs), where a driver records what was sampled, instead of the assistant message."""

    def __init__(self, agent: Any, join_every: int = 4, *, temperature: float | None = None,
                 top_p: float | None = None, max_new: int | None = None, generations: bool = False) -> None:
        self.agent, self.join_every = agent, max(1, join_every)
        self.temperature = agent.temperature if temperature is None else float(temperature)
        self.top_p = agent.top_p if top_p is None else float(top_p)
        self.max_new = agent.max_new_tokens if max_new is None else int(max_new)
        self.generations = generations
        self.decoding = self._fresh()
        self.queue: list[tuple[Any, Any, Any, int | None]] = []
        self.conversations: dict[Any, tuple[Any, Any]] = {}  # admitted turns not answered yet, by key
        self.steps = 0

    def _fresh(self) -> Decoding:
        import torch

        agent = self.agent  # (a sampling agent's rows without a seed of their own share one stream)
        return agent.decoding(self.temperature, self.top_p, self.max_new,
                              generator=torch.Generator(device=agent.device).manual_seed(agent.seed)
                              if self.temperature > 0.0 else None)

    def submit(self, key: Any, messages: Any, tools: Any, seed: int | None = None) -> None:
        """Queue a conversation's next turn; ``seed``: its own random stream (for a sampling agent)."""
        self.queue.append((key, messages, tools, seed))

    @property
    def busy(self) -> bool:
        return bool(self.queue) or bool(self.conversations)

    def step(self) -> list[tuple[Any, Any]]:
        """Admit queued turns where there is room (every ``join_every`` steps, or at once into an empty batch), and
        draw one token for every row: ``(key, assistant message (its Generation with ``generations``), or the
        exception the turn failed with)`` for each turn that ended."""
        ended: list[tuple[Any, Any]] = []
        decoding = self.decoding
        if self.queue and decoding.can_join() and (self.steps % self.join_every == 0 or not decoding.live):
            self._admit(ended)
        if decoding.live:
            self.steps += 1
            try:
                finished = decoding.step()
            except Exception as exc:  # noqa: BLE001 - every turn in the batch fails with it; a new batch starts
                ended += [(key, exc) for key in self.conversations]
                self.conversations, self.decoding = {}, self._fresh()
                return ended
            for key, ids, out in finished:
                turn = self.conversations.pop(key)
                # (a row that failed alone, after a failed step: its turn fails, the others decode on)
                ended.append((key, out if isinstance(out, Exception) else
                              self._result(self.agent.generation(("chat", *turn), ids, out))))
        return ended

    def _result(self, generation: Any) -> Any:
        return generation if self.generations else generation.message

    def _admit(self, ended: list[tuple[Any, Any]]) -> None:
        import torch

        agent = self.agent
        room = self.decoding.room(agent.batch_size)
        taken, self.queue = self.queue[:room], self.queue[room:]
        entries = []
        for key, messages, tools, seed in taken:
            try:
                ids = agent.chat_prompt(messages, tools, self.max_new)
                if not isinstance(ids, list):  # (it does not fit: its turn failed, nothing generated)
                    ended.append((key, self._result(ids)))
                    continue
                gen = torch.Generator(device=agent.device).manual_seed(int(seed)) \
                    if seed is not None and self.temperature > 0.0 else None
                entries.append(Prompt(key, ids, agent.matcher(tools), gen))
            except Exception as exc:  # noqa: BLE001 - this turn's own failure: its episode records it
                ended.append((key, exc))
                continue
            self.conversations[key] = (messages, tools)
        # (prefilled at the next step; where that fails, in halves, and a turn that fails alone fails)
        self.decoding.enqueue(entries)
