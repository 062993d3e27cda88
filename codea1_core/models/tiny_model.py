"""Random-init Qwen2-architecture models for CPU runs, tests and benchmarks; nothing is downloaded.

What it does:

* :func:`build_tiny_model` trains a byte-level BPE tokenizer on a local text corpus (``tokenizers``), with
  Qwen's special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and the Qwen2.5 chat template,
  and saves it beside a small random-init ``Qwen2ForCausalLM`` as a normal HF model directory, loadable by
  ``AutoModelForCausalLM`` / ``AutoTokenizer``. The chat code path of :mod:`codea1_core.models.policy` is
  therefore the same one a real Qwen2.5-Coder-Instruct takes.
* :func:`random_init_like` writes a random-init model with Qwen2.5-Coder-1.5B's shape (config written in
  code, hub name only as a label) for the rollout bench and the GPU tests.

What it does not: pretrain anything (the lab's warm start does that through :mod:`codea1_core.models.sft`).

Run: ``python -c "from codea1_core.models.tiny_model import build_tiny_model; build_tiny_model('/tmp/tiny',
['def f(): pass'])"``
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from codea1_core.atomic import atomic_dir

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen-style special tokens, in the order they get the lowest ids after the byte alphabet."""

# The Qwen2.5-Instruct chat template without the tool branches (a tiny model has no tools), and a neutral
# default system prompt; rendering is token-for-token the Qwen layout.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

QWEN25_CODER_1P5B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
    "use_sliding_window": False,
}
"""Shape of Qwen/Qwen2.5-Coder-1.5B-Instruct (its published ``config.json``), written here, not downloaded."""

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-Coder-1.5B-Instruct": QWEN25_CODER_1P5B_CONFIG,
    "Qwen/Qwen2.5-Coder-1.5B": QWEN25_CODER_1P5B_CONFIG,
}


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 2048) -> Any:
    """Train a byte-level BPE tokenizer with Qwen special tokens and chat template.

    Args:
        corpus: Training texts (any iterable of strings; a generator is fine).
        vocab_size: Target vocabulary size including the 256 byte symbols and the special tokens.

    Returns:
        A ``PreTrainedTokenizerFast`` (``eos_token`` = ``<|im_end|>``, ``pad_token`` = ``<|endoftext|>``).

    Raises:
        ValueError: If the corpus is empty or ``vocab_size`` cannot hold the byte alphabet.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_base = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_base:
        raise ValueError(f"vocab_size: must be >= {n_base} (bytes + special tokens), got {vocab_size}")
    texts = [t for t in corpus if isinstance(t, str) and t]
    if not texts:
        raise ValueError("corpus: no non-empty strings to train the tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = QWEN_CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    out_dir: str | Path,
    corpus: Iterable[str],
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 256,
    vocab_size: int = 2048,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a random-init tiny Qwen2 model and a locally trained tokenizer to ``out_dir``.

    Args:
        out_dir: Target model directory (written atomically via ``.<out_dir>.tmp``).
        corpus: Texts for the BPE tokenizer (problem statements, code, tests).
        hidden_size: Model width.
        num_layers: Decoder layers.
        num_heads: Attention heads (also key/value heads).
        intermediate_size: MLP width.
        vocab_size: Tokenizer vocabulary target; the model's embedding matches the trained vocabulary.
        max_position_embeddings: Context length.
        seed: Seed of the weight initialisation.

    Returns:
        The model directory.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    tokenizer = train_tokenizer(corpus, vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id
    )

    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)


def random_init_like(
    config_name_or_dict: str | dict[str, Any],
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    seed: int = 0,
    dtype: str = "bfloat16",
) -> Path:
    """Write a random-init Qwen2 model with a known shape (no download) to ``out_dir``.

    Args:
        config_name_or_dict: A key of :data:`KNOWN_CONFIGS` (e.g. ``"Qwen/Qwen2.5-Coder-1.5B-Instruct"``) or a
            ``Qwen2Config`` keyword dict.
        out_dir: Target model directory (written atomically).
        tokenizer_dir: Optional tokenizer to save beside the model (e.g. a tiny model's). Its ids must fit the
            model's vocabulary; without one, callers feed token ids directly.
        seed: Seed of the weight initialisation.
        dtype: Stored weights dtype (``bfloat16`` halves the 1.5B model's 6 GB float32 size).

    Returns:
        The model directory.
    """
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if isinstance(config_name_or_dict, str):
        if config_name_or_dict not in KNOWN_CONFIGS:
            raise ValueError(f"config {config_name_or_dict!r}: unknown (known: {', '.join(KNOWN_CONFIGS)})")
        raw = dict(KNOWN_CONFIGS[config_name_or_dict])
    else:
        raw = dict(config_name_or_dict)
    raw.pop("architectures", None)
    raw.pop("model_type", None)
    config = Qwen2Config(**raw)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir)) if tokenizer_dir else None
    if tokenizer is not None and len(tokenizer) > config.vocab_size:
        raise ValueError(f"tokenizer_dir: {len(tokenizer)} tokens do not fit vocab_size {config.vocab_size}")
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(
        getattr(torch, dtype)
    )  # initialise directly in the stored dtype (half the peak RAM)
    try:
        model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)

    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(out_dir)
