"""Checks of the Redis a worker is about to serve from, before it loads its model.

**Eviction.** genq keeps every accepted request in Redis until it is final, and its result
after. With ``maxmemory-policy noeviction`` a full Redis refuses writes, which genq rides out
(the worker holds its results and retries); with an ``allkeys-*`` policy Redis instead deletes
keys at random (work streams with their consumer group, results, the queue's config): accepted
requests vanish with no error. A worker refuses to start on ``allkeys-*`` unless
``--allow-evicting-redis`` says the operator knows; on ``volatile-*`` (which can evict results,
they have TTLs) it warns.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from genq.common.errors import ConfigError

log = logging.getLogger("genq.worker")


def eviction_policy(r: Any) -> str | None:
    """Redis' ``maxmemory-policy`` (on a cluster, the first that is not ``noeviction``), or
    None if this user may not read it (CONFIG and INFO both refused)."""
    try:
        reply = r.config_get("maxmemory-policy")
    except redis.ResponseError:
        try:
            info = r.info("memory")
        except redis.ResponseError:
            return None
        policies = [str(n.get("maxmemory_policy")) for n in _per_node(info)]
    else:
        policies = [str(n.get("maxmemory-policy")) for n in _per_node(reply)]
    return next((p for p in policies if p != "noeviction"), policies[0] if policies else None)


def _per_node(reply: dict[Any, Any]) -> list[dict[Any, Any]]:
    """One reply per node: a cluster client answers {node: reply}, a plain one the reply."""
    if reply and all(isinstance(v, dict) for v in reply.values()):
        return list(reply.values())
    return [reply]


def check_eviction(r: Any, *, allow: bool) -> None:
    """Raise ConfigError on an ``allkeys-*`` policy (unless ``allow``); warn on ``volatile-*``
    and when the policy cannot be read."""
    policy = eviction_policy(r)
    if policy is None:
        log.warning(
            "could not read Redis' maxmemory-policy (CONFIG GET and INFO refused to this user): "
            "make sure it is noeviction, or accepted requests can be evicted"
        )
    elif policy.startswith("allkeys-") and not allow:
        raise ConfigError(
            f"Redis' maxmemory-policy is {policy}: when memory runs out, Redis deletes keys at "
            "random, including work streams and results, and accepted requests vanish without "
            "an error. Set it to noeviction (CONFIG SET maxmemory-policy noeviction; genq rides "
            "out a full Redis), or start with --allow-evicting-redis true if you know why"
        )
    elif policy.startswith(("allkeys-", "volatile-")):
        log.warning(
            "Redis' maxmemory-policy is %s: when memory runs out Redis may evict %s. "
            "noeviction is safe: genq rides out a full Redis",
            policy,
            "any key, accepted requests included" if allow else "results (they have TTLs)",
        )
