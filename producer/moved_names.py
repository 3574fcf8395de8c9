"""Import paths that moved, kept working for one release (0.2 drops them).

The gateway's modules used to sit beside the client (``genq.producer.batches`` and five more);
they are ``genq.producer.gateway.*`` now, so that the client library holds only the client. An
import of an old path still works, gives the new module and warns once where it went.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    f"genq.producer.{name}": f"genq.producer.gateway.{name}"
    for name in (
        "batch_lines",
        "batches",
        "dead_letters",
        "responses",
        "structured_outputs",
        "webhook_letters",
    )
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module it moved to."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes in genq 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the moved one, already run."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
