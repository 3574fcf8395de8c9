"""The ``genq`` command: the group, and the commands that run or measure workers.

=================  =========================================================================
module             commands
=================  =========================================================================
``worker``         ``genq worker`` (and ``--gpus``: one supervised worker per GPU)
``demo``           ``genq demo``
``bench``          ``genq bench`` (its scenarios are in ``genq.worker.bench``)
=================  =========================================================================

The commands of a client and an operator (``submit``, ``stats``, ``batch``, ``serve``, ...)
are in ``genq.producer.commands``; ``main`` below puts both in one group, each imported only
when it runs. A new command is a module in one of the two with a click command, named in
``COMMANDS``.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click
import redis
from genq.common.connection import permission_refused, refusal_text
from genq.common.errors import EXIT_NO_PERMISSION

COMMANDS = {
    "worker": "genq.worker.commands.worker",
    "submit": "genq.producer.commands.submit",
    "stats": "genq.producer.commands.stats",
    "top": "genq.producer.commands.stats",
    "dlq": "genq.producer.commands.dlq",
    "batch": "genq.producer.commands.batch",
    "functions": "genq.producer.commands.functions",
    "models": "genq.producer.commands.models",
    "tenants": "genq.producer.commands.tenants",
    "webhooks": "genq.producer.commands.webhooks",
    "serve": "genq.producer.commands.serve",
    "dashboard": "genq.producer.commands.serve",
    "demo": "genq.worker.commands.demo",
    "bench": "genq.worker.commands.bench",
}
"""Each command's module (the command is the module's attribute of its name). A command's
module is imported when that command runs (or ``--help`` lists them all): ``genq worker``
does not import the gateway, the batch files' code or the benches (its start was 0.36 s
longer for them)."""


class _Main(click.Group):
    """The ``genq`` group: Redis refusing or unreachable is one line saying what to check, not a
    traceback (a refused permission: status 77, ``EXIT_NO_PERMISSION``). Its commands are
    imported as they are asked for (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        command: click.Command = getattr(importlib.import_module(module), cmd_name)
        return command

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


if __name__ == "__main__":
    sys.exit(main())
