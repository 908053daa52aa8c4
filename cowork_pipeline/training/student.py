"""The embedded default student: a tiny Qwen3 with its own byte-level BPE tokenizer, built fully offline.

Nothing is downloaded: the tokenizer is trained on the caller's corpus plus our chat markup, and the model is a
randomly initialised ``Qwen3ForCausalLM`` (deterministic given ``StudentConfig.seed``). The output directory is a
plain Hugging Face checkpoint (``AutoModelForCausalLM`` / ``AutoTokenizer`` load it) carrying ``CHAT_TEMPLATE``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from cowork_pipeline.agents.chat_format import (
    CHAT_TEMPLATE,
    CONTROL_TOKENS,
    END_OF_TEXT,
    IM_END,
    IM_START,
    MARKUP_TOKENS,
    render_conversation,
)

# Written into every checkpoint built here (and kept by full fine-tunes of it): tells train_sft that this is the
# random-init student, which is fully fine-tuned rather than LoRA-adapted.
STUDENT_MARKER = "cowork_student.json"
# The space before a capitalised word (any script's uppercase letter), split off by the tokenizer's pre-tokenizer.
CAPITALISED_WORD_SPACE = r" (?=\p{Lu})"


@dataclass(frozen=True)
class StudentConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    min_frequency: int = 2
    seed: int = 0
    # Pointer-sentinel copy head (training/pointer.py); 0 = a plain Qwen3ForCausalLM.
    pointer_dim: int = 64


class CheckpointError(FileNotFoundError):
    """A path that should be a model checkpoint directory is not one."""


# --- Tokenizer ------------------------------------------------------------------------------------------------
_SAMPLE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} if t != "array" else {"type": "array", "items": {"type": "string"}}
                               for p, t in props},
                "required": [p for p, _ in props[:1]],
            },
        },
    }
    for name, desc, props in [
        ("mail_send", "Send an email.", [("to", "array"), ("subject", "string"), ("body", "string"), ("cc", "array")]),
        ("mail_search", "Search the mailbox.", [("query", "string"), ("limit", "integer")]),
        ("calendar_create_event", "Create a calendar event.",
         [("title", "string"), ("start", "string"), ("end", "string"), ("attendees", "array")]),
        ("crm_update_record", "Update a CRM record.", [("record_id", "string"), ("fields", "object")]),
        ("helpdesk_reply_ticket", "Reply to a ticket.", [("ticket_id", "string"), ("message", "string")]),
        ("docs_create_document", "Create a document.", [("title", "string"), ("content", "string")]),
        ("chat_post_message", "Post a chat message.", [("channel", "string"), ("text", "string")]),
        ("tasks_create_task", "Create a task.", [("title", "string"), ("due_date", "string"), ("done", "boolean")]),
    ]
]


def markup_corpus() -> list[str]:
    """Rendered chat markup and tool schemas, so the tokenizer learns merges for our template and JSON."""
    convo = [
        {"role": "system", "content": "You are a helpful coworker agent."},
        {"role": "user", "content": "Please email the team about the launch."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "mail_send",
                        "arguments": json.dumps({"to": ["team@example.com"], "subject": "Launch", "body": "We launch today."}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": "mail_send", "content": '{"status": "sent", "id": "m_1"}'},
        {"role": "assistant", "content": "Done, the email was sent."},
    ]
    return [render_conversation(convo, _SAMPLE_TOOLS)]


def train_tokenizer(corpus: Iterable[str], vocab_size: int, out_dir: str | Path | None = None,
                    *, model_max_length: int = 4096, min_frequency: int = 2) -> Any:
    """Byte-level BPE with our control/markup tokens as single tokens; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = list(CONTROL_TOKENS) + list(MARKUP_TOKENS)
    tok = Tokenizer(models.BPE())
    # Digits are split one per token (as in Qwen/Llama): ids, amounts and dates then tokenize the same way in
    # every environment, so copying a value the student has never seen is the same skill as copying a seen one.
    # A space before a capitalised word is a token of its own, so the word is spelled the same in prose
    # ("for Priya Okafor": ` `, `Priya`) and at the start of a JSON value (`"Priya Okafor"`): the pointer can copy
    # a name from the request into a tool call. With ` Priya` vs `Priya` it could not, and the student wrote a
    # frequent first name instead (measured, teacher-forced: `query` right 52% -> 89%). Lowercase words keep their
    # space (splitting every word made free text degenerate).
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(CAPITALISED_WORD_SPACE), behavior="isolated"),
                                                 pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False: offsets must cover whitespace exactly for return_assistant_tokens_mask (as in Qwen).
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special,  # first ids, never merged
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk> ever
        show_progress=False,
    )
    tok.train_from_iterator(_strings(corpus), trainer=trainer)
    # Markup tags stay single tokens but are not "special": skip_special_tokens decoding keeps them (like Qwen).
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,  # end of an assistant turn is what generation must stop on
        pad_token=END_OF_TEXT,
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    if out_dir is not None:
        hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def _strings(corpus: Iterable[str]) -> Iterator[str]:
    for text in corpus:
        if isinstance(text, str) and text:
            yield text


