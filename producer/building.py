"""Building and checking requests on the client side, before anything reaches Redis: each
request is validated once, into the form the submit script takes (``Prepared``).

Shared by the sync and async clients, which differ only in how they talk to Redis.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson
from genq.common import states
from genq.common.embeddings import DEFAULT_TRUNCATE
from genq.common.errors import InvalidRequest, RequestFailed
from genq.common.formats import response_format_from
from genq.common.models import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PRIORITY,
    DEFAULT_TENANT,
    MAX_METADATA_VALUE_CHARS,
    MAX_PROMPT_CHARS,
    Priority,
    Request,
    Result,
    model_problem,
    new_request_id,
    tenant_problem,
)
from genq.common.prefixes import prefix_key, prompt_key
from genq.common.wire import BODY_FIELD, describe_validation_error, encode_request
from pydantic import ValidationError


def build_request(
    prompt: str | None = None,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    priority: str = DEFAULT_PRIORITY,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: Sequence[str] | None = None,
    min_p: float = 0.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    logit_bias: Mapping[int | str, float] | None = None,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    logprobs: bool = False,
    top_logprobs: int = 0,
    response_format: Any = None,
    n: int = 1,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: Any = None,
    deadline_in_s: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    request_id: str | None = None,
    stream: bool = False,
    tenant: str = DEFAULT_TENANT,
    prompt_cache_key: str | None = None,
    model: str | None = None,
) -> Request:
    """Validate the arguments into a Request; raise InvalidRequest saying what is wrong. Give a
    ``prompt`` to continue, or chat ``messages`` (``[{"role": ..., "content": ...}]``) that the
    worker renders with the model's chat template. ``tenant`` (1-64 of ``A-Za-z0-9._-``) is
    whom the request belongs to. ``response_format`` constrains the output: a dict in
    OpenAI's shapes or genq's (``genq.common.formats``) or a pydantic model class (JSON of its
    schema). ``n`` (1-16): that many choices (``Result.choices``). ``tools`` and
    ``tool_choice`` (chats): OpenAI's (``genq.common.tools``). ``prompt_cache_key`` (1-256
    characters): placement as sharing cached context (``genq.common.prefixes``). ``model``: as
    workers serve it (``--served-model-name``), only its workers take it (None: the default)."""
    stop = [stop] if isinstance(stop, str) else stop
    problem = tenant_problem(tenant) or (None if model is None else model_problem(model))
    if problem is not None:
        raise InvalidRequest(problem)
    fields: dict[str, Any] = {
        "id": request_id if request_id is not None else new_request_id(),
        "prompt": prompt,
        "messages": _dicts(messages),
        "max_new_tokens": max_new_tokens,
        "priority": priority,
        "temperature": float(temperature) if isinstance(temperature, int) else temperature,
        "top_p": float(top_p) if isinstance(top_p, int) else top_p,
        "top_k": top_k,
        "seed": seed,
        "stop": list(stop) if isinstance(stop, list | tuple) else (stop or []),
        "min_p": _float(min_p),
        "frequency_penalty": _float(frequency_penalty),
        "presence_penalty": _float(presence_penalty),
        "repetition_penalty": _float(repetition_penalty),
        "logit_bias": _logit_bias(logit_bias),
        "min_tokens": min_tokens,
        "ignore_eos": ignore_eos,
        "logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "response_format": response_format_from(response_format),
        "n": n,
        "tools": _dicts(tools),
        "tool_choice": tool_choice,
        "deadline_in_ms": _deadline_ms(deadline_in_s),
        "metadata": dict(metadata) if isinstance(metadata, Mapping) else (metadata or {}),
        "stream": stream,
        "tenant": tenant,
        "prompt_cache_key": prompt_cache_key,
        "model": model,
    }
    try:
        return _keyed(Request.model_validate(fields))
    except ValidationError as err:
        raise InvalidRequest(f"invalid request: {describe_validation_error(err)}") from None


def build_embedding(
    inputs: str | Sequence[str | Sequence[int]],
    *,
    model: str | None = None,
    truncate: str = DEFAULT_TRUNCATE,
    dimensions: int | None = None,
    normalize: bool | None = None,
    query: str | None = None,
    priority: str = DEFAULT_PRIORITY,
    tenant: str = DEFAULT_TENANT,
    deadline_in_s: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> Request:
    """Validate an embedding request (``genq.common.embeddings``): ``inputs`` a text, texts or
    token id lists (at most 2,048); ``truncate`` ``end``, ``start`` or ``none``; the vectors
    come back one per input, in order. With ``query``, for a cross-encoder: each text's score
    against it (a vector of one value a label). Raise InvalidRequest saying what is wrong."""
    problem = tenant_problem(tenant) or (None if model is None else model_problem(model))
    if problem is not None:
        raise InvalidRequest(problem)
    fields: dict[str, Any] = {
        "id": request_id if request_id is not None else new_request_id(),
        "input": [inputs] if isinstance(inputs, str) else _dicts(inputs),
        "max_new_tokens": 0,
        "truncate": truncate,
        "dimensions": dimensions,
        "normalize": normalize,
        "query": query,
        "priority": priority,
        "tenant": tenant,
        "deadline_in_ms": _deadline_ms(deadline_in_s),
        "metadata": dict(metadata) if isinstance(metadata, Mapping) else (metadata or {}),
        "model": model,
    }
    if isinstance(fields["input"], list):
        fields["input"] = [list(i) if isinstance(i, tuple) else i for i in fields["input"]]
    try:
        return Request.model_validate(fields)
    except ValidationError as err:
        raise InvalidRequest(f"invalid request: {describe_validation_error(err)}") from None


class Embeddings(NamedTuple):
    """What ``Client.embed`` returns: one vector per input, in order, and what it cost."""

    vectors: list[list[float]]
    prompt_tokens: int
    """The inputs' tokens, in the model's tokenizer (after truncation)."""
    model: str | None
    result: Result
    """The request's final state (its packed ``embeddings``, timings, worker)."""


