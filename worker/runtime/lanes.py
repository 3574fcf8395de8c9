"""Which lanes a worker reads (``common/keys.py``: ``Keys.lane``): the lane of each name it
serves; but the queue's default model's requests wait in the unnamed lane, with those that
name no model, so its workers read that one instead (and their own lane only if it exists:
requests that named the model before it became the default).

The queue's default model is ``default_model`` in ``genq:{Q}:config``: the first worker to
start sets it to its served name (HSETNX), and so does a worker that starts while no live
worker serves the one recorded (the queue's model was replaced: its model-less requests would
wait for nobody), unless an operator set it with ``genq models default NAME`` (pinned). So
requests without a model are answered by one model only, whichever workers run: a worker of
another model never reads them. A worker looks at the default when it starts. A queue of one
model keeps the keys it always had: one lane, the unnamed one.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from genq.common.errors import ConfigError
from genq.common.keys import (
    DEFAULT_MODEL_FIELD,
    DEFAULT_PINNED_FIELD,
    GROUP,
    QUEUED,
    RETURNED,
    Keys,
    Lanes,
)
from genq.common.models import model_problem
from genq.common.wire import as_text

log = logging.getLogger("genq.worker")

TAKE_DEFAULT = f"""
-- KEYS: the queue's config; ARGV: the default model seen, this worker's
-- The worker's model becomes the default only if it is still the one seen (no other worker
-- took it meanwhile); returns the default now.
if redis.call('HGET', KEYS[1], '{DEFAULT_MODEL_FIELD}') == ARGV[1] then
  redis.call('HSET', KEYS[1], '{DEFAULT_MODEL_FIELD}', ARGV[2])
end
return redis.call('HGET', KEYS[1], '{DEFAULT_MODEL_FIELD}')
"""


def worker_lanes(r: Any, queue: str, served: list[str]) -> Lanes:
    """The lanes of a worker serving the names ``served`` (its model's first), making its
    model the queue's default if the queue has none. Raises ConfigError for a name that
    cannot be a model's (a local path with other characters: give --served-model-name)."""
    for name in served:
        problem = model_problem(name)
        if problem is not None:
            raise ConfigError(f"{problem}; name it with --served-model-name")
    keys = Keys(queue)
    pipe = r.pipeline(transaction=False)
    pipe.hsetnx(keys.config, DEFAULT_MODEL_FIELD, served[0])
    pipe.hmget(keys.config, DEFAULT_MODEL_FIELD, DEFAULT_PINNED_FIELD)
    pipe.sismember(keys.models, served[0])
    _, (default, pinned), named_before = pipe.execute()
    stale = default is not None and as_text(default) != served[0] and not pinned
    if stale and not _served_by_a_live_worker(r, keys, as_text(default)):
        default = r.eval(TAKE_DEFAULT, 1, keys.config, as_text(default), served[0])
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


def _served_by_a_live_worker(r: Any, keys: Keys, model: str) -> bool:
    """Whether a live worker serves ``model`` (its stats hash exists and names it): the
    default's workers are consumers of the unnamed lane."""
    try:
        consumers: Any = r.xinfo_consumers(keys.stream("normal"), GROUP)
    except redis.ResponseError:  # no stream or group yet
        return False
    names = [as_text(c["name"]) for c in consumers]
    pipe = r.pipeline(transaction=False)
    for name in names:
        if name not in (QUEUED, RETURNED):
            pipe.hmget(keys.worker(name), "model", "adapters")
    for served, adapters in pipe.execute():
        if served is not None and model in (as_text(served), *as_text(adapters or b"").split()):
            return True
    return False
