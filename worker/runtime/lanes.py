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
    """The lanes of a worker serving the names ``served`` (its model's first: the queue's
    default if the queue has none; a pool's models after it), naming its LoRA ``adapters``
    (among ``served``) in the queue's set of them (``Keys.adapters``: their entries are keyed by
    adapter, for the read's affinity). The queue's default model, if served, reads the unnamed
    lane (and its own, if requests named it before it became the default). Raises
    ConfigError for a name that cannot be a model's (a local path with other characters: give
    --served-model-name)."""
    for name in served:
        problem = model_problem(name)
        if problem is not None:
            raise ConfigError(f"{problem}; name it with --served-model-name")
    keys = Keys(queue)
    pipe = r.pipeline(transaction=False)
    pipe.hsetnx(keys.config, DEFAULT_MODEL_FIELD, served[0])
    pipe.hget(keys.config, DEFAULT_MODEL_FIELD)
    for name in served:
        pipe.sismember(keys.models, name)
    if adapters:
        pipe.sadd(keys.adapters, *adapters)
    replies = pipe.execute()
    default = None if replies[1] is None else as_text(replies[1])
    named_before = dict(zip(served, replies[2 : 2 + len(served)], strict=True))
    models: list[str | None] = []
    for name in served:
        if name != default:
            models.append(name)
            continue
        models.insert(0, None)  # its requests wait in the unnamed lane
        if named_before[name]:
            models.append(name)
    if default not in served:
        log.info(
            "requests that name no model go to %s (the queue's default model), not to this worker",
            default or "-",
        )
    return Lanes(queue, models)


def default_served(r: Any, keys: Lanes, served: Sequence[str]) -> str:
    """Which of ``served`` answers the requests that name no model: the queue's default, when
    the worker reads the unnamed lane; else its first (none such reach it)."""
    if len(served) == 1 or None not in {k.model for k in keys.lanes()}:
        return served[0]
    default = r.hget(keys.config, DEFAULT_MODEL_FIELD)
    name = None if default is None else as_text(default)
    return name if name is not None and name in served else served[0]
