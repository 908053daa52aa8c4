"""Supervised fine-tuning on teacher demonstrations with TRL's SFTTrainer (assistant-only loss).

Dataset shape (what SFTTrainer consumes as is):

* ``messages``: list of structs ``{role, content, tool_calls: [{id, type, function: {name, arguments}}],
  tool_call_id, name}``; ``arguments`` is a canonical JSON *string* (OpenAI shape). Absent keys are null, which
  ``apply_chat_template`` drops before rendering.
* ``tools``: one JSON *string* per row (``json.dumps`` of the OpenAI tool-schema list). A list-of-structs column
  would make Arrow unify every tool's ``parameters.properties`` into one struct, so each tool would gain every
  other tool's parameters as nulls (rendered as bogus optional params) and mixed-type ``enum``/``default`` values
  fail to unify at all. TRL 1.x ``json.loads`` a string ``tools`` value before ``apply_chat_template``
  (``SFTTrainer._prepare_dataset.tokenize_fn``; JSON strings are TRL's preferred shape since trl#5118), so the
  string column works without a formatting function. ``datasets.Json()`` would also decode, but it is an Arrow
  *extension* type (``arrow.json``) that the Delta/parquet/polars side of the lake does not round-trip; a plain
  string column does.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from cowork_pipeline.agents.chat_format import (
    CHAT_TEMPLATE,
    CONTROL_TOKENS,
    END_OF_TEXT,
    IM_END,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    normalize_messages,
)
from cowork_pipeline.training.student import STUDENT_MARKER, check_checkpoint, is_student_checkpoint, load_checkpoint

_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def sft_features() -> Any:
    """Explicit Arrow schema, so the column types do not depend on which rows happen to come first."""
    from datasets import Features, List, Value

    tool_call = {
        "id": Value("string"),
        "type": Value("string"),
        "function": {"name": Value("string"), "arguments": Value("string")},
    }
    message = {
        "role": Value("string"),
        "content": Value("string"),
        "tool_calls": List(tool_call),
        "tool_call_id": Value("string"),
        "name": Value("string"),
    }
    return Features({"messages": List(message), "tools": Value("string")})


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def _row(demo: dict[str, Any]) -> dict[str, Any]:
    messages = []
    for m in normalize_messages(demo["messages"]):
        row = {k: m.get(k) for k in _MESSAGE_KEYS}
        row["content"] = _text(row["content"])
        if row["tool_calls"]:
            row["tool_calls"] = [
                {"id": c.get("id") or f"call_{i}", "type": c.get("type") or "function",
                 "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                for i, c in enumerate(row["tool_calls"])
            ]
        else:
            row["tool_calls"] = None
        messages.append(row)
    tools = demo.get("tools") or []
    if isinstance(tools, str):
        tools = json.loads(tools)
    return {"messages": messages, "tools": json.dumps(list(tools), ensure_ascii=False)}


def to_sft_dataset(demonstrations: Sequence[dict[str, Any]]) -> Any:
    """``[{"messages": [...], "tools": [...]}, ...]`` -> ``datasets.Dataset`` with columns ``messages`` and ``tools``."""
    from datasets import Dataset

    rows = [_row(d) for d in demonstrations]
    # from_dict (not from_list) so an empty export still carries the schema.
    columns = {"messages": [r["messages"] for r in rows], "tools": [r["tools"] for r in rows]}
    return Dataset.from_dict(columns, features=sft_features())


@dataclass
class SFTSettings:
    epochs: float = 3.0
    lr: float = 1e-3
    batch_size: int = 8
    grad_accum: int = 1
    # None: the base checkpoint's context (max_position_embeddings), the most its rollouts can ever see. TRL keeps
    # the start of a longer sequence, so a cap below the context cuts the end of the longest demonstrations: their
    # last calls and final answer (at 2,048 tokens, 3 in 4 calendar demonstrations lost the booking itself).
    max_length: int | None = None
    max_steps: int = -1  # > 0 overrides epochs
    warmup: float = 0.05  # ratio of total steps if < 1, else steps
    weight_decay: float = 0.0
    lr_scheduler: str = "cosine"
    # None = auto: full fine-tune for our random-init student (it has nothing to preserve and is tiny),
    # LoRA for any other (pretrained) checkpoint.
    lora: bool | None = None
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    seed: int = 0
    device: str = "auto"
    logging_steps: int = 1
    # Batches of similar length: demonstrations vary 2-3x in length, and padding a batch to its longest member
    # is pure wasted compute on CPU (no padding-free kernels there).
    sampling: str = "group_by_length"  # or "random"
    # None = auto. The random-init student learns language from the demonstrations themselves, so it is trained on
    # every token (tool results and requests are most of its corpus); a pretrained checkpoint learns only the
    # assistant turns.
    assistant_only_loss: bool | None = None
    # Weight of assistant tokens relative to the others when the loss covers every token (pointer student only:
    # its loss is ours; TRL's fused loss has no per-token weights). The assistant turns are ~13% of a
    # demonstration's tokens but all of what is graded.
    assistant_loss_weight: float = 1.0
    # Pointer student only: argument names (JSON keys in tool calls) are trained through the vocabulary head and
    # the gate (the model learns not to point there), instead of through the mixture, where copying an earlier
    # call's first key made the student skip the arguments a request needs (measured: held-out pass 0.071 ->
    # 0.143, score 0.153 -> 0.263).
    keys_from_vocab: bool = True


@dataclass
class SFTResult:
    checkpoint: Path
    loss_curve: list[dict[str, float]] = field(default_factory=list)
    train_tokens: int = 0
    tokens_per_second: float = 0.0
    device: str = "cpu"
    lora: bool = False
    steps: int = 0
    train_runtime_s: float = 0.0
    max_length: int | None = None
    # Demonstrations as long as the cap after TRL's preparation (their end cut off, or exactly that long).
    truncated: int = 0


def ensure_chat_tokens(tokenizer: Any, model: Any) -> list[int]:
    """Make a foreign (pretrained) tokenizer able to speak our template; returns the ids of added tokens.

    Only the turn-control tokens must exist as single tokens (``<|im_end|>`` is the stop token). Markup tags
    (``<tool_call>``, ``<tools>``, ...) are not added: they tokenize fine as text and parsing is text-based, while
    every added token needs trainable embedding rows (Qwen tokenizers already have all control tokens, so for
    them nothing is added and plain LoRA suffices)."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in CONTROL_TOKENS if t not in vocab]
    if missing:
        from tokenizers import AddedToken

        tokenizer.add_special_tokens(
            {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in missing]},
            False,  # extend, do not replace, existing extra special tokens (positional: renamed across versions)
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = END_OF_TEXT
    added = [tokenizer.convert_tokens_to_ids(t) for t in missing]
    if added and len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    return added


