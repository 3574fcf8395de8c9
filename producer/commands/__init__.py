"""The ``genq`` commands of a client and an operator: everything but running a worker.

=================  =========================================================================
module             commands
=================  =========================================================================
``submit``         ``genq submit``
``stats``          ``genq stats``, ``genq top``
``dlq``            ``genq dlq list | retry | purge``
``batch``          ``genq batch submit | status | results | cancel``
``functions``      ``genq functions load | code`` (the Redis Functions library)
``models``         ``genq models list | default`` (each model's lane, the queue's default model)
``tenants``        ``genq tenants set | list | delete`` (tenants' weights, limits, webhooks)
``webhooks``       ``genq webhooks list | retry`` (webhook deliveries that gave up)
``serve``          ``genq serve`` (the OpenAI-compatible HTTP gateway, with the dashboard),
                   ``genq dashboard`` (the dashboard alone)
``options``        the shared flags (and their env twins), built from the settings models
=================  =========================================================================

None of them imports torch: they work on a base install (``pip install genq``; ``genq serve``
needs the ``serve`` extra). The ``genq`` group itself, with the worker's commands, is
``genq.worker.commands.main``.
"""
