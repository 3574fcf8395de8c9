"""``genq worker``: serve a queue (or, with ``--gpus``, one supervised worker per GPU)."""

from __future__ import annotations

import sys
from typing import Any

import click
from genq.common.errors import ConfigError
from genq.common.settings import WorkerSettings
from genq.worker.commands.options import settings_options


@click.command()
@settings_options
def worker(**flags: Any) -> None:
    """Serve a queue: read, batch, generate, write results. Stop with SIGTERM or Ctrl-C."""
    from genq.worker.engines import make_engine
    from genq.worker.runtime.worker import Worker

    try:
        settings = WorkerSettings.build(flags)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    if settings.gpus is not None:
        sys.exit(_launch(settings, flags))
    engine = make_engine(settings)
    Worker(settings, engine).run()


def _launch(settings: WorkerSettings, flags: dict[str, Any]) -> int:
    """``genq worker --gpus``: one supervised worker per GPU."""
    import socket

    from genq.worker.runtime.launcher import Launcher, parse_gpus

    needs_cuda = settings.engine != "echo"
    try:
        gpus = parse_gpus(str(settings.gpus), needs_cuda)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    skip = {"gpus", "consumer", "device", "metrics_port"}
    args = [
        a
        for k, v in flags.items()
        if v is not None and k not in skip
        for a in (f"--{k.replace('_', '-')}", str(v))
    ]
    launcher = Launcher(
        gpus,
        args,
        consumer_base=settings.consumer or socket.gethostname(),
        device="cuda" if needs_cuda else settings.device,
    )
    return launcher.run()
