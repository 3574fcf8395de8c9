"""The admit step: delivered entries become held requests, final outcomes at once (failed,
expired), or dead letters, by the verdicts of ``policy.admission``. Entries the worker already
holds (a redelivery of one it is running or writing) are skipped.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from genq.common.errors import GenqError, InvalidRequest
from genq.common.formats import ResponseFormat
from genq.common.keys import Keys
from genq.common.models import Request
from genq.common.tools import forced_format
from genq.common.wire import as_dict, as_text, decode_request
from genq.worker.engines.base import Engine
from genq.worker.engines.chat import prompt_text
from genq.worker.engines.pool import EnginePool
from genq.worker.policy.admission import (
    Action,
    Limits,
    Verdict,
    entry_time_ms,
    judge_entry,
    judge_prompt,
)
from genq.worker.policy.fair_share import charge
from genq.worker.policy.lookahead import Held, entry_key
from genq.worker.runtime.dead_letter import dead_letter_fields
from genq.worker.runtime.outcomes import Outcome, Outcomes
from genq.worker.runtime.read_trip import Delivered

Runnable = tuple[str, str, Request, tuple[int, int], int]
"""An entry to run: its stream, id, request, charge and when it was queued."""


@dataclass(kw_only=True)
class Admitted:
    """What one admit step made of the entries it was given."""

    held: list[Held] = field(default_factory=list)
    """Runnable: they join the look-ahead."""
    outcomes: list[Outcome] = field(default_factory=list)
    """Final at once: failed or expired."""
    dead_letters: list[dict[str, str | int]] = field(default_factory=list)
    """Entries with no usable id, as dead-letter records."""
    elsewhere: list[Held] = field(default_factory=list)
    """A pool's entries of a model it does not hold now (read before a swap ended): handed
    back as they are, untokenized, for a worker that holds it."""


KEPT_INPUTS = 1_024
"""Embedding requests whose fitted inputs the intake keeps (4 bytes a token: ~13 KB for 64
inputs of 50 tokens), so that one read again is not tokenized again: a static worker hands back
what waits before a long batch and reads it back next turn, which for 64 inputs a request
cost more than the batch's passes."""


