"""``genq worker``: serve a queue (or, with ``--gpus``, one supervised worker per GPU)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
from genq.common.connection import REDIS_ERRORS, permission_refused, refusal_text
from genq.common.errors import EXIT_NO_PERMISSION, ConfigError
from genq.common.settings import WorkerSettings
from genq.producer.commands.options import settings_options


@click.command()
@settings_options
def worker(**flags: Any) -> None:
    """Serve a queue: read, batch, generate, write results. Stop with SIGTERM or Ctrl-C."""
    from genq.common.collector import settle_collector
    from genq.worker.engines import make_engine
    from genq.worker.runtime.builder import build_worker

    try:
        settings = WorkerSettings.build(flags)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    _check_redis(settings)
    if settings.gpus is not None:
        sys.exit(_launch(settings, flags))
    try:
        engine = make_engine(settings)
    except ConfigError as err:  # a model, package or engine setting that cannot work
        raise click.ClickException(str(err)) from None
    if getattr(engine, "embeds", False):
        on = "vLLM's pooling runner" if engine.name == "vllm" else "transformers, pooled"
        why = f"an embedding model (a sentence-transformers folder): {on}"
        if getattr(engine, "scores", False):
            why = "a cross-encoder (a *ForSequenceClassification folder): transformers"
        logging.getLogger("genq.worker").info("engine embedding: %s", why)
    else:
        log = logging.getLogger("genq.worker")
        log.info("engine %s: %s", settings.engine, settings.engine_why)
    try:
        served = build_worker(settings, engine)
        settle_collector()  # what start-up made stays out of the collector's passes
        served.run()
    except REDIS_ERRORS as err:
        if not permission_refused(err):
            raise
        click.echo(
            f"genq worker: Redis refused this user a command it needs ({refusal_text(err)}); "
            "grant the worker's ACL user what docs/security.md lists, then start it again",
            err=True,
        )
        sys.exit(EXIT_NO_PERMISSION)


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
        for one in (v if isinstance(v, tuple) else (v,))  # a repeatable flag: once per value
        for a in (f"--{k.replace('_', '-')}", str(one))
    ]
    launcher = Launcher(
        gpus,
        args,
        consumer_base=settings.consumer or socket.gethostname(),
        device="cuda" if needs_cuda else settings.device,
    )
    return launcher.run()


def _check_redis(settings: WorkerSettings) -> None:
    """Refuse a Redis that would evict accepted requests (before loading any model). A Redis
    that is not up yet is waited for: a worker is a service, and Redis may be starting too."""
    import logging
    import time

    import redis
    from genq.common.connection import TRANSIENT_ERRORS, connect
    from genq.worker.runtime.redis_checks import check_eviction

    r = connect(settings.redis_url)
    delay_s = 0.5
    try:
        while True:
            try:
                check_eviction(r, allow=settings.allow_evicting_redis)
                return
            except ConfigError as err:
                raise click.ClickException(str(err)) from None
            except TRANSIENT_ERRORS as err:
                if isinstance(err, redis.AuthenticationError):
                    raise
                logging.getLogger("genq.worker").warning(
                    "cannot reach Redis (%s); waiting for it, retrying in %.1f s", err, delay_s
                )
                time.sleep(delay_s)
                delay_s = min(5.0, delay_s * 2)
    finally:
        r.close()
