"""Options shared by the commands: the worker's settings as flags, and the Redis and queue
options of every command that talks to a queue."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import click
from genq.common.models import DEFAULT_TENANT, PRIORITIES, tenant_problem
from genq.common.settings import AUTO, DEFAULT_QUEUE, DEFAULT_REDIS_URL, EngineName, WorkerSettings

F = Callable[..., Any]
WIDE = 160
"""Columns the stats tables get at least, terminal or not, so that no header is cut."""
PRIORITY_CHOICE = click.Choice(list(PRIORITIES))
ENGINE_CHOICE = click.Choice(list(typing.get_args(EngineName)))
QUEUE_ENV = WorkerSettings.env_var("queue")
REDIS_URL_ENV = WorkerSettings.env_var("redis_url")
TENANT_ENV = "GENQ_TENANT"


class RefusedInput(click.ClickException):
    """An input file refused whole before anything was made of it: one line, exit 2 (as a
    usage error: what was given cannot be run)."""

    exit_code = 2


class _AutoOrCount(click.ParamType[Any]):
    """``auto`` or a whole number (``--max-batch-tokens``, ``--max-batch-size``)."""

    name = "auto|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return AUTO
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither 'auto' nor a whole number", param, ctx)


AUTO_OR_COUNT = _AutoOrCount()


def _tenant_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    problem = tenant_problem(value)
    if problem is not None:
        raise click.BadParameter(problem)
    return value


def tenant_option(func: F) -> F:
    """``--tenant``: whom the submitted requests belong to (checked before anything is sent)."""
    return click.option(
        "--tenant",
        envvar=TENANT_ENV,
        default=DEFAULT_TENANT,
        show_default=True,
        callback=_tenant_name,
        help=f"the tenant the requests belong to (1-64 of A-Za-z0-9._-) [env: {TENANT_ENV}]",
    )(func)


def settings_options(func: F) -> F:
    """One --flag per WorkerSettings field. Flags default to None so that the environment
    twin, then the field's own default, apply: each default is written once, in the model."""
    for name, info in reversed(list(WorkerSettings.model_fields.items())):
        annotation = info.annotation
        args = typing.get_args(annotation)
        click_type: Any = str
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get("auto"):
            click_type = AUTO_OR_COUNT
        elif typing.get_origin(annotation) is typing.Literal:
            click_type = click.Choice([str(a) for a in args])
        elif annotation is int or int in args:
            click_type = int
        elif annotation is float or float in args:
            click_type = float
        default = "auto" if click_type is AUTO_OR_COUNT else info.default
        help_text = f"{info.description} [env: {WorkerSettings.env_var(name)}; default: {default}]"
        flag = name.replace("_", "-")
        if isinstance(extra, dict) and extra.get("multiple"):  # repeatable: --x A --x B
            func = click.option(f"--{flag}", name, multiple=True, help=help_text)(func)
            continue
        if isinstance(extra, dict) and extra.get("flag_pair"):  # --x/--no-x
            func = click.option(f"--{flag}/--no-{flag}", name, default=None, help=help_text)(func)
            continue
        func = click.option(f"--{flag}", name, type=click_type, default=None, help=help_text)(func)
    return func


def redis_options(func: F) -> F:
    func = click.option(
        "--queue",
        envvar=QUEUE_ENV,
        default=DEFAULT_QUEUE,
        show_default=True,
        help=f"queue name [env: {QUEUE_ENV}]",
    )(func)
    func = click.option(
        "--redis-url",
        envvar=REDIS_URL_ENV,
        default=DEFAULT_REDIS_URL,
        show_default=True,
        help=f"Redis URL [env: {REDIS_URL_ENV}]",
    )(func)
    return func