def _loss_recorder(curve: list[dict[str, float]], on_log: Callable[[dict[str, float]], None] | None) -> Any:
    """A TrainerCallback that appends {step, loss, epoch} to ``curve`` (and forwards it to ``on_log``)."""
    from transformers import TrainerCallback

    class LossRecorder(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:
                entry = {"step": int(state.global_step), "loss": float(logs["loss"]),
                         "epoch": float(logs.get("epoch", state.epoch or 0.0))}
                curve.append(entry)
                if on_log is not None:
                    on_log(entry)

    return LossRecorder()


def json_key_mask(ids: Sequence[int], pieces: Sequence[str], open_id: int, close_id: int) -> list[bool]:
    """True for the tokens that spell an object key of the JSON inside ``<tool_call>`` ... ``</tool_call>``
    (argument names, and the call's own "name"/"arguments"). A small JSON scanner over the tokens' text."""
    out = [False] * len(ids)
    inside = in_str = esc = is_key = expect_key = False
    stack: list[str] = []
    for i, t in enumerate(ids):
        if t == open_id:
            inside, in_str, esc, is_key, expect_key, stack = True, False, False, False, False, []
            continue
        if t == close_id or not inside:
            inside = inside and t != close_id
            continue
        for ch in pieces[t] if 0 <= t < len(pieces) else "":
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
                    continue
                out[i] = out[i] or is_key
            elif ch == '"':
                in_str, is_key, expect_key = True, expect_key, False
            elif ch == "{":
                stack.append(ch)
                expect_key = True
            elif ch == "[":
                stack.append(ch)
            elif ch in "}]":
                if stack:
                    stack.pop()
            elif ch == ",":
                expect_key = bool(stack) and stack[-1] == "{"
    return out


def _trainer_class(model: Any, settings: SFTSettings) -> Any:
    """SFTTrainer, or for the pointer student a subclass whose loss is the model's own.

    TRL computes the loss from the backbone's hidden states through the LM head alone (its fused head), which
    would train the pointer student as a plain LM and leave the copy head untrained."""
    import torch
    from trl import SFTTrainer

    from cowork_pipeline.training.pointer import PointerQwen3ForCausalLM

    if not isinstance(model, PointerQwen3ForCausalLM):
        return SFTTrainer

    other_weight = 0.0 if settings.assistant_only_loss else 1.0

    class PointerSFTTrainer(SFTTrainer):
        _key_scan: tuple[list[str], int, int] | None = None  # (text of every token id, <tool_call>, </tool_call>)

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            kw = {k: inputs[k] for k in ("input_ids", "attention_mask", "position_ids") if k in inputs}
            if getattr(model.config, "_attn_implementation", None) == CAUSAL_SDPA and _padded_at_the_end(kw.get("attention_mask")):
                # A causal model's real tokens never see the padding after them, so without the mask they compute
                # the same to the bit (their loss and every gradient), while attention runs its causal kernel,
                # which skips the blocks above the diagonal: about twice as fast on CPU. The pointer only reads
                # sources at or before its query, so it needs no mask either.
                del kw["attention_mask"]
                kw["expand_kv_heads"] = True
            # TRL labelled the assistant tokens only (its assistant mask, always requested for this model):
            # every real token gets its label back, weighted by whose it is, and the pointer is trained on the
            # assistant's tokens.
            assistant = inputs["labels"] != -100
            real = inputs["attention_mask"].bool() if "attention_mask" in inputs else torch.ones_like(assistant)
            weights = torch.where(assistant, settings.assistant_loss_weight, other_weight) * real
            labels = inputs["input_ids"].masked_fill(~real, -100)
            extra = {}
            if settings.keys_from_vocab:
                if self._key_scan is None:
                    tok = self.processing_class
                    self._key_scan = ([tok.decode([i]) for i in range(len(tok))],
                                      tok.convert_tokens_to_ids(TOOL_CALL_OPEN), tok.convert_tokens_to_ids(TOOL_CALL_CLOSE))
                keys = torch.tensor([json_key_mask(row, *self._key_scan) for row in inputs["input_ids"].tolist()],
                                    device=assistant.device)
                extra["vocab_path_mask"] = keys & assistant
            outputs = model(**kw, labels=labels, label_weights=weights, pointer_mask=assistant, use_cache=False, **extra)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    return PointerSFTTrainer


CAUSAL_SDPA = "cowork_causal_sdpa"


def _causal_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *, expand_kv_heads: bool = False,
                 **kwargs: Any) -> Any:
    """transformers' SDPA attention, except that a call whose mask the trainer left out gets its key/value heads
    expanded to the query heads here, as the masked call would have. Left to itself, transformers lets the kernel
    group the heads of a call without a mask, and the kernel sums their gradients in another order: the weights
    would drift from a masked run's in the last bits."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if expand_kv_heads and attention_mask is None and groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _causal_attention(model: Any) -> bool:
    """Switch a model running SDPA attention to ``_causal_sdpa`` for training; True if it was switched."""
    from transformers import AttentionInterface

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(CAUSAL_SDPA, _causal_sdpa)
    model.set_attn_implementation(CAUSAL_SDPA)
    return True


def _padded_at_the_end(attention_mask: Any) -> bool:
    """Whether a (B, T) mask has padding, and only at the end of its rows (each row ones, then zeros)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return False
    real = attention_mask.bool()
    return not bool(real.all()) and not bool((real[:, 1:] & ~real[:, :-1]).any())


