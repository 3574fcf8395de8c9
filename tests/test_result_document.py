"""The result document has one owner (genq.common.states): every state it builds is a valid
Result, starts with its id and status (what the scripts and clients read first), and the
APPLY script's answers are the named ones."""

from __future__ import annotations

import fakeredis
import pytest
from genq.common import states
from genq.common.keys import Keys
from genq.common.models import Result
from genq.common.scripts import Applied, apply
from genq.common.wire import decode_result

SUCCEEDED: dict[str, object] = {
    "text": "hi",
    "finish_reason": "stop",
    "prompt_tokens": 3,
    "completion_tokens": 2,
    "queued_ms": 1,
    "started_ms": 5,
    "finished_ms": 9,
    "generation_ms": 4,
    "worker": "w",
    "model": "m",
    "batch_size": 2,
}
"""A succeeded state's arguments, less its id, priority, tenant and metadata."""


def built() -> dict[str, str]:
    common = {"priority": "high", "tenant": "team-a", "metadata": {"k": 1}}
    return {
        "queued": states.queued(request_id="q1", **common),  # type: ignore[arg-type]
        "running": states.running(request_id="r1", queued_ms=1, started_ms=5, worker="w", **common),  # type: ignore[arg-type]
        "succeeded": states.succeeded(request_id="s1", **SUCCEEDED, **common),  # type: ignore[arg-type]
        "failed": states.ended(
            request_id="f1",
            status="failed",
            code="generation_error",
            message="it broke",
            queued_ms=1,
            started_ms=None,
            finished_ms=9,
            worker="w",
            **common,  # type: ignore[arg-type]
        ),
    }


@pytest.mark.parametrize("status", ["queued", "running", "succeeded", "failed"])
def test_every_built_state_is_a_strict_result_read_first_by_its_status(status: str) -> None:
    raw = built()[status]
    result = decode_result(raw)
    assert result.status == status and result.priority == "high"
    assert result.metadata == {"k": 1} and result.tenant == "team-a"
    assert raw.startswith('{"id":"') and states.status_of(raw) == status
    assert states.is_final(raw) == (status in {"succeeded", "failed"})


def test_a_succeeded_state_with_logprobs_choices_and_tool_calls_still_starts_with_its_status() -> (
    None
):
    # These went before id and status, and status_of (and the scripts'
    # is_final) then decoded the whole document instead of reading its first fields.
    token = {"token": "hi", "logprob": -0.5, "bytes": [104, 105], "top_logprobs": []}
    raw = states.succeeded(
        request_id="s2",
        **{**SUCCEEDED, "finish_reason": "tool_calls"},  # type: ignore[arg-type]
        priority="normal",
        tenant="t",
        metadata={},
        logprobs=[token],
        choices=[{"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": [token]}],
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    )
    assert raw.startswith('{"id":"s2","status":"succeeded"')
    result = decode_result(raw)
    assert result.logprobs and result.choices and result.tool_calls


def test_a_succeeded_state_carries_its_wait_usage_and_batch() -> None:
    result = decode_result(built()["succeeded"])
    assert result.timings.queue_wait_ms == 4 and result.timings.generation_ms == 4
    assert result.usage.completion_tokens == 2 and result.batch_size == 2


def test_a_cancel_keeps_what_the_request_had_and_says_why() -> None:
    running = decode_result(built()["running"])
    cancelled = decode_result(states.cancelled(running, finished_ms=42))
    assert cancelled.status == "cancelled" and cancelled.error is not None
    assert cancelled.error.code == "cancelled"
    assert cancelled.worker == "w" and cancelled.timings.started_unix_ms == 5
    assert cancelled.timings.finished_unix_ms == 42


def test_status_is_read_from_states_in_other_layouts_too() -> None:
    assert states.status_of('{ "status": "expired", "id": "x" }') == "expired"
    assert states.status_of(b"not json") is None
    assert states.status_of("[1, 2]") is None
    assert not states.is_final(None)


def test_apply_answers_are_the_named_ones() -> None:
    r = fakeredis.FakeRedis()
    keys = Keys("doc")
    final = Result(id="a1", status="succeeded", text="x").model_dump_json()
    assert apply(r, keys, 60, "final", [("a1", None, "", final)]) == [Applied.WRITTEN]
    assert apply(r, keys, 60, "final", [("a1", None, "", final)]) == [Applied.ALREADY_FINAL]
    assert apply(r, keys, 60, "cancel", [("none", None, "", final)]) == [Applied.NOT_FOUND]
    queued = states.queued(request_id="p1", priority="normal", metadata={})
    r.set(keys.result("p1"), queued)
    running = states.running(
        request_id="p1",
        priority="normal",
        tenant="default",
        metadata={},
        queued_ms=1,
        started_ms=2,
        worker="w",
    )
    answers = [
        apply(r, keys, 60, "running", [("p1", None, "", running)], max_attempts=2, token=t)[0]
        for t in ("t1", "t2", "t3")
    ]
    assert answers == [Applied.WRITTEN, Applied.WRITTEN, Applied.POISON]
