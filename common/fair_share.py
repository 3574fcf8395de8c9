"""Tenants' fair share, the constants the scripts and the worker share: the cost of a request
(``weighted_tokens``), the read rules and the doorbell's bounds. The scripts that keep the
accounts are in ``genq.common.lua`` (``tenants``, ``read``, ``hand_back``); the rule itself, and
what is charged and refunded: ``genq.worker.policy.fair_share``.
"""

from __future__ import annotations

OUTPUT_WEIGHT = 2
"""A generated token weighs this many prompt tokens in a tenant's service (VTC's weights: a
decode step costs more than a prompt token's share of the prefill)."""

READ_RULES = ("fair", "fifo")
"""How ``PULL`` picks among a priority's tenants: ``fair`` (the least weighted tokens served
per unit of weight) or ``fifo`` (the oldest waiting entry, whoever sent it). An order says which
it wants (``WaitingOrder.read_rule``); PULL refuses any other value."""


def weighted_tokens(prompt_tokens: int, generated_tokens: int) -> int:
    """The fair share's cost of a request: what it adds to its tenant's service. The one
    formula; the scripts' ``weighted`` is its twin (a test compares them)."""
    return prompt_tokens + OUTPUT_WEIGHT * generated_tokens


DOORBELL_MAX = 64
"""The doorbell stream is trimmed (approximately) to this many entries: rings nobody heard."""
DOORBELL_BY = "by"
"""A pass-over ring's field naming its reader (PULL rings; ``worker/runtime/doorbell.py``)."""
