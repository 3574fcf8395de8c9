"""Shared pieces of genq: request/result models, settings, the Redis key layout, errors, and
Redis' side: every Lua script, in the ``lua`` package.

Nothing here imports torch or transformers; the client library and the worker both use it.

=================  =========================================================================
module             what it holds
=================  =========================================================================
``models``         ``Request`` / ``Result`` (pydantic, strict), the wire limits, priorities
``formats``        ``ResponseFormat``: shapes, sizes, JSON Schema validity, the cache key
``tools``          tools and ``tool_choice``: shapes, the forcing format, reading calls
``embeddings``     embedding requests' limits and inputs, and a vector's one encoding
``states``         the result document's one owner: every state written at a result key
``keys``           every Redis key, with the key table
``wire``           stream entries and requests, events
``scripts``        calling ``SUBMIT`` and ``APPLY`` from Python (the scripts: ``lua``)
``script_calls``   scripts sent by hash (EVALSHA), the source only where Redis lacks it
``fair_share``     the fair share's one cost formula, the read rules, the doorbell's bounds
``prefixes``       prefix keys (no tokenizer), their scoping per tenant, the affinity's bounds
``tenants``        ``TenantSettings``: weight, tokens per minute, most queued; stored
``webhooks``       endpoints, payloads, signatures, retries, and a final state's owner key
``batch_counts``   a batch's counters, kept on its record where its requests end
``functions``      the same Lua as a Redis Functions library for other languages
``snapshot``       the whole queue from one script call (``genq stats``, the dashboard)
``history``        the queue's history in 5-s buckets, the wait histogram, chart series
``settings``       ``WorkerSettings``: each setting once, with its flag and env twin; what a
                   worker serves is ``model_settings``' ``ModelSettings``
``connection``     connections that ride out restarts and failovers
``collector``      a server process's garbage collector, settled once it is built
``errors``         the error hierarchy
=================  =========================================================================
"""
