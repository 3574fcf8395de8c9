"""genq's client library: submit generation requests and read their results.

Needs only redis, pydantic, click and rich; never torch::

    from genq.producer import Client
    client = Client.from_url("redis://localhost:6379/0")
    result = client.generate("Once upon a time", max_new_tokens=32)
    print(result.text)
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
