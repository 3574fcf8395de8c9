"""Request and result models: what goes on the wire, with its limits.

Both sides validate with these models, so a request that the client accepts is one the worker
can decode, and a limit is written once. JSON is the only encoding (never pickle).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal

from genq.common.embeddings import (
    DEFAULT_TRUNCATE,
    MAX_DIMENSIONS,
    MAX_EMBED_CHARS,
    MAX_EMBED_INPUTS,
    EmbedInput,
    TextInput,
    Truncate,
    input_chars,
    unpack,
)
from genq.common.formats import ResponseFormat
from genq.common.prefixes import MAX_PROMPT_CACHE_KEY_CHARS
from genq.common.tools import (
    MAX_TOOLS,
    Tool,
    ToolCall,
    ToolChoice,
    check_tools,
    tools_size_problem,
)
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

#: Hard limits of the wire format. A worker may set tighter ones (its settings), never looser.
MAX_PROMPT_CHARS = 200_000
MAX_NEW_TOKENS = 16_384
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_METADATA_KEYS = 32
MAX_TOP_LOGPROBS = 20
MAX_CHOICES_PER_REQUEST = 16
"""Most ``n`` (choices generated for one request)."""
MAX_LOGIT_BIAS = 300
"""Most entries in a request's ``logit_bias`` (OpenAI's limit)."""
MAX_METADATA_VALUE_CHARS = 1_024
MAX_METADATA_KEY_CHARS = 64
"""OpenAI's bound on a metadata key."""

Priority = Literal["high", "normal", "low"]
#: Highest first; the order the worker reads and serves them in (before aging).
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
#: A priority's rank: 0 is served first. The one other form a priority takes is its stream.
PRIORITY_RANK: dict[str, int] = {p: i for i, p in enumerate(PRIORITIES)}
DEFAULT_PRIORITY: Priority = "normal"
DEFAULT_MAX_NEW_TOKENS = 64
"""A request's ``max_new_tokens`` when it gives none (client, wire and CLI alike)."""

Status = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
FINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "expired"})

FinishReason = Literal["stop", "length", "tool_calls"]

#: A tenant: whom a request belongs to (a team, an app). Part of key names, so a safe alphabet.
TENANT_CHARS = r"[A-Za-z0-9._\-]{1,64}"
"""What a tenant name may be: 1-64 letters, digits, '.', '_' or '-'."""
TenantName = Annotated[str, StringConstraints(pattern=f"^{TENANT_CHARS}$")]
DEFAULT_TENANT = "default"
"""The tenant of a request that names none (and of an entry from an older client)."""
_TENANT = re.compile(TENANT_CHARS)


def tenant_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a tenant name, or None if nothing is."""
    if isinstance(name, str) and _TENANT.fullmatch(name):
        return None
    return f"tenant {name!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-'"


#: A model's name as requests carry it and workers serve it (``--served-model-name``, an
#: adapter's name): part of key names (``Keys.lane``), so a safe alphabet, but wide enough for
#: hub ids (``org/name``) and tags (``name:8b``).
MODEL_NAME_CHARS = r"[A-Za-z0-9._\-/:@+]{1,128}"
"""What a model name may be: 1-128 letters, digits and ``. _ - / : @ +``."""
ModelName = Annotated[str, StringConstraints(pattern=f"^{MODEL_NAME_CHARS}$")]
_MODEL = re.compile(MODEL_NAME_CHARS)


def model_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a model name, or None if nothing is."""
    if isinstance(name, str) and _MODEL.fullmatch(name):
        return None
    return (
        f"model {name!r} is not allowed: use 1-128 letters, digits and . _ - / : @ + (a name "
        "as clients send it, like 'my-org/chat-8b')"
    )


#: Request ids become part of Redis key names, so they are kept to a safe alphabet.
REQUEST_ID_CHARS = r"[A-Za-z0-9_.:\-]{1,128}"
"""What a request id may be (it becomes part of key names)."""
RequestId = Annotated[str, StringConstraints(pattern=f"^{REQUEST_ID_CHARS}$")]
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_METADATA_KEY_CHARS)]
MetadataValue = (
    Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE_CHARS)]
    | int
    | float
    | bool
    | None
)


def new_request_id() -> str:
    """A fresh random request id (32 hex digits)."""
    return uuid.uuid4().hex


def host_now_ms() -> int:
    """This host's wall clock in Unix milliseconds, the unit of every timestamp genq records.
    Only where no Redis clock is at hand (a client, a command line): a worker records Redis'
    time (``genq.worker.runtime.clock.now_ms``)."""
    return time.time_ns() // 1_000_000


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


MAX_MESSAGES = 256


