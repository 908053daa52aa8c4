"""The pointer-sentinel copy head of the embedded student (training/pointer.py)."""
from __future__ import annotations

import pytest
import torch

from cowork_pipeline.training.pointer import PointerQwen3Config, PointerQwen3ForCausalLM
from cowork_pipeline.training.student import StudentConfig, build_student, load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py
TURN = 3  # the turn-opening token of these tiny models
ROLE, USER = 4, 1  # role tokens after TURN: the model's own turns, another speaker's


def tiny(pointer: bool = True, vocab: int = 96, seed: int = 0, opinions: bool = True):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kw = dict(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=24, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = PointerQwen3ForCausalLM(PointerQwen3Config(pointer_dim=32, turn_token_id=TURN, **kw)) if pointer else Qwen3ForCausalLM(Qwen3Config(**kw))
    if pointer and opinions:
        with torch.no_grad():  # an untrained head points nowhere; give it opinions so the checks below bite
            for p in (model.pointer_query.weight, model.pointer_key_prev.weight, model.pointer_key_src.weight):
                p.normal_(0, 0.15)
            model.pointer_sentinel_bias.fill_(0.0)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.fixture(scope="module")
def ids():
    x = torch.randint(5, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    x[:, 0] = x[:, 12] = TURN  # two turns
    return x


def test_logits_are_a_normalised_mixture_that_points(model, ids):
    with torch.no_grad():
        logp = model(input_ids=ids).logits
        p_vocab = torch.softmax(model.lm_head(model.model(input_ids=ids).last_hidden_state), -1)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(ids.shape), atol=1e-4)
    # Tokens seen earlier in the sequence get probability mass beyond what the vocabulary head gives them.
    seen = ids[0, 1:20].unique()
    assert logp[0, 19].exp()[seen].sum() > p_vocab[0, 19][seen].sum() + 0.1


def test_loss_is_the_mixture_nll(model, ids):
    labels = ids.clone()
    labels[0, :5] = -100
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss
        logp = model(input_ids=ids).logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = labels[:, 1:] != -100
    assert loss.item() == pytest.approx(-(logp[mask]).mean().item(), rel=1e-4)


def test_ngram_bonus_copies_from_earlier_turns_only():
    model = tiny()
    with torch.no_grad():  # only the exact-match bonus decides: no learned scores, a strong bonus, no vocabulary
        model.pointer_query.weight.zero_()
        model.pointer_match.weight.zero_()
        model.pointer_match.bias.fill_(5.0)
        model.pointer_sentinel_bias.fill_(-30.0)
    a, b, c, x = 40, 41, 42, 43
    earlier_turn = torch.tensor([[TURN, a, b, c, x, TURN, a, b]])
    same_turn = torch.tensor([[TURN, a, b, c, x, x, a, b]])
    with torch.no_grad():
        p_earlier = model(input_ids=earlier_turn).logits[0, -1].exp()[c]
        p_same = model(input_ids=same_turn).logits[0, -1].exp()[c]
    assert p_earlier > 0.9 > 0.3 > p_same


def test_pointer_never_copies_from_the_models_own_turns():
    model = tiny()
    model.config.own_role_ids = [ROLE]
    with torch.no_grad():
        model.pointer_query.weight.zero_()
        model.pointer_match.weight.zero_()
        model.pointer_match.bias.fill_(5.0)
        model.pointer_sentinel_bias.fill_(-30.0)
    a, b, c, x = 40, 41, 42, 43
    read_earlier = torch.tensor([[TURN, USER, a, b, c, TURN, ROLE, a, b]])  # a user wrote "a b c"
    wrote_earlier = torch.tensor([[TURN, ROLE, a, b, c, TURN, ROLE, a, b]])  # the model wrote it itself
    with torch.no_grad():
        p_read = model(input_ids=read_earlier).logits[0, -1].exp()[c]
        p_wrote = model(input_ids=wrote_earlier).logits[0, -1].exp()[c]
    assert p_read > 0.9 and p_wrote < 0.1


def test_label_weights_make_a_weighted_mean(model, ids):
    weights = torch.ones(ids.shape)
    weights[:, 12:] = 4.0  # e.g. the assistant turn
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids, label_weights=weights).loss
        nll = -model(input_ids=ids).logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    w = weights[:, 1:]
    assert loss.item() == pytest.approx(((nll * w).sum() / w.sum()).item(), rel=1e-4)


