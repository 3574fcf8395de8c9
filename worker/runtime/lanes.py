"""Which lanes a worker reads (``common/keys.py``: ``Keys.lane``): the lane of each name it
serves; but the queue's default model's requests wait in the unnamed lane, with those that
name no model, so its workers read that one instead (and their own lane only if it exists:
requests that named the model before it became the default).

The queue's default model is ``default_model`` in ``genq:{Q}:config``: the first worker to
start sets it to its served name (HSETNX), and ``genq models default NAME`` changes it. So
requests without a model are answered by one model only, whichever workers run: a worker of
another model never reads them. A worker looks at the default when it starts. A queue of one
model keeps the keys it always had: one lane, the unnamed one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from genq.common.errors import ConfigError
from genq.common.keys import DEFAULT_MODEL_FIELD, Keys, Lanes
from genq.common.models import model_problem
from genq.common.wire import as_text

log = logging.getLogger("genq.worker")


def worker_lanes(r: Any, queue: str, served: list[str], adapters: Sequence[str] = ()) -> Lanes:
    """The lanes of a worker serving the names ``served`` (its model's first), making its
    model the queue's default if the queue has none, and naming its LoRA ``adapters`` (among
    ``served``) in the queue's set of them (``Keys.adapters``: their entries are keyed by
    adapter, for the read's affinity). Raises ConfigError for a name that cannot be a
    model's (a local path with other characters: give --served-model-name)."""
    for name in served:
        problem = model_problem(name)
        if problem is not None:
            raise ConfigError(f"{problem}; name it with --served-model-name")
    keys = Keys(queue)
    pipe = r.pipeline(transaction=False)
    pipe.hsetnx(keys.config, DEFAULT_MODEL_FIELD, served[0])
    pipe.hget(keys.config, DEFAULT_MODEL_FIELD)
    pipe.sismember(keys.models, served[0])
    if adapters:
        pipe.sadd(keys.adapters, *adapters)
    default, named_before = pipe.execute()[1:3]
    models: list[str | None] = list(served)
    if default is not None and as_text(default) == served[0]:
        models = [None, *served[1:]]  # its requests wait in the unnamed lane
        if named_before:
            models.append(served[0])
    else:
        log.info(
            "requests that name no model go to %s (the queue's default model), not to this worker",
            as_text(default) if default is not None else "-",
        )
    return Lanes(queue, models)