BiasValue = Annotated[float, Field(ge=-100.0, le=100.0)]


class ChatMessage(_Strict):
    """One message of a chat request (OpenAI's ``messages`` shape, text content)."""

    role: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    """``system``, ``user``, ``assistant``, ``tool`` (or whatever roles the model's template
    knows)."""
    content: Annotated[str, StringConstraints(max_length=MAX_PROMPT_CHARS)] | None
    """The text (None only for an assistant message that made tool calls)."""
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    """An assistant message's calls, sent back as the conversation goes on."""
    tool_call_id: Annotated[str, StringConstraints(max_length=128)] | None = None
    """A ``tool`` message: the call it answers."""
    name: Annotated[str, StringConstraints(max_length=64)] | None = None

    @property
    def chars(self) -> int:
        """The characters it adds to the prompt: content, calls (ids, names, arguments), the id
        of the call it answers, its name."""
        calls = sum(
            len(c.id) + len(c.function.name) + len(c.function.arguments)
            for c in self.tool_calls or ()
        )
        return len(self.content or "") + calls + len(self.tool_call_id or "") + len(self.name or "")

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("a message needs content (or, from the assistant, tool_calls)")
        return self


class RequestBody(_Strict):
    """The ``body`` field of a stream entry: everything about a request but its id and priority.

    The id travels as its own field (so a request whose body is broken can still be failed by
    id) and the priority is the stream the entry is in.
    """

    model: ModelName | None = None
    """The model (or adapter) to run it: only a worker serving that name takes it
    (``Keys.lane``). First in the body, so that scripts read it without decoding the body.
    None: the queue's default model (docs/models.md)."""
    prefix_key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")] | None = None
    """Which cached context this request likely shares with others (``common/prefixes.py``):
    set where the request is built, first in the body so that scripts read it without decoding
    the body. A hint for placement only."""
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS)] | None = (
        None
    )
    """The text to continue. Tokenized by the worker with the model's own tokenizer. Exactly one
    of ``prompt`` and ``messages`` is given."""
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None
    )
    """A chat to continue: the worker renders it with the model's chat template (or, for a
    model without one, as ``role: content`` lines ending with ``assistant:``)."""
    input: Annotated[list[EmbedInput], Field(min_length=1, max_length=MAX_EMBED_INPUTS)] | None = (
        None
    )
    """An embedding request's inputs (texts or token ids, ``common/embeddings.py``): the result
    holds one vector per input, in order (``Result.embeddings``). Only an embedding model's
    workers serve it; none of the generation fields apply (``max_new_tokens`` is 0)."""
    query: TextInput | None = None
    """Scores: each input is read together with this text by a cross-encoder (a
    ``*ForSequenceClassification`` model), and its "vector" is its score (one value a label).
    Only a cross-encoder's workers serve it; every input is then a text."""
    truncate: Truncate = DEFAULT_TRUNCATE
    """Embeddings: an input over the model's tokens loses them from the ``end`` or ``start``,
    or (``none``) the request fails naming it."""
    dimensions: Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)] | None = None
    """Embeddings: the vectors' size; a model that cannot shorten its vectors refuses any other
    than its own."""
    normalize: bool | None = None
    """Embeddings: scale each vector to length 1 (None: as the model does, its
    ``Normalize`` module)."""
    max_new_tokens: Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS)] = DEFAULT_MAX_NEW_TOKENS
    """Generate at most this many tokens; generation also ends at eos or a stop string. At
    least 1 for a generation (an embedding's is 0: what its charge reads)."""
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 0.0
    """0 means greedy decoding (the default); above 0 samples from the softened distribution."""
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p."""
    top_k: Annotated[int, Field(ge=0, le=100_000)] = 0
    """Sample from the k most likely tokens only; 0 turns it off."""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    """Makes sampling reproducible for the same prompt, settings and seed."""
    stop: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]],
        Field(max_length=MAX_STOP_STRINGS),
    ] = Field(default_factory=list)
    """Generation ends before the first occurrence of any of these strings (not returned)."""
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    """Sampling only: drop tokens less likely than ``min_p`` x the likeliest one's probability."""
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    """OpenAI's: each token's logit is lowered by this x how often it was generated so far."""
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    """OpenAI's: each token already generated has its logit lowered by this, once."""
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    """vLLM's and transformers': a token in the prompt or generated so far has a positive logit
    divided by this and a negative one multiplied by it (1: off)."""
    logit_bias: Annotated[
        dict[Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")], BiasValue],
        Field(max_length=MAX_LOGIT_BIAS),
    ] = Field(default_factory=dict)
    """OpenAI's: token id (in the model's tokenizer, as a decimal string) -> a number from -100
    to 100 added to that token's logit at every step (-100 bans it, 100 all but forces it)."""
    min_tokens: Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS)] = 0
    """vLLM's: eos cannot end the text before this many tokens are generated."""
    ignore_eos: bool = False
    """vLLM's: eos is never picked, so the text runs to ``max_new_tokens`` (or a stop string)."""
    logprobs: bool = False
    """Return each generated token's log-probability (``Result.logprobs``), from the model's
    own distribution (before penalties and temperature)."""
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] = 0
    """With ``logprobs``: also the this many likeliest tokens at each position (0-20)."""
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES_PER_REQUEST)] = 1
    """How many choices to generate for the prompt (1-16), each with its own text, finish
    reason and logprobs (``Result.choices``); choice j of a request with a ``seed`` samples
    with seed + j, so the set is reproducible. Counts n times in a worker's token budget."""
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    """Functions a chat's model may call (OpenAI's ``tools``; ``common/tools.py``)."""
    tool_choice: ToolChoice | None = None
    """``none``, ``auto`` (the default with tools), ``required`` or ``{"type": "function",
    "function": {"name": ...}}``: the last two are forced by constrained decoding."""
    response_format: ResponseFormat | None = None
    """What the output must be: JSON of a schema, any JSON object, a regex's match, one of a
    list of strings (``common/formats.py``), enforced by constrained decoding."""
    stream: bool = False
    """Also send the text as it is generated, as ``delta`` events on the request's event stream."""
    deadline_unix_ms: Annotated[int, Field(ge=0)] | None = None
    """If the request has not started by this time it ends ``expired`` without running (an
    absolute time: as right as the clock of whoever computed it)."""
    deadline_in_ms: Annotated[int, Field(ge=0)] | None = None
    """If the request has not started this long after Redis accepted it (its entry's time, by
    Redis' clock), it ends ``expired``: no host's clock matters. The clients' ``deadline_in_s``
    sets it."""
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=MAX_METADATA_KEYS)] = (
        Field(default_factory=dict)
    )
    """Free-form data the client wants back with the result; genq does not read it."""
    tenant: TenantName = DEFAULT_TENANT
    """Whom the request belongs to (1-64 of ``A-Za-z0-9._-``): its share of the fleet, quotas
    and, at ``genq serve``, who may see it. Set by the gateway from the API key; producers that
    talk to Redis directly are trusted to name their own."""
    prompt_cache_key: (
        Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CACHE_KEY_CHARS)]
        | None
    ) = None
    """OpenAI's ``prompt_cache_key``: requests that give the same one are placed as sharing
    their cached context (per tenant)."""

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_in_bounds(cls, tools: Any) -> Any:
        """Tools are bounded in all before any schema of theirs is checked (checking costs
        ~0.8 s of CPU per 100 KB). A field's validator: it runs only for a body with tools."""
        if isinstance(tools, list) and tools:
            problem = tools_size_problem(tools)
            if problem is not None:
                raise ValueError(problem)
        return tools

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> RequestBody:
        if (self.prompt is None) == (self.messages is None):
            if self.input is not None and self.prompt is None:
                return self._embedding()
            raise ValueError("give exactly one of 'prompt', 'messages' and 'input'")
        if self.input is not None:
            raise ValueError("give exactly one of 'prompt', 'messages' and 'input'")
        if self.query is not None:
            raise ValueError("query goes with input (texts to score), not a prompt or messages")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if (
            self.messages is None
            and self.n == 1
            and not self.top_logprobs
            and self.tools is None
            and self.tool_choice is None
        ):
            return self  # the common case (a prompt, one choice): none of the rules below apply
        if self.n > 1 and self.stream:
            raise ValueError("stream with n > 1 is not supported: ask for one or the other")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if (self.tools or self.tool_choice) and self.messages is None:
            raise ValueError("tools are for chats: give messages, not a prompt")
        problem = check_tools(self.tools, self.tool_choice)
        if problem is not None:
            raise ValueError(problem)
        if self.response_format is not None and self.tool_choice not in (None, "none", "auto"):
            raise ValueError("give response_format or a forced tool_choice, not both")
        if self.tools and self.stream:
            raise ValueError("stream with tools is not supported: ask without stream")
        if self.messages and sum(m.chars for m in self.messages) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"messages hold more than {MAX_PROMPT_CHARS} characters in all (content, tool "
                "calls' ids, names and arguments)"
            )
        return self

    def _embedding(self) -> RequestBody:
        """An embedding request's rules: its inputs in bounds, and no generation field."""
        if self.input is not None and input_chars(self.input) > MAX_EMBED_CHARS:
            raise ValueError(f"input holds more than {MAX_EMBED_CHARS} characters in all")
        if self.stream or self.tools or self.response_format is not None:
            raise ValueError("an embedding request takes no stream, tools or response_format")
        if self.n != 1 or self.logprobs:
            raise ValueError("an embedding request takes no n or logprobs")
        if self.query is not None and not all(isinstance(i, str) for i in self.input or ()):
            raise ValueError("a request with a query scores texts: every input a text")
        if self.query is not None and self.normalize is not None:
            raise ValueError("normalize is for vectors, not a query's scores")
        return self