def embeddings_of(result: Result) -> Embeddings:
    """The vectors of a final state; RequestFailed for one that has none."""
    if result.status != "succeeded" or result.embeddings is None:
        why = result.error.message if result.error else "it made no vectors"
        raise RequestFailed(f"embedding request {result.id} {result.status}: {why}", result)
    return Embeddings(result.vectors(), result.usage.prompt_tokens, result.model, result)


def _dicts(items: Any) -> Any:
    """A list of mappings as a list of dicts (the caller's own are not changed); anything else
    as it is, for validation to name what is wrong with it."""
    if not isinstance(items, list | tuple):
        return items
    return [dict(m) if isinstance(m, Mapping) else m for m in items]


def _keyed(request: Request) -> Request:
    """``request`` with its prefix key (``genq.common.prefixes``), if it has one."""
    key = prefix_key(
        prompt=request.prompt,
        messages=request.messages,
        prompt_cache_key=request.prompt_cache_key,
    )
    return request if key is None else request.model_copy(update={"prefix_key": key})


def _deadline_ms(deadline_in_s: Any) -> int | None:
    """``deadline_in_s`` as the wire's ``deadline_in_ms``: relative to when Redis accepts the
    entry, by Redis' clock, so this host's clock does not enter into it (a negative one has
    passed already)."""
    if deadline_in_s is None:
        return None
    if not isinstance(deadline_in_s, int | float) or not math.isfinite(deadline_in_s):
        raise InvalidRequest(f"deadline_in_s must be a finite number, got {deadline_in_s!r}")
    return max(0, int(deadline_in_s * 1000))


def _float(value: Any) -> Any:
    """An int where a float is meant (``1`` for ``1.0``) is that float; anything else is left
    for validation to name."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _logit_bias(bias: Mapping[Any, Any] | None) -> Any:
    """``{token id: bias}`` with ids as ints or decimal strings, as the wire's strings."""
    if bias is None:
        return {}
    if not isinstance(bias, Mapping):
        return bias  # validation names it
    return {
        str(k) if isinstance(k, int) and not isinstance(k, bool) else k: _float(v)
        for k, v in bias.items()
    }


class Prepared(NamedTuple):
    """A validated request in the form SUBMIT takes: its id, priority, the entry's ``body``
    JSON and the ``queued`` state JSON."""

    id: str
    priority: Priority
    body: str
    queued: str


def prepare(request: Request) -> Prepared:
    """The SUBMIT form of a built request."""
    return Prepared(
        request.id,
        request.priority,
        encode_request(request)[BODY_FIELD],
        states.queued(
            request_id=request.id,
            priority=request.priority,
            metadata=request.metadata,
            tenant=request.tenant,
        ),
    )