def resolve_settings(settings: SFTSettings, *, student: bool) -> SFTSettings:
    """``settings`` with its automatic (None) choices made for a random-init student or a pretrained checkpoint."""
    return replace(settings,
                   lora=settings.lora if settings.lora is not None else not student,
                   assistant_only_loss=settings.assistant_only_loss if settings.assistant_only_loss is not None else not student)


def context_length(model: Any) -> int | None:
    """The number of positions ``model`` was built for (None if its config does not say)."""
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if n else None


def sft_config(out_dir: str | Path, settings: SFTSettings, device: str, *, lora: bool, pointer: bool = False) -> Any:
    """Our SFTConfig. CPU: fp32, no gradient checkpointing (TRL's defaults, bf16 autocast + checkpointing, are
    far slower on CPU), no reporting, no hub, no intermediate checkpoints."""
    import torch
    from trl import SFTConfig

    cuda = device.startswith("cuda")
    # Only worth its recompute cost when memory is the constraint: a pretrained model on GPU. transformers 5.x
    # renamed the flag (the old name still works but warns).
    checkpointing = bool(cuda and lora)
    ckpt_field = "activation_checkpointing" if "activation_checkpointing" in SFTConfig.__dataclass_fields__ \
        else "gradient_checkpointing"
    return SFTConfig(
        output_dir=str(out_dir),
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        learning_rate=settings.lr,
        lr_scheduler_type=settings.lr_scheduler,
        warmup_steps=settings.warmup,
        weight_decay=settings.weight_decay,
        max_length=settings.max_length,
        train_sampling_strategy=settings.sampling,
        # The pointer student's trainer always needs TRL's assistant mask to tell the assistant tokens apart; it
        # restores the other labels itself.
        assistant_only_loss=settings.assistant_only_loss is not False or pointer,
        packing=False,  # BFD packing needs padding-free FlashAttention; not available on CPU
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to="none",
        push_to_hub=False,
        seed=settings.seed,
        data_seed=settings.seed,
        bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        fp16=False,
        use_cpu=not cuda,
        **{ckpt_field: checkpointing},
        dataloader_num_workers=0,
        disable_tqdm=True,
        include_num_input_tokens_seen="non_padding",
    )


