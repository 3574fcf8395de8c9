"""The synchronous client: the same API as AsyncClient (``aio.py``), on redis-py.

Written from ``aio.py`` by ``scripts/unasync.py``: edit that file, then run the script (a
test fails while the two differ)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import redis
from genq.common import collector, script_calls
from genq.common.connection import (
    CLUSTER_RETRIES,
    TRANSIENT_ERRORS,
    connect,
    is_cluster,
    refresh_cluster_view,
)
from genq.common.embeddings import MAX_EMBED_INPUTS, cut_by_length
from genq.common.errors import InvalidRequest, RequestNotFound, ResultTimeout
from genq.common.keys import Keys
from genq.common.models import Request, Result
from genq.common.scripts import APPLY, SUBMIT
from genq.common.settings import DEFAULT_QUEUE, DEFAULT_RESULT_TTL_S
from genq.producer.building import (
    Embeddings,
    Prepared,
    build_embedding,
    build_request,
    embeddings_of,
    prepare,
    prepare_many,
)
from genq.producer.submitting import (
    cancel_call,
    cancel_outcome,
    queued_writes,
    submit_calls,
    submit_outcome,
)
from genq.producer.waiting import StreamReader, Waiter, parse_stored


class Client:
    """Submits requests to one queue and reads their results.

    ``result_ttl_s`` is how long a submitted request's state is kept if no worker touches it;
    workers reset it when they write the final result.
    """

    def __init__(
        self,
        redis_client: redis.Redis,
        queue: str = DEFAULT_QUEUE,
        *,
        result_ttl_s: int = DEFAULT_RESULT_TTL_S,
    ) -> None:
        self.redis = redis_client
        self.keys = Keys(queue)
        self.result_ttl_s = result_ttl_s

    @classmethod
    def from_url(cls, url: str, queue: str = DEFAULT_QUEUE, **kwargs: Any) -> Client:
        """A client for the Redis at ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``;
        user and password in the URL for AUTH/ACL). Extra keyword arguments go to redis-py."""
        result_ttl_s = kwargs.pop("result_ttl_s", DEFAULT_RESULT_TTL_S)
        return cls(connect(url, **kwargs), queue, result_ttl_s=result_ttl_s)

    def close(self) -> None:
        """Close the connection pool."""
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, prompt: str | None = None, **options: Any) -> str:
        """Enqueue one request and return its id. ``options`` are those of ``build_request``
        (``genq.producer.building``): messages (instead of a prompt), model (only workers
        serving it take the request), max_new_tokens, priority, tenant, temperature, top_p,
        top_k, seed, stop, min_p, frequency_penalty, presence_penalty, repetition_penalty,
        logit_bias, min_tokens, ignore_eos, logprobs, top_logprobs, response_format, n, tools,
        tool_choice, prompt_cache_key, deadline_in_s, metadata, request_id, stream. Raises
        InvalidRequest before touching Redis if anything is wrong."""
        return self.submit_requests([build_request(prompt, **options)])[0]

    def submit_many(self, prompts: Iterable[str | Mapping[str, Any]], **defaults: Any) -> list[str]:
        """Enqueue many requests in one round trip; each item is a prompt or a dict of
        ``build_request`` arguments (``prompt`` included) that override ``defaults``. All are
        validated first: if any is invalid, none is sent."""
        return self.submit_prepared(prepare_many(prompts, defaults))

    def submit_requests(self, requests: Sequence[Request]) -> list[str]:
        """Enqueue already-built requests in one round trip. Each chunk of ``SUBMIT_CHUNK``
        (500) is atomic: all of it or none (QueueFull). An id that already has a live state
        (submitted before and not yet expired) is not enqueued again: it stays one request."""
        return self.submit_prepared([prepare(r) for r in requests])

    def submit_prepared(self, requests: Sequence[Prepared]) -> list[str]:
        """``submit_requests`` for requests already in SUBMIT's form (``prepare``)."""
        if not requests:
            return []
        if is_cluster(self.redis):
            for attempt in range(CLUSTER_RETRIES):
                try:
                    return self._submit(requests, cluster=True)
                except TRANSIENT_ERRORS:
                    # Safe to repeat: an id already marked submitted is not enqueued again.
                    if attempt == CLUSTER_RETRIES - 1:
                        raise
                    refresh_cluster_view(self.redis)
                    time.sleep(0.5)
        return self._submit(requests, cluster=False)

    def _submit(self, requests: Sequence[Prepared], cluster: bool) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        for script_keys, args in submit_calls(self.keys, requests, self.result_ttl_s, cluster):
            script_calls.add(pipe, SUBMIT, len(script_keys), *script_keys, *args)
        replies = script_calls.execute(pipe, raise_on_error=False)
        if cluster:  # the queued states, after the entries (see Keys.submitted)
            pipe = self.redis.pipeline(transaction=False)
            for key, state in queued_writes(self.keys, requests, replies):
                pipe.set(key, state, nx=True, ex=self.result_ttl_s)
            pipe.execute()
        return submit_outcome(requests, replies)

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request: it ends ``cancelled`` (a running one is stopped
        at the worker's next step). False if it was already final; RequestNotFound if it has
        no state (never submitted with a client, or expired)."""
        raw = self.redis.get(self.keys.result(request_id))
        call = cancel_call(
            self.keys, request_id, raw, self.result_ttl_s, cluster=is_cluster(self.redis)
        )
        if call is None:
            return False
        script_keys, args = call
        return cancel_outcome(
            request_id,
            script_calls.call(self.redis, APPLY, len(script_keys), *script_keys, *args),
        )

    def status(self, request_id: str) -> Result:
        """The request's current state. Raises RequestNotFound if there is none."""
        res = parse_stored(self.redis.get(self.keys.result(request_id)))
        if res is None:
            raise RequestNotFound(
                f"no request {request_id!r} in Redis (never submitted, or expired)"
            )
        return res

    def result(self, request_id: str, timeout: float | None = None) -> Result:
        """Wait until the request is final and return its result. ``timeout`` in seconds (None:
        wait as long as it takes). Raises ResultTimeout."""
        return self.results([request_id], timeout=timeout)[0]

    def results(self, request_ids: Sequence[str], timeout: float | None = None) -> list[Result]:
        """Wait for many requests at once (blocking reads over their event streams, no polling)
        and return their results in the same order. An id with no state yet is waited for
        like any other (it may have been enqueued without one); ``timeout`` bounds the wait."""
        ids = list(request_ids)
        waiter = Waiter(self.keys, ids, timeout)
        if is_cluster(self.redis):
            self._poll_results(waiter)
            return [waiter.results[i] for i in ids]
        with collector.paused():  # (what this read decodes is kept: ``collector.paused``)
            raws = self.redis.mget([self.keys.result(i) for i in ids]) if ids else []
            # A missing key is waited for too: a request enqueued with a plain XADD
            # (redis-cli, another language) has no state until a worker writes one.
            waiter.take_stored(ids, raws)
        while waiter.pending:
            read = waiter.next_read()
            if read is None:
                raise waiter.timed_out()
            head, rest, block_ms = read
            waiter.take_events(self.redis.xread(head, block=block_ms))
            if rest:  # (as above)
                with collector.paused():
                    waiter.take_events(self.redis.xread(rest))
        return [waiter.results[i] for i in ids]

    def _poll_results(self, waiter: Waiter) -> None:
        """Redis Cluster: poll the states of the pending requests (a pipeline per round, with
        a growing pause; see ``Waiter.next_poll``), riding out a failover."""
        while waiter.pending:
            pipe = self.redis.pipeline(transaction=False)
            poll = waiter.queue_poll(pipe)
            if poll is None:
                raise waiter.timed_out()
            batch, pause_s = poll
            try:
                waiter.take_stored(batch, pipe.execute())
            except TRANSIENT_ERRORS:  # a node failed over: read again next round
                refresh_cluster_view(self.redis)
            time.sleep(pause_s)

    def generate(
        self, prompt: str | None = None, timeout: float | None = None, **options: Any
    ) -> Result:
        """Submit and wait: ``result(submit(prompt, **options), timeout)``."""
        return self.result(self.submit(prompt, **options), timeout=timeout)

    def embed(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[int]],
        *,
        model: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> Embeddings:
        """Embed ``inputs`` (a text, texts or token id lists, at most 2,048) as one request and
        wait: one vector per input, in order (``Embeddings``). ``options`` are
        ``build_embedding``'s (truncate, dimensions, normalize, query, priority, tenant,
        deadline_in_s, metadata, request_id). Raises InvalidRequest before touching Redis,
        RequestFailed if it ends without vectors, ResultTimeout."""
        request = build_embedding(inputs, model=model, **options)
        ids = self.submit_requests([request])
        return embeddings_of(self.results(ids, timeout=timeout)[0])

    def score(
        self,
        query: str,
        texts: str | Sequence[str],
        *,
        model: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> list[float]:
        """Score each of ``texts`` (at most 2,048) against ``query`` with a cross-encoder, as
        one request, and wait: one score a text, in order (a model of several labels: the
        first; ``embed(texts, query=query)`` gives them all). ``options`` as ``embed``'s."""
        got = self.embed(texts, model=model, timeout=timeout, query=query, **options)
        return [v[0] for v in got.vectors]

    def embed_many(
        self,
        inputs: Sequence[str] | Sequence[Sequence[int]],
        *,
        model: str | None = None,
        per_request: int = 64,
        timeout: float | None = None,
        **options: Any,
    ) -> list[list[float]]:
        """Embed any number of inputs as requests of at most ``per_request`` inputs each (and
        ``PART_CHARS`` characters), inputs of like length together (``cut_by_length``), sent in
        one round trip (so workers share them out) and waited for together: one vector per
        input, in the inputs' order. All are validated before any is sent."""
        if not 1 <= per_request <= MAX_EMBED_INPUTS:
            raise InvalidRequest(f"per_request must be 1-{MAX_EMBED_INPUTS}")
        parts = cut_by_length(inputs, most_inputs=per_request)
        requests = [build_embedding([inputs[i] for i in p], model=model, **options) for p in parts]
        ids = self.submit_requests(requests)
        results = self.results(ids, timeout=timeout)
        vectors: list[list[float]] = [[] for _ in inputs]
        for part, result in zip(parts, results, strict=True):
            for index, vector in zip(part, embeddings_of(result).vectors, strict=True):
                vectors[index] = vector
        return vectors

    def stream(self, request_id: str, timeout: float | None = None) -> Iterator[str | Result]:
        """Follow a request submitted with ``stream=True``: yields each new piece of text as it is
        generated, then the final Result (whose ``text`` the pieces add up to). Works for any
        request; one submitted without ``stream=True`` yields its whole text at the end.
        Raises ResultTimeout if it is not final within ``timeout`` seconds."""
        reader = StreamReader(self.keys, request_id, timeout)
        while not reader.done:
            block_ms = reader.next_block_ms()
            if block_ms is None:
                raise ResultTimeout(f"request {request_id} not final after {timeout} s")
            response = self.redis.xread({reader.key: reader.last_id}, block=block_ms)
            yield from reader.take(response)  # type: ignore[arg-type]