def prepare_many(
    items: Iterable[str | Mapping[str, Any]], defaults: Mapping[str, Any]
) -> list[Prepared]:
    """``build_request`` for each item (a prompt, or a dict of arguments overriding
    ``defaults``), then ``prepare``; raises InvalidRequest for the first invalid one.

    Plain prompts take a fast path that gives the same entries: the shared ``defaults`` are
    validated once (as a request with a placeholder prompt) and each prompt is checked on its
    own against the prompt's limits, so a big ``submit_many`` costs a few microseconds per
    request instead of a full model validation each. Anything the fast path cannot vouch for
    (an over-long, empty or non-UTF-8 prompt) goes through ``build_request``, which raises
    the same error it always does."""
    fast = not {"prompt", "messages", "request_id"} & set(defaults)
    template: PromptTemplate | None = None
    items = list(items)
    ids = iter(new_request_ids(sum(isinstance(x, str) for x in items)))
    out: list[Prepared] = []
    for item in items:
        if not isinstance(item, str):
            out.append(prepare(build_request(**{**defaults, **item})))
            continue
        if fast and template is None:
            template = PromptTemplate(defaults)  # raises if the options are invalid
        request_id = next(ids)
        done = None if template is None else template.prepare(item, request_id)
        if done is None:
            done = prepare(build_request(item, **{"request_id": request_id, **defaults}))
        out.append(done)
    return out


class PromptTemplate:
    """Many prompts with the same options, prepared fast (``prepare_many``'s and batch lines'
    path): the options are validated once, as a request with a placeholder prompt, and each
    prompt is checked on its own against the prompt's limits, so each costs a few
    microseconds instead of a full model validation, with the same entry ``build_request``
    and ``prepare`` would give. ``prepare`` answers None for what it cannot vouch for (an
    over-long, empty or non-UTF-8 prompt, metadata beyond the checked shape): the caller then
    takes the full path, which raises the error it always does."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        template = build_request("-", **options)  # raises InvalidRequest
        shared = orjson.loads(encode_request(template)[BODY_FIELD])
        del shared["prompt"]
        self._key = shared.pop("prefix_key", None)  # from a prompt_cache_key, or None
        self._model = shared.pop("model", None)  # first in a body: SUBMIT reads it there
        self._shared = shared
        self._tenant = template.tenant
        self._metadata_keys = set(template.metadata)
        self.priority = template.priority
        queued = states.queued(
            request_id="", priority=self.priority, metadata=template.metadata, tenant=self._tenant
        )
        self._queued_tail = queued[len('{"id":""') :]

    def prepare(
        self, prompt: str, request_id: str, metadata: Mapping[str, str] | None = None
    ) -> Prepared | None:
        """The entry of ``prompt`` with these options (and ``metadata`` instead of theirs: the
        same keys, text values); None when the full path must decide."""
        if not 0 < len(prompt) <= MAX_PROMPT_CHARS:
            return None
        key = self._key or prompt_key(prompt)
        head = {"prefix_key": key, "prompt": prompt} if key else {"prompt": prompt}
        if self._model is not None:
            head = {"model": self._model, **head}
        shared = self._shared
        if metadata is not None:
            if set(metadata) != self._metadata_keys or any(
                not isinstance(v, str) or len(v) > MAX_METADATA_VALUE_CHARS
                for v in metadata.values()
            ):
                return None
            shared = {**shared, "metadata": dict(metadata)}
        try:
            body = orjson.dumps({**head, **shared}).decode()
        except orjson.JSONEncodeError:  # a lone surrogate: build_request says why
            return None
        if metadata is None:
            queued = '{"id":"' + request_id + '"' + self._queued_tail
        else:
            queued = states.queued(
                request_id=request_id,
                priority=self.priority,
                metadata=metadata,
                tenant=self._tenant,
            )
        return Prepared(request_id, self.priority, body, queued)


def new_request_ids(n: int) -> list[str]:
    """``n`` fresh random request ids like ``new_request_id`` (32 hex digits), made at once."""
    digits = os.urandom(16 * n).hex()
    return [digits[i : i + 32] for i in range(0, 32 * n, 32)]
