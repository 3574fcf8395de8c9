"""The ``genq`` command: one module per command group.

=================  =========================================================================
module             commands
=================  =========================================================================
``worker``         ``genq worker`` (and ``--gpus``: one supervised worker per GPU)
``submit``         ``genq submit``
``stats``          ``genq stats``, ``genq top``
``dlq``            ``genq dlq list | retry | purge``
``batch``          ``genq batch submit | status | results | cancel``
``functions``      ``genq functions load | code`` (the Redis Functions library)
``tenants``        ``genq tenants set | list | delete`` (tenants' weights, limits, webhooks)
``webhooks``       ``genq webhooks list | retry`` (webhook deliveries that gave up)
``serve``          ``genq serve`` (the OpenAI-compatible HTTP gateway, with the dashboard),
                   ``genq dashboard`` (the dashboard alone)
``demo``           ``genq demo``
``bench``          ``genq bench``
=================  =========================================================================

``options`` builds the shared flags (and their env twins) from the settings models.
A new command is a module here with a click command, added to ``main`` below.
"""

from __future__ import annotations

import logging
import sys

import click
import redis
from genq.worker.commands.batch import batch
from genq.worker.commands.bench import bench
from genq.worker.commands.demo import demo
from genq.worker.commands.dlq import dlq
from genq.worker.commands.functions import functions
from genq.worker.commands.serve import dashboard, serve
from genq.worker.commands.stats import stats, top
from genq.worker.commands.submit import submit
from genq.worker.commands.tenants import tenants
from genq.worker.commands.webhooks import webhooks
from genq.worker.commands.worker import worker


class _Main(click.Group):
    """The ``genq`` group: Redis refusing or unreachable is one line saying what to check, not a
    traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except redis.AuthenticationError as err:
            raise click.ClickException(
                f"Redis refused the credentials ({err}): check the user and password in "
                "--redis-url / GENQ_REDIS_URL"
            ) from None
        except redis.ConnectionError as err:
            raise click.ClickException(
                f"cannot reach Redis ({err}): check --redis-url / GENQ_REDIS_URL and that "
                "redis-server runs there"
            ) from None


@click.group(cls=_Main)
@click.option("-v", "--verbose", is_flag=True, help="log debug detail")
def main(verbose: bool) -> None:
    """genq: a Redis Streams queue for batched LLM generation."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


for _command in (
    worker,
    submit,
    stats,
    top,
    dlq,
    batch,
    functions,
    tenants,
    webhooks,
    serve,
    dashboard,
    demo,
    bench,
):
    main.add_command(_command)

if __name__ == "__main__":
    sys.exit(main())