def test_pointer_mask_trains_the_mixture_only_where_marked(model, ids):
    pointer = torch.zeros(ids.shape, dtype=torch.bool)
    pointer[:, 14:] = True  # e.g. the assistant turn
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids, pointer_mask=pointer).loss
        mixed = model(input_ids=ids).logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        vocab = torch.log_softmax(model.lm_head(model.model(input_ids=ids).last_hidden_state), -1)[:, :-1]
        vocab = vocab.gather(-1, ids[:, 1:, None]).squeeze(-1)
    expected = torch.where(pointer[:, 1:], mixed, vocab)
    assert loss.item() == pytest.approx(-expected.mean().item(), rel=1e-4)


def test_vocab_path_trains_gate_and_vocabulary_instead_of_the_mixture(model, ids):
    pointer = torch.zeros(ids.shape, dtype=torch.bool)
    pointer[:, 14:] = True
    through_vocab = torch.zeros_like(pointer)
    through_vocab[:, 16:20] = True  # e.g. the argument names of a tool call
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids, pointer_mask=pointer, vocab_path_mask=through_vocab).loss
        mix = model(input_ids=ids).logits[:, :-1].exp()
        vocab = torch.softmax(model.lm_head(model.model(input_ids=ids).last_hidden_state), -1)[:, :-1]
    # The gate's share a_sentinel per position: on tokens that no source proposes, all mass is the vocabulary's.
    absent = torch.ones(mix.shape[-1], dtype=torch.bool)
    absent[ids.unique()] = False
    a_sentinel = mix[..., absent].sum(-1) / vocab[..., absent].sum(-1)
    assert bool((a_sentinel[through_vocab[:, 1:]] < 0.99).all())  # the checks bite: the pointer holds real mass there
    y = ids[:, 1:, None]
    mixed, vocab_lp = mix.gather(-1, y).squeeze(-1).log(), vocab.gather(-1, y).squeeze(-1).log()
    expected = torch.where(through_vocab[:, 1:], a_sentinel.log() + vocab_lp, torch.where(pointer[:, 1:], mixed, vocab_lp))
    assert loss.item() == pytest.approx(-expected.mean().item(), rel=1e-4)


def test_json_key_mask_marks_argument_names_inside_tool_calls_only():
    from cowork_pipeline.training.sft import json_key_mask

    chunks = ['{"', 'x', '": 1} ', '<tool_call>', '{"', 'na', 'me', '": "', 'mail_send', '", "', 'arguments', '": {"',
              'to', '": ["', 'a', '", "', 'b', '"], "', 'body', '": "', 'say \\"', 'hi', '\\": ', 'x', '", "',
              'meta', '": {"', 'deep', '": null}}}', '</tool_call>', ' {"', 'y', '": 2}']
    pieces = sorted(set(chunks))
    ids = [pieces.index(c) for c in chunks]
    mask = json_key_mask(ids, pieces, pieces.index("<tool_call>"), pieces.index("</tool_call>"))
    keys = [c for c, m in zip(chunks, mask) if m]
    # Keys of the call (not the values, not an escaped quote inside a value, not JSON outside the call).
    assert keys == ["na", "me", "arguments", "to", "body", "meta", "deep"]


def test_incremental_decoding_with_cache_matches_full_forward(model, ids):
    from transformers import DynamicCache

    with torch.no_grad():
        full = model(input_ids=ids).logits
        cache = DynamicCache(config=model.config)
        steps = [model(input_ids=ids[:, :16], cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]]
        for i in range(16, 23):
            out = model(input_ids=ids[:, i:i + 1], cache=cache, use_cache=True,
                        attention_mask=torch.ones(2, i + 1, dtype=torch.long))
            steps.append(out.logits[:, -1])
    assert torch.allclose(torch.stack(steps, 1), full[:, 15:23], atol=1e-4)
    # The pointer memory is one extra cache layer, so batch compaction keeps it aligned.
    assert len(cache.layers) == model.config.num_hidden_layers + 1
    cache.batch_select_indices(torch.tensor([1]))
    assert cache.layers[-1].keys.shape[0] == 1