def train_sft(
    base_checkpoint: str | Path,
    dataset: Any,
    out_dir: str | Path,
    settings: SFTSettings | None = None,
    on_log: Callable[[dict[str, float]], None] | None = None,
) -> SFTResult:
    """Fine-tune ``base_checkpoint`` on ``dataset`` (a ``to_sft_dataset`` Dataset or a list of demonstrations)
    and save a plain, merged checkpoint (model + tokenizer with ``CHAT_TEMPLATE`` + generation config) to ``out_dir``."""
    import torch
    from trl import SFTTrainer

    from cowork_pipeline.agents.hf_agent import resolve_device

    settings = settings or SFTSettings()
    base = check_checkpoint(base_checkpoint)
    device = resolve_device(settings.device)
    student = is_student_checkpoint(base)
    settings = resolve_settings(settings, student=student)
    use_lora = bool(settings.lora)
    if not hasattr(dataset, "column_names"):
        dataset = to_sft_dataset(dataset)
    missing = {"messages", "tools"} - set(dataset.column_names)
    if missing:
        raise ValueError(f"SFT dataset lacks column(s) {sorted(missing)}; build it with to_sft_dataset()")

    torch.manual_seed(settings.seed)
    # LoRA on a pretrained model on GPU: keep the frozen base in bf16. Full fine-tunes keep fp32 master weights.
    dtype = torch.bfloat16 if (use_lora and device.startswith("cuda")) else torch.float32
    # Loaded before anything is written: a bad base raises CheckpointError naming it and leaves out_dir untouched.
    model, tokenizer = load_checkpoint(base, device="cpu", dtype=dtype)
    if settings.max_length is None:
        settings = replace(settings, max_length=context_length(model))
    tokenizer.chat_template = CHAT_TEMPLATE  # the one rendering, whatever the base shipped with
    added = ensure_chat_tokens(tokenizer, model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "_trainer"

    peft_config = None
    if use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=settings.lora_r,
            lora_alpha=settings.lora_alpha,
            lora_dropout=settings.lora_dropout,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        if added:
            # New control tokens need trainable embedding/output rows, or the model can never emit <|im_end|>.
            # (PEFT's trainable_token_indices would be lighter, but its lm_head wrapper breaks TRL 1.x's fused
            # LM-head loss: "TrainableTokensWrapper object has no attribute 'bias'".)
            peft_config.modules_to_save = ["embed_tokens", "lm_head"]
            # A base whose output layer is its input embedding (e.g. Llama 3.2 1B/3B) keeps one trainable copy for
            # both instead of two that drift apart: half these trainable parameters (a 128k x 2048 embedding: 525M
            # -> 263M), and the merged checkpoint stays tied (PEFT otherwise unties it on merging).
            out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
            peft_config.ensure_weight_tying = out_emb is not None and out_emb.weight is in_emb.weight

    curve: list[dict[str, float]] = []
    trainer_cls = _trainer_class(model, settings)
    # The pointer student's trainer leaves out the mask of a batch padded only at its end (its own loss).
    causal = trainer_cls is not SFTTrainer and _causal_attention(model)
    trainer = trainer_cls(
        model=model,
        args=sft_config(work, settings, device, lora=use_lora, pointer=trainer_cls is not SFTTrainer),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_loss_recorder(curve, on_log)],
    )
    from transformers.trainer_callback import PrinterCallback

    truncated = sum(1 for ids in trainer.train_dataset["input_ids"] if len(ids) >= settings.max_length) \
        if settings.max_length else 0
    trainer.remove_callback(PrinterCallback)  # disable_tqdm swaps in a stdout printer; logs go to on_log instead
    started = time.perf_counter()
    output = trainer.train()
    runtime = float(output.metrics.get("train_runtime", time.perf_counter() - started))
    tokens = int(trainer.state.num_input_tokens_seen or 0)
    if tokens == 0:  # fallback: prepared sequence lengths x epochs
        tokens = int(sum(len(x) for x in trainer.train_dataset["input_ids"]) * max(1.0, settings.epochs))

    trained = trainer.model
    if causal:
        trained.set_attn_implementation("sdpa")
    if use_lora:
        trained = trained.merge_and_unload()  # plain checkpoint for HFAgent / the server / vLLM
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    eot = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    gen = trained.generation_config
    old_eos = gen.eos_token_id
    old_eos = old_eos if isinstance(old_eos, list) else ([old_eos] if old_eos is not None else [])
    gen.eos_token_id = list(dict.fromkeys([im_end, eot, *old_eos]))  # generate() stops at end of turn
    gen.pad_token_id = tokenizer.pad_token_id
    trained.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if not use_lora and (base / STUDENT_MARKER).is_file():
        shutil.copyfile(base / STUDENT_MARKER, out / STUDENT_MARKER)
    shutil.rmtree(work, ignore_errors=True)

    return SFTResult(
        checkpoint=out,
        loss_curve=curve,
        train_tokens=tokens,
        tokens_per_second=tokens / runtime if runtime > 0 else math.nan,
        device=device,
        lora=use_lora,
        steps=int(trainer.state.global_step),
        train_runtime_s=runtime,
        max_length=settings.max_length,
        truncated=truncated,
    )