class Request(RequestBody):
    """A generation request as the worker sees it: the body plus id and priority."""

    id: RequestId
    """Client-given or generated; the key of the result."""
    priority: Priority = DEFAULT_PRIORITY
    """Which stream the request is in: ``high``, ``normal`` or ``low``."""


class Usage(_Strict):
    """Token counts, in the worker's tokenizer."""

    prompt_tokens: int = 0
    """Tokens in the prompt (no padding counted)."""
    completion_tokens: int = 0
    """Tokens returned; never more than the request's max_new_tokens."""
    cached_tokens: int = 0
    """Of ``prompt_tokens``, those the engine took from its prefix cache instead of computing
    (OpenAI's ``prompt_tokens_details.cached_tokens``; 0 where the engine cannot tell)."""


class ErrorInfo(_Strict):
    """Why a request failed: a stable code and a message a person can act on."""

    code: str
    message: str


class Timings(_Strict):
    """When things happened, in Unix milliseconds, and the two durations users ask about."""

    queued_unix_ms: int | None = None
    """When the request entered the queue (the stream entry's id)."""
    started_unix_ms: int | None = None
    """When a worker started running it."""
    finished_unix_ms: int | None = None
    """When its final state was written."""
    queue_wait_ms: int | None = None
    """started - queued."""
    generation_ms: int | None = None
    """Time spent in the engine for the batch that ran it."""