class Intake:
    """Decodes, checks and tokenizes delivered entries for one worker."""

    def __init__(
        self, *, engine: Engine, limits: Limits, outcomes: Outcomes, keys: Keys, consumer: str
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.outcomes = outcomes
        self.keys = keys
        self.consumer = consumer
        self._limits: dict[str, Limits] = {}  # a pool's, by model (each model's context)
        self._priorities = {s: keys.priority_of(s) for s in keys.streams()}  # (every read's)
        self._fitted: OrderedDict[tuple[str | None, str], list[array[int]]] = OrderedDict()
        """The last ``KEPT_INPUTS`` embedding requests' fitted inputs, by model and id."""

    def admit(
        self,
        delivered: Delivered,
        *,
        now_ms: int,
        held: Sequence[Collection[str]],
    ) -> Admitted:
        """The verdicts on ``delivered``; an entry whose key (``entry_key``) is in one of
        ``held`` (the look-ahead's, the runner's, the writer's) is held already: skipped."""
        out = Admitted()
        runnable: list[Runnable] = []
        taken: set[str] = set().union(*held)  # (one lookup an entry, not one per container)
        for raw_stream, entries in delivered:
            stream = as_text(raw_stream)
            priority = self._priorities.get(stream) or self.keys.priority_of(stream)
            for raw_id, fields in entries:
                entry_id = as_text(raw_id)
                key = entry_key(stream, entry_id)
                if key in taken:
                    continue
                decoded = decode_request(priority, fields or {})
                enqueued_ms = entry_time_ms(entry_id)
                verdict = judge_entry(decoded, now_ms, enqueued_ms)
                common = isinstance(fields, list) and len(fields) == 4 and fields[2] == b"body"
                charged = charge(fields[3] if common else body_of(fields))  # (as decode_request)
                if verdict.action is Action.RUN and isinstance(decoded, Request):
                    runnable.append((stream, entry_id, decoded, charged, enqueued_ms))
                elif verdict.action is Action.EXPIRE and isinstance(decoded, Request):
                    out.outcomes.append(
                        self.outcomes.expired(
                            stream=stream, entry_id=entry_id, request=decoded, charge=charged
                        )
                    )
                elif verdict.action is Action.FAIL and verdict.error and verdict.request_id:
                    out.outcomes.append(
                        self.outcomes.failed(
                            stream=stream,
                            entry_id=entry_id,
                            request_id=verdict.request_id,
                            error=verdict.error,
                        )
                    )
                else:
                    record = dead_letter_fields(
                        stream=stream,
                        entry_id=entry_id,
                        fields=as_dict(fields),
                        error=str(verdict.error),
                        worker=self.consumer,
                    )
                    out.dead_letters.append(record)
        if runnable:
            self._tokenize(runnable, out)
        return out

    def _constrain(self, engine: Engine, fmt: ResponseFormat) -> Any:
        """The engine's constraint for ``fmt`` (None for free text); raises InvalidRequest
        when the engine cannot enforce it."""
        if not fmt.constrains:
            return None
        constrain = getattr(engine, "constrain", None)
        if constrain is None:
            raise InvalidRequest(f"--engine {engine.name} cannot constrain output")
        return constrain(fmt)

    def _tokenize(self, runnable: list[Runnable], out: Admitted) -> None:
        """Cost and check each runnable request with its model's engine: the worker's one
        engine, or a pool's engine of the model (its entries of a model not loaded here go
        back: ``Admitted.elsewhere``)."""
        if not isinstance(self.engine, EnginePool):
            self._tokenize_with(self.engine, self.limits, runnable, out)
            return
        groups: dict[str | None, list[Runnable]] = {}
        for item in runnable:
            groups.setdefault(item[2].model, []).append(item)
        for model, group in groups.items():
            engine = self.engine.of(model)
            if engine is None:
                out.elsewhere += [
                    Held(stream=s, entry_id=e, request=r, prompt_ids=[], enqueued_ms=t, charge=c)
                    for s, e, r, c, t in group
                ]
                continue
            limits = self._limits.get(model or self.engine.default)
            if limits is None:
                vocab = None if engine.tokenizer is None else len(engine.tokenizer)
                limits = replace(
                    self.limits, max_context_tokens=engine.max_context_tokens, vocab_size=vocab
                )
                self._limits[model or self.engine.default] = limits
            self._tokenize_with(engine, limits, group, out)

    def _tokenize_with(
        self, engine: Engine, limits: Limits, runnable: list[Runnable], out: Admitted
    ) -> None:
        """Cost each runnable request in the engine's tokenizer (one call for all), then check
        it against the limits. A chat the model's template cannot render fails alone; a request
        of the other kind than the model's (an embedding for a generating model, a prompt for
        an embedding model) fails too, and embedding requests go to ``_embed_with``."""
        embeds = getattr(engine, "embeds", False)
        if embeds or [1 for item in runnable if item[2].input is not None]:
            kept = [item for item in runnable if (item[2].input is not None) == embeds]
            for stream, entry_id, request, charged, _ in runnable:
                if (request.input is not None) != embeds:
                    self._fail(out, stream, entry_id, request, charged, _kind_error(embeds))
            if embeds:
                self._embed_with(engine, kept, out)
                return
            runnable = kept
        texts = []
        for item in list(runnable):
            stream, entry_id, request, charged, _ = item
            try:
                texts.append(prompt_text(request, engine.tokenizer))
            except Exception as err:  # a template's own error (jinja), about these messages
                runnable.remove(item)
                error = InvalidRequest(
                    f"the model's chat template cannot render these messages: "
                    f"{type(err).__name__}: {err}"
                )
                self._fail(out, stream, entry_id, request, charged, error)
        for (stream, entry_id, request, charged, enqueued_ms), ids in zip(
            runnable, engine.tokenize(texts), strict=True
        ):
            verdict = judge_prompt(request, len(ids), limits)
            constraint = None
            fmt = request.response_format or (
                forced_format(request.tools, request.tool_choice) if request.tools else None
            )
            if verdict.action is Action.RUN and fmt is not None:
                try:
                    constraint = self._constrain(engine, fmt)
                except GenqError as err:
                    verdict = Verdict(action=Action.FAIL, error=err)
            if verdict.action is Action.FAIL and verdict.error is not None:
                self._fail(out, stream, entry_id, request, charged, verdict.error)
                continue
            out.held.append(
                Held(
                    stream=stream,
                    entry_id=entry_id,
                    request=request,
                    prompt_ids=ids,
                    enqueued_ms=enqueued_ms,
                    constraint=constraint,
                    charge=charged,
                )
            )

    def _embed_with(self, engine: Any, runnable: list[Runnable], out: Admitted) -> None:
        """Tokenize every text input of these embedding requests in one call, fit each input to
        the model (``truncate``) and hold the request with its inputs; one that asks for what
        the model cannot give (other dimensions, an input over it with ``truncate: none``,
        token ids outside its vocabulary) fails alone."""
        scores = getattr(engine, "scores", False)
        for item in [item for item in runnable if (item[2].query is not None) != scores]:
            runnable.remove(item)
            self._fail(out, item[0], item[1], item[2], item[3], _score_error(scores))
        kept = self._fitted
        fresh = [i for i in runnable if (i[2].model, i[2].id) not in kept]
        texts = [i for item in fresh for i in item[2].input or () if isinstance(i, str)]
        tokenized = iter([] if scores else engine.tokenize(texts))
        vocab = len(engine.tokenizer)
        for stream, entry_id, request, charged, enqueued_ms in runnable:
            key = (request.model, request.id)
            if key in kept:  # read again after a hand-back: as it was fitted then
                kept.move_to_end(key)
                inputs = [list(ids) for ids in kept[key]]
            else:
                try:
                    inputs = _fitted(engine, request, tokenized, vocab)
                except InvalidRequest as err:
                    self._fail(out, stream, entry_id, request, charged, err)
                    continue
                kept[key] = [array("i", ids) for ids in inputs]
                while len(kept) > KEPT_INPUTS:
                    kept.popitem(last=False)
            flat = [t for ids in inputs for t in ids]
            out.held.append(
                Held(
                    stream=stream,
                    entry_id=entry_id,
                    request=request,
                    prompt_ids=flat,
                    enqueued_ms=enqueued_ms,
                    inputs=inputs,
                    charge=charged,
                )
            )

    def _fail(
        self,
        out: Admitted,
        stream: str,
        entry_id: str,
        request: Request,
        charged: tuple[int, int],
        error: GenqError,
    ) -> None:
        out.outcomes.append(
            self.outcomes.failed(
                stream=stream,
                entry_id=entry_id,
                request_id=request.id,
                error=error,
                request=request,
                charge=charged,
            )
        )


def _fitted(
    engine: Any, request: Request, tokenized: Iterator[list[int]], vocab: int
) -> list[list[int]]:
    """An embedding request's inputs as the model takes them: its texts' ids (the next of
    ``tokenized``, or a cross-encoder's pairs with its query), its ids checked, each fitted to
    the model (``truncate``); InvalidRequest for what the model cannot give."""
    if request.query is not None:  # a cross-encoder's pairs (texts only: the model's rule)
        raw = engine.tokenize_pairs(request.query, request.input)
    else:
        raw = [next(tokenized) if isinstance(i, str) else i for i in request.input or ()]
    if request.dimensions not in (None, engine.dimension):
        raise InvalidRequest(
            f"this model's vectors have {engine.dimension} dimensions and it cannot "
            f"make {request.dimensions}: leave out dimensions"
        )
    for n, ids in enumerate(raw):
        if any(t >= vocab for t in ids):
            raise InvalidRequest(f"input {n} has token ids outside the vocabulary")
    return [engine.fit(ids, request.truncate, n) for n, ids in enumerate(raw)]


def _score_error(scores: bool) -> InvalidRequest:
    """Why an embedding request fails on a cross-encoder, or a score request on an embedder."""
    if scores:
        return InvalidRequest(
            "this model is a cross-encoder: it scores input texts against a query (send "
            "query, or use /v1/rerank or /v1/score) and makes no embeddings"
        )
    return InvalidRequest("this model makes embeddings and scores no query: leave out query")


def _kind_error(embeds: bool) -> InvalidRequest:
    """Why a request of the other kind than its model's fails."""
    if embeds:
        return InvalidRequest(
            "this model makes embeddings and generates no text: send input (an embedding "
            "request), not a prompt or messages"
        )
    return InvalidRequest("this model generates text and makes no embeddings: send a prompt")


def body_of(fields: Any) -> bytes:
    """An entry's ``body`` field as bytes (empty if it has none)."""
    if isinstance(fields, list):
        if len(fields) >= 4 and fields[2] == b"body":  # the common shape: id, then body
            value = fields[3]
        else:
            value = as_dict(fields).get(b"body", b"")
    else:
        value = (fields or {}).get(b"body", (fields or {}).get("body", b""))
    return value if isinstance(value, bytes) else str(value).encode()
