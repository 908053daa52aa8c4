"""KV reuse across the steps of a conversation (agents/prefix_cache.py) and the buffered decode cache."""
from __future__ import annotations

import pytest
import torch

from cowork_pipeline.agents.prefix_cache import MIN_REUSE_TOKENS, PrefixCache, buffered, buffered_layer_class
from cowork_pipeline.services import tools_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py

TOOLS = tools_for(["mail_search", "mail_read", "crm_update_invoice"])


def kv(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), fill)) for _ in range(2)]


# --- the store ----------------------------------------------------------------------------------------------
def test_a_prompt_that_extends_an_entry_reuses_the_common_prefix_once():
    cache = PrefixCache(max_bytes=10**9)
    prompt = list(range(100, 140))
    cache.put(prompt + [7, 8, 9], anchor=len(prompt), layers=kv(43))
    # The next step re-renders the completion slightly differently after 2 tokens: reuse stops there.
    nxt = prompt + [7, 8, 5, 5, 5]
    n, layers = cache.take(nxt)
    assert n == len(prompt) + 2 and layers[0][0].shape == (2, n, 4)
    assert cache.take(nxt) is None and len(cache) == 0 and cache.bytes == 0  # consumed: the conversation moved on
    assert (cache.hits, cache.reused_tokens) == (1, n)


def test_no_reuse_without_the_anchor_prompt_or_for_a_short_prefix():
    cache = PrefixCache(max_bytes=10**9)
    prompt = list(range(40))
    cache.put(prompt + [1], anchor=40, layers=kv(41))
    assert cache.take(list(range(39)) + [999, 1, 2]) is None  # does not start with the entry's prompt
    assert cache.take(prompt) is None  # nothing new to prefill: a prompt must extend the anchor
    short = PrefixCache(max_bytes=10**9)
    short.put(list(range(MIN_REUSE_TOKENS - 1)) + [5], anchor=MIN_REUSE_TOKENS - 1, layers=kv(MIN_REUSE_TOKENS))
    assert short.take(list(range(MIN_REUSE_TOKENS - 1)) + [6, 7]) is None  # too little to be worth it


def test_of_several_rollouts_from_one_prompt_the_longest_match_wins():
    cache = PrefixCache(max_bytes=10**9)
    prompt = list(range(50))
    for k, completion in enumerate(([1, 2, 3], [1, 9, 9, 9], [4])):
        cache.put(prompt + completion, anchor=50, layers=kv(50 + len(completion), fill=float(k)))
    n, layers = cache.take(prompt + [1, 9, 9, 9, 0])
    assert n == 54 and float(layers[0][0][0, 0, 0]) == 1.0 and len(cache) == 2


def test_oldest_entries_are_evicted_beyond_the_budget():
    one = sum(k.nelement() * 4 + v.nelement() * 4 for k, v in kv(40))
    cache = PrefixCache(max_bytes=2 * one)
    for base in (0, 1000, 2000):
        cache.put(list(range(base, base + 40)), anchor=39, layers=kv(40))
    assert len(cache) == 2 and cache.bytes == 2 * one
    assert cache.take(list(range(0, 39)) + [1, 2]) is None  # the oldest went first
    assert cache.take(list(range(2000, 2039)) + [1, 2]) is not None


# --- the buffered layer -------------------------------------------------------------------------------------
def test_buffered_layer_appends_in_place_grows_and_selects_rows_like_a_dynamic_layer():
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = DynamicCache()
    ref = DynamicLayer()
    k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    cache.layers = [DynamicLayer()]
    cache.layers[0].update(k, v)
    ref.update(k, v)
    buffered(cache, extra=2)
    layer = cache.layers[0]
    assert isinstance(layer, buffered_layer_class()) and isinstance(layer, DynamicLayer)
    for _ in range(4):  # two steps fit the buffer, the next two make it grow
        a, b = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        got, ref_out = layer.update(a, b), ref.update(a, b)
        assert torch.equal(got[0], ref_out[0]) and torch.equal(got[1], ref_out[1])
    idx = torch.tensor([2, 0])
    layer.batch_select_indices(idx)
    ref.batch_select_indices(idx)
    assert torch.equal(layer.keys, ref.keys) and layer.get_seq_length() == ref.get_seq_length() == 9


# --- end to end through HFAgent -----------------------------------------------------------------------------
@pytest.fixture
def student(tiny_student):  # (conftest.py)
    return tiny_student


def conversations(step: int) -> list[list[dict]]:
    """Three conversations at a given step: two identical ones (a rollout group) and a different one."""
    base = [[{"role": "system", "content": "You are a helpful coworker."},
             {"role": "user", "content": f"Find Clara's invoice number {k} and fix its amount."}] for k in (1, 1, 2)]
    for conv in base:
        for s in range(step):
            conv.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{s}", "type": "function",
                         "function": {"name": "mail_search", "arguments": '{"query": "Clara"}'}}]})
            conv.append({"role": "tool", "tool_call_id": f"call_{s}", "name": "mail_search",
                         "content": '[{"id": "msg_%d", "from": "clara@acme.example"}]' % s})
    return base


def test_reuse_gives_the_same_tokens_and_logprobs_as_full_prefill(student):
    from cowork_pipeline.agents.hf_agent import HFAgent

    with_reuse = HFAgent(student, device="cpu", max_new_tokens=12, strict_tools=False)
    without = HFAgent(student, device="cpu", max_new_tokens=12, strict_tools=False, prefix_cache_mb=0)
    histories = conversations(0)
    for step in range(3):
        convs = [(h, TOOLS) for h in histories]
        a = with_reuse.sample_with_logprobs(convs, temperature=1.0, seed=step)
        b = without.sample_with_logprobs(convs, temperature=1.0, seed=step)
        for x, y in zip(a, b):
            assert x.completion_ids == y.completion_ids and x.prompt_ids == y.prompt_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        # The generated text goes back into history as the model wrote it, then the world answers.
        for h, s in zip(histories, a):
            h.append({"role": "assistant", "content": with_reuse.tokenizer.decode(s.completion_ids[:-1])})
            h.append({"role": "user", "content": f"and now step {step + 1}?"})
    cache = with_reuse._prefix_cache
    assert cache.hits == 6 and cache.reused_tokens > 0.8 * sum(len(s.prompt_ids) for s in a)


def test_kv_from_older_weights_is_never_reused(student):
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(student, device="cpu", max_new_tokens=8, strict_tools=False)
    fresh = HFAgent(student, device="cpu", max_new_tokens=8, strict_tools=False, prefix_cache_mb=0)
    first = agent.generate([(h, TOOLS) for h in conversations(1)])
    assert len(agent._prefix_cache) == 3
    with torch.no_grad():  # an RL update: in place, as optimizers do
        for m in (agent.model, fresh.model):
            for p in m.parameters():
                p.mul_(1.5)
    histories = conversations(1)
    for h, g in zip(histories, first):
        h += [{"role": "assistant", "content": g.text}, {"role": "user", "content": "go on"}]
    got = agent.generate([(h, TOOLS) for h in histories])
    want = fresh.generate([(h, TOOLS) for h in histories])
    assert agent._prefix_cache.hits == 0
    assert [g.completion_ids for g in got] == [w.completion_ids for w in want]