# --- Model ----------------------------------------------------------------------------------------------------
def build_student(corpus: Iterable[str], out_dir: str | Path, config: StudentConfig | None = None) -> Path:
    """Train the tokenizer, randomly initialise a Qwen3 student and save both (+ generation config) to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = config or StudentConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Markup is repeated so that its merges win even against a large corpus.
    texts = list(_strings(corpus)) + markup_corpus() * 4
    tokenizer = train_tokenizer(
        texts, config.vocab_size, None, model_max_length=config.max_position_embeddings,
        min_frequency=config.min_frequency,
    )
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    eot = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    # Embedding rows rounded up to a multiple of 64 (tensor-core/cache friendly); extra rows are never produced
    # by the tokenizer.
    vocab = ((len(tokenizer) + 63) // 64) * 64
    from cowork_pipeline.training.pointer import PointerQwen3Config, PointerQwen3ForCausalLM

    config_cls, model_cls = (PointerQwen3Config, PointerQwen3ForCausalLM) if config.pointer_dim else (Qwen3Config, Qwen3ForCausalLM)
    extra = {}
    if config.pointer_dim:
        # <|im_start|>: the n-gram bonus skips the query's own turn. own_role_ids (never point into the model's
        # own turns) is left off: measured on 42 held-out environments it lowered teacher-forced exact calls
        # from 69 to 61 of 168.
        extra = {"pointer_dim": config.pointer_dim, "turn_token_id": tokenizer.convert_tokens_to_ids(IM_START)}
    model_config = config_cls(
        **extra,
        vocab_size=vocab,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=True,  # halves the parameter count of a tiny model
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    torch.manual_seed(config.seed)
    model = model_cls(model_config)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, eot], pad_token_id=eot, bos_token_id=None, do_sample=False, max_new_tokens=256
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / STUDENT_MARKER).write_text(json.dumps(asdict(config), indent=2, sort_keys=True))
    return out


# --- Loading --------------------------------------------------------------------------------------------------
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def check_checkpoint(path: str | Path) -> Path:
    """Validate that ``path`` is a loadable causal-LM checkpoint directory; raise ``CheckpointError`` naming what is missing."""
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {str(p)!r} is not a directory (expected a Hugging Face model directory)")
    missing: list[str] = []
    if not (p / "config.json").is_file():
        if (p / "adapter_config.json").is_file():
            raise CheckpointError(
                f"checkpoint {str(p)!r} is a LoRA adapter (adapter_config.json) without a base model; "
                "merge it into its base first (train_sft saves merged checkpoints)"
            )
        missing.append("config.json")
    if not any((p / f).is_file() for f in _WEIGHT_FILES):
        missing.append("model weights (one of " + ", ".join(_WEIGHT_FILES) + ")")
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json or tokenizer_config.json)")
    if missing:
        raise CheckpointError(f"checkpoint {str(p)!r} is not a model directory: missing " + "; ".join(missing))
    return p


def is_student_checkpoint(path: str | Path) -> bool:
    return (Path(path) / STUDENT_MARKER).is_file()


def load_checkpoint(path: str | Path, device: str = "cpu", dtype: Any = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a checkpoint directory, with a clear error if it is not one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import cowork_pipeline.training.pointer  # noqa: F401  (registers the pointer student with AutoModel)

    p = check_checkpoint(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p))
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {str(p)!r} could not be loaded: {exc}") from exc
    return model.to(device), tokenizer
