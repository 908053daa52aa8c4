"""Offline student construction, SFT on demonstrations, and the HF agent on the result."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cowork_pipeline.agents.chat_format import CHAT_TEMPLATE, MARKUP_TOKENS, CONTROL_TOKENS, render_conversation
from cowork_pipeline.training.student import CheckpointError, StudentConfig, build_student, check_checkpoint, load_checkpoint

TINY = StudentConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                     num_kv_heads=1, max_position_embeddings=1024, seed=0)
SYSTEM = "You are a coworker agent."
MAIL_SEND = {"type": "function", "function": {
    "name": "mail_send", "description": "Send an email.",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"},
        "body": {"type": "string"}, "cc": {"type": "array", "items": {"type": "string"}}},
        "required": ["to", "subject", "body"]}}}
CAL = {"type": "function", "function": {
    "name": "calendar_create_event", "description": "Create a calendar event.",
    "parameters": {"type": "object", "properties": {
        "title": {"type": "string"}, "start": {"type": "string"},
        "priority": {"type": "integer", "enum": [1, 2, 3]}}, "required": ["title", "start"]}}}
TOOLS = [MAIL_SEND, CAL]
# One repeated, trivially learnable pattern: every first assistant turn is the same mail_send call.
FIXED_ARGS = {"to": ["team@example.com"], "subject": "Update", "body": "Status update."}
NAMES = ["alice", "bob", "carol", "dave", "erin"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest.py


def demonstrations(n: int = 20) -> list[dict]:
    demos = []
    for i in range(n):
        who = NAMES[i % len(NAMES)]
        demos.append({
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Please send the team an update, {who} asked."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "mail_send", "arguments": json.dumps(FIXED_ARGS)}}]},
                {"role": "tool", "tool_call_id": "call_0", "name": "mail_send", "content": '{"status": "sent"}'},
                {"role": "assistant", "content": "Sent."},
            ],
        })
    return demos


def prompt(who: str = "frank") -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Please send the team an update, {who} asked."}]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [render_conversation(d["messages"], d["tools"]) for d in demonstrations()]


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, corpus) -> Path:
    return build_student(corpus, tmp_path_factory.mktemp("student"), TINY)


@pytest.fixture(scope="module")
def dataset():
    from cowork_pipeline.training.sft import to_sft_dataset

    return to_sft_dataset(demonstrations())


@pytest.fixture(scope="module")
def trained(student_dir, dataset, tmp_path_factory):
    from cowork_pipeline.training.sft import SFTSettings, train_sft

    logged = []
    result = train_sft(student_dir, dataset, tmp_path_factory.mktemp("sft"),
                       SFTSettings(max_steps=150, lr=3e-3, batch_size=4, max_length=512, device="cpu",
                                   assistant_loss_weight=2.0),
                       on_log=logged.append)
    return result, logged


# --- student ------------------------------------------------------------------------------------------------
def test_student_reloads_with_auto_classes(student_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(student_dir)
    model = AutoModelForCausalLM.from_pretrained(student_dir)
    from transformers import Qwen3ForCausalLM

    from cowork_pipeline.training.pointer import POINTER_MODEL_TYPE

    # A Qwen3 with the pointer head (training/pointer.py), registered with the Auto classes.
    assert model.config.model_type == POINTER_MODEL_TYPE and isinstance(model, Qwen3ForCausalLM)
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 64 == 0
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for t in CONTROL_TOKENS + MARKUP_TOKENS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids) == t
    assert model.generation_config.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]


def test_student_build_is_deterministic(student_dir, corpus, tmp_path):
    again = build_student(corpus, tmp_path / "again", TINY)
    for name in ("tokenizer.json", "model.safetensors"):
        assert hashlib.sha256((again / name).read_bytes()).digest() == hashlib.sha256((student_dir / name).read_bytes()).digest()


def test_a_capitalised_word_is_the_same_token_in_prose_and_in_a_json_value():
    """The pointer copies token ids: a name read in prose must be spelled the same at the start of a JSON value."""
    from cowork_pipeline.training.student import train_tokenizer

    names = ["Priya Okafor", "Élodie Brun", "Lukas Berg"]
    corpus = [f"Please ask {n} about it. " * 3 + json.dumps({"query": n, "note": "call back"}, ensure_ascii=False) for n in names] * 5
    tok = train_tokenizer(corpus, vocab_size=400)

    def pieces(text: str) -> list[str]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text  # lossless, whatever the spaces
        return [tok.decode([i]) for i in ids]

    for n in names:
        first, last = n.split()
        prose, value = pieces(f"Please ask {n} about it."), pieces(json.dumps({"query": n}, ensure_ascii=False))
        assert first in prose and first in value and last in prose and last in value, (prose, value)
    # Lowercase words keep their leading space (splitting those made free text degenerate).
    assert " about" in pieces("Please ask Priya Okafor about it.")
    for text in ("two  spaces  Before Caps", "line\nBreak", " Lead", "trailing ", "A", "x Y z", '"Quoted" Word'):
        pieces(text)


def test_not_a_model_gives_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"does not exist"):
        check_checkpoint(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match=r"not a directory"):
        check_checkpoint(tmp_path / "file.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(empty)
    assert str(empty) in str(err.value) and "config.json" in str(err.value) and "weights" in str(err.value)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="LoRA adapter"):
        check_checkpoint(adapter)
    from cowork_pipeline.agents.hf_agent import HFAgent

    with pytest.raises(CheckpointError, match="config.json"):
        HFAgent(empty)


# --- dataset ------------------------------------------------------------------------------------------------
def test_dataset_shape(dataset, tmp_path):
    from datasets import Dataset

    assert dataset.column_names == ["messages", "tools"] and len(dataset) == 20
    assert dataset.features["tools"].dtype == "string"
    row = dataset[0]
    assert json.loads(row["tools"]) == TOOLS
    call = row["messages"][2]["tool_calls"][0]
    assert isinstance(call["function"]["arguments"], str) and json.loads(call["function"]["arguments"]) == FIXED_ARGS
    # Parquet round trip keeps the schema (what the Delta/parquet export stores).
    dataset.to_parquet(str(tmp_path / "d.parquet"))
    assert Dataset.from_parquet(str(tmp_path / "d.parquet")).features == dataset.features


def test_sft_trainer_loads_dataset_as_is(student_dir, dataset, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    from cowork_pipeline.training.sft import SFTSettings, sft_config

    tok = AutoTokenizer.from_pretrained(student_dir)
    model = AutoModelForCausalLM.from_pretrained(student_dir)
    trainer = SFTTrainer(model=model, args=sft_config(tmp_path, SFTSettings(max_length=512), "cpu", lora=False),
                         train_dataset=dataset, processing_class=tok)
    ex = trainer.train_dataset[0]
    trained_ids = [i for i, lab in zip(ex["input_ids"], ex["labels"]) if lab != -100]
    text = tok.decode(trained_ids, skip_special_tokens=False)
    # Only assistant turns (tool call + final answer, each with its <|im_end|>) carry loss.
    assert text == ('<tool_call>{"name": "mail_send", "arguments": {"body": "Status update.", "subject": "Update", '
                    '"to": ["team@example.com"]}}</tool_call><|im_end|>Sent.<|im_end|>')
    assert "mail_send(to: array[string]" in tok.decode(ex["input_ids"])  # tools came through the JSON column


# --- SFT + agent --------------------------------------------------------------------------------------------
def test_sft_lowers_loss(trained):
    result, logged = trained
    assert result.steps == 150 and result.device == "cpu" and result.lora is False
    assert logged == result.loss_curve and {"step", "loss", "epoch"} <= set(result.loss_curve[0])
    first, last = result.loss_curve[0]["loss"], result.loss_curve[-1]["loss"]
    assert last < 0.3 * first, (first, last)
    assert result.train_tokens > 0 and result.tokens_per_second > 0
    assert not (result.checkpoint / "_trainer").exists()
    assert (result.checkpoint / "cowork_student.json").is_file()  # full fine-tune stays a student


def test_trained_student_emits_the_learned_tool_call(trained):
    from cowork_pipeline.agents.base import BatchAgent
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(trained[0].checkpoint, device="cpu", max_new_tokens=64)
    assert isinstance(agent, BatchAgent)
    # A prompt from the training distribution: the claim is "learns the pattern", not "generalises from 20 demos".
    msg = agent.act(prompt("alice"), TOOLS)
    assert "parse_error" not in msg, msg
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["mail_send"]
    assert isinstance(json.loads(msg["tool_calls"][0]["function"]["arguments"]), dict)
    # After the tool result it closes the task with plain text; call ids continue past earlier calls.
    follow = prompt("alice") + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "name": "mail_send",
                               "content": '{"status": "sent"}'}]
    out = agent.act(follow, TOOLS)
    assert "parse_error" not in out and out["content"] == "Sent." and "tool_calls" not in out


def test_batched_generation_matches_single(trained):
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(trained[0].checkpoint, device="cpu", max_new_tokens=48)
    shared = [(prompt("x" * k), TOOLS) for k in (1, 7, 30)]  # same system+tools prefix: prefilled once, shared
    mixed = shared + [(prompt()[1:], [])]  # nothing in common: plain left-padded batch
    for convs in (shared, mixed):
        batched = agent.generate(convs)
        for conv, b in zip(convs, batched):
            single = agent.generate([conv])[0]
            assert single.prompt_ids == b.prompt_ids
            assert single.completion_ids == b.completion_ids
            assert single.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert agent.act_batch(convs) == [g.message for g in batched]


def test_sample_with_logprobs(trained):
    import torch

    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(trained[0].checkpoint, device="cpu", max_new_tokens=48, strict_tools=False)
    convs = [(prompt(), TOOLS), (prompt("bob"), TOOLS)]
    strict = HFAgent(trained[0].checkpoint, device="cpu", max_new_tokens=48).sample_with_logprobs(convs, temperature=1.0, seed=7)
    for s in strict:  # the grammar only removes tokens: what is sampled is at least as likely as under the raw model
        assert all(a >= b - 1e-5 for a, b in zip(s.sampling_logprobs, s.logprobs))
    samples = agent.sample_with_logprobs(convs, temperature=1.0, seed=7)
    again = agent.sample_with_logprobs(convs, temperature=1.0, seed=7)
    assert [s.completion_ids for s in samples] == [s.completion_ids for s in again]  # seeded
    for s in samples:
        assert len(s.logprobs) == len(s.completion_ids) == len(s.sampling_logprobs) > 0
        assert all(lp <= 0 for lp in s.logprobs)
        assert s.logprobs == pytest.approx(s.sampling_logprobs, abs=1e-4)  # T=1, top_p=1: same distribution
        # Recompute with a plain forward pass: stored log-probs are the model's raw distribution.
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(agent.model(ids).logits.float(), -1)[0]
        n = len(s.prompt_ids)
        ref = [logp[n - 1 + i, t].item() for i, t in enumerate(s.completion_ids)]
        assert s.logprobs == pytest.approx(ref, abs=1e-3)


def test_context_policy(trained):
    from cowork_pipeline.agents.hf_agent import HFAgent

    agent = HFAgent(trained[0].checkpoint, device="cpu", max_new_tokens=16, max_context_tokens=160)
    history = prompt()
    for i in range(6):
        history += [{"role": "assistant", "content": f"Working on step {i} of the request."},
                    {"role": "user", "content": f"Continue with step {i + 1} please."}]
    ids = agent.encode_prompt(history, [])
    assert ids is not None and len(ids) <= 160 - 16
    text = agent.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n" + SYSTEM) and "step 6 please" in text and "step 0 of" not in text
    assert "frank asked" in text  # the task statement stays pinned after the system block
    # History ending in tool results: a result is never kept without the call that produced it.
    call = {"id": "call_9", "type": "function", "function": {"name": "mail_send", "arguments": "{}"}}
    history += [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_9", "name": "mail_send", "content": "ok " * 20}]
    text = agent.tokenizer.decode(agent.encode_prompt(history, []))
    assert text.count("<tool_response>") == 1 and "<tool_call>" in text
    # The tools block alone exceeds the budget: a failed step, not an exception.
    tiny = HFAgent(trained[0].checkpoint, device="cpu", max_new_tokens=16, max_context_tokens=40)
    msg = tiny.act(prompt(), TOOLS)
    assert msg["parse_error"].startswith("context_overflow")


def test_lora_path_saves_a_merged_plain_checkpoint(student_dir, dataset, tmp_path):
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.sft import SFTSettings, train_sft

    result = train_sft(student_dir, dataset.select(range(4)), tmp_path / "lora",
                       SFTSettings(max_steps=2, batch_size=2, max_length=512, lora=True, lora_r=4, device="cpu"))
    assert result.lora is True
    assert not (result.checkpoint / "adapter_config.json").exists()
    assert not (result.checkpoint / "cowork_student.json").exists()
    msg = HFAgent(result.checkpoint, device="cpu", max_new_tokens=4).act(prompt(), TOOLS)
    assert msg["role"] == "assistant"  # loads and generates (content is random-ish after 2 LoRA steps)


def test_foreign_checkpoint_gets_lora_and_chat_tokens(corpus, dataset, tmp_path):
    """A non-student ("pretrained") checkpoint whose tokenizer lacks our control tokens: auto mode picks LoRA,
    adds the tokens, trains their rows, and still saves a merged plain checkpoint."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.sft import SFTSettings, train_sft

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    foreign = tmp_path / "foreign"
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>").save_pretrained(foreign)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                 max_position_embeddings=1024, tie_word_embeddings=True)).save_pretrained(foreign)
    result = train_sft(foreign, dataset.select(range(4)), tmp_path / "out",
                       SFTSettings(max_steps=2, batch_size=2, max_length=1024, device="cpu"))
    assert result.lora is True and not (result.checkpoint / "adapter_config.json").exists()
    agent = HFAgent(result.checkpoint, device="cpu", max_new_tokens=4)
    im_end = agent.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in agent.stop_ids and agent.model.config.vocab_size >= len(agent.tokenizer)
    assert agent.act(prompt(), TOOLS)["role"] == "assistant"
    # the base ties its output layer to its input embedding: trained as one copy, it is saved tied, as it came
    merged = agent.model
    assert merged.config.tie_word_embeddings and merged.get_output_embeddings().weight is merged.get_input_embeddings().weight
    foreign_model = Qwen3ForCausalLM.from_pretrained(foreign)
    assert not torch.equal(merged.get_input_embeddings().weight[:320], foreign_model.get_input_embeddings().weight), \
        "the embedding rows were not trained"


