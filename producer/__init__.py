"""genq's client library: submit generation requests and read their results.

A base install (``pip install genq``) has all it needs; never torch, never a web server::

    from genq.producer import Client
    client = Client.from_url("redis://localhost:6379/0")
    result = client.generate("Once upon a time", max_new_tokens=32)
    print(result.text)

=================  =========================================================================
module             what it holds
=================  =========================================================================
``client``         ``Client``: submit, cancel, status, result, generate, stream (sync;
                   written from ``aio`` by ``scripts/unasync.py``)
``aio``            ``AsyncClient``: the same API on asyncio (the one to edit)
``building``       a request validated once, into ``Prepared`` (the submit script's form)
``submitting``     the submit and cancel script calls, and what their answers mean
``waiting``        waiting for many results (``Waiter``), following one stream
``files``          ``genq submit --file`` lines
``moved_names``    old import paths of the gateway's modules, kept for one release
=================  =========================================================================

Beside it, not imported by it: ``genq.producer.gateway`` (``genq serve``: the HTTP gateway, its
OpenAI shapes, batches, dead letters, webhooks and the dashboard) and ``genq.producer.commands``
(the ``genq`` commands of a client and an operator).
"""

from genq.common.errors import (
    GenqError,
    InvalidRequest,
    QueueFull,
    RequestNotFound,
    ResultTimeout,
    SubmitFailed,
)
from genq.common.models import Request, Result
from genq.producer.aio import AsyncClient
from genq.producer.building import build_request
from genq.producer.client import Client
from genq.producer.moved_names import install as _install_moved_names

_install_moved_names()

__all__ = [
    "AsyncClient",
    "Client",
    "GenqError",
    "InvalidRequest",
    "QueueFull",
    "Request",
    "RequestNotFound",
    "Result",
    "ResultTimeout",
    "SubmitFailed",
    "build_request",
]
