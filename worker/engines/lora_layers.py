"""LoRA on a transformers model, batched per row, without PEFT at run time.

Each Linear that some adapter adapts becomes a ``LoraLinear``: the base layer, plus stacks of
the resident adapters' LoRA matrices, one slot each (slot 0: all zeros, the base model). For a
batch, every row is given its adapter's slot (``SlotTable.rows``), and a forward adds
``x A[slot] B[slot]`` row by row: two batched matrix products a layer, whatever the number of
adapters in the batch, where PEFT's mixed batch runs each adapter's rows apart in every layer
(its Python loop was most of a mixed batch's cost on a CPU: BENCHMARKS.md). A row of the
base model adds exactly zero. Each row's product is its own (``torch.bmm``), the same
whether the row runs alone or among others.

What is read is PEFT's own format (``adapter_config.json``, ``adapter_model.safetensors``):
``lora_A`` and ``lora_B`` of each adapted Linear, scaled by ``lora_alpha / r`` (``/ sqrt(r)``
with ``use_rslora``). What this does not run (DoRA, per-module rank or alpha patterns, trained
``modules_to_save``, LoRA biases, embedding or convolution adapters) stops the worker at start
with one line naming it.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any

from genq.common.errors import ConfigError

PREFIX = "base_model.model."
"""What PEFT puts before a module's name in an adapter's weight names."""


def _torch() -> Any:
    import torch

    return torch


def read_adapter(name: str, path: str) -> dict[str, tuple[Any, Any]]:
    """An adapter's LoRA matrices by the name of the module they adapt: ``(A, B)`` with
    ``A`` of shape (in, r) and ``B`` of (r, out), its scale folded into ``B``. Raises
    ConfigError (one line) for what this module does not run."""
    with open(os.path.join(path, "adapter_config.json")) as f:
        config = json.load(f)
    unsupported = [
        what
        for what, used in (
            ("DoRA (use_dora)", config.get("use_dora")),
            ("fan_in_fan_out", config.get("fan_in_fan_out")),
            ("rank_pattern", config.get("rank_pattern")),
            ("alpha_pattern", config.get("alpha_pattern")),
            ("modules_to_save", config.get("modules_to_save")),
            (f"bias={config.get('bias')!r}", config.get("bias", "none") != "none"),
        )
        if used
    ]
    if unsupported:
        raise ConfigError(f"adapter {name!r} ({path}) uses {', '.join(unsupported)}: unsupported")
    rank = int(config.get("r") or 8)
    alpha = float(config.get("lora_alpha") or rank)
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    tensors = _weights(path)
    pairs: dict[str, dict[str, Any]] = {}
    for key, t in tensors.items():
        module, _, part = key.removeprefix(PREFIX).rpartition(".lora_")
        if part not in ("A.weight", "B.weight"):
            raise ConfigError(f"adapter {name!r} ({path}): weight {key!r} is not a LoRA A or B")
        pairs.setdefault(module, {})[part[0]] = t
    out: dict[str, tuple[Any, Any]] = {}
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise ConfigError(f"adapter {name!r} ({path}): {module} lacks lora_A or lora_B")
        a, b = ab["A"].float(), ab["B"].float()  # (r, in), (out, r)
        out[module] = (a.t().contiguous(), (b * scale).t().contiguous())
    if not out:
        raise ConfigError(f"adapter {name!r} ({path}) holds no LoRA weights")
    return out


def _weights(path: str) -> dict[str, Any]:
    safetensors = os.path.join(path, "adapter_model.safetensors")
    if os.path.isfile(safetensors):
        from safetensors.torch import load_file

        return dict(load_file(safetensors))
    loaded: dict[str, Any] = _torch().load(
        os.path.join(path, "adapter_model.bin"), map_location="cpu", weights_only=True
    )
    return loaded


class SlotTable:
    """The adapter slot of each row of the batch being run, shared by every ``LoraLinear``
    of a model: None while no row runs through an adapter."""

    def __init__(self) -> None:
        self.slots: Any = None


@functools.cache
def _layer_class() -> Any:
    """``LoraLinear``'s class, made once (torch is imported only when adapters are used)."""
    torch = _torch()

    class LoraLinear(torch.nn.Module):  # type: ignore[misc,name-defined]
        """An adapted Linear: the base layer, and per slot an adapter's ``A`` and ``B``."""

        def __init__(self, base: Any, table: SlotTable, slots: int, rank: int) -> None:
            super().__init__()
            self.base = base
            self.table = table
            w = base.weight
            shape_a, shape_b = (slots, w.shape[1], rank), (slots, rank, w.shape[0])
            self.register_buffer("lora_a", torch.zeros(shape_a, dtype=w.dtype, device=w.device))
            self.register_buffer("lora_b", torch.zeros(shape_b, dtype=w.dtype, device=w.device))

        def forward(self, x: Any) -> Any:
            y = self.base(x)
            rows = self.table.slots
            if rows is None:
                return y
            a, b = self.lora_a.index_select(0, rows), self.lora_b.index_select(0, rows)
            h = x.reshape(rows.shape[0], -1, x.shape[-1])
            return y + torch.bmm(torch.bmm(h, a), b).reshape(y.shape)

    return LoraLinear


def wrap(model: Any, modules: set[str], table: SlotTable, slots: int, rank: int) -> dict[str, Any]:
    """Replace each Linear named in ``modules`` with a ``LoraLinear`` of ``slots`` slots of
    rank ``rank``; the new layers by name. Raises ConfigError naming a module that is not
    in the model or not a Linear."""
    torch = _torch()
    layers: dict[str, Any] = {}
    for name in sorted(modules):
        try:
            base = model.get_submodule(name)
        except AttributeError:
            raise ConfigError(f"the model has no module {name!r} to adapt") from None
        if not isinstance(base, torch.nn.Linear):
            raise ConfigError(f"module {name!r} is a {type(base).__name__}, not a Linear")
        parent, _, child = name.rpartition(".")
        layer = _layer_class()(base, table, slots, rank)
        setattr(model.get_submodule(parent) if parent else model, child, layer)
        layers[name] = layer
    return layers


def check_shapes(name: str, weights: dict[str, tuple[Any, Any]], layers: dict[str, Any]) -> None:
    """Raise ConfigError if an adapter's matrices do not fit the layers they adapt (an
    adapter made for another model)."""
    for module, (a, b) in weights.items():
        w = layers[module].base.weight
        if a.shape[0] != w.shape[1] or b.shape[1] != w.shape[0]:
            raise ConfigError(
                f"adapter {name!r} does not fit this model: {module} is {w.shape[1]} -> "
                f"{w.shape[0]}, the adapter's {a.shape[0]} -> {b.shape[1]}"
            )


def fill(layers: dict[str, Any], slot: int, weights: dict[str, tuple[Any, Any]] | None) -> None:
    """Put an adapter's matrices in ``slot`` of every layer (zeros where it adapts nothing;
    ``weights`` None: empty the slot)."""
    for module, layer in layers.items():
        layer.lora_a[slot].zero_()
        layer.lora_b[slot].zero_()
        if weights is not None and module in weights:
            a, b = weights[module]
            r = a.shape[1]
            layer.lora_a[slot, :, :r].copy_(a)
            layer.lora_b[slot, :r, :].copy_(b)