def test_sft_keeps_whole_demonstrations_up_to_the_checkpoint_context(student_dir, tmp_path):
    """The default cap is the checkpoint's context: TRL keeps a sequence's start, so a smaller cap would cut the
    end of the longest demonstrations (their last calls and answer); a cap a user sets is reported when it bites."""
    from cowork_pipeline.training.sft import SFTSettings, to_sft_dataset, train_sft

    demos = demonstrations(4)
    listing = json.dumps([{"title": f"Sync {i}", "start": f"2026-03-{i % 28 + 1:02d}T10:00"} for i in range(15)])
    for d in demos[:2]:  # a long tool result before the final answer, as a calendar listing is
        d["messages"][3] = {**d["messages"][3], "content": listing}
    model, tok = load_checkpoint(student_dir, device="cpu")
    tok.chat_template = CHAT_TEMPLATE
    lengths = [len(tok(tok.apply_chat_template(d["messages"], tools=d["tools"], tokenize=False))["input_ids"]) for d in demos]
    assert min(lengths[:2]) > 400 and max(lengths) < TINY.max_position_embeddings and max(lengths[2:]) <= 400

    whole = train_sft(student_dir, to_sft_dataset(demos), tmp_path / "whole", SFTSettings(max_steps=1, batch_size=2, device="cpu"))
    assert (whole.max_length, whole.truncated) == (TINY.max_position_embeddings, 0)
    capped = train_sft(student_dir, to_sft_dataset(demos), tmp_path / "capped",
                       SFTSettings(max_steps=1, batch_size=2, max_length=400, device="cpu"))
    assert (capped.max_length, capped.truncated) == (400, 2)