def test_the_cache_keeps_each_source_key_as_a_full_forward_computes_it(model, ids):
    """A step with the cache computes the keys of its new positions only (the token before one of them may be
    cached, or new in the same step) and keeps them: they are the keys of a forward over the whole sequence."""
    from transformers import DynamicCache

    from cowork_pipeline.training.pointer import _prev_index

    n, d = ids.shape[1], model.config.pointer_dim
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        whole, _ = model._memory(hidden, ids, None, _prev_index(torch.ones_like(ids, dtype=torch.bool)))
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :10], cache=cache, use_cache=True, logits_to_keep=1)
        model(input_ids=ids[:, 10:14], cache=cache, use_cache=True, attention_mask=torch.ones(2, 14, dtype=torch.long))
        for i in range(14, n):
            model(input_ids=ids[:, i:i + 1], cache=cache, use_cache=True, attention_mask=torch.ones(2, i + 1, dtype=torch.long))
    kept = cache.layers[-1].keys[:, 0]
    assert kept.shape == (2, n, 2 * d)
    assert torch.allclose(kept[..., d:], whole, atol=1e-5)


def test_left_padding_and_logits_to_keep_do_not_change_the_distribution(model, ids):
    pad = torch.cat([torch.zeros(1, 6, dtype=torch.long), ids[1:, :18]], 1)
    mask = torch.cat([torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 18, dtype=torch.long)], 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = model(input_ids=ids).logits
        padded = model(input_ids=pad, attention_mask=mask, position_ids=pos).logits
        kept = model(input_ids=ids, logits_to_keep=3).logits
    assert torch.allclose(padded[0, 6:], full[1, :18], atol=1e-4)
    assert torch.allclose(kept, full[:, -3:], atol=1e-5)


def test_student_checkpoint_round_trips_as_the_pointer_class(tmp_path):
    cfg = StudentConfig(vocab_size=400, hidden_size=48, intermediate_size=96, num_layers=2, num_heads=2, num_kv_heads=1,
                        max_position_embeddings=512, min_frequency=1, pointer_dim=16)
    out = build_student(["Clara Fischer emailed about invoice INV-6803. " * 20], tmp_path / "s", cfg)
    model, _tok = load_checkpoint(out)
    assert isinstance(model, PointerQwen3ForCausalLM) and model.config.pointer_dim == 16
    assert model.config.turn_token_id == _tok.convert_tokens_to_ids("<|im_start|>")
    plain, _ = load_checkpoint(build_student(["hello"] * 20, tmp_path / "p", StudentConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, min_frequency=1,
        pointer_dim=0)))
    assert not isinstance(plain, PointerQwen3ForCausalLM)


def _copy_batch(gen: torch.Generator, n: int = 16, k: int = 6, gap: int = 10) -> torch.Tensor:
    # "<noise> <value> <noise> TURN <value>" with the value at a random distance: the tokens of the second copy
    # after its first one are predictable only by finding the value by content (no fixed offset to learn).
    rows = []
    for _ in range(n):
        r = int(torch.randint(0, gap + 1, (1,), generator=gen))
        noise = torch.randint(5, 96, (gap,), generator=gen)
        value = torch.randint(5, 96, (k,), generator=gen)
        rows.append(torch.cat([noise[:r], value, noise[r:], torch.tensor([TURN]), value]))
    return torch.stack(rows)


def _copy_accuracy(model, gen: torch.Generator, k: int = 6) -> float:
    x = _copy_batch(gen, n=64, k=k)
    with torch.no_grad():
        pred = model(input_ids=x).logits.argmax(-1)
    return (pred[:, -k:-1] == x[:, -k + 1:]).float().mean().item()


def test_pointer_head_learns_to_copy_unseen_values_where_a_plain_lm_cannot():
    results = {}
    for pointer in (True, False):
        model = tiny(pointer=pointer, opinions=False).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(0)
        for _ in range(120):
            x = _copy_batch(gen)
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        results[pointer] = _copy_accuracy(model.eval(), torch.Generator().manual_seed(99))
    assert results[True] > 0.9, results
    assert results[False] < 0.3, results
