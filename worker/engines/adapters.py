"""LoRA adapters on a transformers model (``--lora NAME=PATH``, ``--max-loras N``).

The model's adapted layers hold up to ``max_loras`` adapters at once, one slot each
(``lora_layers``: PEFT's files, run per row without PEFT); one ``generate`` call runs rows of
different adapters and of the base model together, each through its own (``rows``). An
adapter a batch needs that is not resident is loaded into a slot, and the least recently used
one not in the batch goes (``loads`` counts them). A batch that needs more adapters than fit
at once runs in parts, each within ``max_loras`` (``parts``).

Every adapter is loaded once at start, so a missing file, a broken one or one made for another
model stops the worker with one line (``ConfigError``), not the first request that names it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from genq.common.errors import ConfigError
from genq.worker.engines import lora_layers
from genq.worker.engines.base import BatchReport, GenerationInput

BASE = "__base__"
"""The name of the all-zero adapter the base model's rows run through on vLLM's CPU build
(``zero_adapter``)."""


def adapter_base(path: str) -> str | None:
    """The base model an adapter directory says it was made for (``base_model_name_or_path``
    in its ``adapter_config.json``), or None."""
    with open(os.path.join(path, "adapter_config.json")) as f:
        base = json.load(f).get("base_model_name_or_path")
    return base if isinstance(base, str) and base else None


def adapter_rank(path: str) -> int:
    """An adapter's LoRA rank (``r`` in its ``adapter_config.json``)."""
    with open(os.path.join(path, "adapter_config.json")) as f:
        return int(json.load(f).get("r") or 8)


def check_adapter(name: str, path: str, base_names: Sequence[str]) -> None:
    """Raise ConfigError (one line) if the adapter at ``path`` says it was made for another
    model than ``base_names`` (the worker's ``--model`` and its directory), or its weights
    cannot be read (what the vLLM engine checks at start; the transformers engines also load
    each adapter once)."""
    try:
        base = adapter_base(path)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"adapter {name!r} ({path}): unreadable adapter_config.json: {err}"
        ) from None
    if base is not None and not any(same_model(base, b) for b in base_names):
        raise ConfigError(
            f"adapter {name!r} ({path}) was made for {base!r}, not this worker's model "
            f"({base_names[0]})"
        )
    weights = os.path.join(path, "adapter_model.safetensors")
    if os.path.isfile(weights):
        from safetensors import safe_open

        try:
            with safe_open(weights, framework="np") as f:
                list(f.keys())
        except Exception as err:
            raise ConfigError(f"adapter {name!r}: unreadable weights {weights}: {err}") from None
    elif not os.path.isfile(os.path.join(path, "adapter_model.bin")):
        raise ConfigError(f"adapter {name!r} ({path}): no adapter_model.safetensors nor .bin")


def same_model(a: str, b: str) -> bool:
    """Whether two names of a model (a genq name, a directory, a hub id) may be the same
    model: equal, or the same last path part (a hub id and its local copy)."""
    return a == b or os.path.basename(a.rstrip("/")) == os.path.basename(b.rstrip("/"))