def test_a_batch_padded_at_its_end_trains_without_its_mask_to_the_same_weights(student_dir, tmp_path, monkeypatch):
    """The pointer student's trainer leaves out the mask of a batch padded only at its end, so attention runs its
    causal kernel (about twice as fast on CPU); the weights it trains are the masked run's to the bit."""
    from cowork_pipeline.training import sft

    demos = demonstrations(8)
    for i, d in enumerate(demos):  # lengths that differ, so that every batch of two pads one of its rows
        d["messages"][1] = {**d["messages"][1], "content": d["messages"][1]["content"] + " Thanks." * (3 * i)}
    settings = sft.SFTSettings(max_steps=6, lr=3e-3, batch_size=2, device="cpu")
    unmasked = []
    causal_sdpa = sft._causal_sdpa

    def counted(module, query, key, value, attention_mask, **kwargs):
        unmasked.append(attention_mask is None and kwargs.get("expand_kv_heads", False))
        return causal_sdpa(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(sft, "_causal_sdpa", counted)
    fast = sft.train_sft(student_dir, sft.to_sft_dataset(demos), tmp_path / "fast", settings)
    assert unmasked and all(unmasked)  # every batch was padded, and none kept its mask
    model, _ = load_checkpoint(fast.checkpoint, device="cpu")
    assert model.config._attn_implementation == "sdpa"  # the saved student runs as any other

    monkeypatch.setattr(sft, "_causal_attention", lambda model: False)
    masked = sft.train_sft(student_dir, sft.to_sft_dataset(demos), tmp_path / "masked", settings)
    assert len(unmasked) == 6 * TINY.num_layers  # a call per layer and step, none from the masked run
    assert (fast.checkpoint / "model.safetensors").read_bytes() == (masked.checkpoint / "model.safetensors").read_bytes()
    assert [r["loss"] for r in fast.loss_curve if "loss" in r] == [r["loss"] for r in masked.loss_curve if "loss" in r]


# --- settings -----------------------------------------------------------------------------------------------
def test_sft_settings_resolve_per_kind_of_checkpoint():
    from cowork_pipeline.training.sft import SFTSettings, resolve_settings

    student = resolve_settings(SFTSettings(), student=True)
    assert (student.lora, student.assistant_only_loss) == (False, False)
    pretrained = resolve_settings(SFTSettings(), student=False)
    assert (pretrained.lora, pretrained.assistant_only_loss) == (True, True)
    explicit = resolve_settings(SFTSettings(lora=True, assistant_only_loss=True), student=True)
    assert (explicit.lora, explicit.assistant_only_loss) == (True, True)


def test_the_current_checkpoint_is_the_one_trained_last_not_the_last_row(tmp_path):
    """The checkpoint registry is upserted (a Delta merge keeps no row order): after a re-run with other settings
    the new SFT checkpoint may come first. The benchmark and RL take the one trained last, and score only the RL
    checkpoints grown from it."""
    import os

    import polars as pl

    from cowork_pipeline.training.registry import current_checkpoints, latest_trained

    old, new = tmp_path / "sft-s1000", tmp_path / "sft-s1300"
    for d, t in ((old, 1_000_000), (new, 2_000_000)):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
        os.utime(d / "model.safetensors", (t, t))
    rows = [{"checkpoint_id": "sft-s1300", "kind": "sft", "path": str(new), "base_checkpoint_id": "base"},
            {"checkpoint_id": "sft-s1000", "kind": "sft", "path": str(old), "base_checkpoint_id": "base"}]
    assert latest_trained(rows)["checkpoint_id"] == "sft-s1300"
    assert latest_trained(list(reversed(rows)))["checkpoint_id"] == "sft-s1300"
    gone = {"checkpoint_id": "sft-gone", "kind": "sft", "path": str(tmp_path / "missing"), "base_checkpoint_id": "base"}
    assert latest_trained([gone, *rows])["checkpoint_id"] == "sft-s1300" and latest_trained([gone]) is gone and latest_trained([]) is None
    table = pl.DataFrame(rows + [{"checkpoint_id": "base", "kind": "base", "path": str(tmp_path), "base_checkpoint_id": None},
                                 {"checkpoint_id": "rl-a-sft-s1000", "kind": "rl", "path": str(old), "base_checkpoint_id": "sft-s1000"},
                                 {"checkpoint_id": "rl-a-sft-s1300", "kind": "rl", "path": str(new), "base_checkpoint_id": "sft-s1300"}])
    assert [r["checkpoint_id"] for r in current_checkpoints(table.to_dicts())] == ["base", "sft-s1300", "rl-a-sft-s1300"]
