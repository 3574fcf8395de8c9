"""``genq submit``: one prompt, or every line of a file, with a progress bar."""

from __future__ import annotations

import json
from typing import Any

import click
from genq.common.errors import GenqError
from genq.common.models import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PRIORITY
from genq.producer.commands.options import (
    PRIORITY_CHOICE,
    RefusedInput,
    redis_options,
    tenant_option,
)
from rich.console import Console


def _options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--option NAME=VALUE`` pairs: VALUE as JSON where it parses, else as text; NAME one of
    ``build_request``'s options."""
    import inspect
    import json

    from genq.producer.building import build_request

    known = set(inspect.signature(build_request).parameters) - {"prompt"}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name.strip() not in known:
            raise click.BadParameter(
                f"{pair!r} is not NAME=VALUE with NAME one of {', '.join(sorted(known))}",
                param_hint="--option",
            )
        try:
            out[name.strip()] = json.loads(text)
        except ValueError:
            out[name.strip()] = text
    return out


@click.command()
@redis_options
@click.argument("prompt", required=False)
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="submit every line of this file: a prompt per line, or JSON Lines of "
    "request options; results are printed as JSON Lines",
)
@click.option("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, show_default=True)
@click.option("--priority", type=PRIORITY_CHOICE, default=DEFAULT_PRIORITY)
@tenant_option
@click.option(
    "--model",
    default=None,
    help="the model (or adapter) to run it: only workers serving that name take it (default: "
    "the queue's default model)",
)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="a stop string (repeatable)")
@click.option(
    "--option",
    "extra",
    multiple=True,
    callback=lambda ctx, param, value: _options(value),
    help="any other request option as NAME=VALUE, VALUE as JSON where it parses (repeatable): "
    "--option frequency_penalty=0.5 --option 'logit_bias={\"5\": -100}' --option ignore_eos=true",
)
@click.option("--timeout-s", type=float, default=None, help="give up waiting after this long")
@click.option("--no-wait", is_flag=True, help="print the request id and return")
@click.option("--json", "as_json", is_flag=True, help="print the whole result as JSON")
def submit(
    redis_url: str,
    queue: str,
    prompt: str | None,
    path: str | None,
    max_new_tokens: int,
    priority: str,
    tenant: str,
    model: str | None,
    temperature: float,
    seed: int | None,
    stop: tuple[str, ...],
    extra: dict[str, Any],
    timeout_s: float | None,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Submit PROMPT and print the generated text (or the result as JSON); or submit every
    line of --file with a progress bar."""
    from genq.producer import Client

    if (prompt is None) == (path is None):
        raise click.UsageError("give a PROMPT or --file, not both")
    options = {
        "max_new_tokens": max_new_tokens,
        "priority": priority,
        "tenant": tenant,
        **({"model": model} if model is not None else {}),
        "temperature": temperature,
        "seed": seed,
        "stop": list(stop),
        **extra,
    }
    if path is not None:
        _submit_file(redis_url, queue, path, options, timeout_s, no_wait)
        return
    prompt = prompt or ""  # given: checked above
    with Client.from_url(redis_url, queue) as client:
        try:
            request_id = client.submit(prompt, **options)
            if no_wait:
                click.echo(request_id)
                return
            result = client.result(request_id, timeout=timeout_s)
        except GenqError as err:
            raise click.ClickException(str(err)) from None
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    elif result.status == "succeeded":
        click.echo(result.text)
    else:
        msg = result.error.message if result.error else ""
        raise click.ClickException(f"request {result.id} {result.status}: {msg}")


def _submit_file(
    redis_url: str,
    queue: str,
    path: str,
    options: dict[str, Any],
    timeout_s: float | None,
    no_wait: bool,
) -> None:
    """``genq submit --file``: every line checked first (one that is not a request: one line
    saying where and why, exit 2, nothing submitted), then submitted in chunks under a
    progress bar; then (unless --no-wait) one JSON line per result."""
    from genq.producer import Client
    from genq.producer.files import read_requests
    from genq.producer.submitting import SUBMIT_CHUNK
    from rich.progress import Progress

    with click.open_file(path, encoding="utf-8") as f:
        requests, errors = read_requests(f, options)
    if errors:  # nothing is submitted: the file is mended and run again whole
        first, others = errors[0], len(errors) - 1
        shown = ", ".join(str(e.line) for e in errors[1:6]) + (" ..." if others > 5 else "")
        more = f" (and {others} more: line{'s' if others > 1 else ''} {shown})" if others else ""
        raise RefusedInput(f"line {first.line}: {first.message}{more}; nothing was submitted")
    if not requests:
        raise RefusedInput(f"{path} has no lines; nothing was submitted")
    err = Console(stderr=True)
    chunk = SUBMIT_CHUNK
    with Client.from_url(redis_url, queue) as client, Progress(console=err) as progress:
        sent = progress.add_task("submitting", total=len(requests))
        ids: list[str] = []
        try:
            for start in range(0, len(requests), chunk):
                part = [r for _, r in requests[start : start + chunk]]
                ids += client.submit_requests(part)
                progress.advance(sent, len(part))
        except GenqError as e:
            raise click.ClickException(f"{e} ({len(ids)} of {len(requests)} submitted)") from None
        if no_wait:
            progress.stop()
            for (line, _), request_id in zip(requests, ids, strict=True):
                click.echo(json.dumps({"line": line, "id": request_id}))
            return
        done = progress.add_task("waiting", total=len(ids))
        for start in range(0, len(ids), chunk):
            results = client.results(ids[start : start + chunk], timeout=timeout_s)
            progress.advance(done, len(results))
            for (line, _), res in zip(requests[start : start + chunk], results, strict=True):
                out = {"line": line, **res.model_dump(mode="json")}
                click.echo(json.dumps(out))
