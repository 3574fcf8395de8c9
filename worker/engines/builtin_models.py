"""The built-in tiny model: a small random-weight Llama with a byte-level tokenizer.

Built offline and deterministically (fixed seed, fixed config) the first time it is asked for,
then cached on disk, so tests and the demo need no download. Its output is gibberish, but it is
a real transformers causal LM: batching, padding, KV caches and sampling behave as with any model.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TINY_MODEL_NAME = "tiny"
#: Changing anything here changes the cache key, so old caches are never reused by mistake.
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 259,  # 3 special tokens + 256 bytes
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    # Wider than the usual 0.02 so the random model does not collapse into one repeated token.
    "initializer_range": 0.2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
#: Built-in models by name: ``tiny`` for tests and the demo, ``random-250m`` (258 M parameters,
#: random weights, same byte tokenizer) and ``random-1b`` to measure batching on a GPU at a
#: realistic step cost.
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    TINY_MODEL_NAME: TINY_CONFIG,
    "random-250m": {
        **TINY_CONFIG,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 20,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
    },
    # Llama-3.2-1B's shape (974 M parameters with the byte vocabulary): the GPU check's
    # bigger model, so a step costs what a 1 B model's does.
    "random-1b": {
        **TINY_CONFIG,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
    },
}
TINY_SEED = 1234
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
_FORMAT_VERSION = 2
#: The eos row of the output layer is scaled by this, so rows end on eos now and then (at
#: different points), but most run to their max_new_tokens.
EOS_LOGIT_SCALE = 0.8


def cache_dir() -> Path:
    """Where genq keeps built models: ``$GENQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/genq``, else
    ``~/.cache/genq``."""
    if os.environ.get("GENQ_CACHE_DIR"):
        return Path(os.environ["GENQ_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "genq"


def tiny_model_dir() -> Path:
    """The tiny model's directory, built on first use. Safe to call from several processes."""
    return builtin_model_dir(TINY_MODEL_NAME)


def builtin_model_dir(name: str) -> Path:
    """A built-in model's directory (see BUILTIN_CONFIGS), built on first use."""
    config = BUILTIN_CONFIGS[name]
    digest = hashlib.sha256(
        json.dumps([config, TINY_SEED, EOS_LOGIT_SCALE, _FORMAT_VERSION], sort_keys=True).encode()
    ).hexdigest()[:12]
    prefix = "tiny-llama" if name == TINY_MODEL_NAME else name
    target = cache_dir() / f"{prefix}-{digest}"
    return build_once(target, lambda path: build_tiny_model(path, config))


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, a model folder, built by ``build(path)`` unless it is there already. Built in
    a private folder and renamed into place, so a concurrent builder never sees a half-written
    model; the loser of a race just discards its copy."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        build(Path(tmp) / "model")
        try:
            os.rename(Path(tmp) / "model", target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    return target


def _byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(byte_chars)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        padding_side="left",
        model_max_length=TINY_CONFIG["max_position_embeddings"],
    )


def _byte_of(ch: str) -> int:
    # GPT-2's byte-to-unicode map: printable bytes map to themselves, others to 256 + n.
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {}
    n = 0
    for b in range(256):
        if b in printable:
            mapping[chr(b)] = b
        else:
            mapping[chr(256 + n)] = b
            n += 1
    return mapping[ch]


def build_tiny_model(path: Path, config_values: dict[str, Any] = TINY_CONFIG) -> None:
    """Write a random-weight Llama (the tiny one by default) and its tokenizer to ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    torch.manual_seed(TINY_SEED)
    config = LlamaConfig(**config_values)
    model = LlamaForCausalLM(config)
    tokenizer = _byte_tokenizer()
    # Only printable ASCII, newline and eos can win the argmax: output is readable gibberish.
    keep = [TINY_CONFIG["eos_token_id"]]
    for ch in [chr(c) for c in range(32, 127)] + ["\n"]:
        keep += tokenizer(ch, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        weight = model.lm_head.weight
        mask = torch.zeros(weight.shape[0], dtype=torch.bool)
        mask[keep] = True
        weight[~mask] = 0.0
        weight[TINY_CONFIG["eos_token_id"]] *= EOS_LOGIT_SCALE
    model.generation_config.pad_token_id = TINY_CONFIG["pad_token_id"]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
