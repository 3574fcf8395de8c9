"""Redis' side of genq: every Lua script, each in a module of its own, and the fragments they
share, each declaring what it defines (``compose``). Key names come from ``keys.py`` through
the generated ``key_names`` functions: no script spells one.

===============  ========  ===================================================================
module           kind      what it holds
===============  ========  ===================================================================
``submit``       script    ``SUBMIT``: requests enqueued all or nothing, one per id, in lanes
``apply``        script    ``APPLY``: states written unless final; ends ack their entries
``read``         script    ``PULL``: a worker's read, fairly among tenants, placed by prefix
``hand_back``    scripts   ``GIVE_BACK`` (read, not started: back in place), ``TAKE_BACK``
``hold``         script    ``HOLD``: the prefixes and adapters a worker holds, its free slots
``model_claim``  script    ``CLAIM_MODEL``: a pool's worker claims a model before it loads it
``cancel``       script    ``CANCEL``: ``genq_cancel`` of the Functions library
``snapshot``     script    ``SNAPSHOT``: the whole queue in one read-only call
``history``      script    ``HISTORY``: a heartbeat's increments in the current 5-s bucket
``quotas``       script    ``QUOTA_CLAIM``: a tenant's place among what it keeps via gateways
``batch_waves``  scripts   ``FEED``, ``COMMIT``, ``STOP`` of wave batches, and ``FINISH``
``lanes``        fragment  ``PRIORITIES``; ``LANES``: the queue's and the current lane's bases
``tenants``      fragment  ``COST`` (the fair share's cost); ``TENANTS``: settings, indexes
``prefix_keys``  fragment  ``PREFIX_KEYS``: prefix keys scoped per tenant and model
``affinity``     fragment  ``AFFINITY``: which of a tenant's waiting items a reader takes
``claims``       fragment  ``CLAIM``: XCLAIM's answer for a list of ids, for less
``numbers``      fragment  ``NUMBER``: a number from JSON text without decoding it
``final_states`` fragment  ``FINAL``: whether a stored state is final
``tally``        fragment  ``TALLY``: a batch's counters, written once a call
``hook``         fragment  ``HOOK``: a response's or a batch's webhook event
``compose``      -         ``Fragment``, ``script`` (registers it), ``compose`` (a test's probe)
``key_names``    -         the ``key_*`` functions, generated from ``Keys``
===============  ========  ===================================================================
"""