class Adapters:
    """A model's LoRA adapters, resident up to ``max_loras`` at once (least recently used
    goes), run per row by ``lora_layers``."""

    def __init__(
        self, model: Any, adapters: Mapping[str, str], *, max_loras: int, base_names: Sequence[str]
    ) -> None:
        """Adapt ``model`` in place (reads every adapter once to check it; raises ConfigError
        naming what is wrong). ``base_names``: the names the worker's model goes by
        (``--model`` and its directory), which an adapter's recorded base must be one of."""
        if not adapters:
            raise ConfigError("no adapters given")
        self.paths = dict(adapters)
        self.max_loras = max_loras or len(self.paths)
        self.loads = 0
        """Adapters loaded on demand since the start (swaps)."""
        self.parts = 0
        """Batches run in parts because they needed more adapters than fit at once."""
        self._weights: dict[str, dict[str, tuple[Any, Any]]] = {}
        for name, path in self.paths.items():
            check_adapter(name, path, base_names)
            try:
                self._weights[name] = lora_layers.read_adapter(name, path)
            except (OSError, ValueError, RuntimeError) as err:
                why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
                raise ConfigError(f"cannot read adapter {name!r} ({path}): {why}") from None
        modules = {m for w in self._weights.values() for m in w}
        rank = max(a.shape[1] for w in self._weights.values() for a, _ in w.values())
        self.table = lora_layers.SlotTable()
        self._layers = lora_layers.wrap(model, modules, self.table, self.max_loras + 1, rank)
        for name, weights in self._weights.items():
            try:
                lora_layers.check_shapes(name, weights, self._layers)
            except ConfigError as err:
                raise ConfigError(f"{err} ({self.paths[name]})") from None
        self.model = model.eval()
        self._slot: OrderedDict[str, int] = OrderedDict()  # resident adapter -> its slot
        for name in list(self.paths)[: self.max_loras]:
            self._load(name, len(self._slot) + 1)

    def _load(self, name: str, slot: int) -> None:
        lora_layers.fill(self._layers, slot, self._weights[name])
        self._slot[name] = slot

    @property
    def resident(self) -> list[str]:
        """The adapters loaded now, the least recently used first."""
        return list(self._slot)

    def ensure(self, names: set[str]) -> None:
        """Make ``names`` (at most ``max_loras``) resident, most recently used."""
        for name in names:
            if name in self._slot:
                self._slot.move_to_end(name)
        for name in sorted(names - set(self._slot)):
            free = set(range(1, self.max_loras + 1)) - set(self._slot.values())
            if not free:
                old = next(a for a in self._slot if a not in names)
                free = {self._slot.pop(old)}
            self._load(name, min(free))
            self.loads += 1

    def adapter_of(self, row: GenerationInput) -> str | None:
        """The adapter a row runs through (None: the base model)."""
        return row.adapter if row.adapter in self.paths else None

    @contextlib.contextmanager
    def rows(self, batch: Sequence[GenerationInput], device: str) -> Iterator[None]:
        """Run each row of ``batch`` (resident adapters: ``ensure``) through its adapter
        while in this block."""
        slots = [self._slot[a] if a else 0 for a in map(self.adapter_of, batch)]
        if any(slots):
            import torch

            self.table.slots = torch.tensor(slots, dtype=torch.long, device=device)
        try:
            yield
        finally:
            self.table.slots = None

    def parts_of(self, adapters: Sequence[str | None]) -> list[list[int]]:
        """The rows of a batch (each row's adapter, None: the base) in parts that each need at
        most ``max_loras`` adapters: one part when they fit, the resident ones' rows first."""
        needed = list(dict.fromkeys(a for a in adapters if a is not None))
        if len(needed) <= self.max_loras:
            return [list(range(len(adapters)))]
        self.parts += 1
        needed.sort(key=lambda a: a not in self._slot)
        groups = [
            set(needed[i : i + self.max_loras]) for i in range(0, len(needed), self.max_loras)
        ]
        out = [[i for i, a in enumerate(adapters) if a is None or a in groups[0]]]
        for g in groups[1:]:
            out.append([i for i, a in enumerate(adapters) if a in g])
        return out


def in_parts(
    run: Callable[[Sequence[GenerationInput]], BatchReport],
    batch: Sequence[GenerationInput],
    adapters: Adapters,
) -> BatchReport:
    """``run`` over the batch with its adapters resident: in one call, or part by part
    (``parts_of``) with the outputs put back in the batch's order and the costs added."""
    parts = adapters.parts_of([adapters.adapter_of(r) for r in batch])
    if len(parts) == 1:
        adapters.ensure({a for a in map(adapters.adapter_of, batch) if a is not None})
        return run(batch)
    outputs: list[Any] = [None] * len(batch)
    errors: dict[int, str] = {}
    prompt = padded = slots = 0
    for part in parts:
        rows = [batch[i] for i in part]
        adapters.ensure({a for a in map(adapters.adapter_of, rows) if a is not None})
        report = run(rows)
        for i, out in zip(part, report.outputs, strict=True):
            outputs[i] = out
        errors.update({part[j]: why for j, why in report.errors.items()})
        prompt += report.prompt_tokens
        padded += report.padded_prompt_tokens
        slots += report.decode_slots
    return BatchReport(
        outputs=outputs,
        prompt_tokens=prompt,
        padded_prompt_tokens=padded,
        decode_slots=slots,
        errors=errors,
    )


def zero_adapter(like: str, into: str) -> str:
    """Write to ``into`` an adapter shaped as the one at ``like`` whose every LoRA B weight is
    zero: it changes nothing (x + x A B with B = 0 is x, exactly). vLLM's CPU kernels give a
    row with no adapter the last adapter slot's weights (vLLM #48421 and vLLM #49656: index -1
    aliases it), so there the base model's rows run through this one instead."""
    import shutil

    from safetensors.numpy import load_file, save_file

    os.makedirs(into, exist_ok=True)
    shutil.copy(os.path.join(like, "adapter_config.json"), into)
    tensors = load_file(os.path.join(like, "adapter_model.safetensors"))
    for name, t in tensors.items():
        if "lora_B" in name:
            t[...] = 0
    save_file(tensors, os.path.join(into, "adapter_model.safetensors"))
    return into
