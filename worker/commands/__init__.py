"""The ``genq`` command: the group, and the commands that run or measure workers.

=================  =========================================================================
module             commands
=================  =========================================================================
``worker``         ``genq worker`` (and ``--gpus``: one supervised worker per GPU)
``demo``           ``genq demo``
``bench``          ``genq bench`` (its scenarios are in ``genq.worker.bench``)
=================  =========================================================================

The commands of a client and an operator (``submit``, ``stats``, ``batch``, ``serve``, ...)
are in ``genq.producer.commands``; ``main`` below puts both in one group. A new command is a
module in one of the two with a click command, added to ``main``.
"""

from __future__ import annotations

import logging
import sys

import click
import redis
from genq.common.connection import permission_refused, refusal_text
from genq.common.errors import EXIT_NO_PERMISSION
from genq.producer.commands.batch import batch
from genq.producer.commands.dlq import dlq
from genq.producer.commands.functions import functions
from genq.producer.commands.models import models
from genq.producer.commands.serve import dashboard, serve
from genq.producer.commands.stats import stats, top
from genq.producer.commands.submit import submit
from genq.producer.commands.tenants import tenants
from genq.producer.commands.webhooks import webhooks
from genq.worker.commands.bench import bench
from genq.worker.commands.demo import demo
from genq.worker.commands.worker import worker


class _Main(click.Group):
    """The ``genq`` group: Redis refusing or unreachable is one line saying what to check, not a
    traceback (a refused permission: status 77, ``EXIT_NO_PERMISSION``)."""

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
        except redis.RedisError as err:
            if not permission_refused(err):
                raise
            click.echo(
                f"Error: Redis refused this user a command or key ({refusal_text(err)}): run "
                "it as a user whose ACL has it (docs/security.md lists each role's)",
                err=True,
            )
            sys.exit(EXIT_NO_PERMISSION)


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
    models,
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