class TopLogprob(_Strict):
    """One of the likeliest tokens at a position (OpenAI's ``top_logprobs`` item)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    """The token's text as UTF-8 bytes (a token may hold part of a character)."""


class TokenLogprob(TopLogprob):
    """A generated token and its log-probability (OpenAI's chat ``logprobs.content`` item)."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class Choice(_Strict):
    """One of the ``n`` outputs of a request (OpenAI's ``choices[]`` item)."""

    index: int
    text: str
    finish_reason: FinishReason
    logprobs: list[TokenLogprob] | None = None


class Result(_Strict):
    """The state of one request, kept at its result key and sent as its final event."""

    id: RequestId
    status: Status
    """queued, running, succeeded, failed, cancelled or expired (the last four are final)."""
    priority: Priority | None = None
    tenant: TenantName = DEFAULT_TENANT
    """The tenant the request belongs to (``default`` when it named none)."""
    text: str | None = None
    """The generated text (without the prompt and without a matched stop string)."""
    embeddings: list[str] | None = None
    """An embedding request's vectors, one per input in order, each packed (float32
    little-endian bytes in base64: ``common/embeddings.py``; ``vectors()`` unpacks them)."""
    finish_reason: FinishReason | None = None
    """``stop``: eos or a stop string; ``length``: reached max_new_tokens."""
    logprobs: list[TokenLogprob] | None = None
    """With the request's ``logprobs``: each generated token (eos not included) and its
    log-probability, with the ``top_logprobs`` likeliest at that position."""
    tool_calls: list[ToolCall] | None = None
    """The tools the model called (``finish_reason`` is then ``tool_calls``; ``text`` keeps
    what it generated)."""
    choices: list[Choice] | None = None
    """With the request's ``n`` > 1: every choice, in order (``text``, ``finish_reason`` and
    ``logprobs`` above are the first's; ``usage.completion_tokens`` counts them all)."""
    usage: Usage = Field(default_factory=Usage)
    error: ErrorInfo | None = None
    """Set when status is failed, expired or cancelled."""
    timings: Timings = Field(default_factory=Timings)
    worker: str | None = None
    """The consumer name of the worker that ran it."""
    model: str | None = None
    """The model that generated it (the worker's ``--model``; ``echo`` for the echo engine)."""
    batch_size: int | None = None
    """How many requests shared the engine batch that ran it."""
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    """The request's metadata, echoed back."""
    entry: str | None = None
    """``queued`` states only: the work entry that owns the id (``PRIORITY/ENTRY_ID``); a
    second entry with the same id is a duplicate."""

    def vectors(self) -> list[list[float]]:
        """The embeddings as floats (empty for a result that has none)."""
        return [unpack(e) for e in self.embeddings or ()]

    @property
    def is_final(self) -> bool:
        """True once the request can no longer change state."""
        return self.status in FINAL_STATUSES
